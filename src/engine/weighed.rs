//! The share-out of the copies' physical pages kept between snapshots: one physical copy
//! counts once (a fork's shared pages are shared out among its sharers), and reading the
//! frames of every copy costs 8 bytes of page map a page, so a file's last share-out is
//! kept while what it depends on stands (see [`Engine::share_out`]).

use std::time::{Duration, Instant};

use super::reuse::{Fingerprint, Fingerprints};
use super::Engine;
use crate::dupes::physical::{self, CopyRanges, SilentMoves};
use crate::sample::ProofSample;

/// The last share-out of one file's physical pages ([`crate::dupes::physical::weigh`]):
/// the proofs it weighed, their processes' fingerprints, the result per pid and when.
pub(super) struct Weighed {
    key: Vec<WeighKey>,
    physical: std::collections::BTreeMap<i32, Option<crate::sample::PhysicalSample>>,
    at: Instant,
    /// The host's counters of what shares or moves pages without a fault, at the weigh or
    /// at the last check that the sharers' anonymous memory stood ([`Weighed::anon`]).
    silent: Option<crate::dupes::physical::SilentMoves>,
    /// When the share-out was last known to hold: the weigh, or the last check of `anon`.
    checked: Instant,
    /// Each sharer's anonymous memory at the weigh ([`AnonShares`]), where pages were
    /// shared and every sharer's faults are known; empty otherwise.
    anon: Vec<(i32, Option<AnonShares>)>,
}

/// What a merge (KSM) or a collapse (khugepaged) of a process's shared anonymous pages
/// changes in its `smaps_rollup`: `Pss_Anon` (a page shared by one more or one fewer
/// process), `Anonymous`, `Swap`, and the shared/private dirty sizes (a page leaving or
/// joining the shared ones). Neither moves with other processes' file mappings (a
/// library mapped by a new process moves `Pss` and the clean sizes only).
type AnonShares = (Option<u64>, Option<u64>, Option<u64>, u64, u64);

fn anon_shares(root: &std::path::Path, pid: i32) -> Option<AnonShares> {
    let r = crate::collect::process::rollup_of(root, pid)?;
    r.pss_anon_bytes?;
    Some((
        r.pss_anon_bytes,
        r.anonymous_bytes,
        r.swap_bytes,
        r.shared_dirty_bytes,
        r.private_dirty_bytes,
    ))
}

impl Weighed {
    /// Whether nothing that moves pages without a fault did so since this share-out:
    /// `now` holds the host's counters. Where every page weighed was its own process's
    /// alone, only a merge (KSM) can make one shared; a collapse into a huge page
    /// (khugepaged) copies a page, so it matters only where pages were shared.
    fn quiet_since(&self, now: Option<&SilentMoves>) -> bool {
        let (Some(then), Some(now)) = (self.silent.as_ref(), now) else {
            return false;
        };
        // The copies weighed (the key); a candidate holding none has nothing to share.
        let alone = self.key.iter().all(|k| {
            self.physical
                .get(&k.0)
                .is_some_and(|p| p.as_ref().is_some_and(alone))
        });
        if alone {
            then.merges() == now.merges()
        } else {
            then == now
        }
    }

    /// Whether every sharer's anonymous memory reads as at the weigh (each known then and
    /// now): no page of theirs was merged, collapsed, swapped or shared anew since.
    fn anon_stands(&self, root: &std::path::Path) -> bool {
        !self.anon.is_empty()
            && self
                .anon
                .iter()
                .all(|(pid, then)| then.is_some() && *then == anon_shares(root, *pid))
    }

    /// The processes whose copies were weighed (their page faults are in the key).
    pub(super) fn pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.key.iter().map(|k| k.0)
    }

    /// Whether this share-out holds for copies of `key`: the same copies with the same
    /// fingerprints and faults; or, where every page weighed was its own process's alone
    /// (each copy's share 1: no fork, shared memory or KSM sharing them), the same copies
    /// (processes, bytes, ranges) however their processes' other memory moved. Such a
    /// share-out changes only when a page becomes shared: by a fork (whose child, holding
    /// the copy, is another copy in the key), shared memory (never exclusive to begin
    /// with) or KSM (the host's counters, [`crate::dupes::physical::SilentMoves`]); a
    /// Python server that maps and unmaps buffers every second faults at every snapshot
    /// and keeps its copy's frames.
    fn holds_for(&self, key: &[WeighKey]) -> bool {
        if self.key == key {
            return true;
        }
        let alone = |p: &Option<crate::sample::PhysicalSample>| p.as_ref().is_some_and(alone);
        self.key.len() == key.len()
            && key
                .iter()
                .all(|k| self.physical.get(&k.0).is_some_and(alone))
            && self
                .key
                .iter()
                .zip(key)
                .all(|(a, b)| a.0 == b.0 && a.3 == b.3 && a.4 == b.4)
    }
}

