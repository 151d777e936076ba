//! `twofold scan`.

use std::io::Write;

use crate::cli::ScanArgs;
use crate::collect::gather::{self, Request};
use crate::collect::Roots;
use crate::{model, render};

pub fn request(args: &ScanArgs) -> Request {
    Request {
        paths: args.paths.clone(),
        pids: args.pids.clone(),
        cgroup: args.cgroup.clone(),
        min_size: args.min_size,
        all_processes: args.all,
        residency: args.method.into(),
    }
}

/// collect → model (→ byte-level proof of suspected copies when `prove`), on the live
/// system; warnings go to stderr.
pub fn report(
    req: &Request,
    prove: bool,
    trace: Option<std::time::Duration>,
) -> anyhow::Result<model::Report> {
    let roots = Roots::live();
    let mut warnings = Vec::new();
    let traced = trace.and_then(|d| super::trace::trace_window(d, req, &mut warnings));
    let sample = gather::gather(&roots, req, &mut warnings)?;
    let mut report = model::build(&sample);
    if prove {
        let proofs = super::dupes::prove(&report, &roots, &mut warnings);
        model::apply_proofs(&mut report, &proofs);
    }
    if let Some(t) = &traced {
        super::trace::apply_to_report(&mut report, t, &req.pids);
    }
    super::warn_all(&warnings);
    Ok(report)
}

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = report(&request(args), args.prove, args.trace)?;
    if args.output.json {
        render::json(out, &report)?;
    } else {
        out.write_all(render::scan::human(&report).as_bytes())?;
    }
    Ok(())
}
