//! What a collection could not do, as a typed [`Warning`]: a kind, the thing it is about
//! (a path, a pid, or nothing for the host as a whole) and the sentence that says it.
//!
//! The views print the sentence; [`Said`] remembers what a long run (record, serve, top)
//! has said, so that a condition which holds for an hour is said once, and again only
//! when its sentence changes (one process unreadable, then two).

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A file (given, or found below a directory) was skipped: unreadable, gone, not a model.
    FileSkipped,
    /// Processes could not be read fully (their maps, smaps or fds were denied).
    ProcessesDenied,
    /// One process could not be read, for a reason other than denial or exit.
    ProcessUnreadable,
    /// A cgroup's memory files could not be read.
    CgroupUnreadable,
    /// The model files' content could not be indexed, so no copy could be searched for.
    IndexFailed,
    /// Kernel tracing (`--trace`) could not start, or lost events.
    Trace,
    /// A whole collection failed (the last good one stays shown).
    CollectionFailed,
    /// A recording's store is damaged (a torn frame, a shard that cannot be read), or a
    /// snapshot could not be read back from it.
    StoreDamaged,
}

/// One warning: its kind, its subject (a path or pid as text; empty for the host as a
/// whole) and its sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub kind: WarningKind,
    pub subject: String,
    pub text: String,
}

impl Warning {
    /// A warning about `subject` (a path or pid as text, or "" for the host).
    pub fn new(kind: WarningKind, subject: impl Into<String>, text: impl Into<String>) -> Self {
        Warning {
            kind,
            subject: subject.into(),
            text: text.into(),
        }
    }

    /// A warning about the host as a whole.
    pub fn host(kind: WarningKind, text: impl Into<String>) -> Self {
        Warning::new(kind, "", text)
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How long a changed warning waits before it is said again: a count that moves with
/// every snapshot (processes of other users coming and going) is said once a minute at
/// most, not once a snapshot.
pub const REPEAT_AFTER_SECS: f64 = 60.0;

/// What a long run has said: per (kind, subject), the last sentence said and when.
#[derive(Debug, Default, Clone)]
pub struct Said {
    last: HashMap<(WarningKind, String), (String, f64)>,
}

impl Said {
    /// The warnings of `now` (at `at_secs`, any clock in seconds) to print: those whose
    /// (kind, subject) was never said, and those whose sentence differs from the last one
    /// said for it, once [`REPEAT_AFTER_SECS`] have passed since then. A condition that
    /// goes away and comes back unchanged is not said again.
    pub fn fresh<'a>(&mut self, now: &'a [Warning], at_secs: f64) -> Vec<&'a Warning> {
        let mut out = Vec::new();
        for w in now {
            let key = (w.kind, w.subject.clone());
            let say = match self.last.get(&key) {
                None => true,
                Some((text, when)) => *text != w.text && at_secs - when >= REPEAT_AFTER_SECS,
            };
            if say {
                self.last.insert(key, (w.text.clone(), at_secs));
                out.push(w);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(n: usize) -> Warning {
        Warning::host(
            WarningKind::ProcessesDenied,
            format!("{n} process(es) could not be read fully"),
        )
    }

    #[test]
    fn a_lasting_condition_is_said_once_and_again_when_it_changes() {
        let mut said = Said::default();
        let skip = Warning::new(WarningKind::FileSkipped, "/m/a", "skipping '/m/a': gone");
        let one = [denied(1), skip.clone()];
        assert_eq!(said.fresh(&one, 0.0), vec![&one[0], &one[1]]);
        // The same two again, a second later and an hour later: nothing new.
        assert!(said.fresh(&one, 1.0).is_empty());
        assert!(said.fresh(&one, 3600.0).is_empty());
        // Gone for a snapshot, back unchanged: still nothing new.
        assert!(said.fresh(&[], 3601.0).is_empty());
        assert!(said.fresh(&one, 3602.0).is_empty());
        // Its sentence changed: said again; the unchanged one is not.
        let two = [denied(2), skip];
        assert_eq!(said.fresh(&two, 3603.0), vec![&two[0]]);
        // Another subject of the same kind is its own warning.
        let other = [Warning::new(
            WarningKind::FileSkipped,
            "/m/b",
            "skipping '/m/b': gone",
        )];
        assert_eq!(said.fresh(&other, 3604.0).len(), 1);
    }

    #[test]
    fn a_count_that_moves_every_snapshot_is_said_once_a_minute() {
        let mut said = Said::default();
        let mut printed = Vec::new();
        // Two minutes of snapshots a second apart, the count flipping between 12 and 13.
        for t in 0..120 {
            let now = [denied(12 + t % 2)];
            printed.extend(
                said.fresh(&now, t as f64)
                    .into_iter()
                    .map(|w| w.text.clone()),
            );
        }
        assert_eq!(
            printed,
            ["12", "13"].map(|n| format!("{n} process(es) could not be read fully")),
            "said at 0 s, then at the first change after 60 s (60 s: 12, the same; 61 s: 13)"
        );
    }

    #[test]
    fn a_warning_shows_its_sentence() {
        assert_eq!(
            denied(3).to_string(),
            "3 process(es) could not be read fully"
        );
    }
}
