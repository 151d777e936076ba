//! Proofs kept between snapshots: a (process, file) searched in full is reused while its
//! fingerprint holds, checked in place when its memory changed within its cadence, and
//! searched again after it (see [`Engine::prove`](super::Engine)).

use crate::sample::Warning;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::carry::{carry, still_there};
use super::placed::Placed;
use super::todo::{boosted, by_budget, pending, MAX_BOOST};
use super::Engine;
use crate::collect::Roots;
use crate::dupes::moved::Placement;
use crate::dupes::prove::{Proof, ProveOptions};
use crate::sample::unsearched::Unsearched;
use crate::sample::{FileKey, ProofSample, Sample};

/// The last full search of a (process, file), with what it depends on.
pub(super) struct Reused {
    fingerprint: (Option<u64>, Option<u64>, Option<u64>),
    at: Instant,
    pub(super) proof: Proof,
    /// How long the last full search took (a search of what moved keeps the full one's):
    /// the safety net's cadence ([`Reused::again_after`]).
    full_took: Duration,
    /// The last check in place since (memory changed): when, how long it took, and what
    /// it found.
    checked: Option<Checked>,
    /// Where the process's memory was when the search began ([`Placement`]): while it
    /// has not moved, the search stands.
    placement: Option<Arc<Placement>>,
    /// When its copies were last confirmed in full (a search that kept them, checked in
    /// place, confirmed none: [`REVERIFY_AFTER`]), and the bytes that confirmation
    /// compared (what confirming them again would cost; a search that kept them compared
    /// the spot pages only).
    verified: Instant,
    confirmed_bytes: u64,
    /// The process's run time (all its threads, `collect::statfiles::run_time_ns`) read
    /// before the search: while it stands, the process has not run since.
    ran: Option<u64>,
    /// The process's start and page faults (all its threads, live and exited: the task
    /// iterator's stamp) read before `placement`: while they stand, no page of it was
    /// faulted in, or freed and faulted again, so its memory has not moved (a copy needs
    /// new pages or refaulted ones), and no placement need be read to know it.
    placed_faults: Option<(u64, u64)>,
    /// The process's start and its live threads' reads (the task iterator's stamp) read
    /// before the search: while they stand, none of its threads `read()` since, whatever
    /// its `rchar` (which takes in its reaped children's reads) says.
    reads: Option<(u64, (u64, u32, u64))>,
}

pub(super) struct Checked {
    at: Instant,
    took: Duration,
    result: Result<ProofSample, String>,
}

/// A search is reused while the process's `RssAnon` and `rchar` and the file's size are
/// unchanged for this long, or for its cadence if that is longer (`top`, `serve` and
/// `record` take a snapshot every few seconds; re-searching unchanged memory every time
/// would cost a core).
pub const REPROVE_AFTER: Duration = Duration::from_secs(60);

/// A search again of an unchanged process ([`REPROVE_AFTER`]) keeps the whole copies the
/// last one found when a check in place finds them still there, and searches the rest of
/// its memory only (a reader's 1 GiB copy is not confirmed again page by page each
/// minute); the copies are confirmed in full again by a whole search at least this often
/// (or every tenth search again of a process whose search takes long: its cadence).
pub const REVERIFY_AFTER: Duration = Duration::from_secs(10 * 60);
/// What a check in place compares at most: the copies are kept only where confirming
/// them compared more (large copies; a few MiB are confirmed again instead).
const SPOT_BYTES: u64 = crate::dupes::sweep::SPOT_PAGES as u64 * crate::sample::PAGE_BYTES;

/// ...and, for a process that ran, no sooner than this many times as long as its last full
/// search took: the search again for what nothing cheap can see (a copy written over
/// pages the process had, which moves no frame and no counter) costs at most about 0.1%
/// of a core per process (a daemon of 1.5 GiB searched in 0.2 s: every 200 s, not every
/// minute), at most [`RESEARCH_MAX`].
pub const REPROVE_COST_FACTOR: u32 = 1000;

/// A process whose memory changes is searched again at most this often...
pub const RESEARCH_MIN: Duration = Duration::from_secs(5);
/// ...and no sooner than this many times as long as its last search took, so searching a
/// process costs at most about 1% of a core...
pub const RESEARCH_COST_FACTOR: u32 = 100;
/// ...and at least this often (a search of 10 s or more: a process of hundreds of GiB).
pub const RESEARCH_MAX: Duration = Duration::from_secs(20 * 60);