/// What a share-out depends on, per copy of the file weighed: (pid, the process's
/// fingerprint, its minor and major page faults where the engine reads them, copy bytes,
/// the copy's memory ranges).
type WeighKey = (i32, Fingerprint, Option<(u64, u64)>, u64, Vec<(u64, u64)>);

/// How long a share-out of physical pages is kept while nothing it depends on changed,
/// when the sharers' page faults are unknown (a copy-on-write break in one sharer changes
/// no fingerprint; it shows within this)...
pub const REWEIGH_AFTER: Duration = Duration::from_secs(10);
/// ...and when they are known (a copy-on-write break is a fault of the process writing;
/// what moves pages without a fault: KSM merging, khugepaged collapsing shared pages,
/// shows within this).
pub const REWEIGH_AFTER_TRACKED: Duration = Duration::from_secs(60);
/// ...and when, besides, the host's KSM and khugepaged counters have not moved since
/// ([`crate::dupes::physical::SilentMoves`]: nothing merged or collapsed pages anywhere),
/// a safety net only.
pub const REWEIGH_AFTER_QUIET: Duration = Duration::from_secs(10 * 60);

/// Whether a copy's pages were all its own process's: no fork, shared memory or KSM
/// sharing them, none estimated.
pub(super) fn alone(w: &crate::sample::PhysicalSample) -> bool {
    w.shared_by <= 1 && !w.shmem && !w.ksm && !w.estimated
}

impl Engine {
    /// Makes every kept share-out of physical pages `by` older (tests).
    #[doc(hidden)]
    pub fn backdate_weighs(&mut self, by: Duration) {
        for w in self.weighed.values_mut() {
            w.at = w.at.checked_sub(by).unwrap_or(w.at);
            w.checked = w.checked.checked_sub(by).unwrap_or(w.checked);
        }
    }

    /// Makes every kept share-out's record of the host's silent counters differ from the
    /// host's (as if KSM or khugepaged had moved pages somewhere) and, with `anon`, its
    /// record of the sharers' anonymous memory too (tests).
    #[doc(hidden)]
    pub fn pretend_pages_moved(&mut self, anon: bool) {
        for w in self.weighed.values_mut() {
            w.silent = Some(SilentMoves::of([None, None, None, Some(u64::MAX)]));
            if anon {
                for a in w.anon.iter_mut().filter_map(|a| a.1.as_mut()) {
                    a.4 = a.4.wrapping_add(4096);
                }
            }
        }
    }

