//! What each model file looked like over the session, for the drill-down's sparklines: a
//! bounded ring per file key of residency (per mille of the file's pages), refaults per
//! second (from the trace, when tracing gives them) and held bytes (page cache + CoW +
//! proven private copies). Pure: fed one report at a time by [`History::record`].

use std::collections::{BTreeMap, VecDeque};

use crate::model::{FileModel, Report};
use crate::sample::FileKey;

/// Points kept per file (two minutes at the default interval of 1 s, four at 2 s).
pub const RING: usize = 120;

/// A bounded ring of optional values (`None`: unknown at that point).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ring {
    values: VecDeque<Option<u64>>,
}

impl Ring {
    pub fn push(&mut self, v: Option<u64>) {
        if self.values.len() == RING {
            self.values.pop_front();
        }
        self.values.push_back(v);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The newest value, if known.
    pub fn last(&self) -> Option<u64> {
        self.values.back().copied().flatten()
    }

    /// Whether any point is known.
    pub fn any_known(&self) -> bool {
        self.values.iter().any(Option::is_some)
    }

    pub fn values(&self) -> impl Iterator<Item = Option<u64>> + '_ {
        self.values.iter().copied()
    }

    /// Largest known value.
    pub fn max(&self) -> Option<u64> {
        self.values.iter().flatten().copied().max()
    }
}

/// One file's rings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileHistory {
    /// Resident fraction of the file's pages, per mille.
    pub residency_permille: Ring,
    /// Refaulted pages per second (eBPF tracing), rounded.
    pub refaults_per_sec: Ring,
    /// Bytes of the file held in memory: page cache + CoW + proven private copies.
    pub held_bytes: Ring,
}

/// Every file's history; files no longer in the report are dropped (bounded memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub files: BTreeMap<FileKey, FileHistory>,
    /// `at_unix_ns` of the last recorded report (a report is recorded once).
    last_at: Option<u64>,
}

/// Refaulted pages per second of the file, from the report's trace.
pub fn refaults_per_sec(r: &Report, f: &FileModel) -> Option<f64> {
    r.trace
        .as_ref()?
        .files
        .iter()
        .find(|t| t.key == f.key)?
        .refault_pages_per_sec
}

impl History {
    /// Adds one point per file of `r` (once per report: the same report twice adds nothing).
    pub fn record(&mut self, r: &Report) {
        if r.at_unix_ns.is_some() && r.at_unix_ns == self.last_at {
            return;
        }
        self.last_at = r.at_unix_ns;
        self.files
            .retain(|k, _| r.files.iter().any(|f| f.key == *k));
        for f in &r.files {
            let h = self.files.entry(f.key).or_default();
            h.residency_permille
                .push(f.resident_fraction.map(|v| (v * 1000.0).round() as u64));
            h.refaults_per_sec
                .push(refaults_per_sec(r, f).map(|v| v.round().max(0.0) as u64));
            h.held_bytes.push(f.held_bytes());
        }
    }

    pub fn of(&self, key: FileKey) -> Option<&FileHistory> {
        self.files.get(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;

    #[test]
    fn rings_are_bounded_and_keep_unknown_apart() {
        let mut r = fixture::report();
        let mut h = History::default();
        for i in 0..(RING as u64 + 5) {
            r.at_unix_ns = Some(i);
            r.files[0].resident_bytes = Some(i);
            h.record(&r);
        }
        let llama = h.of(r.files[0].key).unwrap();
        assert_eq!(llama.held_bytes.len(), RING);
        // 4 GiB proven copy + 0 CoW + the page cache of the last point.
        assert_eq!(llama.held_bytes.last(), Some((4 << 30) + RING as u64 + 4));
        assert_eq!(llama.residency_permille.last(), Some(1000));
        // No trace in the fixture: refaults are unknown, never 0.
        assert!(!llama.refaults_per_sec.any_known());
        // The qwen file's residency is unknown.
        let qwen = h.of(r.files[1].key).unwrap();
        assert!(!qwen.residency_permille.any_known());
        assert!(!qwen.held_bytes.any_known());
        // The same report again adds nothing; a file that left is dropped.
        h.record(&r);
        assert_eq!(h.of(r.files[0].key).unwrap().held_bytes.len(), RING);
        r.files.remove(1);
        r.at_unix_ns = Some(10_000);
        h.record(&r);
        assert!(h.of(fixture::report().files[1].key).is_none());
    }
}