impl Reused {
    /// How long after this search a changed process is searched again.
    fn cadence(&self) -> Duration {
        (self.proof.took * RESEARCH_COST_FACTOR).clamp(RESEARCH_MIN, RESEARCH_MAX)
    }

    /// Whether no page of the process faulted since its placement was read (`faults`: its
    /// start and faults in this snapshot's stamp): its memory has not moved.
    fn quiet(&self, faults: Option<(u64, u64)>) -> bool {
        faults.is_some() && faults == self.placed_faults
    }

    /// How long after its last full search a process whose counters stand, or whose moved
    /// memory alone was searched since, is searched again in full.
    fn again_after(&self) -> Duration {
        again_after(self.full_took, self.cadence())
    }
}

/// The safety net's age for a process whose last full search took `full_took`.
fn again_after(full_took: Duration, cadence: Duration) -> Duration {
    let budget = (full_took * REPROVE_COST_FACTOR).min(RESEARCH_MAX);
    REPROVE_AFTER.max(budget).max(cadence)
}

/// What a proof of a (process, file) depends on: the process's private memory (`RssAnon`
/// and `HugetlbPages`) and `rchar`, the file's size.
pub(crate) type Fingerprint = (Option<u64>, Option<u64>, Option<u64>);

/// `RssAnon` plus the huge pages of the hugetlbfs pool (`HugetlbPages`, not in `RssAnon`):
/// a copy made into either changes it.
fn private_bytes(p: &crate::sample::ProcessSample) -> Option<u64> {
    let huge = p.status.hugetlb_bytes.unwrap_or(0);
    p.status.rss_anon_bytes.map(|a| a + huge)
}

/// The [`Fingerprint`]s of one sample's (process, file) pairs: its processes and files
/// looked up by key (a host with 200 files and 2,000 candidates: no linear scan each).
/// Where a pid or a file stands twice, the first counts.
pub(crate) struct Fingerprints {
    procs: HashMap<i32, (Option<u64>, Option<u64>), foldhash::fast::RandomState>,
    files: HashMap<FileKey, Option<u64>, foldhash::fast::RandomState>,
}

impl Fingerprints {
    pub(crate) fn of(sample: &Sample) -> Fingerprints {
        let fast = foldhash::fast::RandomState::default();
        let mut procs = HashMap::with_capacity_and_hasher(sample.processes.len(), fast.clone());
        for p in &sample.processes {
            // The first of a pid, as `fingerprint` finds it.
            procs
                .entry(p.pid)
                .or_insert((private_bytes(p), p.rchar_bytes));
        }
        let mut files = HashMap::with_capacity_and_hasher(sample.files.len(), fast);
        for f in &sample.files {
            files.entry(f.key).or_insert(f.size_bytes);
        }
        Fingerprints { procs, files }
    }

    pub(crate) fn get(&self, pid: i32, file: FileKey) -> Fingerprint {
        let (anon, rchar) = self.procs.get(&pid).copied().unwrap_or((None, None));
        (anon, rchar, self.files.get(&file).copied().flatten())
    }
}

impl Engine {
    /// Makes every kept search `searched` older and its copies' last full confirmation
    /// `verified` older (tests: what a live engine does after [`REPROVE_AFTER`] or
    /// [`REVERIFY_AFTER`], without waiting for it).
    #[doc(hidden)]
    pub fn backdate_searches(&mut self, searched: Duration, verified: Duration) {
        for r in self.reuse.values_mut() {
            r.at = r.at.checked_sub(searched).unwrap_or(r.at);
            r.verified = r.verified.checked_sub(verified).unwrap_or(r.verified);
        }
    }

    /// Forgets every kept search's run time (tests: the next search due is made as if
    /// the process had run since, as a live one does).
    #[doc(hidden)]
    pub fn forget_run_times(&mut self) {
        for r in self.reuse.values_mut() {
            r.ran = None;
        }
    }

