//! `top` and `serve`: collections every interval, on a screen or for Prometheus.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::parse::*;
use super::{reword, CollectArgs, Selection};

/// The view `top` opens on.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum TopView {
    #[default]
    Files,
    Processes,
    Cgroups,
}

#[derive(Debug, Args)]
#[command(mut_args(reword(
    "no_prove",
    "Skip the byte-level proof (as `scan --no-prove`): copies are only suspected",
    None
)))]
pub struct TopArgs {
    #[command(flatten)]
    pub selection: Selection,
    /// Time between collections.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    // The help lists every view's sort columns from the field registry.
    #[arg(long, value_name = "COLUMN", help = crate::model::fields::sort::help())]
    pub sort: Option<String>,
    /// Filter to start with: a substring of names, or FIELD>VALUE (anon>1G, count>=2).
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// The view to open on.
    #[arg(long, value_enum, default_value_t)]
    pub view: TopView,
    #[command(flatten)]
    pub collect: CollectArgs,
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
    /// Trace uploads to GPUs alone (the upload probes on the CUDA driver library, without
    /// the tracepoints of --trace): exports twofold_file_device_uploaded_bytes_total and
    /// the device copies proven at upload, for less (docs/device.md, "Cost").
    #[arg(long, conflicts_with = "trace")]
    pub trace_uploads: bool,
    /// Add a pid label to the per-workload series (one series per process: high
    /// cardinality).
    #[arg(long)]
    pub per_pid: bool,
    /// TLS and basic authentication, from a node_exporter-compatible web config file
    /// (YAML: tls_server_config with cert_file and key_file; basic_auth_users, user to
    /// bcrypt hash). See docs/serve.md.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Connections open at once; beyond it the oldest idle one is closed (503 when none
    /// is idle). Default 256, at most a quarter of the soft limit of open files.
    #[arg(long = "web.max-connections", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Close a connection that sent no request for this long.
    #[arg(long = "web.idle-timeout", value_name = "DURATION", default_value = "2m", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,
    #[command(flatten)]
    pub collect: CollectArgs,
}
