//! Snapshots round-trip through the store's JSON (generated ones, traced or not), a
//! version-1 snapshot still reads, and the trace part of a report is an input: totals,
//! and rates from the snapshot before when it comes from the same attachment.

use super::*;
use crate::sample::trace::{Counter, FileCounters, IoCounters, OomKill, PidCounters, TraceSample};
use crate::sample::Sample;
use crate::sample::{
    CandidateSample, CandidateWhy, ProcessSample, ProofSample, ReadSample, StatusSample,
};

/// xorshift64*: deterministic generated snapshots without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Mostly small numbers, some zeros (left out of the JSON), some near the limits.
    fn count(&mut self) -> u64 {
        match self.below(8) {
            0 | 1 => 0,
            2 => u64::MAX - self.below(3),
            _ => {
                let bits = self.below(48) + 1;
                self.below(1 << bits)
            }
        }
    }

    /// An f64 with every bit of its mantissa used (the JSON must keep all of them).
    fn secs(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 30) as f64
    }

    fn key(&mut self) -> FileKey {
        FileKey {
            major: self.below(300) as u32,
            minor: self.below(300) as u32,
            inode: {
                let shift = self.below(64);
                self.next() >> shift
            },
        }
    }

    fn name(&mut self) -> String {
        let pool = [
            "/m/model.gguf",
            "sh",
            "",
            "naïve \"quoted\"\n",
            "\\x",
            "llama-server",
        ];
        pool[self.below(pool.len() as u64) as usize].to_string()
    }
}

fn pid_counters(r: &mut Rng) -> PidCounters {
    let mut hist = [0u64; 32];
    for h in hist.iter_mut() {
        if r.below(4) == 0 {
            *h = r.count();
        }
    }
    PidCounters {
        faults_by_code: [r.count(), r.count(), r.count(), r.count()],
        kernel_faults: r.count(),
        file_faults: r.count(),
        fault_around_events: r.count(),
        fault_around_pages: r.count(),
        direct_reclaims: r.count(),
        memcg_reclaims: r.count(),
        reclaim_ns: r.count(),
        reclaim_max_ns: r.count(),
        reclaimed_pages: r.count(),
        reclaim_hist_us_log2: hist,
    }
}

fn file_counters(r: &mut Rng) -> FileCounters {
    FileCounters {
        file_faults: r.count(),
        fault_around_events: r.count(),
        fault_around_pages: r.count(),
        added_pages: r.count(),
        evicted_pages: r.count(),
        refault_pages: r.count(),
        add_events: r.count(),
        evict_events: r.count(),
    }
}

/// A trace sample with every field exercised.
fn trace_sample(r: &mut Rng) -> TraceSample {
    let mut t = TraceSample {
        at_secs: r.secs(),
        attached_mono_ns: r.next(),
        lost_updates: r.count(),
        added_pages_all: r.count(),
        evicted_pages_all: r.count(),
        ..TraceSample::default()
    };
    for _ in 0..r.below(20) {
        t.pids.insert(r.below(1 << 22) as i32, pid_counters(r));
    }
    for _ in 0..r.below(20) {
        t.files.insert(r.key(), file_counters(r));
    }
    for _ in 0..r.below(30) {
        let k = (r.below(1 << 22) as i32, r.key());
        let io = IoCounters {
            read_bytes: r.count(),
            read_calls: r.count(),
            mmap_shared: r.count(),
            mmap_shared_write: r.count(),
            mmap_private: r.count(),
            mmap_private_write: r.count(),
            mmap_bytes: r.count(),
            comm: r.name(),
        };
        t.io.insert(k, io);
    }
    for _ in 0..r.below(3) {
        t.exited_read_bytes.insert(r.key(), r.count());
    }
    for _ in 0..r.below(3) {
        t.oom_kills.push(OomKill {
            pid: r.below(1 << 22) as i32,
            comm: r.name(),
            uid: r.below(70_000) as u32,
            killer_pid: r.below(1 << 22) as i32,
            total_vm_bytes: r.count(),
            anon_rss_bytes: r.count(),
            file_rss_bytes: r.count(),
            shmem_rss_bytes: r.count(),
            at_secs: r.secs(),
        });
    }
    if r.below(2) == 0 {
        t.unavailable
            .insert(Counter::DirectReclaim, "tracepoint missing".into());
        t.unavailable.insert(Counter::Mmaps, r.name());
    }
    t.pinned_pids = (0..r.below(3)).map(|_| r.below(1000) as i32).collect();
    for _ in 0..r.below(5) {
        t.names.paths.insert(r.key(), r.name());
        t.names.comms.insert(r.below(1000) as i32, r.name());
    }
    t
}

