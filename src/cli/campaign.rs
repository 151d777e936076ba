//! `run`, `compare`, `pressure` and `demo`: campaigns in a sandbox cgroup.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse::*;
use super::{reword, OutputArgs};

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
    /// Write the results into this directory (created if missing); each command's help
    /// lists the files.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(mut_args(reword(
    "out",
    "Write into this directory (created if missing): timeline.jsonl (the samples, JSON \
     Lines), summary.json, summary.md, and the memory plot timeline.svg and timeline.png",
    None
)))]
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
#[command(mut_args(reword(
    "out",
    "Write into this directory (created if missing): comparison.json, comparison.md, \
     timeline.jsonl (every round's samples with its round and arm, JSON Lines), and the \
     plot of the peaks per round peaks.svg and peaks.png",
    None
)))]
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
#[command(mut_args(reword(
    "out",
    "Write into this directory (created if missing): pressure.json, pressure.md, \
     pressure.jsonl (the experiments' records and samples as they ran, JSON Lines), and \
     the plots readers.svg/.png and competitor.svg/.png of the experiments that ran",
    None
)))]
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
