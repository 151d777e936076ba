//! `twofold dupes`: byte-level proof of private and converted copies ([`crate::dupes::search`]).

use std::io::Write;

use crate::cli::DupesArgs;
use crate::collect::Roots;
use crate::dupes::search::{search, SearchRequest};
use crate::render;

pub fn run(args: &DupesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let req = SearchRequest {
        pids: args.pids.clone(),
        files: args.files.clone(),
        align: args.align,
        widen: !args.no_widen,
    };
    let mut warnings = Vec::new();
    let r = search(&req, &Roots::live(), &mut warnings);
    super::warn_all(&warnings);
    let r = r?;
    for p in &r.processes {
        if let Some(e) = &p.error {
            super::warn_all(&[format!("pid {} not searched: {e}", p.pid)]);
        }
    }
    if args.output.json {
        render::json(out, &r)?;
    } else {
        out.write_all(crate::render::safe::terminal(&render::dupes::human(&r)).as_bytes())?;
    }
    Ok(())
}
