//! `trace` and `probe`: eBPF counters and GPU placement.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::parse::*;
use super::{reword, OutputArgs};

#[derive(Debug, Args)]
#[command(mut_args(reword(
    "json",
    "Print JSON Lines: one {\"schema_version\", \"type\", \"data\"} object per record \
     (attached, each interval, the summary); warnings go to stderr",
    None
)))]
pub struct TraceArgs {
    /// Only this process (repeatable); its counters are kept however many others run.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
    /// A file (or directory of model files) of interest (repeatable); only these files
    /// are listed. Default: the model files processes hold now, and the busiest others.
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Time between reports.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    /// Stop after this long and print a summary (default: until interrupted).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// At most this many other files and processes per report.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum ProbeBackendArg {
    /// Every backend whose driver is present.
    #[default]
    All,
    Vulkan,
    Cuda,
    /// A CPU stand-in with fixed rates (for tests).
    #[value(hide = true)]
    Fake,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ProbeArgs {
    /// Model file to probe (default: a generated probe file of --size, removed
    /// afterwards).
    pub file: Option<PathBuf>,
    /// Only list devices and their capabilities (fast; needs no file).
    #[arg(long)]
    pub caps: bool,
    /// Which driver stacks to probe.
    #[arg(long, value_enum, default_value_t)]
    pub backend: ProbeBackendArg,
    /// Vulkan device index (default: the first GPU with host-pointer import).
    #[arg(long, value_name = "INDEX")]
    pub vulkan_device: Option<usize>,
    /// CUDA device ordinal.
    #[arg(long, value_name = "ORDINAL", default_value_t = 0)]
    pub cuda_device: usize,
    /// Bytes every pass reads from the start of the file (default: the whole file;
    /// rounded down to 4 KiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_page_size)]
    pub working_set: Option<u64>,
    /// Size of the generated probe file when no FILE is given.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_page_size)]
    pub size: u64,
    /// Directory for the generated probe file (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Timed passes per arm and process (their median is the process's rate).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub passes: u32,
    /// Warm-up passes per arm and process, discarded.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub warmup: u32,
    /// Probe processes per backend; the arm order rotates from one to the next.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// Seconds an import attempt may take before its process is killed and reported as
    /// a hang; a set of arms gets this much for its setup and for every round of passes.
    #[arg(long, value_name = "SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    pub timeout: u64,
    /// Import attempts spent bisecting the largest single import after one fails.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub ceiling_steps: u32,
    /// Bind at most this many bytes per descriptor (default: maxStorageBufferRange; at
    /// least 4 KiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_page_size)]
    pub range_limit: Option<u64>,
    /// Bytes staged per copy in the per-use copy arm (at least 4 KiB).
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_page_size)]
    pub chunk: u64,
    /// Endpoints whose path times differ by at most this fraction are a tie, resolved
    /// to map (in (0, 1)).
    #[arg(long, default_value_t = crate::model::probe::TIE_BAND, value_parser = parse_band)]
    pub tie_band: f64,
    /// Skip the import tests and the ceiling search.
    #[arg(long)]
    pub no_import: bool,
    /// Print a report saved with `--json` (from another machine, say) instead of
    /// probing.
    #[arg(long, value_name = "JSON")]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(subcommand)]
    pub job: Option<ProbeJob>,
}

#[derive(Debug, Subcommand)]
pub enum ProbeJob {
    /// Runs one probe job (JSON) and prints its result: the child side of `probe`.
    #[command(name = "__job", hide = true)]
    Job { json: String },
}