/// A sample with a few processes, files, candidates and proofs.
fn sample(r: &mut Rng) -> Sample {
    let mut s = Sample::default();
    s.system.page_size = [4096, 16384, 65536][r.below(3) as usize];
    s.system.meminfo.insert("MemTotal".into(), r.count());
    s.system.vmstat.insert("pgmajfault".into(), r.count());
    for i in 0..r.below(4) {
        let key = r.key();
        let size = r.below(1 << 40);
        s.files.push(crate::collect::test_file_sample(
            key,
            &format!("/m/{i}.gguf"),
            size,
            Some(r.below(size + 1)),
        ));
        let pid = 100 + i as i32;
        s.processes.push(ProcessSample {
            pid,
            comm: r.name(),
            cmdline: vec![r.name()].into(),
            status: StatusSample {
                rss_anon_bytes: Some(r.below(1 << 40)),
                ..StatusSample::default()
            },
            ..ProcessSample::default()
        });
        s.candidates.push(CandidateSample {
            pid,
            file: key,
            why: CandidateWhy::Read,
            private_anon_bytes: size,
        });
        s.proofs.push(ProofSample {
            pid,
            file: key,
            identical_file_bytes: size / 2,
            searchable_fraction: r.secs().fract(),
            ..ProofSample::default()
        });
    }
    s
}

fn snapshot(r: &mut Rng) -> Snapshot {
    let sample = sample(r);
    let mut trace = (r.below(4) != 0).then(|| trace_sample(r));
    if let Some(t) = &mut trace {
        // Counters of the sample's own files and processes too.
        for f in &sample.files {
            t.files.insert(f.key, file_counters(r));
        }
        for p in &sample.candidates {
            t.io.insert(
                (p.pid, p.file),
                IoCounters {
                    read_bytes: r.count(),
                    ..IoCounters::default()
                },
            );
        }
    }
    Snapshot {
        version: SNAPSHOT_VERSION,
        at_unix_ns: r.next(),
        at_mono_ns: r.next(),
        sample,
        trace,
    }
}

#[test]
fn generated_snapshots_round_trip_through_json() {
    let mut r = Rng(0x7ace_5eed);
    let mut traced = 0;
    for i in 0..300 {
        let snap = snapshot(&mut r);
        traced += snap.trace.is_some() as usize;
        let text = serde_json::to_vec(&snap).unwrap();
        let back: Snapshot = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            back,
            snap,
            "snapshot {i}: {}",
            String::from_utf8_lossy(&text)
        );
        // Written again, the same bytes (entry lists are sorted, nothing depends on
        // hash order).
        assert_eq!(serde_json::to_vec(&back).unwrap(), text, "snapshot {i}");
        // Its report, with a previous snapshot of the same attachment, is the same too.
        let mut prev = snapshot(&mut r);
        if let (Some(p), Some(c)) = (&mut prev.trace, &snap.trace) {
            p.attached_mono_ns = c.attached_mono_ns;
            p.at_secs = c.at_secs / 2.0;
        }
        assert_eq!(
            report(&back, Some(&prev)),
            report(&snap, Some(&prev)),
            "snapshot {i}"
        );
    }
    assert!(traced > 150, "{traced} of 300 generated snapshots traced");
}

