//! `twofold scan`.

use std::io::Write;

use crate::cli::ScanArgs;
use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use crate::engine::{self, Engine, Snapshot};
use crate::model;

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

/// One snapshot through the engine; with `trace`, the eBPF counters of a traced window
/// of that length go into it (a warning, and none, when tracing is impossible).
pub fn snapshot(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: Option<std::time::Duration>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Snapshot> {
    let mut engine = Engine::new(req.clone(), prove);
    if let Some(d) = trace {
        match engine.trace_once() {
            Ok(()) => {
                // Progress, on stderr: also tells a caller when the window starts.
                eprintln!("twofold: tracing for {:.1} s", d.as_secs_f64());
                std::thread::sleep(d);
            }
            Err(e) => warnings.push(format!("--trace: {e}; the scan goes on without it")),
        }
    }
    engine.snapshot(warnings)
}

/// collect → byte-level proof of the candidates' copies (unless `prove` is `None`) →
/// model, on the live system; warnings go to stderr.
pub fn report(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: Option<std::time::Duration>,
) -> anyhow::Result<model::Report> {
    let mut warnings = Vec::new();
    let snap = snapshot(req, prove, trace, &mut warnings)?;
    let report = engine::report(&snap, None);
    super::warn_all(&warnings);
    Ok(report)
}

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let req = request(args);
    let mut warnings = Vec::new();
    let snap = snapshot(&req, prove_options(args), args.trace, &mut warnings)?;
    if let Some(dir) = &args.record {
        super::record::append_to(dir, &snap)?;
    }
    let report = engine::report(&snap, None);
    super::warn_all(&warnings);
    super::record::render_report(&report, args.output.json, out)
}
