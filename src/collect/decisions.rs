//! What a long-lived engine decided about each file processes map or hold, kept between
//! snapshots.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sample::FileKey;

/// What phase 1 kept of a process (the cache's parts), held by [`Decisions::quiet`] to know
/// them again: the same allocation is the same parts.
type Parts = Arc<dyn std::any::Any + Send + Sync>;

/// What a long-lived engine decided about each file, by (file, path seen by): see
/// [`Decisions`].
pub type Decided = Decisions<Option<Interest>>;

/// A file of interest while gathering: how to open it and how to show it.
#[derive(Debug, Clone)]
pub struct Interest {
    pub(crate) shown: String,
    /// `shown`'s bytes when they are not UTF-8.
    pub(crate) raw: Option<Vec<u8>>,
    pub(crate) open_path: PathBuf,
    pub(crate) size_bytes: Option<u64>,
    pub(crate) explicit: bool,
    pub(crate) store: bool,
    /// `open_path` was seen naming this file during this gather: `stat`ed, or listed by a
    /// walk of its directory whose every directory was unchanged (a file created, removed
    /// or renamed in one moves its mtime: [`super::walkmemo`]). Only files named by the
    /// user are; no decision kept between snapshots is.
    pub(crate) named: bool,
}

/// Decisions about the files processes map or hold, kept by a long-lived engine between
/// snapshots so that each is not taken again (a path built, a `stat` or three) at every
/// snapshot: by (file, xxh3 of the path it was seen by and whether it was seen as code),
/// with when it was taken. Most files are ruled out (shared libraries, small data files);
/// for a file of interest, what the decision found is kept too (its name on the host, its
/// size). A decision is trusted for `max_age` (the cache's maximum age): a file that grows
/// past the size of interest in place, or an inode number taken again by a new file at the
/// same path, shows within it; a file seen by a new path (a model file put there, a file
/// renamed: maps and fds show the new name) is looked at at once.
pub struct Decisions<V> {
    seen: HashMap<(FileKey, u64), (Instant, V), foldhash::fast::RandomState>,
    max_age: Duration,
    /// Moves when a decision is forgotten or taken again (never when one is first taken:
    /// that changes no earlier verdict).
    generation: u64,
    /// Processes found to map and hold nothing of interest, by the parts phase 1 kept for
    /// them and the generation (and the files named or in stores) they were judged under:
    /// while all stand, judging them again would give the same (see [`Decisions::quiet`]).
    quiet: HashMap<i32, (Parts, u64, u64), foldhash::fast::RandomState>,
}

impl<V> Default for Decisions<V> {
    /// Keeps nothing (a one-shot gather).
    fn default() -> Self {
        Decisions {
            seen: HashMap::default(),
            max_age: Duration::ZERO,
            generation: 0,
            quiet: HashMap::default(),
        }
    }
}

