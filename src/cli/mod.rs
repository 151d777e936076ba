//! The command line, defined once with clap derive: help, man page and completions all
//! come from here. One module per family of commands; the argument groups several
//! commands share ([`OutputArgs`], [`Selection`], [`CollectArgs`]) are defined here.

mod campaign;
mod internal;
mod live;
mod parse;
mod scan;
mod store;
mod trace;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Arg, Args, Parser, Subcommand, ValueEnum};

pub use campaign::{CompareArgs, DemoArgs, Experiment, PressureArgs, RunArgs, SandboxArgs};
pub use internal::{BenchArgs, BenchWhat, ChildArgs, ChildMode};
pub use live::{ServeArgs, TopArgs, TopView};
pub use parse::{MAX_COUNT, MAX_SECONDS, MIN_MEMORY_MAX};
pub use scan::{DupesArgs, FailOn, FincoreColumn, InspectArgs, ResidencyArgs, ScanArgs};
pub use store::{DumpArgs, DumpFormat, DumpWhat, RecordArgs, ReplayArgs, SnapshotArgs};
pub use trace::{ProbeArgs, ProbeBackendArg, ProbeJob, TraceArgs};

use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use parse::{parse_duration, parse_size};

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
    /// Proves private and converted copies of model files in processes' memory, tensor by
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
    /// Tensors, dtypes and alignment of model containers (safetensors, GGUF, NumPy .npy and
    /// .npz, PyTorch, ONNX).
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
    /// Prints the man page (roff) of twofold or of one command to stdout, or writes them
    /// all into a directory.
    Man(ManArgs),
    /// A test reader process (used by the demo and the tests).
    #[command(name = "__child", hide = true)]
    Child(ChildArgs),
    /// Benchmark helpers: write a synthetic safetensors model; read a process's memory
    /// with plain `pread` of /proc/PID/mem (the bandwidth baseline for `dupes`).
    #[command(name = "__bench", hide = true)]
    Bench(BenchArgs),
}

/// `twofold man [COMMAND] [--dir DIR]`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The command whose page to print (for scan, twofold-scan(1)); none: twofold(1).
    pub command: Option<String>,
    /// Write every page (twofold.1, twofold-scan.1, ...) into this directory instead.
    #[arg(long, value_name = "DIR", conflicts_with = "command")]
    pub dir: Option<PathBuf>,
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

/// What a collecting command looks at: the files named and the processes (`scan`,
/// `record`, `top`). Each command words the paths in its own help.
#[derive(Debug, Args, Clone)]
pub struct Selection {
    /// Model files or directories to include, as for `scan` (none: every model file a
    /// process holds, names or could hold a copy of, and the model stores).
    pub paths: Vec<PathBuf>,
    /// Only this process (repeatable). `scan` without FILEs searches it for the host's
    /// files of interest (those any process maps, holds or names), so a copy of a file it
    /// read and closed is found; a file no process maps or holds must be named.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,
}

/// The request of a selection: the files named (none: every model file a process holds,
/// and copies of the stored models), their holders and the candidates of the proof.
impl From<&Selection> for Request {
    fn from(s: &Selection) -> Request {
        Request {
            paths: s.paths.clone(),
            pids: s.pids.clone(),
            stores: s.paths.is_empty(),
            candidates: true,
            ..Request::default()
        }
    }
}

/// How each collection of a repeating command runs (`record`, `top`, `serve`): its
/// byte-level proof and the size that makes a file of interest. Each command may word
/// the proof flags, and the budget's default, its own way.
#[derive(Debug, Args, Clone)]
pub struct CollectArgs {
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

impl CollectArgs {
    /// The request of each collection over `selection` (`record`, `top`).
    pub fn request(&self, selection: &Selection) -> Request {
        Request {
            min_size: self.min_size,
            ..Request::from(selection)
        }
    }

    /// The proof options of each collection: `None` with `--no-prove`.
    pub fn proof(&self) -> Option<ProveOptions> {
        (!self.no_prove).then_some(ProveOptions {
            budget: Some(self.prove_budget),
            exact: false,
        })
    }
}

/// Words the shared argument `id` in one command's own help (with `default`, its own
/// default too), for `#[command(mut_args(..))]`. Unlike `mut_arg`, which moves the
/// argument last, it keeps its place: completions list arguments in that order.
fn reword(
    id: &'static str,
    help: &'static str,
    default: Option<&'static str>,
) -> impl FnMut(Arg) -> Arg {
    move |a| {
        if a.get_id().as_str() != id {
            return a;
        }
        let a = a.help(help);
        match default {
            Some(d) => a.default_value(d),
            None => a,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(args).unwrap().command
    }

    #[test]
    fn the_shared_groups_keep_each_command_s_defaults() {
        Cli::command().debug_assert();
        let Command::Record(r) = parse(&["twofold", "record", "--pid", "7", "m.gguf"]) else {
            panic!("not record")
        };
        assert_eq!(r.collect.prove_budget, Duration::from_secs(5));
        let req = r.collect.request(&r.selection);
        assert_eq!(
            (req.paths, req.pids),
            (vec![PathBuf::from("m.gguf")], vec![7])
        );
        assert!(!req.stores && req.candidates && req.min_size == 64 << 20);
        let Command::Top(t) = parse(&["twofold", "top", "--no-prove"]) else {
            panic!("not top")
        };
        assert_eq!(t.collect.prove_budget, Duration::from_secs(2));
        assert!(t.collect.proof().is_none() && Request::from(&t.selection).stores);
        let Command::Serve(s) = parse(&["twofold", "serve", "--prove-budget", "3s"]) else {
            panic!("not serve")
        };
        let proof = s.collect.proof().unwrap();
        assert_eq!(
            (proof.budget, proof.exact),
            (Some(Duration::from_secs(3)), false)
        );
    }
}
