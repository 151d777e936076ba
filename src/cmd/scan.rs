//! `twofold scan`.

use std::io::Write;

use crate::cli::ScanArgs;
use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use crate::engine;
use crate::model::gate::{self, Condition};

use super::common;

pub fn request(args: &ScanArgs) -> Request {
    let named = !args.selection.paths.is_empty();
    Request {
        cgroup: args.cgroup.clone(),
        min_size: args.min_size,
        all_processes: args.all,
        residency: args.method.into(),
        // `scan FILE...` is about those files; `--all` keeps the whole host. A bare scan
        // (or one by pid) also looks for copies of stored models (the selection's default).
        only_paths: named && !args.all,
        host_files: !named,
        ..Request::from(&args.selection)
    }
}

/// The proof options of a scan: `None` with `--no-prove`.
pub fn prove_options(args: &ScanArgs) -> Option<ProveOptions> {
    (!args.no_prove).then_some(ProveOptions {
        budget: Some(args.prove_budget),
        exact: args.exact,
    })
}

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let req = request(args);
    let mut warnings = Vec::new();
    let window = match (args.trace, args.trace_uploads) {
        (Some(d), _) => common::TraceWindow::All(d),
        (None, Some(d)) => common::TraceWindow::Uploads(d),
        (None, None) => common::TraceWindow::Off,
    };
    let snap = common::snapshot(&req, prove_options(args), window, &mut warnings)?;
    if let Some(dir) = &args.record {
        common::append_to(dir, &snap)?;
    }
    let report = engine::report(&snap, None);
    super::warn_all(&warnings);
    common::render_report(&report, args.output.json, out)?;
    let conditions: Vec<Condition> = args.fail_on.iter().map(|&c| c.into()).collect();
    let met = gate::check(&report, &conditions);
    if met.is_empty() {
        return Ok(());
    }
    out.flush()?;
    Err(super::ConditionMet(
        met.iter()
            .map(|m| format!("--fail-on {}: '{}': {}", m.condition.name(), m.path, m.why))
            .collect(),
    )
    .into())
}
