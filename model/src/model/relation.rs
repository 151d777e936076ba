//! Which file a copy is counted under when its bytes are several files' (identical tensors
//! in a `.safetensors` and a `.pt`, a model downloaded twice): the file the process came
//! to, by the strongest relation it has with one of them; by content alone only where it
//! has none. Pure.
//!
//! Relations, strongest first: it **read** the file (the eBPF read() ledger: bytes read,
//! the more the stronger), it **maps** it, it holds it **open**, it held it open or mapped
//! **at upload** (the upload tracer looked when a copy matched several files), its command
//! line **names** it, it holds a proven private **copy** of it (weakest: the proof credits
//! tensor bytes two files share to one of them by content; a copy of identical files that
//! was counted under one by content alone is no relation at all). A tie at the strongest
//! relation, or no relation at all, is decided by content: the file not in shared memory,
//! then the smallest (device, inode), never by the order the files were named in; such a
//! copy says "matched by content; also identical to B".

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::FileModel;
use crate::sample::{FileKey, Sample};

/// How a choice by content alone begins in words (a copy placed so is no relation).
pub const BY_CONTENT: &str = "matched by content";

/// How a process came to a file, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// It holds a proven private copy of the file.
    Copied,
    /// Its command line names the file.
    Named,
    /// It held the file open or mapped when its upload was matched.
    HeldAtUpload,
    /// It holds the file open.
    Open,
    /// It maps the file.
    Mapped,
    /// It read() the file (eBPF read ledger).
    Read,
}

impl Relation {
    /// In words: `the file it read`.
    pub fn words(self) -> &'static str {
        match self {
            Relation::Named => "the file its command line names",
            Relation::Copied => "the file it holds a copy of",
            Relation::HeldAtUpload => "the file it held open when it uploaded",
            Relation::Open => "the file it holds open",
            Relation::Mapped => "the file it maps",
            Relation::Read => "the file it read",
        }
    }
}

/// The file a copy is counted under, and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub file: FileKey,
    /// The relation that chose it; `None`: content alone.
    pub by: Option<Relation>,
    /// The other files of the same bytes.
    pub also: Vec<FileKey>,
}

/// What the sample says of each (process, file): built once per report.
pub struct Relations {
    reads: BTreeMap<(i32, FileKey), u64>,
    mapped: BTreeSet<(i32, FileKey)>,
    open: BTreeSet<(i32, FileKey)>,
    copied: BTreeSet<(i32, FileKey)>,
    named: BTreeSet<(i32, FileKey)>,
    paths: BTreeMap<FileKey, String>,
    /// The files a report shows (those `new` was given; empty: any): a copy is counted
    /// under one of them when it can be (a /dev/shm copy folded under its original is
    /// none).
    shown: BTreeSet<FileKey>,
}

impl Relations {
    /// From the sample, the read() ledger and the files' proven copies (`files` after
    /// [`super::copies::attribute`]; empty to leave copies out).
    pub fn new(
        sample: &Sample,
        reads: &BTreeMap<(i32, FileKey), u64>,
        files: &[FileModel],
    ) -> Relations {
        let mut mapped = BTreeSet::new();
        let mut open = BTreeSet::new();
        for p in &sample.processes {
            mapped.extend(p.mappings.iter().map(|m| (p.pid, m.key())));
            open.extend(p.open_files.iter().map(|o| (p.pid, o.key)));
        }
        let mut named: BTreeSet<(i32, FileKey)> = sample.named.iter().copied().collect();
        named.extend(
            sample
                .candidates
                .iter()
                .filter(|c| c.why == crate::sample::CandidateWhy::Named)
                .map(|c| (c.pid, c.file)),
        );
        Relations {
            reads: reads
                .iter()
                .filter(|(_, b)| **b > 0)
                .map(|(k, b)| (*k, *b))
                .collect(),
            mapped,
            open,
            // A copy counted under a file by content alone says nothing of the process.
            copied: files
                .iter()
                .flat_map(|f| {
                    f.proven_copies
                        .iter()
                        .filter(|c| {
                            c.attribution
                                .as_deref()
                                .is_none_or(|a| !a.starts_with(BY_CONTENT))
                        })
                        .map(move |c| (c.pid, f.key))
                })
                .collect(),
            named,
            paths: sample
                .files
                .iter()
                .map(|f| (f.key, f.path.clone()))
                .collect(),
            shown: files.iter().map(|f| f.key).collect(),
        }
    }

    /// The strongest relation of `pid` to `file` (with the bytes it read, for ties among
    /// readers); `held` says it held the file when it uploaded.
    pub fn of(&self, pid: i32, file: FileKey, held: bool) -> Option<(Relation, u64)> {
        let k = (pid, file);
        if let Some(b) = self.reads.get(&k) {
            return Some((Relation::Read, *b));
        }
        let r = if self.mapped.contains(&k) {
            Relation::Mapped
        } else if self.open.contains(&k) {
            Relation::Open
        } else if held {
            Relation::HeldAtUpload
        } else if self.named.contains(&k) {
            Relation::Named
        } else if self.copied.contains(&k) {
            Relation::Copied
        } else {
            return None;
        };
        Some((r, 0))
    }