impl<V: Clone> Decisions<V> {
    /// For a long-lived engine's cache: decisions trusted for `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Decisions {
            max_age,
            ..Decisions::default()
        }
    }

    /// Forgets the decisions older than `max_age`, and the processes judged on parts
    /// that the cache dropped (the last holder of their parts is this).
    pub fn expire(&mut self, now: Instant) {
        let age = self.max_age;
        let before = self.seen.len();
        self.seen.retain(|_, (at, _)| now.duration_since(*at) < age);
        if self.seen.len() != before {
            self.generation += 1;
        }
        self.quiet
            .retain(|_, (parts, _, _)| Arc::strong_count(parts) > 1);
    }

    /// Whether `pid`, with these `parts` and `named` (a fingerprint of the files named and
    /// found in stores, of interest whatever the decisions), was found to map and hold
    /// nothing of interest under the decisions as they stand: its mappings and fds need
    /// not be judged again. A process's verdict rests only on the decisions about its own
    /// files, which stand until one is forgotten.
    pub fn quiet<P: Send + Sync + 'static>(&self, pid: i32, parts: &Arc<P>, named: u64) -> bool {
        self.quiet.get(&pid).is_some_and(|(p, g, n)| {
            std::ptr::addr_eq(Arc::as_ptr(p), Arc::as_ptr(parts))
                && *g == self.generation
                && *n == named
        })
    }

    /// Records [`Decisions::quiet`]'s verdict for `pid` (kept by a long-lived engine only).
    pub fn set_quiet<P: Send + Sync + 'static>(
        &mut self,
        pid: i32,
        parts: &Arc<P>,
        named: u64,
        quiet: bool,
    ) {
        if quiet && !self.max_age.is_zero() {
            let kept: Parts = Arc::clone(parts) as Parts;
            self.quiet.insert(pid, (kept, self.generation, named));
        } else {
            self.quiet.remove(&pid);
        }
    }

    /// The decision about `key` seen by the path (and code bit) hashed to `path`, taken
    /// within `max_age`.
    pub fn get(&self, key: FileKey, path: u64) -> Option<V> {
        if self.max_age.is_zero() {
            return None;
        }
        self.seen.get(&(key, path)).map(|(_, v)| v.clone())
    }

    /// Keeps a decision just made (nothing without a cache: a zero age).
    pub fn note(&mut self, key: FileKey, path: u64, v: V) {
        if !self.max_age.is_zero() && self.seen.insert((key, path), (Instant::now(), v)).is_some() {
            self.generation += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_holds_per_path_until_it_ages_and_never_without_a_cache() {
        let key = FileKey::from_dev(8, 77);
        let mut r = Decisions::new(Duration::from_millis(50));
        r.note(key, 1, Some("model"));
        r.note(key, 3, None);
        assert_eq!(r.get(key, 1), Some(Some("model")));
        assert_eq!(r.get(key, 3), Some(None));
        // Seen by another path (a model file that took the inode number): looked at.
        assert_eq!(r.get(key, 2), None);
        r.expire(Instant::now() + Duration::from_millis(60));
        assert_eq!(r.get(key, 1), None);
        // A one-shot gather keeps nothing.
        let mut none = Decisions::default();
        none.note(key, 1, ());
        assert_eq!(none.get(key, 1), None);
    }

    /// A process judged to hold nothing stays so while its parts, the decisions and the
    /// files of interest whatever the decisions stand; each one's change judges it again.
    /// Stands for phase 1's parts of a process: any value kept behind an `Arc`.
    #[derive(Default)]
    struct BasicParts(#[allow(dead_code)] Vec<u8>);

    #[test]
    fn a_quiet_process_is_judged_again_when_its_parts_a_decision_or_the_preset_files_change() {
        let key = FileKey::from_dev(8, 77);
        let mut d: Decisions<Option<()>> = Decisions::new(Duration::from_secs(60));
        let parts = Arc::new(BasicParts::default());
        let kept = Arc::clone(&parts); // the cache's entry
        d.note(key, 1, None);
        d.set_quiet(7, &parts, 5, true);
        assert!(d.quiet(7, &parts, 5));
        // A first decision about another file changes no verdict.
        d.note(FileKey::from_dev(8, 78), 1, Some(()));
        d.expire(Instant::now());
        assert!(d.quiet(7, &parts, 5));
        // Parts read again (another Arc with the same contents), or other preset files.
        assert!(!d.quiet(7, &Arc::new(BasicParts::default()), 5));
        assert!(!d.quiet(7, &parts, 6));
        assert!(!d.quiet(8, &parts, 5));
        // A decision forgotten (its file may have grown into a model since).
        d.expire(Instant::now() + Duration::from_secs(61));
        assert!(!d.quiet(7, &parts, 5));
        d.set_quiet(7, &parts, 5, true);
        assert!(d.quiet(7, &parts, 5));
        // Found holding something: no longer quiet.
        d.set_quiet(7, &parts, 5, false);
        assert!(!d.quiet(7, &parts, 5));
        // A process gone from the cache (its parts held here only) is forgotten.
        d.set_quiet(7, &parts, 5, true);
        drop((parts, kept));
        d.expire(Instant::now());
        assert!(d.quiet.is_empty());
        // A one-shot gather keeps no verdicts.
        let mut none: Decisions<()> = Decisions::default();
        let p = Arc::new(BasicParts::default());
        none.set_quiet(1, &p, 0, true);
        assert!(!none.quiet(1, &p, 0));
    }
}
