//! One scan's worth of reading: which processes, which files of interest, which cgroups.
//!
//! Order of work keeps the cost proportional to what matters: `status`, `maps` and `fd` for
//! every process (cheap), then `smaps_rollup`, `smaps` (only the VMAs of files of interest),
//! `cmdline` and `cgroup` only for processes that hold a file of interest or were asked for.
//! A process that exits mid-scan is counted in `skipped.gone`; one whose private files are
//! refused (another user's, without root or `CAP_SYS_PTRACE`) in `skipped.denied`.
//!
//! The per-process reads of each phase are in [`super::phases`], which files are of
//! interest in [`super::interest`], the candidate copy holders in [`super::candidates`].

use crate::sample::{Warning, WarningKind};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;

use super::cache::ProcCache;
use super::candidates;
use super::cgroup::CgroupReader;
use super::interest::Gatherer;
use super::phases;
use super::{system, Roots};
use crate::sample::Sample;

pub use super::request::Request;

/// The processes whose `smaps_rollup` a collection with [`Request::defer_rollups`] left
/// unread (indices into `sample.processes`).
pub fn deferred_rollups(sample: &Sample) -> Vec<usize> {
    sample
        .processes
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            p.rollup.is_none()
                && p.mappings.is_empty()
                && !p.kernel_thread
                && p.unreadable.is_none()
        })
        .map(|(i, _)| i)
        .collect()
}

/// Reads the rollups [`deferred_rollups`] names (to run beside the proof).
pub fn read_rollups(
    roots: &Roots,
    sample: &Sample,
    which: &[usize],
) -> Vec<super::error::Result<Option<crate::sample::RollupSample>>> {
    let procs = super::process::ProcReader::new(&roots.proc);
    let pids: Vec<i32> = which.iter().map(|&i| sample.processes[i].pid).collect();
    super::par_map(&pids, |&pid| procs.rollup(pid))
}

/// Puts the rollups read by [`read_rollups`] in place; a refused one marks its process
/// unreadable (its PSS unknown), one that exited meanwhile leaves it unknown.
pub fn fill_rollups(
    sample: &mut Sample,
    which: &[usize],
    read: Vec<super::error::Result<Option<crate::sample::RollupSample>>>,
) {
    for (&i, r) in which.iter().zip(read) {
        let p = &mut sample.processes[i];
        match r {
            Ok(r) => p.rollup = r,
            Err(e) if e.is_denied() => {
                p.unreadable = Some(crate::sample::Unreadable::Denied);
                sample.skipped.denied += 1;
            }
            Err(_) => {}
        }
    }
}

/// Reads everything a scan needs. Errors are for bad input (a missing path, an unknown
/// pid, an unreadable procfs root); a process's trouble is counted, never fatal.
pub fn gather(roots: &Roots, req: &Request, warnings: &mut Vec<Warning>) -> anyhow::Result<Sample> {
    gather_cached(roots, req, warnings, None)
}