    /// Which of `options` (each file, and whether `pid` held it when it uploaded) a copy of
    /// `pid` whose bytes are all of theirs is counted under.
    pub fn choose(&self, pid: i32, options: &[(FileKey, bool)]) -> Choice {
        let mut files: Vec<(FileKey, bool)> = options.to_vec();
        files.sort();
        files.dedup_by_key(|f| f.0);
        let eligible: Vec<(FileKey, bool)> = match files.iter().any(|f| self.shown.contains(&f.0)) {
            true => files
                .iter()
                .copied()
                .filter(|f| self.shown.contains(&f.0))
                .collect(),
            false => files.clone(),
        };
        let ranked: Vec<(FileKey, Option<(Relation, u64)>)> = eligible
            .iter()
            .map(|(f, held)| (*f, self.of(pid, *f, *held)))
            .collect();
        let best = ranked.iter().filter_map(|r| r.1).max();
        let tied: Vec<FileKey> = ranked.iter().filter(|r| r.1 == best).map(|r| r.0).collect();
        // By content: not in shared memory (device major 0: tmpfs, shmem), then the
        // smallest key.
        let file = tied
            .iter()
            .copied()
            .min_by_key(|k| (k.major == 0, *k))
            .unwrap_or_default();
        Choice {
            file,
            by: best.filter(|_| tied.len() == 1).map(|b| b.0),
            also: files.iter().map(|f| f.0).filter(|f| *f != file).collect(),
        }
    }

    /// A file's path as the sample names it, else `major:minor:inode`.
    pub fn path(&self, key: FileKey) -> String {
        self.paths
            .get(&key)
            .cloned()
            .unwrap_or_else(|| format!("{}:{}:{}", key.major, key.minor, key.inode))
    }

    /// How a choice reads beside the copy: `the file it read`, or `matched by content;
    /// also identical to B` (names as the sample gives them).
    pub fn words(&self, c: &Choice) -> Option<String> {
        if c.also.is_empty() {
            return None;
        }
        let others: Vec<String> = c.also.iter().map(|k| self.path(*k)).collect();
        Some(match c.by {
            Some(r) => format!("{} (also identical to {})", r.words(), others.join(", ")),
            None => format!("{BY_CONTENT}; also identical to {}", others.join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(inode: u64) -> FileKey {
        FileKey {
            major: 8,
            minor: 1,
            inode,
        }
    }

    fn relations() -> Relations {
        Relations {
            reads: BTreeMap::new(),
            mapped: BTreeSet::new(),
            open: BTreeSet::new(),
            copied: BTreeSet::new(),
            named: BTreeSet::new(),
            paths: [(key(1), "/m/a".to_string()), (key(2), "/m/b".to_string())]
                .into_iter()
                .collect(),
            shown: BTreeSet::new(),
        }
    }

    /// The related file wins whatever the order of the options; without a relation the
    /// choice is the same in either order, and says so.
    #[test]
    fn the_related_file_wins_in_any_order_and_content_decides_alike() {
        let mut r = relations();
        r.open.insert((7, key(2)));
        for options in [
            [(key(1), false), (key(2), false)],
            [(key(2), false), (key(1), false)],
        ] {
            let c = r.choose(7, &options);
            assert_eq!(
                (c.file, c.by, c.also.clone()),
                (key(2), Some(Relation::Open), vec![key(1)])
            );
            assert_eq!(
                r.words(&c).as_deref(),
                Some("the file it holds open (also identical to /m/a)")
            );
            let c = r.choose(8, &options);
            assert_eq!((c.file, c.by), (key(1), None));
            assert_eq!(
                r.words(&c).as_deref(),
                Some("matched by content; also identical to /m/b")
            );
        }
        // Read beats open; more bytes read beats fewer; held at upload beats a copy.
        r.reads.insert((7, key(1)), 10);
        assert_eq!(
            r.choose(7, &[(key(1), false), (key(2), false)]).file,
            key(1)
        );
        r.reads.insert((7, key(2)), 20);
        assert_eq!(
            r.choose(7, &[(key(1), false), (key(2), false)]).file,
            key(2)
        );
        r.copied.insert((9, key(1)));
        let c = r.choose(9, &[(key(1), false), (key(2), true)]);
        assert_eq!((c.file, c.by), (key(2), Some(Relation::HeldAtUpload)));
        // Two files read alike: content decides, and says so.
        r.reads.insert((7, key(1)), 20);
        assert_eq!(r.choose(7, &[(key(2), false), (key(1), false)]).by, None);
        // A file the report does not show (a /dev/shm copy folded under its original) is
        // passed over for one it shows, whatever the relation.
        r.shown.insert(key(1));
        r.mapped.insert((5, key(2)));
        let c = r.choose(5, &[(key(2), false), (key(1), false)]);
        assert_eq!((c.file, c.by, c.also), (key(1), None, vec![key(2)]));
    }
}
