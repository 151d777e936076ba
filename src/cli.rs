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
    /// Runs a command inside a memory-limited cgroup and reports its peak footprint,
    /// relative to a model file, with a timeline and plots.
    Run(RunArgs),
    /// Alternating, order-rotated rounds of two commands under `run`: medians, IQR and
    /// bootstrap 95% intervals of the paired ratios.
    Compare(CompareArgs),
    /// Pressure experiments on a model file: N concurrent readers, and eviction/refault
    /// integrity.
    Pressure(PressureArgs),
    /// Writes a small safetensors model, starts a copying and a mapping reader, and
    /// diagnoses them with the scan code; removes everything afterwards.
    Demo(DemoArgs),
    /// Tensors, dtypes and alignment of model containers (safetensors, GGUF, NumPy, PyTorch).
    Inspect(InspectArgs),
    /// Live eBPF tracing: page faults, page-cache adds, evictions and refaults, read()
    /// ingestion, direct reclaim and OOM kills, per file and per process (needs root or
    /// CAP_BPF + CAP_PERFMON); --json prints JSON Lines.
    Trace(TraceArgs),
    /// Can a GPU read the model file's pages in place, and should it? Vulkan and CUDA
    /// capabilities, import tests of a read-only shared mapping, map / resident /
    /// per-use copy rates, and the placement verdict.
    Probe(ProbeArgs),
    /// A live terminal view of model memory: files with their count, processes, cgroups
    /// and findings, refreshed every --interval (or a recording, with --replay).
    Top(TopArgs),
    /// Records snapshots (what `scan` collects, with the proof) into a store every
    /// --interval, until SIGTERM or SIGINT (then it flushes and exits 0).
    Record(RecordArgs),
    /// Prints the scan view of the recorded snapshot nearest --at, as `scan` printed it
    /// then (rates from the snapshot before it in --json).
    Replay(ReplayArgs),
    /// Streams rows of recorded snapshots over a time range: JSON Lines, CSV or
    /// OpenMetrics (which `promtool tsdb create-blocks-from openmetrics` loads).
    Dump(DumpArgs),
    /// Writes a self-contained store of a time range of a recording (for a bug report);
    /// replay and dump read it with --store.
    Snapshot(SnapshotArgs),
    /// A Prometheus exporter: collects every --interval on its own thread and serves the
    /// latest exposition on GET /metrics (OpenMetrics, or text 0.0.4 when asked) and
    /// /healthz; until SIGTERM or SIGINT.
    Serve(ServeArgs),
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
    /// with plain `pread` of /proc/PID/mem (the bandwidth baseline for `dupes`).
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
    /// Model files or directories to report on, with their holders, candidates and
    /// cgroups (directories: files with a model extension or at least --min-size); none:
    /// every model file on the host.
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
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Model files or directories to include, as for `scan` (none: every model file a
    /// process holds, names or could hold a copy of, and the model stores).
    pub paths: Vec<PathBuf>,
    /// Only this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
    /// Time between snapshots.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    /// The store (default: /var/lib/twofold/store as root, else
    /// $XDG_DATA_HOME/twofold/store).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Delete day shards older than this (e.g. 7d, 48h).
    #[arg(long, value_name = "AGE", default_value = "7d", value_parser = parse_age)]
    pub retain: Duration,
    /// Delete the oldest day shards while the store is larger than this.
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = parse_size)]
    pub max_size: u64,
    /// Stop after this many snapshots (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Keep eBPF tracing on and record the read() ledger in every snapshot (which process
    /// read which file, even after it closed it); needs root or CAP_BPF + CAP_PERFMON.
    #[arg(long)]
    pub trace: bool,
    /// Skip the byte-level proof (as `scan --no-prove`).
    #[arg(long)]
    pub no_prove: bool,
    /// Time budget of each snapshot's proof.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub prove_budget: Duration,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
}

