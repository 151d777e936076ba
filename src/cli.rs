//! The command line, defined once with clap derive: help, man page and completions all
//! come from here.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// How many times is my model in memory, and why?
///
/// twofold reads the kernel's own accounting (/proc, cgroups, cachestat, mincore) and tells
/// page cache, private copies and copy-on-write pages of model files apart.
#[derive(Debug, Parser)]
#[command(name = "twofold", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per-process, per-file and per-cgroup footprint of model files, with findings.
    Scan(ScanArgs),
    /// Page-cache residency of files (like fincore; --map draws it like vmtouch -v).
    Residency(ResidencyArgs),
    /// Proves private and widened copies of model files in processes' memory, tensor by
    /// tensor, byte by byte.
    Dupes(DupesArgs),
    /// Writes a small safetensors model, starts a copying and a mapping reader, and
    /// diagnoses them with the scan code; removes everything afterwards.
    Demo(DemoArgs),
    /// Tensors, dtypes and alignment of model containers (safetensors, GGUF, NumPy, PyTorch).
    Inspect(InspectArgs),
    /// Live eBPF tracing: page faults, page-cache adds, evictions and refaults, read()
    /// ingestion, direct reclaim and OOM kills, per file and per process (needs root or
    /// CAP_BPF + CAP_PERFMON); --json prints JSON Lines.
    Trace(TraceArgs),
    /// Prints shell completions to stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Prints the man page (roff) to stdout.
    Man,
    /// A test reader process (used by the demo and the tests).
    #[command(name = "__child", hide = true)]
    Child(ChildArgs),
    /// Benchmark helpers: write a synthetic safetensors model; read a process's memory
    /// with plain process_vm_readv (the bandwidth baseline for `dupes`).
    #[command(name = "__bench", hide = true)]
    Bench(BenchArgs),
}

/// Output format shared by the commands.
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct OutputArgs {
    /// Print one JSON document (with schema_version) instead of tables; warnings go to
    /// stderr.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum MethodArg {
    /// cachestat(2), falling back to mincore(2) where the kernel lacks it.
    #[default]
    Auto,
    Cachestat,
    Mincore,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Model files or directories to include (directories: files with a model extension
    /// or at least --min-size).
    pub paths: Vec<PathBuf>,
    /// Only this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
    /// Only processes in this memory cgroup (a directory under /sys/fs/cgroup, or a path
    /// like /system.slice/llama.service); its counters are reported.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
    /// List every process, not only those holding model files.
    #[arg(long)]
    pub all: bool,
    /// Prove suspected copies byte by byte (as `twofold dupes` does; needs ptrace rights).
    #[arg(long)]
    pub prove: bool,
    /// How to read page-cache residency.
    #[arg(long, value_enum, default_value_t)]
    pub method: MethodArg,
    /// Also trace with eBPF for this long first (e.g. 10s) and add the counters of
    /// `twofold trace` and their findings (needs root or CAP_BPF + CAP_PERFMON; without,
    /// a warning and the plain scan).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub trace: Option<Duration>,
    #[command(flatten)]
    pub output: OutputArgs,
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
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DupesArgs {
    /// Process to search (repeatable).
    #[arg(long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<i32>,
    /// Model files to look for (default: every model file each process maps or holds
    /// open).
    pub files: Vec<PathBuf>,
    /// Alignment copies may start at: 16 covers heap allocators (and whole-file copies
    /// into an aligned buffer are always covered); smaller values find copies at any
    /// offset at proportionally more work.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub align: u64,
    /// Do not look for F16/BF16 tensors widened to F32.
    #[arg(long)]
    pub no_widen: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size of the synthetic model file.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// Directory for the temporary model (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
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

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Only this process (repeatable); its counters are kept however many others run.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
    /// A file (or directory of model files) of interest (repeatable); only these files
    /// are listed. Default: the model files processes hold now, and the busiest others.
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Time between reports.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stop after this long and print a summary (default: until interrupted).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// At most this many other files and processes per report.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
    // With --json: JSON Lines, one `{"schema_version", "type", "data"}` object per report.
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ChildMode {
    /// read() the whole file into a heap buffer; keep the fd open.
    Copy,
    /// mmap MAP_SHARED read-only and touch every page.
    Map,
    /// mmap MAP_PRIVATE read-write and write --bytes of it (copy-on-write).
    PrivateWrite,
    /// Allocate and touch --bytes of anonymous memory (holding FILE open, if given).
    Anon,
    /// Copy the --range byte ranges (F16 or BF16 per --dtype) widened to F32 into a heap
    /// buffer.
    Widen,
}

#[derive(Debug, Args)]
pub struct ChildArgs {
    #[arg(value_enum)]
    pub mode: ChildMode,
    pub file: Option<PathBuf>,
    /// Heap offset of the copy (copy mode), to land at an unusual alignment.
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub bytes: u64,
    /// Only these byte ranges of FILE, `START:LEN` (repeatable); copies are laid out one
    /// after another at 16-byte-aligned positions from --offset.
    #[arg(long = "range", value_name = "START:LEN")]
    pub ranges: Vec<String>,
    /// Fill --bytes of extra anonymous memory with pseudo-random data instead of touching
    /// one byte per page (copy and anon modes).
    #[arg(long)]
    pub random: bool,
    /// Source element type for widen mode: f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Print `armed` and wait for a line on stdin before doing anything (so a tracer can
    /// measure exactly the work of the mode).
    #[arg(long)]
    pub go: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Writes a synthetic safetensors model of about SIZE bytes.
    WriteModel {
        file: PathBuf,
        #[arg(value_parser = parse_size)]
        size: u64,
    },
    /// Reads every present page `dupes` would search in PID, 1 MiB per call, and prints
    /// bytes, seconds and GB/s as JSON.
    Readmem { pid: i32 },
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s)
}

impl From<MethodArg> for crate::collect::residency::Method {
    fn from(m: MethodArg) -> Self {
        use crate::collect::residency::Method;
        match m {
            MethodArg::Auto => Method::Auto,
            MethodArg::Cachestat => Method::Cachestat,
            MethodArg::Mincore => Method::Mincore,
        }
    }
}