    /// Makes every kept search as if it had just run and never been checked in place
    /// since (tests: the next snapshot of a changed process checks its copies in place,
    /// whatever the load, and no cadence is due).
    #[doc(hidden)]
    pub fn renew_searches(&mut self) {
        let now = Instant::now();
        for r in self.reuse.values_mut() {
            r.at = now;
            r.checked = None;
        }
    }

    /// Proves the sample's candidates: each (process, file) is searched in full when it
    /// never was, when its memory changed and the last search is older than its cadence
    /// ([`RESEARCH_COST_FACTOR`] times the search's time, from [`RESEARCH_MIN`] to
    /// [`RESEARCH_MAX`]), or when the last full search is older than [`REPROVE_AFTER`], the
    /// cadence and [`REPROVE_COST_FACTOR`] times its time (and the process ran). Unchanged, the last search is reused. Changed but within the cadence, the
    /// copies the last search found are checked again in place ([`stale`]), and the rest
    /// of the process's memory counts as not searched: a suspicion beside the count, which
    /// then says it is a lower bound, until the next full search.
    pub(super) fn prove(
        &mut self,
        sample: &Sample,
        opts: ProveOptions,
        warnings: &mut Vec<Warning>,
    ) -> Vec<ProofSample> {
        use crate::dupes::physical::CopyRanges;
        let now = Instant::now();
        // Each proof with the memory ranges of its copies (to weigh their pages).
        let mut kept: Vec<(ProofSample, CopyRanges)> = Vec::with_capacity(sample.candidates.len());
        let mut todo = Vec::new();
        self.last_reused = 0;
        self.last_rechecked = 0;
        self.last_moved = 0;
        self.last_carried = 0;
        self.last_slept = 0;
        // Where each changed process's memory is now, read once per process.
        let mut placed = Placed::default();
        // The copies kept through a search again of the rest, and where they are.
        let mut carried: HashMap<(i32, FileKey), (Proof, Instant, u64)> = HashMap::new();
        let mut known = crate::dupes::prove::KnownCopies::new();
        let prints = Fingerprints::of(sample);
        // Processes whose memory moved since their search: only what moved is searched
        // now (the memory where it was passes over), so the count stays exact. Per pid,
        // the memory that did not move; the pids searched in full for some file; and the
        // time of each partial search's last full one (the cadence of full searches).
        let mut unmoved_known: HashMap<i32, Vec<(u64, u64)>> = HashMap::new();
        let mut full: HashSet<i32> = HashSet::new();
        let mut partial_at: HashMap<(i32, FileKey), Instant> = HashMap::new();
        // Each process's run time, read at most once a snapshot, before its search: the
        // task iterator's (read first in the snapshot) where it loaded, else `schedstat`'s.
        let mut ran: HashMap<i32, Option<u64>> = HashMap::new();
        let proc_root = self.roots.proc.clone();
        let stamps = self.cache.as_ref().and_then(|c| c.tasks.now());
        let faults_now = |pid: i32| {
            stamps
                .and_then(|t| t.get(pid))
                .map(|s| (s.start_ns, s.faults))
        };
        let reads_now = |pid: i32| {
            stamps
                .and_then(|t| t.get(pid))
                .map(|s| (s.start_ns, s.own_reads))
        };
        let mut run_time = |pid: i32| {
            *ran.entry(pid)
                .or_insert_with(|| match stamps.and_then(|t| t.get(pid)) {
                    Some(t) => Some(t.run_ns),
                    None => crate::collect::statfiles::run_time_ns(&proc_root, pid),
                })
        };
        for c in &sample.candidates {
            let fp = prints.get(c.pid, c.file);
            let Some(r) = self.reuse.get_mut(&(c.pid, c.file)) else {
                full.insert(c.pid);
                todo.push(c.clone());
                continue;
            };
            // Due up to an eighth early: snapshots every cadence (serve at 5 s) start their
            // proofs after collections of varying length, and must not just miss it.
            let age = now.duration_since(r.at);
            let due = |after: Duration| age + after / 8 >= after;
            let again = due(r.again_after());
            // Unchanged and not run since its search: nothing of its own wrote its memory
            // (what another process could write into it, through shared memory or
            // `/proc/PID/mem`, is searched at least every REVERIFY_AFTER). An idle
            // process is not searched again every minute.
            if again
                && r.fingerprint == fp
                && r.ran.is_some()
                && now.duration_since(r.verified) < REVERIFY_AFTER
                && run_time(c.pid) == r.ran
            {
                r.at = now;
                self.last_reused += 1;
                self.last_slept += 1;
                let ranges = CopyRanges::of(c.file, &r.proof.found);
                kept.push((r.proof.sample.clone(), ranges));
                continue;
            }
            // Changed, and its cadence due: searched in full where a `read()` could have
            // written a copy over pages it had (one of its threads read since: `rchar` moved
            // by more than its reaped children's reads) or where the placement of its
            // memory is not known; where only its private memory's size moved, what moved is
            // searched (below), as within the cadence: a copy written over pages it had
            // without a `read()` moves nothing an unchanged process's would not, and is
            // the safety net's (`again`). A Python server allocating 24 MiB a second was
            // searched in full at every `serve` snapshot (5 s), a third of its CPU.
            let placed_known = r.placement.is_some() && self.cache.is_some();
            // Its own threads' reads where the task iterator counts them, else `rchar`.
            let read_since = r.fingerprint.2 != fp.2
                || match (r.reads, reads_now(c.pid)) {
                    (Some(then), Some(now)) => then != now,
                    _ => r.fingerprint.1 != fp.1,
                };
            let cadence = r.fingerprint != fp && due(r.cadence()) && (read_since || !placed_known);
            if again || cadence {
                // Unchanged, searched again for what nothing cheap can see (a copy written
                // over pages it had): the copies found, still in place, are kept.
                if again
                    && r.fingerprint == fp
                    && now.duration_since(r.verified) < REVERIFY_AFTER.max(r.cadence() * 10)
                    && r.confirmed_bytes > SPOT_BYTES
                {
                    if let Some(k) = still_there(&self.roots, sample, &r.proof, opts.exact) {
                        known.entry(c.pid).or_default().extend(k.ranges());
                        carried.insert((c.pid, c.file), (k, r.verified, r.confirmed_bytes));
                    }
                }
                full.insert(c.pid);
                todo.push(c.clone());
            } else if r.fingerprint == fp {
                self.last_reused += 1;
                let ranges = CopyRanges::of(c.file, &r.proof.found);
                kept.push((r.proof.sample.clone(), ranges));
            } else {
                let faults = faults_now(c.pid);
                let moved = match (&r.placement, self.cache.is_some()) {
                    (Some(then), true)
                        if !r.quiet(faults) && !placed.unmoved(&self.roots, c.pid, then) =>
                    {
                        placed.unmoved_ranges(&self.roots, c.pid, then)
                    }
                    _ => None,
                };
                if let Some(unmoved) = moved {
                    // The copies found before, checked in place, are kept; a copy gone or
                    // changed makes the search a full one.
                    match still_there(&self.roots, sample, &r.proof, opts.exact) {
                        Some(k) => {
                            known.entry(c.pid).or_default().extend(k.ranges());
                            carried.insert((c.pid, c.file), (k, r.verified, r.confirmed_bytes));
                            unmoved_known.entry(c.pid).or_default().extend(unmoved);
                            partial_at.insert((c.pid, c.file), r.at);
                        }
                        None if r.proof.found.is_empty() => {
                            unmoved_known.entry(c.pid).or_default().extend(unmoved);
                            partial_at.insert((c.pid, c.file), r.at);
                        }
                        None => {
                            full.insert(c.pid);
                        }
                    }
                    todo.push(c.clone());
                    continue;
                }
                match stale(&self.roots, sample, r, now, opts.exact, faults, &mut placed) {
                    Some(p) => {
                        self.last_rechecked += 1;
                        // A check in place keeps the whole copies only.
                        let ranges =
                            CopyRanges::of(c.file, r.proof.found.iter().filter(|f| f.whole));
                        kept.push((p, ranges));
                    }
                    // A copy found before is gone or changed: search it again now.
                    None => {
                        full.insert(c.pid);
                        todo.push(c.clone());
                    }
                }
            }
        }
        // A process searched in full for one file is searched in full for all of them.
        for (pid, ranges) in unmoved_known {
            if full.contains(&pid) {
                partial_at.retain(|k, _| k.0 != pid);
            } else {
                known.entry(pid).or_default().extend(ranges);
            }
        }
        self.last_moved = partial_at.len();
        let mut fresh = Vec::new();
        // Where each process's memory is, read before its search (or earlier in this
        // snapshot, to see what moved): what appears during the search counts as moved
        // next time (searched then), never as searched.
        let mut placements: std::collections::BTreeMap<i32, Option<Arc<Placement>>> =
            Default::default();
        // Only a long-running engine searches again; a one-shot scan needs none.
        for c in todo.iter().filter(|_| self.cache.is_some()) {
            placements
                .entry(c.pid)
                .or_insert_with(|| placed.current(&self.roots, c.pid));
        }
        for c in &todo {
            run_time(c.pid);
        }
        if !todo.is_empty() {
            let cuts = todo
                .iter()
                .filter_map(|c| self.cut.get(&(c.pid, c.file)).copied());
            let opts = boosted(opts, cuts);
            let pending = pending(sample, todo);
            fresh = crate::dupes::prove::prove_cached(
                &self.roots,
                &pending,
                opts,
                None,
                warnings,
                Some(&mut self.index),
                Some(&known),
            );
        }
        // Keep the searches of processes that are still candidates.
        let candidates: HashSet<(i32, FileKey), foldhash::fast::RandomState> =
            sample.candidates.iter().map(|c| (c.pid, c.file)).collect();
        self.reuse.retain(|k, _| candidates.contains(k));
        self.cut.retain(|k, _| candidates.contains(k));
        for mut p in fresh {
            let (verified, confirmed_bytes) = match carried.remove(&(p.sample.pid, p.sample.file)) {
                Some((k, at, bytes)) => {
                    carry(&mut p, k);
                    self.last_carried += 1;
                    (at, bytes)
                }
                None => (now, p.sample.compared_bytes),
            };
            kept.push((p.sample.clone(), CopyRanges::of(p.sample.file, &p.found)));
            // A process that could not be read at all is tried again next time.
            if p.took.is_zero() {
                continue;
            }
            let key = (p.sample.pid, p.sample.file);
            // Cut by the budget (others took it, or the search needs more: two 1.5 GiB
            // daemons on a loaded 2-core host took 2.3 s of top's 2 s): searched again at
            // the next snapshot with twice the budget, not kept as if whole (its
            // fingerprint would keep the cut proof, and the count a lower bound, for
            // minutes). Cut with twice the budget too, it is kept until its cadence: a
            // process too large for the budget must not take it at every snapshot.
            if by_budget(&p.sample) {
                let n = self.cut.entry(key).or_insert(0);
                *n += 1;
                if *n <= MAX_BOOST {
                    self.reuse.remove(&key);
                    continue;
                }
            }
            self.cut.remove(&key);
            let ran_before = ran.get(&p.sample.pid).copied().flatten();
            let full_took = match partial_at.contains_key(&key) {
                true => self
                    .reuse
                    .get(&key)
                    .map_or(p.took, |r| r.full_took.max(p.took)),
                false => p.took,
            };
            let reads = reads_now(p.sample.pid);
            self.reuse.insert(
                (p.sample.pid, p.sample.file),
                Reused {
                    fingerprint: prints.get(p.sample.pid, p.sample.file),
                    // A search of what moved keeps the time of the last full one.
                    at: partial_at
                        .get(&(p.sample.pid, p.sample.file))
                        .copied()
                        .unwrap_or(now),
                    placement: placements.get(&p.sample.pid).cloned().flatten(),
                    placed_faults: placements
                        .get(&p.sample.pid)
                        .is_some_and(Option::is_some)
                        .then(|| faults_now(p.sample.pid))
                        .flatten(),
                    proof: p,
                    full_took,
                    checked: None,
                    verified,
                    confirmed_bytes,
                    ran: ran_before,
                    reads,
                },
            );
        }
        // In the candidates' order, which is mostly this one already (a steady snapshot's
        // is): each element (a proof and its ranges) moved once at most.
        let by = |p: &ProofSample| (p.file, p.pid);
        if !kept.is_sorted_by_key(|k| by(&k.0)) {
            let mut order: Vec<usize> = (0..kept.len()).collect();
            order.sort_by_key(|&i| by(&kept[i].0));
            let mut slots: Vec<Option<(ProofSample, CopyRanges)>> =
                kept.into_iter().map(Some).collect();
            kept = order.iter().filter_map(|&i| slots[i].take()).collect();
        }
        self.last_placements = placed.reads;
        let (mut proofs, ranges): (Vec<ProofSample>, Vec<CopyRanges>) = kept.into_iter().unzip();
        self.share_out(&mut proofs, &ranges, &prints, now);
        proofs
    }
}

