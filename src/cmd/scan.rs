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

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut warnings = Vec::new();
    let traced = args
        .trace
        .and_then(|d| super::trace::trace_window(d, &request(args), &mut warnings));
    let sample = gather::gather(&Roots::live(), &request(args), &mut warnings)?;
    let mut report = model::build(&sample);
    if args.prove {
        let proofs = super::dupes::prove(&report, &Roots::live(), &mut warnings);
        model::apply_proofs(&mut report, &proofs);
    }
    if let Some(t) = &traced {
        super::trace::apply_to_report(&mut report, t, &args.pids);
    }
    super::warn_all(&warnings);
    if args.output.json {
        render::json(out, &report)?;
    } else {
        out.write_all(render::scan::human(&report).as_bytes())?;
    }
    Ok(())
}
