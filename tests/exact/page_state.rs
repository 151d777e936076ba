//! A long-lived engine's phase 3 for a process whose memory moves but whose mappings of a
//! model do not: `smaps_rollup` only, its mappings' `smaps` values kept while their pages
//! (present, copy-on-write) stand as `PAGEMAP_SCAN` reads them; `smaps` again when they
//! move. Against full reads of /proc by a fresh gather and the pages the test made.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, Write};

use crate::common::*;
use twofold::collect::gather::{gather, Request};
use twofold::collect::Roots;

/// Maps the file copy-on-write, reads every page, then on `grow` allocates and touches
/// 8 MiB more, on `cow` writes one byte in each of its first 4 pages; says `done`.
const HOLDER: &str = r#"
import mmap, sys
f = open(sys.argv[1], 'rb')
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
s = sum(m[i] for i in range(0, len(m), 4096))
bufs = []
print('ready', flush=True)
for line in sys.stdin:
    if line.strip() == 'grow':
        b = bytearray(8 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        bufs.append(b)
    elif line.strip() == 'cow':
        for i in range(4):
            m[i * 4096] = (m[i * 4096] + 1) % 256
    print('done', flush=True)
"#;

/// The process's mappings of `file` and its whole-process sums (RSS, anonymous) in `s`.
fn of(
    s: &twofold::sample::Sample,
    pid: i32,
    file: &std::path::Path,
) -> impl PartialEq + std::fmt::Debug {
    let key = s
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .map(|f| f.key)
        .unwrap();
    let p = s.processes.iter().find(|p| p.pid == pid).unwrap();
    let maps: Vec<_> = p
        .mappings
        .iter()
        .filter(|m| m.key() == key)
        .map(|m| {
            (
                (m.start, m.end, m.rss_bytes, m.pss_bytes),
                (
                    m.anonymous_bytes,
                    m.private_dirty_bytes,
                    m.private_clean_bytes,
                ),
                (m.shared_clean_bytes, m.shared_dirty_bytes, m.swap_bytes),
            )
        })
        .collect();
    (maps, p.status.vm_rss_bytes, p.status.rss_anon_bytes)
}

/// The process's whole-process sums from `smaps_rollup` in `s`.
fn rollup(s: &twofold::sample::Sample, pid: i32) -> (u64, Option<u64>) {
    let p = s.processes.iter().find(|p| p.pid == pid).unwrap();
    let r = p.rollup.as_ref().unwrap();
    (r.rss_bytes, r.anonymous_bytes)
}

/// A full gather beside the engine's snapshot `s`, when neither could have seen another
/// twofold's passing mapping of a file's pages (`None` then: a read that saw one is true
/// at its moment, and differs from one that did not): no read of `s` was tainted, and the
/// other twofolds' fault counters stood over the gather.
fn quiet_full(
    req: &Request,
    s: &twofold::sample::Sample,
    engine: &twofold::engine::Engine,
) -> Option<twofold::sample::Sample> {
    use twofold::collect::quiet::Quiet;
    let own = std::process::id() as i32;
    let others: Vec<i32> = s.observers.iter().copied().filter(|p| *p != own).collect();
    let root = std::path::Path::new("/proc");
    let quiet = Quiet::before(root, &others, false);
    let full = gather(&Roots::live(), req, &mut Vec::new()).unwrap();
    let tainted = engine.cache_stats().unwrap().tainted;
    (tainted == 0 && quiet.held(root)).then_some(full)
}

#[test]
fn a_process_whose_model_pages_stand_reads_only_its_rollup() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (PAGEMAP_SCAN of another process's pages)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 16 * MIB);
    let (mut child, pid) = python_ready(HOLDER, &[file.as_os_str()]);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut say = |what: &str| {
        writeln!(child.stdin.as_mut().unwrap(), "{what}").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done");
    };
    // Every process of the host is read: only then are all mappers of the file known (a
    // mapper's PSS of it moves with theirs), and kept.
    let req = Request {
        paths: vec![file.clone()],
        ..Request::default()
    };
    let grown = |s: &twofold::sample::Sample| {
        let p = s.processes.iter().find(|p| p.pid == pid).unwrap();
        p.status.rss_anon_bytes.unwrap()
    };
    // Another twofold beside this test (a `serve` of another build) maps the file's pages
    // for a moment when it searches the holder: a snapshot whose reads it could have
    // disturbed keeps nothing, and is tried again.
    let mut tries = 0;
    let mut engine = loop {
        tries += 1;
        assert!(
            tries <= 30,
            "other twofolds mapped pages at each of 30 tries"
        );
        if tries > 1 {
            // Let another twofold's snapshot end.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let mut engine = twofold::engine::Engine::new(req.clone(), None)
            .incremental(std::time::Duration::from_secs(3600));
        let mut w = Vec::new();
        let first = engine.snapshot(&mut w).unwrap().sample;
        if engine.cache_stats().unwrap().tainted > 0 {
            continue;
        }
        // Its heap grows by 8 MiB: the process moved, its mapping of the model did not.
        say("grow");
        let cached = engine.snapshot(&mut w).unwrap().sample;
        let stats = engine.cache_stats().unwrap();
        let Some(full) = quiet_full(&req, &cached, &engine) else {
            continue;
        };
        assert_eq!(stats.pages_stood, 1, "{stats:?}");
        assert_eq!(of(&cached, pid, &file), of(&full, pid, &file));
        // Its rollup (the process table's PSS and USS) is kept within its cadence, as that
        // of a moving process that maps no model: the 8 MiB shows in `status`, not there.
        assert_eq!(rollup(&cached, pid), rollup(&first, pid));
        assert!(
            grown(&cached) >= grown(&first) + 7 * MIB,
            "status is read afresh"
        );
        break engine;
    };
    // Four pages of the mapping written (copy-on-write): `smaps` again, 4 pages private.
    say("cow");
    let mut w = Vec::new();
    let cached = loop {
        let cached = engine.snapshot(&mut w).unwrap().sample;
        let stats = engine.cache_stats().unwrap();
        if let Some(full) = quiet_full(&req, &cached, &engine) {
            assert_eq!(stats.pages_stood, 0, "{stats:?}");
            assert_eq!(of(&cached, pid, &file), of(&full, pid, &file));
            assert_eq!(
                rollup(&cached, pid),
                rollup(&full, pid),
                "smaps read again: fresh sums"
            );
            break cached;
        }
        tries += 1;
        assert!(tries <= 60, "other twofolds mapped pages at each try");
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    let key = cached
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .unwrap()
        .key;
    let cow: u64 = cached
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap()
        .mappings
        .iter()
        .filter(|m| m.key() == key)
        .filter_map(|m| m.anonymous_bytes)
        .sum();
    assert_eq!(cow, 4 * 4096, "the pages the holder wrote");
    drop(child.stdin.take());
    child.wait().unwrap();
}
