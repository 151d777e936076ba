//! `twofold scan`.

use std::io::Write;

use crate::cli::ScanArgs;
use crate::collect::gather::{self, Request};
use crate::collect::Roots;
use crate::dupes::prove::ProveOptions;
use crate::{model, render};

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
    }
}

/// The proof options of a scan: `None` with `--no-prove`.
pub fn prove_options(args: &ScanArgs) -> Option<ProveOptions> {
    (!args.no_prove).then_some(ProveOptions {
        budget: Some(args.prove_budget),
        exact: args.exact,
    })
}

/// collect → byte-level proof of the candidates' copies (unless `prove` is `None`) →
/// model, on the live system; warnings go to stderr.
pub fn report(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: Option<std::time::Duration>,
) -> anyhow::Result<model::Report> {
    let roots = Roots::live();
    let mut warnings = Vec::new();
    let traced = trace.and_then(|d| super::trace::trace_window(d, req, &mut warnings));
    let mut sample = gather::gather(&roots, req, &mut warnings)?;
    if let Some(t) = &traced {
        sample.reads =
            t.io.iter()
                .map(|((pid, file), c)| crate::sample::ReadSample {
                    pid: *pid,
                    file: *file,
                    read_bytes: c.read_bytes,
                    read_calls: c.read_calls,
                    mmap_calls: c.mmap_shared + c.mmap_private,
                })
                .collect();
    }
    if let Some(opts) = prove {
        sample.proofs = crate::dupes::prove::prove(&roots, &sample, opts, &mut warnings);
    }
    let mut report = model::build(&sample);
    if let Some(t) = &traced {
        super::trace::apply_to_report(&mut report, t, &req.pids);
    }
    super::warn_all(&warnings);
    Ok(report)
}

pub fn run(args: &ScanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = report(&request(args), prove_options(args), args.trace)?;
    if args.output.json {
        render::json(out, &report)?;
    } else {
        out.write_all(crate::render::safe::terminal(&render::scan::human(&report)).as_bytes())?;
    }
    Ok(())
}