/// [`gather`], reusing what `cache` kept of processes that did not change since the last
/// call (see [`super::cache`]); a long-lived engine passes the same cache every time.
pub fn gather_cached(
    roots: &Roots,
    req: &Request,
    warnings: &mut Vec<Warning>,
    mut cache: Option<&mut ProcCache>,
) -> anyhow::Result<Sample> {
    let profile = std::env::var_os("TWOFOLD_PROFILE").is_some();
    let mut clock = Instant::now();
    let mut lap = |what: &str| {
        if profile {
            eprintln!(
                "gather: {what}: {:.1} ms",
                clock.elapsed().as_secs_f64() * 1e3
            );
        }
        clock = Instant::now();
    };
    let mut sample = Sample {
        system: system::read(&roots.proc)?,
        privilege: super::access::privilege(&roots.proc),
        ..Sample::default()
    };
    let policy = sample.privilege.is_some_and(|p| p.reads_any());
    let mut g = Gatherer::new(roots, req, warnings);
    // What an engine found not of interest before, trusted for its maximum age.
    if let Some(c) = cache.as_deref_mut() {
        c.decisions.expire(Instant::now());
        (g.decisions, g.walks) = c.lend();
    }
    g.add_explicit_paths(cache.is_some(), cache.as_deref().map(|c| &c.held))?;
    if req.stores {
        g.add_store_files();
    }
    g.seal_preset();

    let cgroups = CgroupReader::new(&roots.cgroup);
    let only_cgroup = match &req.cgroup {
        Some(p) => Some(
            cgroups
                .resolve(p)
                .with_context(|| format!("no memory cgroup at '{}'", p.display()))?
                .1,
        ),
        None => None,
    };

    // Named processes without named files (`scan --pid P`): every process is read (phase
    // 1 is cheap) to learn the host's files of interest, since P may hold a copy of a file
    // it read and closed; only the named ones are kept.
    let asked: Option<HashSet<i32>> =
        (!req.pids.is_empty()).then(|| req.pids.iter().copied().collect());
    let host_wide = g.host_wide();
    // A live engine's stamps of every process, in one read where the task iterator loads:
    // the processes listed from them, not from `/proc` ([`super::taskview`]).
    if let Some(c) = cache.as_deref_mut() {
        c.tasks.read(&roots.proc);
    }
    let listed = cache
        .as_deref()
        .and_then(|c| c.tasks.now())
        .map(|t| t.pids());
    let pids = if req.pids.is_empty() {
        match listed {
            Some(pids) => pids,
            None => g.procs.pids()?,
        }
    } else {
        for pid in &req.pids {
            crate::input::check_pid(&roots.proc, *pid)?;
        }
        let mut pids = req.pids.clone();
        if host_wide {
            let named: HashSet<i32> = pids.iter().copied().collect();
            let all = match listed {
                Some(pids) => pids,
                None => g.procs.pids()?,
            };
            pids.extend(all.into_iter().filter(|p| !named.contains(p)));
        }
        pids
    };
    let is_asked = |pid: &i32| asked.as_ref().is_none_or(|a| a.contains(pid));

    lap("setup");
    // Phase 1, in parallel: status, maps and fds of every process (cheap).
    let procs = g.procs.clone();
    if let Some(c) = cache.as_deref_mut() {
        c.begin();
    }
    let view = cache.as_deref();
    // The unchanged on this thread, the rest (new, moved) on every core.
    let quick: Vec<_> = pids
        .iter()
        .map(|pid| phases::read_basic_quick(&procs, *pid, only_cgroup.as_ref(), view))
        .collect();
    let slow: Vec<i32> = pids
        .iter()
        .zip(&quick)
        .filter_map(|(pid, q)| q.is_none().then_some(*pid))
        .collect();
    let mut slow = super::par_map(&slow, |pid| {
        phases::read_basic(&procs, *pid, only_cgroup.as_ref(), view)
    })
    .into_iter();
    let basics = quick
        .into_iter()
        .map(|q| q.or_else(|| slow.next()).expect("one read per process"));
    let basics: Vec<_> = pids
        .iter()
        .zip(basics)
        .map(|(pid, (basic, stamp, opened))| {
            if let (Some(c), Some((stat, read))) = (cache.as_deref_mut(), stamp) {
                c.put_basic(*pid, stat, read);
                if let Some(f) = opened {
                    c.statm_files.keep(*pid, f);
                }
            }
            basic
        })
        .collect();
    if let Some(c) = cache.as_deref_mut() {
        c.stats.statm_skipped = c.tasks.statm_skipped.load(Ordering::Relaxed);
    }
    lap("phase 1 (status, maps, fds)");
    // Phase 2: which files are of interest (a stat per new file, cached), which
    // processes to keep.
    let mut kept = Vec::new();
    let mut others = Vec::new();
    for (pid, basic) in pids.iter().zip(basics) {
        if !is_asked(pid) {
            // Another process of the host: only what it maps, holds or names counts.
            if let Ok(Some(b)) = basic {
                let _ = g.admit(*pid, b);
            }
            continue;
        }
        match basic {
            Ok(Some(b)) => {
                // Counted whether it is kept or not: whether another user's process
                // maps or holds a file of interest is unknown, never "no".
                if b.parts.denied {
                    sample.skipped.denied += 1;
                }
                match g.admit(*pid, b) {
                    Ok(k) => kept.push(k),
                    Err(Some(other)) => others.push(other),
                    Err(None) => {}
                }
            }
            Ok(None) => {}
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(unreadable(e)),
        }
    }
    // Processes holding nothing that could still hold a copy (read, then closed).
    if req.candidates {
        let sizes = g.interest_sizes();
        for mut p in others {
            p.rchar_bytes = cache.as_deref().and_then(|c| c.rchar(p.pid));
            let could = req.gpu_pids.contains(&p.pid)
                || candidates::could_hold_any(&procs, &mut p, &sizes, &g.named);
            if let Some(c) = cache.as_deref_mut() {
                c.put_rchar(p.pid, p.rchar_bytes);
            }
            if could {
                // A candidate's `rchar` is read afresh (below): its proof's fingerprint.
                p.rchar_bytes = None;
                kept.push((p, HashSet::new()));
            }
        }
    }
    lap("phase 2 (files of interest)");
    // Phase 3, in parallel: smaps (or smaps_rollup), cmdline and cgroup of the kept ones.
    // Other twofolds' fault counters around phase 3: a read made while one of them could
    // have mapped a file's pages is used now, never kept ([`super::quiet::Quiet`]).
    let mut quiet = None;
    if let Some(c) = cache.as_deref_mut() {
        c.end_basic(kept.iter().map(|(p, w)| (p.pid, w)));
        c.sees_host = req.cgroup.is_none() && (req.pids.is_empty() || host_wide);
        let own = procs.own_pid();
        let others: Vec<i32> = g.observers.iter().copied().filter(|p| *p != own).collect();
        let mapping = others.iter().any(|o| {
            c.parts(*o).is_some_and(|b| {
                b.mapped_keys()
                    .any(|k| kept.iter().any(|(_, w)| w.contains(&k)))
            })
        });
        quiet = Some(super::quiet::Quiet::before(procs.root(), &others, mapping));
    }
    let view = cache.as_deref();
    // A cache keeps details whole, so only a one-shot collection defers rollups.
    let defer = req.defer_rollups && view.is_none();
    // A process that moved reads `smaps` again unless its mappings of the files of
    // interest stand page by page ([`super::cache::PageState`]): `smaps_rollup` then.
    let details = super::par_map(&kept, |k| {
        let pid = k.0.pid;
        if let Some(d) = view.and_then(|c| c.detail(pid, &k.1)) {
            return (Ok(phases::reuse_detail(&k.0, &d)), None);
        }
        let parts = view.and_then(|c| c.parts(pid));
        let pages = parts.and_then(|b| phases::page_state(&procs, &k.0, &b.maps, &k.1));
        let kept = view.and_then(|c| c.detail_if_pages_stand(pid, &k.1));
        if let Some(d) = phases::detail_if_pages_stand(&procs, pid, kept, pages.as_ref()) {
            return (Ok(phases::reuse_detail(&k.0, &d)), Some((d, false)));
        }
        let began = Instant::now();
        let r = phases::read_detail(&procs, k, defer);
        let d = r.as_ref().ok().map(|(p, _)| super::cache::Detail {
            pages,
            took: began.elapsed(),
            ..phases::detail_of(p, &k.1)
        });
        (r, d.map(|d| (d, true)))
    });
    let tainted = quiet.is_some_and(|q| !q.held(procs.root()));
    let details: Vec<_> = kept
        .iter()
        .zip(details)
        .map(|(k, (r, mut d))| {
            if let (Some(c), true) = (cache.as_deref_mut(), r.is_ok()) {
                if let Some((d, _)) = d.as_mut().filter(|_| tainted) {
                    d.tainted = true;
                    c.stats.tainted += 1;
                }
                match d {
                    Some((d, false)) => c.put_detail_pages(k.0.pid, d),
                    Some((d, true)) => c.put_detail(k.0.pid, Some(d)),
                    None => c.put_detail(k.0.pid, None),
                }
            }
            r
        })
        .collect();
    lap("phase 3 (smaps, cgroup)");
    if profile {
        if let Some(c) = cache.as_deref() {
            eprintln!("gather: cache: {:?}", c.stats);
        }
    }
    for detail in details {
        match detail {
            Ok((p, newly_denied)) => {
                if newly_denied {
                    sample.skipped.denied += 1;
                }
                sample.processes.push(p)
            }
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(unreadable(e)),
        }
    }
    if sample.skipped.denied > 0 && policy {
        g.warnings.push(Warning::host(WarningKind::ProcessesDenied, format!(
            "{} could not be read fully: their smaps, maps or fds were {}; whether they map or hold the files is unknown",
            crate::units::count(sample.skipped.denied as u64, "process", "processes"),
            super::access::POLICY
        )));
    } else if sample.skipped.denied > 0 {
        g.warnings.push(Warning::host(WarningKind::ProcessesDenied, format!(
            "{} could not be read fully (their smaps, maps or fds need root or CAP_SYS_PTRACE): whether they map or hold the files, and their PSS, are unknown",
            crate::units::count(sample.skipped.denied as u64, "process", "processes")
        )));
    }

    let sizes = g.interest_sizes();
    if req.candidates {
        // The processes kept read `rchar` afresh: it is in their proofs' fingerprints (a
        // read() into memory already resident moves it and nothing in `stat`).
        let (io, tasks) = match cache.as_deref_mut() {
            Some(c) => (Some(&mut c.io_files), c.tasks.now()),
            None => (None, None),
        };
        candidates::add_to(&procs, &mut sample, &sizes, &g.named, policy, io, tasks);
        if let Some(c) = cache.as_deref_mut() {
            for p in &sample.processes {
                c.put_rchar(p.pid, p.rchar_bytes);
            }
        }
        sample.named = g.named.iter().copied().collect();
        sample.named.sort_unstable();
    }
    lap("candidates (rchar)");
    g.observers.sort_unstable();
    sample.observers = std::mem::take(&mut g.observers);
    let held = match cache {
        Some(c) => {
            c.decisions = std::mem::take(&mut g.decisions);
            c.walks = std::mem::take(&mut g.walks);
            let t = Instant::now();
            let pages = match c.held.want_pages() {
                true => c.tasks.held_pages(),
                false => None,
            };
            c.held.begin(pages, t.elapsed());
            Some(&mut c.held)
        }
        None => None,
    };
    sample.files = match held {
        Some(h) => {
            let files = g.files(&sample, Some(&mut *h));
            h.end();
            files
        }
        None => g.files(&sample, None),
    };
    if host_wide {
        sample.host_files = Some(crate::sample::HostFiles {
            considered: g.considered,
            left_out: g.considered - sample.files.len() as u64,
        });
    }
    lap("files (residency)");
    sample.cgroups = phases::read_cgroups(&cgroups, &sample.processes, only_cgroup, g.warnings);
    lap("cgroups");
    Ok(sample)
}

