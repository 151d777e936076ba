//! What a long-lived engine decided about each file processes map or hold, kept between
//! snapshots.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sample::FileKey;

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
}

impl<V> Default for Decisions<V> {
    /// Keeps nothing (a one-shot gather).
    fn default() -> Self {
        Decisions {
            seen: HashMap::default(),
            max_age: Duration::ZERO,
        }
    }
}

impl<V: Clone> Decisions<V> {
    /// For a long-lived engine's cache: decisions trusted for `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Decisions {
            seen: HashMap::default(),
            max_age,
        }
    }

    /// Forgets the decisions older than `max_age`.
    pub fn expire(&mut self, now: Instant) {
        let age = self.max_age;
        self.seen.retain(|_, (at, _)| now.duration_since(*at) < age);
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
        if !self.max_age.is_zero() {
            self.seen.insert((key, path), (Instant::now(), v));
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
}
