//! The content index of the model files, built once per version of them and kept by a
//! long-running engine (`top`, `serve`, `record`) across its proofs: a 200,000-tensor
//! safetensors file is parsed and sampled once, not at every proof.
//!
//! A version is the files' (device, inode, size, mtime, ctime): a file rewritten in place
//! changes its mtime, a file replaced by rename changes its inode, so either builds anew.
//! A kept index holds each file open (to read its bytes when confirming a copy). So that
//! this never keeps a model alive that its users let go, [`IndexCache::keep_only`] drops,
//! at every snapshot, the indexes of files that left the sample, and within 5 s those of
//! files deleted (no link left), and at most [`IndexCache::MAX`] indexes are kept, taking
//! at most [`IndexCache::MAX_BYTES`] and holding at most an eighth of the soft
//! `RLIMIT_NOFILE` descriptors, the least recently used going first (the one just built
//! always stays). A host whose proofs need many indexes in turn (200 idle processes that
//! each map a file of their own, searched again each minute, beside the groups of the
//! readers of all 200 files) keeps them all: a smaller count made each minute's searches
//! build the large ones again (0.3 s of a core a minute on `bench/host.sh`).

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

/// What keeping an index costs: its table's bytes and its files' descriptors (each file
/// open once, and once more with `O_DIRECT`).
fn cost(ix: &Indexed) -> (u64, usize) {
    (ix.grid.table_bytes(), ix.grid.files.len() * 2)
}

/// Descriptors the kept indexes may hold: an eighth of the soft `RLIMIT_NOFILE` (`statm`
/// and `io` of the processes take three quarters).
fn fd_budget() -> usize {
    crate::collect::statfiles::soft_limit() / 8
}

impl IndexCache {
    /// Indexes kept at most (the least recently used goes first)...
    pub const MAX: usize = 512;
    /// ...and bytes of their tables.
    pub const MAX_BYTES: u64 = 256 << 20;

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
        self.entries
            .push((versions, exact, indexed, Instant::now()));
        self.fit(Self::MAX, Self::MAX_BYTES, fd_budget());
    }

    /// Drops the least recently used indexes until at most `max` are kept, taking at most
    /// `bytes` and `fds`; the newest stays whatever it costs.
    fn fit(&mut self, max: usize, bytes: u64, fds: usize) {
        let costs: Vec<(Instant, u64, usize)> = self
            .entries
            .iter()
            .map(|e| {
                let (b, f) = cost(&e.2);
                (e.3, b, f)
            })
            .collect();
        let drop = to_drop(&costs, max, bytes, fds);
        let mut i = 0;
        self.entries.retain(|_| {
            i += 1;
            !drop.contains(&(i - 1))
        });
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

/// Which entries (last used, bytes, descriptors) go, least recently used first, so that at
/// most `max` stay within `bytes` and `fds`; the last one (just built) always stays.
fn to_drop(costs: &[(Instant, u64, usize)], max: usize, bytes: u64, fds: usize) -> Vec<usize> {
    let Some(newest) = costs.len().checked_sub(1) else {
        return Vec::new();
    };
    let mut order: Vec<usize> = (0..newest).collect();
    order.sort_by_key(|&i| costs[i].0);
    let (mut n, mut b, mut f) = costs.iter().fold((0usize, 0u64, 0usize), |(n, b, f), c| {
        (n + 1, b + c.1, f + c.2)
    });
    let mut out = Vec::new();
    for i in order {
        if n <= max && b <= bytes && f <= fds {
            break;
        }
        n -= 1;
        b -= costs[i].1;
        f -= costs[i].2;
        out.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The least recently used go first, until count, bytes and descriptors all fit; the
    /// newest stays even alone over budget.
    #[test]
    fn the_least_recently_used_go_until_everything_fits() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Used at 5, 1, 3; the last just built.
        let costs = [
            (at(5), 10, 2),
            (at(1), 10, 2),
            (at(3), 10, 2),
            (at(6), 10, 2),
        ];
        assert!(to_drop(&costs, 4, 40, 8).is_empty());
        assert_eq!(to_drop(&costs, 3, 40, 8), [1]);
        assert_eq!(to_drop(&costs, 4, 25, 8), [1, 2]);
        assert_eq!(to_drop(&costs, 4, 40, 5), [1, 2]);
        // Over every budget alone: only it stays.
        let big = [(at(1), 10, 2), (at(2), 100, 50)];
        assert_eq!(to_drop(&big, 4, 20, 8), [0]);
        assert!(to_drop(&[], 1, 0, 0).is_empty());
    }
}
