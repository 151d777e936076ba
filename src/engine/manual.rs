//! What the engine does when asked rather than on its cadence: the byte-level proof of one
//! process (`top`'s `p`, [`Engine::prove_now`]), run on a thread of its own with a
//! [`Progress`] the screen draws and can cancel, and the page-cache map of one file
//! ([`Engine::residency_map`], `mincore`, see [`crate::collect::residency`]).
//!
//! A proof asked for by hand is kept by the engine ([`Engine::keep_proved`]) and merged into
//! every later snapshot, so its row stays proven under `--no-prove`, while the process's
//! `RssAnon` and `rchar` and the file's size are unchanged (as the engine keeps its own
//! proofs); merged, it is weighed again with the engine's proofs, so one physical copy
//! counts once.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

pub use crate::dupes::prove::Progress;

use super::{Engine, Fingerprint, Fingerprints, Snapshot};
use crate::collect::{residency, Roots};
use crate::dupes::physical::{self, CopyRanges};
use crate::dupes::prove::{self, ProveOptions};
use crate::model::residency::MapModel;
use crate::sample::{FileKey, ProofSample, Sample};

/// A proof asked for by hand, kept with what it depends on.
pub(super) struct Manual {
    fingerprint: Fingerprint,
    proof: ProofSample,
    ranges: CopyRanges,
}

/// The proof of one process, ready to run on a thread of its own
/// ([`Engine::prove_now`]).
pub struct ProveJob {
    pid: i32,
    roots: Roots,
    /// The snapshot's sample with the process's candidacies only.
    pending: Sample,
}

/// What a [`ProveJob`] found.
pub struct Proved {
    pub pid: i32,
    /// One per file the process was a candidate for (or found to hold a copy of).
    proofs: Vec<(ProofSample, CopyRanges)>,
    /// Why part of it could not be searched (a process that exited, a denied read).
    pub warnings: Vec<crate::sample::Warning>,
    /// How long it took.
    pub secs: f64,
}

impl Proved {
    /// Files searched in full, and all the files of the proof.
    pub fn complete(&self) -> (usize, usize) {
        let complete = self
            .proofs
            .iter()
            .filter(|q| q.0.unsearched.is_none())
            .count();
        (complete, self.proofs.len())
    }
}

impl ProveJob {
    /// Searches the process's memory for copies of every file it is a candidate for, in
    /// full (no budget), reporting to (and stopping when cancelled through) `progress`.
    pub fn run(self, progress: &Progress) -> Proved {
        let started = Instant::now();
        let mut warnings = Vec::new();
        let opts = ProveOptions {
            budget: None,
            exact: false,
        };
        let proofs = prove::prove_found(
            &self.roots,
            &self.pending,
            opts,
            Some(progress),
            &mut warnings,
        )
        .into_iter()
        .map(|p| {
            let r = CopyRanges::of(p.sample.file, &p.found);
            (p.sample, r)
        })
        .collect();
        Proved {
            pid: self.pid,
            proofs,
            warnings,
            secs: started.elapsed().as_secs_f64(),
        }
    }
}

impl Engine {
    /// The proof of `pid` over the candidacies of the snapshot `from` (the last one
    /// taken), to run anywhere ([`ProveJob::run`]); `Err` says why there is nothing to
    /// prove.
    pub fn prove_now(&self, pid: i32, from: &Snapshot) -> Result<ProveJob, String> {
        let pending = Sample {
            candidates: from
                .sample
                .candidates
                .iter()
                .filter(|c| c.pid == pid)
                .cloned()
                .collect(),
            ..from.sample.clone()
        };
        if pending.candidates.is_empty() {
            return Err(format!(
                "pid {pid} is not a candidate for a copy: nothing to prove"
            ));
        }
        Ok(ProveJob {
            pid,
            roots: self.roots.clone(),
            pending,
        })
    }

    /// Keeps the complete proofs of `p` (searched in full) for the snapshots after `of`,
    /// the one they were proved from: merged into each while nothing they depend on
    /// changed.
    pub fn keep_proved(&mut self, p: &Proved, of: &Snapshot) {
        let prints = Fingerprints::of(&of.sample);
        for (q, r) in p.proofs.iter().filter(|q| q.0.unsearched.is_none()) {
            self.manual.insert(
                (q.pid, q.file),
                Manual {
                    fingerprint: prints.get(q.pid, q.file),
                    proof: q.clone(),
                    ranges: r.clone(),
                },
            );
        }
    }

    /// Adds the kept proofs to a fresh sample where the engine has no complete one of its
    /// own, and forgets those whose process, candidacy or file changed.
    pub(super) fn merge_manual(&mut self, sample: &mut Sample) {
        let prints = Fingerprints::of(sample);
        self.manual.retain(|(pid, file), m| {
            sample
                .candidates
                .iter()
                .any(|c| c.pid == *pid && c.file == *file)
                && prints.get(*pid, *file) == m.fingerprint
        });
        let mut merged = false;
        for ((pid, file), m) in &self.manual {
            let have = sample
                .proofs
                .iter()
                .position(|p| p.pid == *pid && p.file == *file);
            match have {
                Some(i) if sample.proofs[i].unsearched.is_none() => continue,
                Some(i) => sample.proofs[i] = m.proof.clone(),
                None => sample.proofs.push(m.proof.clone()),
            }
            merged = true;
        }
        // One physical copy once, the merged proofs included: weighed again together.
        if merged {
            let ranges: Vec<CopyRanges> = sample
                .proofs
                .iter()
                .map(|p| match self.manual.get(&(p.pid, p.file)) {
                    Some(m) if m.proof == *p => m.ranges.clone(),
                    _ => self.copy_ranges(p.pid, p.file),
                })
                .collect();
            physical::weigh(&self.roots.proc, &mut sample.proofs, &ranges);
        }
    }

    /// The page-cache map of `path` (which must still be the file `key`), drawn as `scan
    /// --map` draws it; `Err` says why it is unknown.
    /// Read on a helper thread under the deadline (`collect::answer`); a file on FUSE is
    /// not opened (opening drops its page cache there).
    pub fn residency_map(&self, path: &str, key: FileKey) -> Result<MapModel, String> {
        use crate::collect::answer::{self, Place};
        let p = std::path::PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(path));
        let at = p.clone();
        answer::within(Place::of_key(key), &at, move || map_of(&p, key))
            .map_err(|e| e.to_string())?
    }
}

/// [`Engine::residency_map`] on its helper thread.
fn map_of(p: &Path, key: FileKey) -> Result<MapModel, String> {
    use crate::collect::answer;
    if nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type().0 == answer::FUSE_SUPER_MAGIC)
    {
        return Err(format!("not read: {}", answer::fuse_why(p)));
    }
    let (file, size, _) = residency::open(p).map_err(|e| e.to_string())?;
    let same = file
        .metadata()
        .is_ok_and(|m| FileKey::from_dev(m.dev(), m.ino()) == key);
    if !same {
        return Err(format!("'{}' now names another file", p.display()));
    }
    residency::mincore_map(&file, p, size)
        .map(|m| crate::model::residency::draw(&m))
        .map_err(|e| e.to_string())
}
