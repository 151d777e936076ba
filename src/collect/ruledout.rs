//! Files found not of interest, kept by a long-lived engine between snapshots.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::sample::FileKey;

/// Files found not of interest (shared libraries, small data files: most of what
/// processes map), kept by a long-lived engine between snapshots so that each is not
/// looked at again (a path built and a `stat`) at every snapshot: by (file, xxh3 of the
/// path it was seen by), with when it was decided. A decision is trusted for `max_age`
/// (the cache's maximum age): a file that grows past the size of interest in place, or
/// an inode number taken again by a new file at the same path, shows within it; a model
/// file at a new path is looked at at once.
#[derive(Default)]
pub struct RuledOut {
    seen: HashMap<(FileKey, u64), Instant>,
    max_age: Duration,
}

impl RuledOut {
    /// Forgets the decisions older than `max_age`; a fresh engine's is empty (nothing is
    /// trusted with a zero age).
    pub fn expire(&mut self, now: Instant) {
        let age = self.max_age;
        self.seen.retain(|_, at| now.duration_since(*at) < age);
    }

    /// For a long-lived engine's cache: decisions trusted for `max_age`.
    pub fn new(max_age: Duration) -> Self {
        RuledOut {
            seen: HashMap::new(),
            max_age,
        }
    }

    /// Whether `key`, seen by the path hashed to `path`, was ruled out within `max_age`.
    pub fn holds(&self, key: FileKey, path: u64) -> bool {
        !self.max_age.is_zero() && self.seen.contains_key(&(key, path))
    }

    /// Keeps a decision just made (nothing without a cache: a zero age).
    pub fn note(&mut self, key: FileKey, path: u64) {
        if !self.max_age.is_zero() {
            self.seen.insert((key, path), Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_holds_per_path_until_it_ages_and_never_without_a_cache() {
        let key = FileKey::from_dev(8, 77);
        let mut r = RuledOut::new(Duration::from_millis(50));
        r.note(key, 1);
        assert!(r.holds(key, 1));
        // Seen by another path (a model file that took the inode number): looked at.
        assert!(!r.holds(key, 2));
        r.expire(Instant::now() + Duration::from_millis(60));
        assert!(!r.holds(key, 1));
        // A one-shot gather keeps nothing.
        let mut none = RuledOut::default();
        none.note(key, 1);
        assert!(!none.holds(key, 1));
    }
}
