//! The paths named to a gather: files, and the model files of directories.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::Context;

use super::{raw_if_lossy, Gatherer};
use crate::collect::answer::Place;
use crate::collect::decisions::Interest;
use crate::collect::has_model_extension;
use crate::sample::{FileKey, Warning};

/// The model files a long-lived engine keeps open ([`crate::collect::heldfiles`]).
type Held<'h> = Option<&'h crate::collect::heldfiles::HeldFiles>;

impl Gatherer<'_> {
    /// The paths named, and the model files of the directories named. A path whose
    /// filesystem does not answer is an error, or, for a long-lived engine (`lenient`:
    /// it was checked when the command started), a warning and the rest goes on.
    pub(in crate::collect) fn add_explicit_paths(
        &mut self,
        lenient: bool,
        held: Held,
    ) -> anyhow::Result<()> {
        for path in self.req.paths.clone() {
            match self.add_explicit(&path, held) {
                Err(e)
                    if lenient
                        && e.chain()
                            .any(|c| c.is::<crate::collect::answer::NotAnswering>()) =>
                {
                    self.warnings.push(Warning::new(
                        crate::sample::WarningKind::FileSkipped,
                        path.display().to_string(),
                        format!("not read: {e}"),
                    ));
                }
                r => r?,
            }
        }
        Ok(())
    }

    fn add_explicit(&mut self, path: &Path, held: Held) -> anyhow::Result<()> {
        // Its directory unchanged: the same inode, `fstat`ed through the descriptor kept.
        if let Some((place, meta)) = self.walks.named(path, |k| held?.get(k)) {
            crate::input::refuse_pseudo_meta(path, "file", place, &meta)?;
            self.insert_explicit(path, &meta);
            return Ok(());
        }
        let place = Place::of(path);
        let meta = crate::collect::answer::metadata(place.clone(), path)?
            .with_context(|| format!("cannot access '{}'", path.display()))?;
        if meta.is_dir() {
            crate::input::refuse_pseudo_meta(path, "directory", place, &meta)?;
            self.walk(path)?;
        } else if meta.is_file() {
            crate::input::refuse_pseudo_meta(path, "file", place.clone(), &meta)?;
            self.walks.keep_named(path, place, &meta);
            self.insert_explicit(path, &meta);
        } else {
            return Err(crate::input::not_file_or_dir(path, &meta));
        }
        Ok(())
    }

    fn walk(&mut self, dir: &Path) -> anyhow::Result<()> {
        for (p, meta) in self.walks.files(dir, self.warnings)? {
            if has_model_extension(&p.to_string_lossy()) || meta.len() >= self.req.min_size {
                self.insert_explicit(&p, &meta);
            }
        }
        Ok(())
    }

    fn insert_explicit(&mut self, path: &Path, meta: &std::fs::Metadata) {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        self.explicit.insert(abs.clone());
        // A file named through an overlay is the file that holds its bytes, opened there
        // and shown by the name given.
        let real = crate::collect::overlay::real_here(self.procs.root(), path, meta);
        let (key, open_path) = match real {
            Some(r) => (r.key, r.path),
            None => (FileKey::from_dev(meta.dev(), meta.ino()), abs.clone()),
        };
        self.decided.insert(
            key,
            Some(Interest {
                shown: abs.display().to_string(),
                raw: raw_if_lossy(&abs),
                named: open_path == abs,
                open_path,
                size_bytes: Some(meta.len()),
                explicit: true,
                store: false,
            }),
        );
    }
}
