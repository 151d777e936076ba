//! `twofold scan`.

use std::io::Write;

use crate::cli::ScanArgs;
use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use crate::engine::{self, Engine, Snapshot};
use crate::model;
use crate::sample::trace::TraceSample;

pub fn request(args: &ScanArgs) -> Request {
    Request {
        paths: args.paths.clone(),
        pids: args.pids.clone(),
        cgroup: args.cgroup.clone(),
        min_size: args.min_size,
        all_processes: args.all,
        residency: args.method.into(),
        // A bare scan (or one by pid) also looks for copies of stored models.
        stores: args.paths.is_empty(),
        candidates: true,
        gpu_pids: Vec::new(),
    }
}

/// The proof options of a scan: `None` with `--no-prove`.
pub fn prove_options(args: &ScanArgs) -> Option<ProveOptions> {
    (!args.no_prove).then_some(ProveOptions {
        budget: Some(args.prove_budget),
        exact: args.exact,
    })
}

/// One snapshot through the engine (after a traced window, when asked: the window's
/// read() ledger goes into the snapshot), and the traced sample itself.
pub fn snapshot(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: Option<std::time::Duration>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(Snapshot, Option<TraceSample>)> {
    let traced = trace.and_then(|d| super::trace::trace_window(d, req, warnings));
    let reads = traced
        .as_ref()
        .map(super::trace::reads_of)
        .unwrap_or_default();
    let snap = Engine::new(req.clone(), prove).snapshot(reads, warnings)?;
    Ok((snap, traced))
}

/// collect → byte-level proof of the candidates' copies (unless `prove` is `None`) →
/// model, on the live system; warnings go to stderr.
pub fn report(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: Option<std::time::Duration>,
) -> anyhow::Result<model::Report> {
    let mut warnings = Vec::new();
    let (snap, traced) = snapshot(req, prove, trace, &mut warnings)?;
    let mut report = engine::report(&snap, None);
    if let Some(t) = &traced {
        super::trace::apply_to_report(&mut report, t, &req.pids);
    }
    super::warn_all(&warnings);
    Ok(report)
}

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let req = request(args);
    let mut warnings = Vec::new();
    let (snap, traced) = snapshot(&req, prove_options(args), args.trace, &mut warnings)?;
    if let Some(dir) = &args.record {
        super::record::append_to(dir, &snap)?;
    }
    let mut report = engine::report(&snap, None);
    if let Some(t) = &traced {
        super::trace::apply_to_report(&mut report, t, &req.pids);
    }
    super::warn_all(&warnings);
    super::record::render_report(&report, args.output.json, out)
}