/// The view `top` opens on.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum TopView {
    #[default]
    Files,
    Processes,
    Cgroups,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Model files or directories to include, as for `scan` (none: every model file a
    /// process holds, names or could hold a copy of, and the model stores).
    pub paths: Vec<PathBuf>,
    /// Only this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
    /// Time between collections.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    /// Sort column to start with (count, size, cache, cow, private, suspected, resident,
    /// holders, path; rss, anon, file, pss, growth, files, pid, comm; usage, limit, oom).
    #[arg(long, value_name = "COLUMN")]
    pub sort: Option<String>,
    /// Filter to start with: a substring of names, or FIELD>VALUE (anon>1G, count>=2).
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// The view to open on.
    #[arg(long, value_enum, default_value_t)]
    pub view: TopView,
    /// Skip the byte-level proof (as `scan --no-prove`): copies are only suspected.
    #[arg(long)]
    pub no_prove: bool,
    /// Time budget of each collection's proof.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub prove_budget: Duration,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
    /// Show a recording instead of the live system: the store DIR (`record`, `scan
    /// --record`); `[` and `]` step through its snapshots.
    #[arg(long, value_name = "STORE")]
    pub replay: Option<PathBuf>,
    /// With --replay: the snapshot nearest TIME (as for `replay --at`).
    #[arg(long, value_name = "TIME", default_value = "now", requires = "replay")]
    pub at: String,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; the exposition names the host's model
    /// files and cgroups).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Time between collections; scrapes serve the latest one.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    /// Files matching this glob are of interest too, besides the model files processes
    /// hold (repeatable; expanded at every collection).
    #[arg(long = "model-glob", value_name = "GLOB")]
    pub model_globs: Vec<String>,
    /// Export at most N files one by one (those holding the most bytes); the rest are
    /// summed into file_id="other".
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub max_files: usize,
    /// Attach the eBPF programs of `twofold trace` (root) and export per-file counters
    /// since the exporter started: page faults, page-cache bytes added and evicted,
    /// refaults, read() bytes.
    #[arg(long)]
    pub trace: bool,
    /// Add a pid label to the per-workload series (one series per process: high
    /// cardinality).
    #[arg(long)]
    pub per_pid: bool,
    /// Skip the byte-level proof (copies are then only suspected).
    #[arg(long)]
    pub no_prove: bool,
    /// Time budget of each collection's proof.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub prove_budget: Duration,
    /// Files at least this large are of interest whatever their extension.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub min_size: u64,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// When: RFC 3339, an epoch in seconds, 'now', '10m ago', 'yesterday 03:12' (UTC).
    #[arg(long, value_name = "TIME", default_value = "now")]
    pub at: String,
    /// The store (default as for `record`).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DumpWhat {
    Files,
    Processes,
    Cgroups,
    /// eBPF counters of snapshots recorded with `record --trace`: per file and per
    /// process, totals since attach and rates since the snapshot before.
    Trace,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DumpFormat {
    Json,
    Csv,
    Openmetrics,
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Start of the range (TIME as for replay --at).
    #[arg(long, value_name = "TIME", default_value = "1d ago")]
    pub from: String,
    /// End of the range, included.
    #[arg(long, value_name = "TIME", default_value = "now")]
    pub to: String,
    #[arg(long, value_enum, default_value = "files")]
    pub what: DumpWhat,
    #[arg(long, value_enum, default_value = "json")]
    pub format: DumpFormat,
    /// Per snapshot, only the N largest rows (by held bytes, RSS or usage).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// The store (default as for `record`).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[arg(long, value_name = "TIME", default_value = "1h ago")]
    pub from: String,
    #[arg(long, value_name = "TIME", default_value = "now")]
    pub to: String,
    /// The new store to write (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The store to read (default as for `record`).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
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

/// Sandbox settings shared by the campaigns.
#[derive(Debug, Args, Clone)]
pub struct SandboxArgs {
    /// Memory limit of the campaign's cgroup (default: a quarter of MemAvailable). Refused
    /// above MemAvailable minus a margin.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_max)]
    pub memory_max: Option<u64>,
    /// Sampling interval in milliseconds (1 to 60000).
    #[arg(long, value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub interval_ms: u64,
    /// Write the timeline (JSON Lines), the summary (JSON, Markdown) and plots (SVG, PNG)
    /// into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The model file the command loads (for ratios and residency).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Kill the command after this many seconds (or a duration: 500ms, 2m; at most 7 days).
    #[arg(long, value_name = "SECONDS", value_parser = parse_positive_duration)]
    pub timeout: Option<Duration>,
    /// Also sample the residency of this file (repeatable).
    #[arg(long, value_name = "FILE")]
    pub watch: Vec<PathBuf>,
    /// Keep the model's page cache as it is. By default the model's pages are evicted
    /// (whole-file POSIX_FADV_DONTNEED) before each round, unless a process maps the file,
    /// so the load is charged to the sandbox from a cold cache.
    #[arg(long, requires = "model")]
    pub warm: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// The command, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Rounds (each runs both commands, order alternating).
    #[arg(long, default_value_t = 5, value_parser = parse_count)]
    pub rounds: usize,
    /// The model file both commands load (for ratios and residency).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Keep the model's page cache as it is. By default the model's pages are evicted
    /// (whole-file POSIX_FADV_DONTNEED) before each round, unless a process maps the file,
    /// so the load is charged to the sandbox from a cold cache.
    #[arg(long, requires = "model")]
    pub warm: bool,
    /// Kill each command after this many seconds (or a duration: 500ms, 2m; at most 7 days).
    #[arg(long, value_name = "SECONDS", value_parser = parse_positive_duration)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// `CMD_A... ::: CMD_B...`, after `--`.
    #[arg(last = true, required = true)]
    pub commands: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Experiment {
    /// N concurrent readers, copy and mmap arms.
    Readers,
    /// Checksums per 2 MiB chunk, full eviction, refault through a mapping, re-check.
    Integrity,
    /// Mapped readers against a growing anonymous competitor (shared and private arms).
    Competitor,
}

#[derive(Debug, Args)]
pub struct PressureArgs {
    /// The model file (opened read-only, never written).
    pub file: PathBuf,
    /// Experiments to run (repeatable; default all).
    #[arg(long = "experiment", value_enum)]
    pub experiments: Vec<Experiment>,
    /// Reader counts for the readers experiment.
    #[arg(long, value_delimiter = ',', default_value = "1,6,10", value_parser = parse_count)]
    pub readers: Vec<usize>,
    /// Eviction/refault cycles for the integrity experiment.
    #[arg(long, default_value_t = 3, value_parser = parse_count)]
    pub cycles: usize,
    /// Competitor: final size as a fraction of the limit, in (0, 1].
    #[arg(long, default_value_t = 0.9, value_parser = parse_fraction)]
    pub competitor_fraction: f64,
    /// Competitor: number of growth steps.
    #[arg(long, default_value_t = 4, value_parser = parse_count)]
    pub competitor_steps: usize,
    /// Competitor: seconds per step (and of warm-up); at most 7 days.
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive_seconds)]
    pub competitor_step_seconds: f64,
    /// Competitor: keep touching its pages (else it stays idle once allocated).
    #[arg(long)]
    pub competitor_active: bool,
    /// Competitor: mapped readers touching the file every pass.
    #[arg(long, default_value_t = 2, value_parser = parse_count)]
    pub map_readers: usize,
    /// Test only: compare against the checksums of this file instead of FILE's own.
    #[arg(long, hide = true, value_name = "FILE")]
    pub reference: Option<PathBuf>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
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
    // With --json: JSON Lines, one `{"schema_version", "type", "data"}` object per report.
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
    /// to map (in [0, 1)).
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
    /// mmap read-only (MAP_SHARED, or MAP_PRIVATE with --private) and read every page
    /// over and over, appending each pass's time to --stats.
    MapLoop,
    /// read() the file into a heap buffer, copy it to CUDA device --gpu (cuMemAlloc +
    /// cuMemcpyHtoD), read it back and check it identical, and leave an attestation of
    /// the proven device copy (see `collect::gpu`) until it exits. --free-host frees the
    /// heap buffer after the upload.
    CudaLoad,
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
    /// Exit this many milliseconds after `ready` instead of waiting for stdin to close
    /// (a loader that runs to completion, for `twofold run`).
    #[arg(long, value_name = "MS")]
    pub exit_after_ms: Option<u64>,
    /// map-loop: map MAP_PRIVATE instead of MAP_SHARED.
    #[arg(long)]
    pub private: bool,
    /// copy/widen: close the file after reading it (as `np.load`, `torch.load` and
    /// llama.cpp `--load-mode none` do), so only the copy is left.
    #[arg(long)]
    pub close: bool,
    /// cuda-load: CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: i32,
    /// cuda-load: free the host buffer once the device copy is made.
    #[arg(long)]
    pub free_host: bool,
    /// map-loop: file to append `<seconds since start> <pass milliseconds>` lines to.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// anon: keep touching every page after `ready` (an active competitor).
    #[arg(long)]
    pub touch_loop: bool,
    /// copy: after `ready`, touch new anonymous memory every 50 ms, 2 MiB apart (memory
    /// that keeps changing, as a serving runtime's), and zero the copy on each line read
    /// from stdin (the copy is gone, the memory stays).
    #[arg(long)]
    pub drift: bool,
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

/// An age such as 7d, 48h or 30m (up to 10 years).
fn parse_age(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (n, mult) = match t.strip_suffix('d') {
        Some(n) => (n, 86_400.0),
        None => match t.strip_suffix('h') {
            Some(n) => (n, 3600.0),
            None => (t.strip_suffix('m').unwrap_or(t), 60.0),
        },
    };
    let v: f64 = n
        .parse()
        .map_err(|_| format!("'{s}' is not an age (e.g. 7d, 48h, 30m)"))?;
    let secs = v * mult;
    if !secs.is_finite() || secs <= 0.0 || secs > 3650.0 * 86_400.0 {
        return Err(format!(
            "age '{s}' is out of range (above 0, at most 3650d)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Longest duration any flag takes (7 days): beyond it, deadlines are absurd and
/// `Instant + Duration` could overflow.
pub const MAX_SECONDS: u64 = crate::units::MAX_DURATION_SECS as u64;

/// Smallest `--memory-max`: below it no loader even starts.
pub const MIN_MEMORY_MAX: u64 = 16 << 20;

/// Most of anything counted (readers, cycles, rounds, steps).
pub const MAX_COUNT: usize = 10_000;

/// A duration above zero (and, as every duration, at most [`MAX_SECONDS`]).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("'{s}' must be more than zero"));
    }
    Ok(d)
}

/// Seconds as a float, validated like [`parse_positive_duration`].
fn parse_positive_seconds(s: &str) -> Result<f64, String> {
    parse_positive_duration(s).map(|d| d.as_secs_f64())
}

/// A count from 1 to [`MAX_COUNT`].
fn parse_count(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))?;
    if n == 0 || n > MAX_COUNT {
        return Err(format!("'{s}' is not between 1 and {MAX_COUNT}"));
    }
    Ok(n)
}

/// A fraction in (0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!("'{s}' is not a fraction in (0, 1]"));
    }
    Ok(f)
}

/// A tolerance band in [0, 1).
fn parse_band(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..1.0).contains(&f) {
        return Err(format!("'{s}' is not a fraction in [0, 1)"));
    }
    Ok(f)
}

/// A size of at least one page (4 KiB).
fn parse_page_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < 4096 {
        return Err(format!("'{s}' is less than one page (4 KiB)"));
    }
    Ok(v)
}

/// A memory limit of at least [`MIN_MEMORY_MAX`] (checked against MemAvailable when the
/// campaign starts).
fn parse_memory_max(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < MIN_MEMORY_MAX {
        return Err(format!(
            "'{s}' is less than the smallest limit, {}",
            crate::units::iec(MIN_MEMORY_MAX)
        ));
    }
    Ok(v)
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
