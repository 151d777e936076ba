//! `scan`, `residency`, `dupes` and `inspect`: what is in memory now.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::*;
use super::{reword, MethodArg, OutputArgs, Selection};

#[derive(Debug, Args)]
#[command(mut_args(reword(
    "paths",
    "Model files or directories to report on, with their holders, candidates and cgroups \
     (directories: files with a model extension or at least --min-size); none: every model \
     file on the host",
    None
)))]
pub struct ScanArgs {
    #[command(flatten)]
    pub selection: Selection,
    /// Only processes in this memory cgroup (a directory under /sys/fs/cgroup, or a path
    /// like /system.slice/llama.service); its counters are reported.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
    /// The whole host: every process, and every model file (with FILEs, not only
    /// those named).
    #[arg(long)]
    pub all: bool,
    /// Kept for compatibility: the byte-level proof now runs by default.
    #[arg(long, hide = true)]
    pub prove: bool,
    /// Skip the byte-level proof: copies are then only suspected, and the count is a
    /// lower bound wherever a process could hold one.
    #[arg(long, conflicts_with = "prove")]
    pub no_prove: bool,
    /// Stop starting new proof searches after this long (the count then says "at least").
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub prove_budget: Duration,
    /// Compare every page of every copy found (slower; the default compares the pages
    /// on the sampling stride, and every page of a copy that differs anywhere).
    #[arg(long)]
    pub exact: bool,
    /// How to read page-cache residency.
    #[arg(long, value_enum, default_value_t)]
    pub method: MethodArg,
    /// Also append this scan's snapshot to the recording store DIR (as `record` does).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Also trace with eBPF for this long first (e.g. 10s) and add the counters of
    /// `twofold trace` and their findings (needs root or CAP_BPF + CAP_PERFMON; without,
    /// a warning and the plain scan).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub trace: Option<Duration>,
    /// Also trace uploads to GPUs for this long first, with the upload probes on the CUDA
    /// driver library alone (none of --trace's tracepoints): the device copies uploaded in
    /// the window are proven at upload, for less (docs/device.md, "Cost"); needs root or
    /// CAP_BPF + CAP_PERFMON.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, conflicts_with = "trace")]
    pub trace_uploads: Option<Duration>,
    /// Exit 1 when a condition holds, naming it and each file on stderr (a CI gate;
    /// comma list): copies (a proven private, copy-on-write or device copy beside the page
    /// cache), suspected (a suspected copy), lower-bound (a count that is only a lower
    /// bound). Exit status: 0 none holds, 1 one holds, 2 bad input or an error.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "CONDITION")]
    pub fail_on: Vec<FailOn>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A condition of `scan --fail-on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    Copies,
    Suspected,
    LowerBound,
}

impl From<FailOn> for crate::model::gate::Condition {
    fn from(f: FailOn) -> Self {
        use crate::model::gate::Condition;
        match f {
            FailOn::Copies => Condition::Copies,
            FailOn::Suspected => Condition::Suspected,
            FailOn::LowerBound => Condition::LowerBound,
        }
    }
}

#[derive(Debug, Args)]
pub struct ResidencyArgs {
    /// Files (or, with --recursive, directories).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Draw the per-page residency map (uses mincore).
    #[arg(long)]
    pub map: bool,
    /// Descend into directories.
    #[arg(short, long)]
    pub recursive: bool,
    /// Print only the total line (for many files).
    #[arg(long)]
    pub summary: bool,
    /// How to read page-cache residency.
    #[arg(long, value_enum, default_value_t)]
    pub method: MethodArg,
    /// As fincore: print sizes in bytes (a fincore-compatible table).
    #[arg(short, long, conflicts_with_all = ["map", "summary", "json"])]
    pub bytes: bool,
    /// As fincore: no header line (a fincore-compatible table).
    #[arg(short, long, conflicts_with_all = ["map", "summary", "json"])]
    pub noheadings: bool,
    /// As fincore: these columns, in this order (comma list; default RES,PAGES,SIZE,FILE),
    /// in a fincore-compatible table.
    #[arg(short, long, value_name = "LIST", value_enum, value_delimiter = ',', ignore_case = true,
          conflicts_with_all = ["map", "summary", "json"])]
    pub output: Vec<FincoreColumn>,
    #[command(flatten)]
    pub format: OutputArgs,
}

/// A column of `residency --output`, as fincore names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum FincoreColumn {
    /// File data resident in memory in bytes.
    Res,
    /// File data resident in memory in pages.
    Pages,
    /// Size of the file.
    Size,
    /// File name.
    File,
}

impl ResidencyArgs {
    /// The fincore-compatible table's columns, when a fincore flag asks for one.
    pub fn fincore_columns(&self) -> Option<Vec<FincoreColumn>> {
        use FincoreColumn::*;
        if !self.output.is_empty() {
            return Some(self.output.clone());
        }
        (self.bytes || self.noheadings).then(|| vec![Res, Pages, Size, File])
    }
}

#[derive(Debug, Args)]
pub struct DupesArgs {
    /// Process to search (repeatable).
    #[arg(long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<i32>,
    /// Model files to look for (default: every model file each process maps or holds
    /// open, and those of the host's files of interest it has the private memory and
    /// the reads to hold a copy of: a file it read and closed).
    pub files: Vec<PathBuf>,
    /// Alignment copies may start at: 16 covers heap allocators (and whole-file copies
    /// into an aligned buffer are always covered); smaller values find copies at any
    /// offset at proportionally more work.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub align: u64,
    /// Do not look for tensors converted to another dtype (F16/BF16 widened to F32, F32
    /// narrowed to F16/BF16, F16 ↔ BF16) or repacked by llama.cpp (q4_0_8x8, AMX tiles...).
    #[arg(long)]
    pub no_widen: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Model files; the format is sniffed from their first bytes, not their names.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}