/// A private copy is looked for only where it could be most of the file: private
/// anonymous memory at least this fraction of the file's size (the model's policy).
pub use crate::model::SUSPECT_FRACTION as COPY_FRACTION;

/// A process that could not be read for a reason other than denial or exit. Its sentence
/// (which names the pid and the file) is its subject too: two such processes are two
/// warnings.
fn unreadable(e: super::error::CollectError) -> Warning {
    let text = format!("{:#}", anyhow::Error::from(e));
    Warning::new(WarningKind::ProcessUnreadable, text.clone(), text)
}

/// `scan --pid P` without named files, after the proof: the host's files that P neither
/// maps, holds nor names and in which every search of P found nothing are left out (and
/// counted in [`crate::sample::HostFiles::left_out`]). A file whose search of P did not
/// finish, or that was not searched, stays: P may hold a copy of it.
pub fn keep_related(sample: &mut Sample) {
    let Some(host) = sample.host_files.as_mut() else {
        return;
    };
    let refs = crate::sample::referrers(&sample.processes);
    let related = |k: &crate::sample::FileKey| {
        refs.contains_key(k)
            || sample.named.iter().any(|(_, f)| f == k)
            || sample.candidates.iter().any(|c| {
                c.file == *k
                    && sample
                        .proofs
                        .iter()
                        .find(|p| p.pid == c.pid && p.file == *k)
                        .is_none_or(|p| {
                            p.unsearched.is_some()
                                || p.copy_memory_bytes > 0
                                || p.cow_file_bytes > 0
                                || !p.shmem_files.is_empty()
                        })
            })
    };
    let keep: HashSet<crate::sample::FileKey> = sample
        .files
        .iter()
        .map(|f| f.key)
        .filter(|k| related(k))
        .collect();
    host.left_out += (sample.files.len() - keep.len()) as u64;
    sample.files.retain(|f| keep.contains(&f.key));
    sample.candidates.retain(|c| keep.contains(&c.file));
    sample.proofs.retain(|p| keep.contains(&p.file));
}