/// Maps keyed by files or (process, file) pairs are sorted entry lists; zero counters are
/// left out.
#[test]
fn trace_json_is_entry_lists_without_zeros() {
    let k = FileKey {
        major: 254,
        minor: 1,
        inode: 7,
    };
    let mut t = TraceSample {
        at_secs: 2.5,
        attached_mono_ns: 9,
        ..TraceSample::default()
    };
    t.files.insert(
        k,
        FileCounters {
            added_pages: 3,
            ..FileCounters::default()
        },
    );
    t.io.insert(
        (42, k),
        IoCounters {
            read_bytes: 4096,
            comm: "loader".into(),
            ..IoCounters::default()
        },
    );
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(
        v["files"],
        serde_json::json!([[{"major": 254, "minor": 1, "inode": 7}, {"added_pages": 3}]])
    );
    assert_eq!(
        v["io"],
        serde_json::json!([[[42, {"major": 254, "minor": 1, "inode": 7}],
                            {"read_bytes": 4096, "comm": "loader"}]])
    );
    assert_eq!(serde_json::from_value::<TraceSample>(v).unwrap(), t);
}

/// A recording of format 1: no `trace`, the read() ledger in `sample.reads`.
#[test]
fn version_1_snapshots_read_with_no_trace_and_keep_their_ledger() {
    let mut r = Rng(11);
    let mut snap = snapshot(&mut r);
    while snap.sample.proofs.is_empty() {
        snap = snapshot(&mut r);
    }
    snap.trace = None;
    snap.version = 1;
    let p = &snap.sample.proofs[0];
    snap.sample.reads = vec![ReadSample {
        pid: p.pid,
        file: p.file,
        read_bytes: 12345,
        read_calls: 2,
        mmap_calls: 0,
    }];
    let mut v = serde_json::to_value(&snap).unwrap();
    assert!(v.get("trace").is_none());
    v.as_object_mut().unwrap().remove("trace");
    let back: Snapshot = serde_json::from_value(v).unwrap();
    assert_eq!(back.version, 1);
    assert_eq!(back.trace, None);
    let rep = report(&back, None);
    assert!(rep.trace.is_none());
    let traced: Vec<Option<u64>> = rep
        .files
        .iter()
        .flat_map(|f| &f.proven_copies)
        .filter(|c| c.pid == p.pid)
        .map(|c| c.traced_read_bytes)
        .collect();
    assert_eq!(traced, [Some(12345)]);
}

fn traced(at_secs: f64, attached: u64, read: u64, added: u64) -> Snapshot {
    let k = FileKey {
        major: 8,
        minor: 1,
        inode: 77,
    };
    let mut t = TraceSample {
        at_secs,
        attached_mono_ns: attached,
        added_pages_all: added,
        ..TraceSample::default()
    };
    t.files.insert(
        k,
        FileCounters {
            added_pages: added,
            ..FileCounters::default()
        },
    );
    t.io.insert(
        (42, k),
        IoCounters {
            read_bytes: read,
            read_calls: 1,
            comm: "loader".into(),
            ..IoCounters::default()
        },
    );
    t.names.paths.insert(k, "/m/closed.gguf".into());
    Snapshot {
        version: SNAPSHOT_VERSION,
        at_unix_ns: 1_000_000_000 * at_secs as u64,
        at_mono_ns: 1_000_000_000 * at_secs as u64,
        sample: Sample::default(),
        trace: Some(t),
    }
}

