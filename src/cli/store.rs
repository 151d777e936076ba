//! `record`, `replay`, `dump` and `snapshot`: recordings in a store.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse::*;
use super::{reword, CollectArgs, OutputArgs, Selection};

#[derive(Debug, Args)]
#[command(
    mut_args(reword("no_prove", "Skip the byte-level proof (as `scan --no-prove`)", None)),
    mut_args(reword("prove_budget", "Time budget of each snapshot's proof", Some("5s")))
)]
pub struct RecordArgs {
    #[command(flatten)]
    pub selection: Selection,
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
    /// Trace uploads to GPUs alone (the upload probes on the CUDA driver library, without
    /// the page-fault, syscall and page-cache tracepoints of --trace): proves device copies
    /// at upload for less (docs/device.md, "Cost"); needs root or CAP_BPF + CAP_PERFMON.
    #[arg(long, conflicts_with = "trace")]
    pub trace_uploads: bool,
    #[command(flatten)]
    pub collect: CollectArgs,
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
