use std::collections::BTreeMap;

use super::*;
use crate::model::findings::Severity;

fn key(inode: u64) -> FileKey {
    FileKey {
        major: 254,
        minor: 0,
        inode,
    }
}

fn sample(at: f64, faults: u64, added: u64, read: u64) -> TraceSample {
    let mut s = TraceSample {
        at_secs: at,
        ..TraceSample::default()
    };
    s.pids.insert(
        42,
        PidCounters {
            faults_by_code: [faults, 0, faults, 1],
            reclaim_ns: 20_000_000 * (at as u64),
            direct_reclaims: at as u64,
            ..PidCounters::default()
        },
    );
    s.files.insert(
        key(7),
        FileCounters {
            added_pages: added,
            evicted_pages: added / 2,
            refault_pages: added / 4,
            file_faults: faults / 10,
            ..FileCounters::default()
        },
    );
    s.io.insert(
        (42, key(7)),
        IoCounters {
            read_bytes: read,
            read_calls: 3,
            comm: "loader".into(),
            ..IoCounters::default()
        },
    );
    s
}

fn ctx() -> TraceContext {
    TraceContext {
        paths: BTreeMap::from([(key(7), "/m/model.gguf".to_string())]),
        interest: [key(7)].into(),
        sizes: BTreeMap::from([(key(7), 1 << 30)]),
        top: 10,
        ..TraceContext::default()
    }
}

#[test]
fn rates_are_differences_over_elapsed_time() {
    let prev = sample(1.0, 100, 1000, 1 << 20);
    let cur = sample(3.0, 300, 5000, 5 << 20);
    let m = TraceModel::new(&cur, Some(&prev), &ctx());
    assert_eq!(m.interval_secs, 2.0);
    let p = &m.processes[0];
    assert_eq!(p.pid, 42);
    assert_eq!(
        p.comm.as_deref(),
        Some("loader"),
        "comm from the read counters"
    );
    // faults = by_code sum: 2*faults + 1.
    assert_eq!(p.total.faults, Some(601));
    assert_eq!(p.delta.faults, Some(400));
    assert_eq!(p.faults_per_sec, Some(200.0));
    assert_eq!(p.write_faults_per_sec, Some(100.0));
    assert_eq!(p.read_bytes_per_sec, Some(2.0 * 1048576.0));
    assert_eq!(p.reclaim_ms_per_sec, Some(20.0));
    let f = &m.files[0];
    assert_eq!(f.path.as_deref(), Some("/m/model.gguf"));
    assert_eq!(f.device, "254:0");
    assert_eq!(f.added_pages_per_sec, Some(2000.0));
    assert_eq!(f.evicted_pages_per_sec, Some(1000.0));
    assert_eq!(f.refault_pages_per_sec, Some(500.0));
    assert_eq!(f.total.read_bytes, Some(5 << 20));
    assert_eq!(f.delta.read_bytes, Some(4 << 20));
}

#[test]
fn without_previous_sample_rates_are_since_attach() {
    let cur = sample(2.0, 100, 1000, 0);
    let m = TraceModel::new(&cur, None, &ctx());
    assert_eq!(m.processes[0].faults_per_sec, Some(100.5));
    assert_eq!(m.files[0].added_pages_per_sec, Some(500.0));
}

#[test]
fn a_counter_that_went_down_restarted() {
    // An LRU entry evicted and created again: count from zero, never negative.
    let prev = sample(1.0, 500, 1000, 0);
    let cur = sample(2.0, 100, 1000, 0);
    let m = TraceModel::new(&cur, Some(&prev), &ctx());
    assert_eq!(m.processes[0].delta.faults, Some(201));
}

#[test]
fn unavailable_counters_are_unknown_not_zero() {
    let mut cur = sample(2.0, 100, 1000, 0);
    cur.unavailable
        .insert(Counter::PageCacheEvictions, "tracepoint missing".into());
    let m = TraceModel::new(&cur, None, &ctx());
    let f = &m.files[0];
    assert_eq!(f.evicted_pages_per_sec, None);
    assert_eq!(f.refault_pages_per_sec, None, "refaults need evictions");
    assert_eq!(f.added_pages_per_sec, Some(500.0));
    let json = serde_json::to_value(&m).unwrap();
    assert!(json["files"][0]["evicted_pages_per_sec"].is_null());
    assert_eq!(
        json["unavailable"]["page_cache_evictions"],
        "tracepoint missing"
    );
}

#[test]
fn idle_files_of_interest_are_listed_others_only_when_active() {
    let mut cur = sample(1.0, 0, 0, 0);
    cur.files.insert(key(8), FileCounters::default());
    cur.files.insert(
        key(9),
        FileCounters {
            added_pages: 3,
            ..FileCounters::default()
        },
    );
    let m = TraceModel::new(&cur, Some(&cur.clone()), &ctx());
    let inodes: Vec<u64> = m.files.iter().map(|f| f.inode).collect();
    assert_eq!(inodes, [7], "idle others are dropped");
    let m = TraceModel::new(&cur, None, &ctx());
    let inodes: Vec<u64> = m.files.iter().map(|f| f.inode).collect();
    assert_eq!(inodes, [7, 9]);
}

