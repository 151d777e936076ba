//! The one directory walk (`scan DIR`, `residency -r DIR`): regular files below a
//! directory, in name order, symlinked directories not followed (no loops), with one rule
//! for errors: the directory itself must be readable (else an error), anything below that
//! cannot be read is a warning and the walk goes on.

use crate::sample::{Warning, WarningKind};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Regular files below `dir`, with their metadata; warnings for what could not be read.
pub fn files(
    dir: &Path,
    warnings: &mut Vec<Warning>,
) -> anyhow::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    files_and_dirs(dir, warnings).map(|(files, _)| files)
}

/// [`files`], and the directories walked through (`dir` first) with their metadata, each
/// taken before its entries were listed.
#[allow(clippy::type_complexity)]
pub fn files_and_dirs(
    dir: &Path,
    warnings: &mut Vec<Warning>,
) -> anyhow::Result<(
    Vec<(PathBuf, std::fs::Metadata)>,
    Vec<(PathBuf, std::fs::Metadata)>,
)> {
    std::fs::read_dir(dir).with_context(|| format!("cannot read directory '{}'", dir.display()))?;
    let (mut out, mut dirs) = (Vec::new(), Vec::new());
    for entry in walkdir::WalkDir::new(dir)
        .follow_links(false)
        .sort_by_file_name()
    {
        match entry {
            Ok(e) if e.file_type().is_file() || e.file_type().is_dir() => match e.metadata() {
                Ok(m) if m.is_dir() => dirs.push((e.into_path(), m)),
                Ok(m) => out.push((e.into_path(), m)),
                Err(err) => warnings.push(skipped(e.path(), err.to_string())),
            },
            Ok(_) => {}
            Err(err) => warnings.push(skipped(
                err.path().unwrap_or(dir),
                err.io_error()
                    .map_or_else(|| err.to_string(), |io| io.to_string()),
            )),
        }
    }
    Ok((out, dirs))
}

/// A file below the directory that was skipped, and why.
fn skipped(path: &Path, why: String) -> Warning {
    Warning::new(
        WarningKind::FileSkipped,
        path.display().to_string(),
        format!("skipping '{}': {why}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn files_in_name_order_and_errors_are_warnings() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("b/c")).unwrap();
        std::fs::write(d.path().join("b/c/z.gguf"), b"x").unwrap();
        std::fs::write(d.path().join("a.bin"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path(), d.path().join("b/loop")).unwrap();
        let mut w = Vec::new();
        let got: Vec<String> = files(d.path(), &mut w)
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.strip_prefix(d.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(got, ["a.bin", "b/c/z.gguf"]);
        assert!(w.is_empty(), "{w:?}");
        assert!(files(&d.path().join("missing"), &mut w).is_err());
    }
}