#[test]
fn trace_rates_come_from_the_snapshot_before_of_the_same_attachment() {
    let a = traced(10.0, 1, 1 << 20, 256);
    let b = traced(12.0, 1, 5 << 20, 1280);
    // Alone: totals, and rates since attach.
    let r = report(&b, None);
    let t = r.trace.as_ref().unwrap();
    assert_eq!(t.interval_secs, 12.0);
    let f = &t.files[0];
    assert_eq!(f.path.as_deref(), Some("/m/closed.gguf"));
    assert_eq!(f.total.read_bytes, Some(5 << 20));
    assert_eq!(f.total.added_pages, Some(1280));
    assert_eq!(t.cache_added_pages, Some(1280));
    // With the snapshot before: rates over the 2 s between them.
    let r = report(&b, Some(&a));
    let t = r.trace.as_ref().unwrap();
    assert_eq!(t.interval_secs, 2.0);
    let f = &t.files[0];
    assert_eq!(f.read_bytes_per_sec, Some((4 << 20) as f64 / 2.0));
    assert_eq!(f.added_pages_per_sec, Some(512.0));
    assert_eq!(t.cache_added_pages_per_sec, Some(512.0));
    let p = &t.processes[0];
    assert_eq!((p.pid, p.comm.as_deref()), (42, Some("loader")));
    assert_eq!(p.read_bytes_per_sec, Some((4 << 20) as f64 / 2.0));
    assert_eq!(p.total.read_bytes, Some(5 << 20));
    // A snapshot before of another attachment (tracing turned off and on, a restarted
    // recorder) is not subtracted: rates since attach.
    let other = traced(10.0, 2, 1 << 20, 256);
    assert_eq!(report(&b, Some(&other)).trace, report(&b, None).trace);
    // Nor is one without counters.
    let untraced = Snapshot {
        trace: None,
        ..a.clone()
    };
    assert_eq!(report(&b, Some(&untraced)).trace, report(&b, None).trace);
    // A report of an untraced snapshot has no trace section.
    assert!(report(&untraced, Some(&a)).trace.is_none());
}

#[test]
fn tracing_off_is_a_no_op_and_snapshots_carry_no_trace() {
    let mut e = Engine::new(Request::default(), None);
    assert!(!e.tracing());
    assert_eq!(e.set_tracing(false), Ok(()));
    assert!(e.trace_unavailable().is_empty());
    // The fixture tree of the tests: no live /proc needed.
    e.roots = Roots {
        proc: std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v2-hand/proc"
        )),
        cgroup: std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v2-hand/cgroup"
        )),
    };
    let snap = e.snapshot(&mut Vec::new()).unwrap();
    assert_eq!(snap.version, SNAPSHOT_VERSION);
    assert!(snap.trace.is_none());
    assert!(report(&snap, None).trace.is_none());
}

/// A search of a few candidates gets their processes and the other holders of their
/// files (the ways to open them), not every process of the sample.
#[test]
fn a_pending_search_keeps_its_processes_and_the_holders_of_its_files() {
    use crate::sample::{MappingSample, OpenFileSample};
    let file = FileKey {
        major: 8,
        minor: 1,
        inode: 42,
    };
    let other = FileKey { inode: 43, ..file };
    let process = |pid: i32| ProcessSample {
        pid,
        ..ProcessSample::default()
    };
    let mapper = ProcessSample {
        mappings: vec![MappingSample {
            major: file.major,
            minor: file.minor,
            inode: file.inode,
            ..MappingSample::default()
        }],
        ..process(2)
    };
    let opener = ProcessSample {
        open_files: vec![OpenFileSample {
            fd: 3,
            key: file,
            path: "/m".into(),
        }],
        ..process(3)
    };
    let elsewhere = ProcessSample {
        open_files: vec![OpenFileSample {
            fd: 3,
            key: other,
            path: "/o".into(),
        }],
        ..process(4)
    };
    let candidate = CandidateSample {
        pid: 1,
        file,
        why: CandidateWhy::Holder,
        private_anon_bytes: 1,
    };
    let sample = Sample {
        processes: vec![process(1), mapper, opener, elsewhere, process(5)],
        files: vec![crate::collect::test_file_sample(file, "/m", 1 << 20, None)],
        candidates: vec![candidate.clone()],
        ..Sample::default()
    };
    let p = todo::pending(&sample, vec![candidate.clone()]);
    let pids: Vec<i32> = p.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![1, 2, 3]);
    assert_eq!(p.candidates, vec![candidate]);
    assert_eq!(p.files, sample.files);
}