#[test]
fn pid_filter_keeps_asked_processes_even_idle() {
    let cur = sample(1.0, 0, 0, 0);
    let c = TraceContext {
        pids: vec![42, 43],
        ..ctx()
    };
    let m = TraceModel::new(&cur, None, &c);
    let pids: Vec<i32> = m.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [42, 43]);
    assert_eq!(m.processes[1].total.faults, Some(0));
}

#[test]
fn findings_name_the_copying_loader_thrashing_reclaim_and_oom() {
    let mut cur = sample(10.0, 100, 4096, 900 << 20);
    cur.oom_kills.push(OomKill {
        pid: 99,
        comm: "hog".into(),
        uid: 0,
        killer_pid: 99,
        total_vm_bytes: 1 << 30,
        anon_rss_bytes: 1 << 29,
        file_rss_bytes: 0,
        shmem_rss_bytes: 0,
        at_secs: 3.0,
    });
    let m = TraceModel::new(&cur, None, &ctx());
    let f = findings::evaluate(&m, &ctx());
    let codes: Vec<&str> = f.iter().map(|f| f.code.as_str()).collect();
    assert_eq!(
        codes,
        ["read-copy", "oom-kill", "direct-reclaim", "refaults"]
    );
    assert_eq!(
        f[0].message(),
        "pid 42 (loader) read 900.0 MiB of 'model.gguf' with read() in 10.0 s: a copying loader"
    );
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(
        f[2].message()
            .contains("stalled 200 ms in direct reclaim (10 reclaims"),
        "{}",
        f[2].message()
    );
    assert!(
        f[3].message().contains("4.0 MiB evicted and read back"),
        "{}",
        f[3].message()
    );
}

/// A reader folded away between two samples (it exited): its reads move from `io` to
/// `exited_read_bytes`; the file's total stays, its rate counts only new reads, and the
/// process is no longer a row.
#[test]
fn reads_of_exited_processes_stay_in_the_file_total() {
    let prev = sample(1.0, 100, 1000, 4 << 20);
    let mut cur = sample(3.0, 100, 1000, 0);
    cur.io.clear();
    cur.pids.clear();
    cur.exited_read_bytes.insert(key(7), 4 << 20);
    cur.io.insert(
        (43, key(7)),
        IoCounters {
            read_bytes: 2 << 20,
            ..IoCounters::default()
        },
    );
    let m = TraceModel::new(&cur, Some(&prev), &ctx());
    let f = m.files.iter().find(|f| f.key == key(7)).unwrap();
    assert_eq!(f.total.read_bytes, Some(6 << 20));
    assert_eq!(f.delta.read_bytes, Some(2 << 20));
    assert_eq!(f.read_bytes_per_sec, Some((2 << 20) as f64 / 2.0));
    assert!(m.processes.iter().all(|p| p.pid != 42));
    assert!(m.processes.iter().any(|p| p.pid == 43));
}

/// What a collector names ([`shown`]) is exactly what the two models it used to build (the
/// window since the last sample, and since the attach) show, the top cut included.
#[test]
fn shown_names_every_row_of_both_windows_and_no_other() {
    let prev = sample(1.0, 10, 10, 100);
    let mut cur = sample(2.0, 20, 20, 200);
    // 30 other files: 5 active in the window, 20 active only before it, 5 idle.
    for i in 0..30u64 {
        let before = if (5..25).contains(&i) { 4 } else { 0 };
        let now = if i < 5 { 1 + i } else { before };
        let c = |added| FileCounters {
            added_pages: added,
            ..FileCounters::default()
        };
        cur.files.insert(key(100 + i), c(now));
    }
    let mut p = prev.clone();
    for i in 5..25u64 {
        p.files.insert(
            key(100 + i),
            FileCounters {
                added_pages: 4,
                ..FileCounters::default()
            },
        );
    }
    // A second process reading another file.
    cur.pids.insert(43, PidCounters::default());
    cur.io.insert(
        (43, key(200)),
        IoCounters {
            read_bytes: 1 << 20,
            read_calls: 1,
            ..IoCounters::default()
        },
    );
    let ctx = TraceContext { top: 8, ..ctx() };
    let (keys, pids) = shown(&cur, Some(&p), &ctx);
    let mut want_keys = BTreeSet::new();
    let mut want_pids = BTreeSet::new();
    for m in [
        TraceModel::new(&cur, Some(&p), &ctx),
        TraceModel::new(&cur, None, &ctx),
    ] {
        want_keys.extend(m.files.iter().map(|f| f.key));
        want_keys.extend(
            m.processes
                .iter()
                .flat_map(|p| p.files.iter().map(|f| f.key)),
        );
        want_pids.extend(m.processes.iter().map(|p| p.pid));
    }
    assert_eq!(keys, want_keys);
    assert_eq!(pids, want_pids);
    // The cut holds: not all 32 files are named.
    assert!(keys.len() < 20, "{}", keys.len());
    assert!(keys.contains(&key(200)) && pids.contains(&43));
}