    /// Sets `physical` on `proofs` (sorted by file; `ranges[i]` belongs to `proofs[i]`):
    /// each file's last share-out while its proofs and their processes' fingerprints and
    /// page faults are the same (for up to [`REWEIGH_AFTER_TRACKED`], or
    /// [`REWEIGH_AFTER_QUIET`] while nothing merged or collapsed pages on the host since,
    /// [`REWEIGH_AFTER`] where faults are unknown), else weighed again.
    pub(super) fn share_out(
        &mut self,
        proofs: &mut [ProofSample],
        ranges: &[CopyRanges],
        prints: &Fingerprints,
        now: Instant,
    ) {
        // One physical copy counts once: shared pages (fork, shared memory) are shared out.
        // Reading the frames of every copy costs 8 bytes of pagemap a page (a 512 MiB copy
        // shared by 8 processes: a million entries). Pages are shared out among the copies
        // of one file only, so each file is weighed on its own; while its proofs and their
        // processes' fingerprints and page faults are the same, its last share-out is kept
        // (for up to REWEIGH_AFTER_TRACKED, REWEIGH_AFTER_QUIET while no page was merged or
        // collapsed on the host since, REWEIGH_AFTER where faults are unknown): a
        // daemon whose memory moves does not make the copies of the other files be read
        // again. The key: every copy of the file weighed (process, fingerprint, faults,
        // copy bytes, ranges). `kept` is sorted by file: each file's proofs
        // are one run.
        let mut weighed = std::mem::take(&mut self.weighed);
        let proc_root = self.roots.proc.clone();
        // Read once, and only where a file has copies to weigh.
        let silent = std::cell::OnceCell::new();
        let silent = || *silent.get_or_init(crate::dupes::physical::SilentMoves::read);
        self.last_weighed = 0;
        let mut from = 0;
        while from < proofs.len() {
            let file = proofs[from].file;
            let to = from + proofs[from..].partition_point(|p| p.file == file);
            let key: Vec<WeighKey> = proofs[from..to]
                .iter()
                .zip(&ranges[from..to])
                .filter(|(p, r)| !r.ranges.is_empty() && p.copy_memory_bytes > 0)
                .map(|(p, r)| {
                    let spans = r.ranges.iter().map(|x| (x.0, x.1)).collect();
                    let fp = prints.get(p.pid, p.file);
                    let faults = self.cache.as_ref().and_then(|c| c.faults(p.pid));
                    (p.pid, fp, faults, p.copy_memory_bytes, spans)
                })
                .collect();
            // Every sharer's faults known: a copy-on-write break shows in them; and what
            // moves pages without a fault, in the host's counters or, where those moved (a
            // collapse anywhere on the host), in the sharers' anonymous memory, read once
            // REWEIGH_AFTER_TRACKED passed (a few page-table walks instead of a page map).
            let tracked = key.iter().all(|k| k.2.is_some());
            let holds = |w: &mut Weighed| {
                let age = now.saturating_duration_since(w.at);
                if !tracked {
                    return age < REWEIGH_AFTER;
                }
                if age >= REWEIGH_AFTER_QUIET {
                    return false;
                }
                if w.quiet_since(silent().as_ref())
                    || now.saturating_duration_since(w.checked) < REWEIGH_AFTER_TRACKED
                {
                    return true;
                }
                let stands = w.anon_stands(&proc_root);
                if stands {
                    w.checked = now;
                    w.silent = silent();
                }
                stands
            };
            let kept = weighed
                .remove(&file)
                .filter(|w| w.holds_for(&key))
                .and_then(|mut w| holds(&mut w).then_some(w));
            match kept {
                Some(w) => {
                    for p in &mut proofs[from..to] {
                        p.physical = w.physical.get(&p.pid).cloned().flatten();
                    }
                    self.weighed.insert(file, w);
                }
                None => {
                    self.last_weighed += usize::from(!key.is_empty());
                    physical::weigh(&self.roots.proc, &mut proofs[from..to], &ranges[from..to]);
                    let physical = proofs[from..to]
                        .iter()
                        .map(|p| (p.pid, p.physical.clone()))
                        .collect();
                    let silent = (!key.is_empty()).then(silent).flatten();
                    // The sharers' anonymous memory, where pages were shared and faults
                    // are known: what a later check compares.
                    let shared = proofs[from..to]
                        .iter()
                        .any(|p| p.physical.as_ref().is_some_and(|w| !alone(w)));
                    let anon = match tracked && shared {
                        true => key
                            .iter()
                            .map(|k| (k.0, anon_shares(&proc_root, k.0)))
                            .collect(),
                        false => Vec::new(),
                    };
                    self.weighed.insert(
                        file,
                        Weighed {
                            key,
                            physical,
                            at: now,
                            silent,
                            checked: now,
                            anon,
                        },
                    );
                }
            }
            from = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::PhysicalSample;

    fn weighed(shared_by: u32, silent: [Option<u64>; 4]) -> Weighed {
        let w = PhysicalSample {
            pages: 10,
            share_pages: 10.0 / f64::from(shared_by),
            shared_by,
            ..PhysicalSample::default()
        };
        Weighed {
            key: vec![(7, (None, None, None), Some((0, 0)), 40960, vec![(0, 40960)])],
            // Pid 8, a candidate that holds no copy, was not weighed.
            physical: [(7, Some(w)), (8, None)].into_iter().collect(),
            at: Instant::now(),
            silent: Some(SilentMoves::of(silent)),
            checked: Instant::now(),
            anon: Vec::new(),
        }
    }

    #[test]
    fn a_collapse_matters_only_where_pages_were_shared() {
        let then = [Some(0), Some(0), Some(0), Some(258)];
        let collapsed = SilentMoves::of([Some(0), Some(0), Some(0), Some(283)]);
        let merged = SilentMoves::of([Some(0), Some(512), Some(0), Some(258)]);
        let same = SilentMoves::of(then);
        // A copy whose pages were its process's alone: only a merge can share one.
        let alone = weighed(1, then);
        assert!(alone.quiet_since(Some(&same)));
        assert!(alone.quiet_since(Some(&collapsed)));
        assert!(!alone.quiet_since(Some(&merged)));
        // A copy shared by a fork: a collapse may have copied a shared page.
        let shared = weighed(4, then);
        assert!(shared.quiet_since(Some(&same)));
        assert!(!shared.quiet_since(Some(&collapsed)));
        assert!(!shared.quiet_since(Some(&merged)));
        // Counters unknown (no sysfs): nothing is known to stand still.
        assert!(!alone.quiet_since(None));
    }
}
