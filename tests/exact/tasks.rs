//! A live engine with the task iterator (`collect::taskview`): a process none of whose
//! threads ran since the last snapshot is taken as unchanged without a `statm` read and
//! shows what `/proc` shows; one that ran and freed fewer pages than the kernel's per-CPU
//! batch of its resident counters (which the iterator's global parts may not show) is read
//! again at the next snapshot, and its `RssAnon` is `/proc`'s exactly.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use crate::common::*;
use twofold::collect::gather::Request;
use twofold::engine::Engine;

/// Grows by 4 MiB, then on each line frees 16 more of its pages (64 KiB) and says `done`.
const SHRINKER: &str = r#"
import mmap, sys
m = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, 4 << 20, 4096):
    m[i] = 1
print("ready"); sys.stdout.flush()
at = 0
for line in sys.stdin:
    m.madvise(mmap.MADV_DONTNEED, at, 16 * 4096)
    at += 16 * 4096
    print("done"); sys.stdout.flush()
"#;

fn anon_of(s: &twofold::sample::Sample, pid: i32) -> Option<u64> {
    s.processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.status.rss_anon_bytes)
}

fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .contains(") T ")
}

#[test]
fn a_process_that_did_not_run_is_not_read_and_one_that_freed_a_few_pages_is() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (the task iterator is a BPF program)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 8 * MIB);
    let idle = reader("copy", Some(&file), &[]);
    let (mut shrinker, spid) = python_ready(SHRINKER, &[]);
    let ipid = idle.pid();
    let p = nix::unistd::Pid::from_raw(ipid);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
    while !stopped(ipid) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![ipid, spid],
        ..Request::default()
    };
    let mut engine = Engine::new(req, None)
        .incremental(Duration::from_secs(3600))
        .task_iterator(true);
    let mut w = Vec::new();
    engine.snapshot(&mut w).unwrap();
    let s = engine.snapshot(&mut w).unwrap().sample;
    let stats = engine.cache_stats().unwrap();
    assert!(
        stats.statm_skipped >= 1,
        "the stopped reader's statm was read: {stats:?}"
    );
    assert_eq!(anon_of(&s, ipid), Some(status_bytes(ipid, "RssAnon")));
    let mut out = BufReader::new(shrinker.stdout.take().unwrap());
    for round in 1..=3 {
        let stdin = shrinker.stdin.as_mut().unwrap();
        stdin.write_all(b"x\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
        let s = engine.snapshot(&mut w).unwrap().sample;
        // It waits on its stdin now: its memory stands still until the next line.
        assert_eq!(
            anon_of(&s, spid),
            Some(status_bytes(spid, "RssAnon")),
            "round {round}: 64 KiB freed"
        );
        assert_eq!(anon_of(&s, ipid), Some(status_bytes(ipid, "RssAnon")));
    }
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGCONT).unwrap();
    drop(shrinker.stdin.take());
    let _ = shrinker.wait();
}

/// Answers `done` to each line it reads; runs only then.
const ECHO: &str = r#"
import sys
print("ready"); sys.stdout.flush()
for line in sys.stdin:
    print("done"); sys.stdout.flush()
"#;

/// A process none of whose threads ran since its entry was read is not read again at its
/// maximum age but at three times it (`collect::cache::fresh`); one that ran is read again
/// at its maximum age, as without the task iterator.
#[test]
fn an_idle_process_is_read_again_at_three_times_its_maximum_age_one_that_ran_at_it() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (the task iterator is a BPF program)") {
        return;
    }
    let age = Duration::from_secs(2);
    let engine_of = |pid: i32| {
        let req = Request {
            pids: vec![pid],
            ..Request::default()
        };
        Engine::new(req, None).incremental(age).task_iterator(true)
    };
    let mut w = Vec::new();
    // Stopped: it cannot run.
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", MIB);
    let idle = reader("copy", Some(&file), &[]);
    let ipid = idle.pid();
    let p = nix::unistd::Pid::from_raw(ipid);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
    while !stopped(ipid) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut engine = engine_of(ipid);
    engine.snapshot(&mut w).unwrap();
    // Its entry was read before this.
    let t0 = std::time::Instant::now();
    assert_eq!(engine.cache_stats().unwrap().full_read, 1);
    std::thread::sleep(age + Duration::from_millis(100));
    let s = engine.snapshot(&mut w).unwrap().sample;
    let stats = engine.cache_stats().unwrap();
    assert_eq!(stats.full_read, 0, "idle past its age, not read: {stats:?}");
    assert_eq!(anon_of(&s, ipid), Some(status_bytes(ipid, "RssAnon")));
    std::thread::sleep((age * 3 + Duration::from_millis(100)).saturating_sub(t0.elapsed()));
    engine.snapshot(&mut w).unwrap();
    let stats = engine.cache_stats().unwrap();
    assert_eq!(stats.full_read, 1, "past three times its age: {stats:?}");
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGCONT).unwrap();

    // It ran (answered a line) after its entry was read: read again at its age.
    let (mut echo, epid) = python_ready(ECHO, &[]);
    let mut out = BufReader::new(echo.stdout.take().unwrap());
    let mut engine = engine_of(epid);
    engine.snapshot(&mut w).unwrap();
    std::thread::sleep(age + Duration::from_millis(100));
    let stdin = echo.stdin.as_mut().unwrap();
    stdin.write_all(b"x\n").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done");
    engine.snapshot(&mut w).unwrap();
    let stats = engine.cache_stats().unwrap();
    assert_eq!(
        stats.full_read, 1,
        "it ran: read again at its age: {stats:?}"
    );
    drop(echo.stdin.take());
    let _ = echo.wait();
}
