//! The content index of the model files, built once per version of them and kept by a
//! long-running engine (`top`, `serve`, `record`) across its proofs: a 200,000-tensor
//! safetensors file is parsed and sampled once, not at every proof.
//!
//! A version is the files' (device, inode, size, mtime, ctime): a file rewritten in place
//! changes its mtime, a file replaced by rename changes its inode, so either builds anew.
//! A kept index holds each file open (to read its bytes when confirming a copy). So that
//! this never keeps a model alive that its users let go, [`IndexCache::keep_only`] drops,
//! at every snapshot, the indexes of files that left the sample, and within 5 s those of
//! files deleted (no link left), and at most [`IndexCache::MAX`] indexes are kept.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Instant;

use super::grid::Grid;
use crate::sample::FileKey;

pub use super::pointcache::{version, Version};

/// What a proof group indexed: the grid, the keys of its files in grid order, and files
/// of the same bytes searched as another (alias → original).
pub struct Indexed {
    pub grid: Grid,
    pub keys: Vec<FileKey>,
    pub aliases: Vec<(FileKey, FileKey)>,
    /// The files' byte distributions ([`super::likeness`]), read once with the index.
    pub likeness: super::likeness::Likeness,
}

#[derive(Default)]
pub struct IndexCache {
    entries: Vec<(Vec<Version>, bool, Arc<Indexed>, Instant)>,
    /// Indexes built and reused since the engine started.
    pub built: u64,
    pub reused: u64,
    /// When [`IndexCache::keep_only`] last looked for deleted files.
    links_checked: Option<Instant>,
}

/// How often [`IndexCache::keep_only`] looks for files deleted under their index: a
/// `stat` of each indexed file (200 a snapshot, every second for `record`), so a
/// deleted file's inode is kept alive at most this long after its last link went.
const LINKS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl IndexCache {
    /// Indexes kept at most (the least recently used goes first).
    pub const MAX: usize = 16;

    /// The index of exactly these file versions (built `exact` or not), if kept.
    pub fn get(&mut self, versions: &[Version], exact: bool) -> Option<Arc<Indexed>> {
        let e = self
            .entries
            .iter_mut()
            .find(|e| e.0 == versions && e.1 == exact)?;
        e.3 = Instant::now();
        self.reused += 1;
        Some(e.2.clone())
    }

    pub fn put(&mut self, versions: Vec<Version>, exact: bool, indexed: Arc<Indexed>) {
        self.built += 1;
        self.entries.retain(|e| !(e.0 == versions && e.1 == exact));
        if self.entries.len() >= Self::MAX {
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.3)
                .map(|(i, _)| i)
            {
                self.entries.remove(oldest);
            }
        }
        self.entries
            .push((versions, exact, indexed, Instant::now()));
    }

    /// Drops the indexes of files not in `files` any more, or deleted (their last link
    /// gone: the index's open file would keep the inode and its page cache alive).
    /// Deleted files are looked for every [`LINKS_EVERY`].
    pub fn keep_only(&mut self, files: &BTreeSet<FileKey>) {
        let links = self
            .links_checked
            .is_none_or(|at| at.elapsed() >= LINKS_EVERY);
        if links {
            self.links_checked = Some(Instant::now());
        }
        self.entries.retain(|(versions, _, ix, _)| {
            versions.iter().all(|v| files.contains(&v.0))
                && (!links
                    || ix
                        .grid
                        .files
                        .iter()
                        .all(|f| f.bytes.file().metadata().is_ok_and(|m| m.nlink() > 0)))
        });
    }

    /// How many indexes are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
