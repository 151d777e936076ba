//! The count of a long-lived engine (what `top`, `serve` and `record` run) against the
//! same ground truth: a proof reused while nothing changed, a large copy kept through a
//! search again, a copier whose memory only changes in place.

use super::*;

#[test]
fn a_long_lived_engine_reuses_a_proof_while_nothing_changed() {
    let _group = crate::common::group(super::GROUP);
    if !require(is_root(), "root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = model(dir.path(), 9);
    let (mut copier, mut engine) = copier_engine(&path);
    let mut w = Vec::new();
    let first = engine.snapshot(&mut w).unwrap();
    assert_eq!(engine.last_reused, 0);
    let second = engine.snapshot(&mut w).unwrap();
    assert_eq!(
        engine.last_reused, 1,
        "the unchanged copier's proof is reused"
    );
    assert_eq!(first.sample.proofs, second.sample.proofs);
    let f = twofold::engine::report(&second, Some(&first));
    let fm = f.files.iter().find(|x| Path::new(&x.path) == path).unwrap();
    assert_count(fm, 2.0);

    // Past its search's safety net (a minute, or a thousand times the search's time: at
    // most RESEARCH_MAX), unchanged and not run since (it sleeps on its stdin): nothing
    // of its own wrote its memory, its search stands.
    let net = twofold::engine::RESEARCH_MAX;
    engine.backdate_searches(net, twofold::engine::REPROVE_AFTER);
    let idle = engine.snapshot(&mut w).unwrap();
    assert_eq!((engine.last_reused, engine.last_slept), (1, 1));
    assert_eq!(first.sample.proofs, idle.sample.proofs);
    // It runs (a line on its stdin), and past the safety net it is searched again (for a
    // copy written over pages it had) in full: its 24 MiB copy was confirmed with fewer
    // bytes than a check in place takes.
    wake(&mut copier);
    engine.backdate_searches(net, twofold::engine::REPROVE_AFTER);
    let third = engine.snapshot(&mut w).unwrap();
    assert_eq!((engine.last_reused, engine.last_carried), (0, 0));
    assert_eq!(first.sample.proofs, third.sample.proofs);
}

/// Makes a copier that sleeps on its stdin run (a line to read), and waits until its run
/// time moved.
fn wake(c: &mut Reader) {
    let pid = c.pid();
    let ran = || twofold::collect::statfiles::run_time_ns(Path::new("/proc"), pid);
    let before = ran();
    c.say("run").unwrap();
    let t = std::time::Instant::now();
    while ran() == before && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_ne!(ran(), before, "the copier ran");
}

/// A reader that copies `path` and closes it, and a long-lived engine watching both (its
/// proof without a time budget: a loaded machine never cuts a search short here).
fn copier_engine(path: &Path) -> (Reader, twofold::engine::Engine) {
    let c = reader("copy", Some(path), &["--close"]);
    touch_cache(path);
    let req = twofold::collect::gather::Request {
        paths: vec![path.to_path_buf()],
        pids: vec![c.pid()],
        ..Default::default()
    };
    let prove = twofold::dupes::prove::ProveOptions {
        budget: None,
        exact: false,
    };
    (c, twofold::engine::Engine::new(req, Some(prove)))
}

/// A reader of a 256 MiB model, unchanged: minutes on it is searched again, the copy
/// found before checked in place and kept (confirming it again would compare more), its
/// count the full search's; much later the copy is confirmed in full again.
#[test]
fn a_large_copy_is_kept_through_a_search_again_and_confirmed_in_full_later() {
    let _group = crate::common::group(super::GROUP);
    if !require(is_root(), "root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = crate::common::model_file(dir.path(), "large.gguf", 256 << 20);
    let (c, mut engine) = copier_engine(&path);
    let mut w = Vec::new();
    let pid = c.pid();
    let proof = |s: &twofold::engine::Snapshot| {
        s.sample
            .proofs
            .iter()
            .find(|p| p.pid == pid)
            .cloned()
            .unwrap()
    };
    let first = engine.snapshot(&mut w).unwrap();
    let p1 = proof(&first);
    assert!(p1.unsearched.is_none(), "{:?}", p1.unsearched);
    assert_eq!(p1.identical_file_bytes, 256 << 20);
    // Past the search's cadence (a hundred times its time, at most RESEARCH_MAX), its
    // copy confirmed just now.
    let cadence = twofold::engine::RESEARCH_MAX;
    // As if the copier had run since (it sleeps on its stdin: not searched again else).
    engine.forget_run_times();
    engine.backdate_searches(cadence, Duration::ZERO);
    let second = engine.snapshot(&mut w).unwrap();
    assert_eq!((engine.last_reused, engine.last_carried), (0, 1));
    let p2 = proof(&second);
    assert_eq!(
        (p2.identical_file_bytes, p2.copies, p2.copy_memory_bytes),
        (p1.identical_file_bytes, p1.copies, p1.copy_memory_bytes),
        "the kept copy counts as the full search's did"
    );
    assert!(p2.unsearched.is_none(), "{:?}", p2.unsearched);
    assert!(
        p2.compared_bytes < p1.compared_bytes,
        "compared {} bytes keeping the copy, {} confirming it",
        p2.compared_bytes,
        p1.compared_bytes
    );
    let f = twofold::engine::report(&second, Some(&first));
    assert_count(
        f.files.iter().find(|x| Path::new(&x.path) == path).unwrap(),
        2.0,
    );
    // Past the cadence again: kept again (a search again that kept it compared the spot
    // pages only; what decides is what confirming the copy in full compared).
    engine.forget_run_times();
    engine.backdate_searches(cadence, Duration::ZERO);
    let again = engine.snapshot(&mut w).unwrap();
    assert_eq!((engine.last_reused, engine.last_carried), (0, 1));
    assert_eq!(proof(&again).identical_file_bytes, 256 << 20);
    assert!(proof(&again).compared_bytes < p1.compared_bytes);
    // Past the cadence again, the copy confirmed longer ago than ten cadences.
    engine.backdate_searches(cadence, 11 * cadence);
    let third = engine.snapshot(&mut w).unwrap();
    assert_eq!((engine.last_reused, engine.last_carried), (0, 0));
    assert_eq!(proof(&third).compared_bytes, p1.compared_bytes);
    assert_eq!(proof(&third).identical_file_bytes, 256 << 20);
}

/// A copier that keeps doing I/O (its rchar grows, so its fingerprint changes at every
/// snapshot) and rewrites 32 MiB in place, faulting nothing in: between full searches the
/// count stays exact (2, not a lower bound). A copier that touches new memory instead is
/// a lower bound until its next full search (live.rs,
/// `a_changing_copier_is_checked_in_place_between_full_searches`).
#[test]
fn a_copier_whose_memory_only_changes_in_place_keeps_an_exact_count() {
    let _group = crate::common::group(super::GROUP);
    if !require(
        is_root(),
        "root (to search other processes' memory and read frames)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = model(dir.path(), 11);
    let c = reader(
        "copy",
        Some(&path),
        &["--close", "--bytes", "32M", "--io-loop"],
    );
    touch_cache(&path);
    let req = twofold::collect::gather::Request {
        paths: vec![path.clone()],
        pids: vec![c.pid()],
        ..Default::default()
    };
    let mut engine = twofold::engine::Engine::new(req, Some(Default::default()))
        .incremental(std::time::Duration::from_secs(60));
    let mut w = Vec::new();
    let mut prev = engine.snapshot(&mut w).unwrap();
    let f = |snap: &twofold::engine::Snapshot, prev: &twofold::engine::Snapshot| {
        let r = twofold::engine::report(snap, Some(prev));
        r.files
            .into_iter()
            .find(|x| Path::new(&x.path) == path)
            .unwrap()
    };
    let first = f(&prev, &prev);
    assert_count(&first, 2.0);
    assert!(!first.representations.lower_bound);
    let rchar = |pid: i32| {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("rchar: "))
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    // Within the cadence (5 s at least): each snapshot sees a changed fingerprint.
    for _ in 0..3 {
        let before = rchar(c.pid());
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert!(rchar(c.pid()) > before, "the child does I/O");
        let snap = engine.snapshot(&mut w).unwrap();
        assert_eq!(engine.last_reused, 0, "the fingerprint changed");
        let fm = f(&snap, &prev);
        assert_count(&fm, 2.0);
        assert!(
            !fm.representations.lower_bound,
            "unmoved memory keeps the search: {:?}",
            snap.sample.proofs
        );
        prev = snap;
    }
}