/// The proof of a process whose memory changed since its last full search `r`: the
/// copies found then, checked again in place (no more often than
/// [`RESEARCH_COST_FACTOR`] times as long as the last check took, so that checking costs
/// at most about 1% of a core too); the rest not searched, with the reason. `None` when
/// the check found a copy gone or changed: the process is searched in full now. `faults`:
/// the process's start and faults in this snapshot's stamp; where they are those read
/// before its placement, it has not moved, and where a placement read now says it has not
/// either, they become those ([`Reused::placed_faults`]).
#[allow(clippy::too_many_arguments)]
fn stale(
    roots: &Roots,
    sample: &Sample,
    r: &mut Reused,
    now: Instant,
    exact: bool,
    faults: Option<(u64, u64)>,
    placed: &mut Placed,
) -> Option<ProofSample> {
    use crate::dupes::recheck::Rechecked;
    let fresh = |r: &Reused| {
        let began = Instant::now();
        let result = match crate::dupes::recheck::recheck(roots, sample, &r.proof, exact) {
            Ok(Rechecked::Still(p)) => Ok(p.sample),
            Ok(Rechecked::Changed) => return None,
            Err(e) => Err(e),
        };
        let took = began.elapsed();
        if std::env::var_os("TWOFOLD_PROFILE").is_some() {
            eprintln!(
                "twofold: proof: pid {} checked in place in {:.3} s ({} copies)",
                r.proof.sample.pid,
                took.as_secs_f64(),
                r.proof.found.len()
            );
        }
        Some(Checked {
            at: now,
            took,
            result,
        })
    };
    let quiet = r.quiet(faults);
    let checked = match r.checked.take() {
        Some(c) if now.duration_since(c.at) < c.took * RESEARCH_COST_FACTOR => c,
        _ => fresh(r)?,
    };
    let (searched_ago, cadence) = (now.duration_since(r.at), r.cadence());
    let (pid, file, found) = (
        r.proof.sample.pid,
        r.proof.sample.file,
        !r.proof.found.is_empty(),
    );
    let before = r.proof.sample.unsearched.clone();
    let checked = &*r.checked.insert(checked);
    let ago = now.duration_since(checked.at).as_secs_f64();
    // Said only where the memory moved (below).
    let when = || {
        format!(
            " {:.0} s ago (searched again every {:.0} s while it changes{})",
            searched_ago.as_secs_f64(),
            cadence.as_secs_f64(),
            match (found, ago < 0.5) {
                (false, _) => String::new(),
                (true, true) => "; the copies found then were checked again now".to_string(),
                (true, false) => {
                    format!("; the copies found then were checked again {ago:.0} s ago")
                }
            }
        )
    };
    // Nothing moved (no page faulted in or freed and faulted again since the search
    // began): the memory is where the search saw it, rewritten in place at most, so the
    // search stands and the count stays exact (dupes::moved says what this cannot see).
    let unmoved = match &r.placement {
        Some(_) if quiet => true,
        Some(then) => {
            let unmoved = placed.unmoved(roots, pid, then);
            if unmoved {
                // Unmoved up to a placement read after this stamp: while the stamp's
                // faults stand, it stays so.
                r.placed_faults = faults;
            }
            unmoved
        }
        None => false,
    };
    Some(match &checked.result {
        Ok(p) if unmoved => ProofSample {
            unsearched: before,
            ..p.clone()
        },
        Ok(p) => ProofSample {
            unsearched: Some(Unsearched::changed_since_search(before.as_ref(), &when())),
            ..p.clone()
        },
        Err(e) => ProofSample {
            pid,
            file,
            unsearched: Some(Unsearched::from_error(e.clone())),
            ..ProofSample::default()
        },
    })
}

#[cfg(test)]
#[path = "reuse_tests.rs"]
mod tests;
