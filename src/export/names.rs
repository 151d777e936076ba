//! One path per inode for the exposition, stable across collections.
//!
//! A file can have several names at once (a hard link, a symlink given to `--model-glob`,
//! the name another mount namespace gives it) and the name a report shows first depends on
//! which process was read first. Exported as such, `twofold_file_info{path}` would change
//! from one collection to the next, and any join on `file_id` that carries `path` would
//! meet two series. The rule ([`Canonical::apply`]):
//!
//! 1. The names: the report's path and every other name processes gave the file
//!    (`/proc/PID/maps` and fd links: resolved by the kernel), each resolved again
//!    (`realpath`, so a symlink given by the user becomes the path it points to) and kept
//!    only while it still names this inode.
//! 2. The first time a file is exported, its path is the bytewise smallest of those names.
//! 3. From then on that path stays, for as long as it still names the inode, even when the
//!    process that opened the file by it has exited; when it no longer does (renamed,
//!    unlinked), rule 2 picks again.
//! 4. Every other name is an alias: `twofold_file_alias_info{file_id, path}`, never a
//!    second value of `twofold_file_info`'s `path`.
//!
//! The resolving is given by the caller (`resolve`), so this stays pure and testable.

use std::collections::BTreeMap;

use crate::model::Report;
use crate::sample::FileKey;

/// The paths exported so far, by file.
#[derive(Debug, Default, Clone)]
pub struct Canonical {
    chosen: BTreeMap<FileKey, String>,
}

impl Canonical {
    /// Rewrites each file's `path` to its canonical name and `seen_as` to its aliases.
    /// `resolve(name, key)`: the name resolved (no symlink left) when it names the inode
    /// `key` now, `None` otherwise.
    pub fn apply(&mut self, r: &mut Report, resolve: impl Fn(&str, FileKey) -> Option<String>) {
        let mut keep = BTreeMap::new();
        for f in &mut r.files {
            if f.deleted {
                // No name left that names it: shown as the report says, no aliases.
                continue;
            }
            let given: Vec<String> = std::iter::once(f.path.clone())
                .chain(f.seen_as.iter().cloned())
                .collect();
            let resolved: Vec<String> = given.iter().filter_map(|n| resolve(n, f.key)).collect();
            // A name a given one resolved to just now resolves to itself (no link left):
            // only a chosen name no given one leads to is resolved again.
            let sticky = self
                .chosen
                .get(&f.key)
                .filter(|p| {
                    resolved.contains(p) || resolve(p, f.key).as_deref() == Some(p.as_str())
                })
                .cloned();
            let Some(path) = sticky.or_else(|| resolved.iter().min().cloned()) else {
                continue;
            };
            let mut aliases: Vec<String> = given
                .into_iter()
                .chain(resolved)
                .filter(|n| *n != path)
                .collect();
            aliases.sort();
            aliases.dedup();
            f.path_bytes = None;
            f.path = path.clone();
            f.seen_as = aliases;
            keep.insert(f.key, path);
        }
        // Files no longer exported are forgotten: they pick again if they come back.
        self.chosen = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(path: &str, seen_as: &[&str]) -> Report {
        let sample = crate::sample::Sample {
            files: vec![crate::sample::FileSample {
                key: FileKey {
                    major: 8,
                    minor: 1,
                    inode: 7,
                },
                path: path.into(),
                path_bytes: None,
                size_bytes: Some(4096),
                residency: None,
                residency_error: None,
                unopened: None,
                explicit: false,
                store: false,
                deleted: false,
                now_at_path: None,
                seen_as: seen_as.iter().map(|s| s.to_string()).collect(),
                same_bytes: Vec::new(),
            }],
            ..Default::default()
        };
        crate::model::from_sample(&sample)
    }

    /// `/m/link` is a symlink to `/m/real`; `/m/hard` a hard link; `/m/gone` no longer names it.
    fn resolve(n: &str, _: FileKey) -> Option<String> {
        match n {
            "/m/link" | "/m/real" => Some("/m/real".into()),
            "/m/hard" => Some("/m/hard".into()),
            _ => None,
        }
    }

    #[test]
    fn smallest_resolved_name_then_sticky() {
        let mut c = Canonical::default();
        let mut r = report("/m/real", &["/m/hard"]);
        c.apply(&mut r, resolve);
        assert_eq!(r.files[0].path, "/m/hard");
        assert_eq!(r.files[0].seen_as, ["/m/real"]);
        // The process that used /m/hard exited: the path stays while it names the inode.
        let mut r = report("/m/link", &["/m/real"]);
        c.apply(&mut r, resolve);
        assert_eq!(r.files[0].path, "/m/hard");
        assert_eq!(r.files[0].seen_as, ["/m/link", "/m/real"]);
    }

    #[test]
    fn a_name_that_no_longer_names_it_is_replaced() {
        let mut c = Canonical::default();
        let mut r = report("/m/gone", &["/m/real"]);
        c.apply(&mut r, |n, k| match n {
            "/m/gone" => Some("/m/gone".into()),
            _ => resolve(n, k),
        });
        assert_eq!(r.files[0].path, "/m/gone");
        let mut r = report("/m/gone", &["/m/real"]);
        c.apply(&mut r, resolve);
        assert_eq!(r.files[0].path, "/m/real");
        assert_eq!(r.files[0].seen_as, ["/m/gone"]);
    }

    #[test]
    fn a_symlink_given_alone_resolves() {
        let mut c = Canonical::default();
        let mut r = report("/m/link", &[]);
        c.apply(&mut r, resolve);
        assert_eq!(r.files[0].path, "/m/real");
        assert_eq!(r.files[0].seen_as, ["/m/link"]);
    }
}
