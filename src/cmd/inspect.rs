//! `twofold inspect`: container → tensor-table statistics → tables or JSON.

use std::io::Write;
use std::path::Path;

use crate::cli::InspectArgs;
use crate::container::ContainerError;
use crate::model::inspect::{self, InspectReport};
use crate::model::SCHEMA_VERSION;
use crate::render;

/// Adds the path to parse errors (open errors already name it).
fn in_file(path: &Path, e: ContainerError) -> anyhow::Error {
    if e.names_path() {
        e.into()
    } else {
        anyhow::Error::new(e).context(format!("cannot read the container '{}'", path.display()))
    }
}

pub fn run(args: &InspectArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut files = Vec::with_capacity(args.files.len());
    for path in &args.files {
        crate::input::refuse_pseudo(path, "file")?;
        let (_, c) = crate::dupes::filebytes::open_container(path).map_err(|e| in_file(path, e))?;
        files.push(inspect::file(&path.display().to_string(), c));
    }
    let report = InspectReport {
        schema_version: SCHEMA_VERSION,
        files,
    };
    if args.output.json {
        render::json(out, &report)?;
    } else {
        out.write_all(crate::render::safe::terminal(&render::inspect::human(&report)).as_bytes())?;
    }
    Ok(())
}
