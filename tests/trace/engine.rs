//! The engine's traced snapshots: tracing switched on and off at run time, `scan --trace`
//! and `record --trace` replayed and dumped against bpftrace, and readers that exited.

use std::process::Command;

use crate::common::*;
use crate::support::*;
use crate::{serial, twofold_cmd};

/// A model file of `size` in a fresh directory, its key, and an engine (no proof) whose
/// request names it, with candidates.
fn engine_on_file(
    size: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    twofold::sample::FileKey,
    twofold::engine::Engine,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", size);
    let k = key(&file);
    let e = twofold::engine::Engine::new(
        twofold::collect::gather::Request {
            paths: vec![file.clone()],
            candidates: true,
            ..Default::default()
        },
        None,
    );
    (dir, file, k, e)
}

/// The engine's tracing switch (what `top`'s `t` key and `serve --trace` use): off, the
/// snapshots carry no counters; on, they carry them, with the read() ledger of a loader
/// that closed its file; off again, none; on again, a new attachment whose rates do not
/// subtract the old one's counters.
#[test]
fn engine_tracing_turns_on_and_off_at_run_time() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use twofold::engine;
    let size = 8 * MIB;
    let (_dir, file, k, mut e) = engine_on_file(size);
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut w = Vec::new();
    assert!(!e.tracing());
    assert!(e.snapshot(&mut w).unwrap().trace.is_none());

    e.set_tracing(true).unwrap();
    assert!(e.tracing());
    assert_eq!(e.set_tracing(true), Ok(()), "on twice is on");
    assert!(
        e.trace_unavailable().is_empty(),
        "{:?}",
        e.trace_unavailable()
    );
    let s1 = e.snapshot(&mut w).unwrap();
    assert!(s1.trace.is_some());
    assert_eq!(copy.go(), "ready");
    let s2 = e.snapshot(&mut w).unwrap();
    let t2 = s2.trace.as_ref().unwrap();
    assert_eq!(t2.io[&(copy.pid(), k)].read_bytes, size, "the ledger");
    assert!(s2.sample.reads.is_empty(), "the ledger is not stored twice");
    // The report: the file is of interest; the loader read all of it in this interval.
    let r = engine::report(&s2, Some(&s1));
    let t = r.trace.as_ref().unwrap();
    let f = t.files.iter().find(|f| f.key == k).unwrap();
    assert!(f.of_interest);
    assert_eq!(f.path.as_deref(), file.to_str());
    let p = t.processes.iter().find(|p| p.pid == copy.pid()).unwrap();
    assert_eq!(p.delta.read_bytes, Some(size));
    assert_eq!(p.total.read_bytes, Some(size));
    let interval = (t2.at_secs - s1.trace.as_ref().unwrap().at_secs).max(1e-9);
    assert_eq!(t.interval_secs, interval);
    assert_eq!(p.read_bytes_per_sec, Some(size as f64 / interval));

    e.set_tracing(false).unwrap();
    assert!(!e.tracing());
    let s3 = e.snapshot(&mut w).unwrap();
    assert!(s3.trace.is_none());
    assert!(engine::report(&s3, Some(&s2)).trace.is_none());

    e.set_tracing(true).unwrap();
    let s4 = e.snapshot(&mut w).unwrap();
    let t4 = s4.trace.as_ref().unwrap();
    assert_ne!(t4.attached_mono_ns, t2.attached_mono_ns);
    // Nothing read since the new attach; the old attachment's counters are not a base.
    assert!(!t4.io.contains_key(&(copy.pid(), k)));
    assert_eq!(
        engine::report(&s4, Some(&s2)).trace,
        engine::report(&s4, None).trace
    );
    // One window (`scan --trace`): the next snapshot carries the counters and tracing is
    // off again, before the collection.
    e.set_tracing(false).unwrap();
    e.trace_once().unwrap();
    assert!(e.tracing());
    let s5 = e.snapshot(&mut w).unwrap();
    assert!(s5.trace.is_some());
    assert!(!e.tracing());
    assert!(e.snapshot(&mut w).unwrap().trace.is_none());
    assert!(
        w.iter()
            .all(|w| w.kind != twofold::sample::WarningKind::Trace && !w.text.contains("--trace")),
        "warnings: {w:?}"
    );
}

/// `scan --trace` recorded, then replayed: the same bytes, trace section and all.
#[test]
fn scan_trace_replays_byte_for_byte() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 4 * MIB);
    let _map = reader("map", Some(&file), &[]);
    for json in [false, true] {
        let store = dir.path().join(format!("store-{json}"));
        let mut scan = twofold_cmd();
        scan.args(["scan", "--no-prove", "--trace", "500ms", "--record"])
            .arg(&store)
            .arg(&file);
        let mut replay = twofold_cmd();
        replay
            .args(["replay", "--at", "now", "--store"])
            .arg(&store);
        if json {
            scan.arg("--json");
            replay.arg("--json");
        }
        let live = scan.output().unwrap();
        assert!(live.status.success());
        let replayed = replay.output().unwrap();
        assert!(replayed.status.success());
        let (live, mut replayed) = (
            String::from_utf8(live.stdout).unwrap(),
            String::from_utf8(replayed.stdout).unwrap(),
        );
        // Text replay first names the moment it shows; the rest is what scan printed.
        if !json {
            let (first, rest) = replayed.split_once('\n').unwrap();
            assert!(
                first.starts_with("twofold replay: the snapshot of "),
                "{first}"
            );
            replayed = rest.to_string();
        }
        assert_eq!(live, replayed, "json {json}");
        if json {
            let r: twofold::model::Report = serde_json::from_str(&live).unwrap();
            let t = r.trace.unwrap();
            assert!(t
                .files
                .iter()
                .any(|f| f.of_interest && f.path.as_deref() == file.to_str()));
        } else {
            assert!(live.contains("\nTRACED FOR "), "{live}");
        }
    }
}

/// `record --trace` of a loader that copies a model with pread64() and closes it: the
/// counters stored in the snapshots, replayed and dumped (JSON Lines, CSV, OpenMetrics),
/// equal the ground truth (the file's size, all of its pages added to the page cache after
/// an eviction) and bpftrace counting the same tracepoints.
#[test]
fn record_trace_stores_counters_that_replay_and_dump_agree_with_bpftrace() {
    let _serial = serial();
    if !bpf_ready() || !require(have("bpftrace"), "bpftrace") {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    let k = key(&file);
    let store = dir.path().join("store");
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let pid = copy.pid();
    let mut rec = twofold_cmd()
        .args([
            "record",
            "--trace",
            "--no-prove",
            "--interval",
            "300ms",
            "--store",
        ])
        .arg(&store)
        .arg(&file)
        .env("TWOFOLD_UPLOADS_DIR", dir.path().join("ledgers"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first line comes once the tracer is attached.
    let mut out = std::io::BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("twofold record:"), "{line}");
    // bpftrace from now on; the file (fully cached since it was written) is evicted only
    // now, so both count every page that goes back (whoever else on the host reads the
    // file: a scan of /tmp by another tool would refill the cache before the attach).
    let bt = Bpftrace::start(&format!(
        "tracepoint:filemap:mm_filemap_add_to_page_cache /args->i_ino == {ino}/ {{ @added = sum(1 << args->order); }}\n\
         tracepoint:syscalls:sys_exit_pread64 /pid == {pid} && args->ret > 0/ {{ @pread = sum(args->ret); }}\n\
         tracepoint:syscalls:sys_exit_read /pid == {pid} && args->ret > 0/ {{ @read = sum(args->ret); }}",
        ino = k.inode
    ));
    evict_all(&file);
    assert_eq!(copy.go(), "ready");
    // Three more snapshots (32-byte index entries), however slow a snapshot is here.
    let index = store.join(format!(
        "{}.index",
        &twofold::timespec::format(twofold::engine::now().0)[..10]
    ));
    let frames = |i: &std::path::Path| std::fs::metadata(i).map_or(0, |m| m.len()) / 32;
    let want = frames(&index) + 3;
    let start = std::time::Instant::now();
    while frames(&index) < want {
        assert!(start.elapsed().as_secs() < 60, "record is too slow");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(rec.wait().unwrap().code(), Some(0));
    let got = bt.stop();
    assert_eq!(got["pread"], size, "bpftrace: pread64 bytes of the loader");
    // Ground truth: the whole file went back into the page cache after its eviction (more
    // only if memory pressure evicted some of it again meanwhile).
    assert!(got["added"] >= pages(size), "bpftrace: pages added {got:?}");

    let run = |args: &[&str]| {
        let out = twofold_cmd()
            .args(args)
            .arg("--store")
            .arg(&store)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Replay: the trace section of the last snapshot, totals since attach.
    let r: twofold::model::Report =
        serde_json::from_str(&run(&["replay", "--json", "--at", "now"])).unwrap();
    let t = r.trace.as_ref().unwrap();
    let f = t.files.iter().find(|f| f.key == k).unwrap();
    assert!(f.of_interest);
    assert_eq!(
        f.total.added_pages,
        Some(got["added"]),
        "replayed page-cache adds (unavailable {:?}, lost updates {}, all files added {:?})",
        t.unavailable,
        t.lost_updates,
        t.cache_added_pages
    );
    let p = t.processes.iter().find(|p| p.pid == pid).unwrap();
    let pf = p.files.iter().find(|x| x.key == k).unwrap();
    assert_eq!(
        pf.read_bytes, got["pread"],
        "replayed read bytes of the loader"
    );
    assert_eq!(pf.path.as_deref(), file.to_str());
    // Its only reads of regular files after attach were the file's.
    assert_eq!(p.total.read_bytes, Some(size));
    let human = run(&["replay", "--at", "now"]);
    assert!(human.contains("TRACED FOR"), "{human}");

    // JSON Lines: a page-cache, file and process row per snapshot; rates add up.
    let json = run(&["dump", "--what", "trace", "--from", "1h ago"]);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(rows.iter().all(|r| r["type"] == "trace"));
    let file_id = format!("{}:{}:{}", k.major, k.minor, k.inode);
    let file_rows: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "file" && r["data"]["file_id"] == file_id.as_str())
        .collect();
    let proc_rows: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "process" && r["data"]["pid"] == pid)
        .collect();
    let snaps = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "page_cache")
        .count();
    assert!(snaps >= 3, "{snaps} snapshots");
    assert_eq!(
        file_rows.len(),
        snaps,
        "the file of interest in every snapshot"
    );
    let last = &file_rows.last().unwrap()["data"];
    assert_eq!(
        last["added_pages_total"], got["added"],
        "dumped page-cache adds"
    );
    assert_eq!(last["path"], file.to_str().unwrap());
    let last = &proc_rows.last().unwrap()["data"];
    assert_eq!(
        last["read_bytes_total"], size,
        "dumped read bytes of the loader"
    );
    // dump rounds rates and intervals to 6 decimals: each product is off by at most
    // (rate + interval) × 5e-7 (a short interval under load has a large rate).
    let (added, bound) = file_rows.iter().fold((0.0f64, 0.0f64), |(sum, bound), r| {
        let rate = r["data"]["added_pages_per_sec"].as_f64().unwrap();
        let interval = r["data"]["interval_secs"].as_f64().unwrap();
        (
            sum + rate * interval,
            bound + (rate.abs() + interval) * 5e-7 + 1e-12,
        )
    });
    assert!(
        (added - got["added"] as f64).abs() <= bound,
        "rates × intervals = {added}, total {}, bound {bound}",
        got["added"]
    );
    // CSV: one header, one line per row.
    let csv = run(&[
        "dump", "--what", "trace", "--from", "1h ago", "--format", "csv",
    ]);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("added_pages_per_sec,"), "{}", lines[0]);
    assert!(lines[0].contains("scope") && lines[0].contains("read_bytes_total"));
    assert_eq!(lines.len(), rows.len() + 1);
    // OpenMetrics: counters named `_total`, the last value the ground truth; promtool
    // accepts it and backfills it.
    let om = run(&[
        "dump",
        "--what",
        "trace",
        "--from",
        "1h ago",
        "--format",
        "openmetrics",
    ]);
    assert!(om.ends_with("# EOF\n"));
    assert!(
        om.contains("# TYPE twofold_trace_file_added_pages_total counter\n"),
        "{om}"
    );
    let series = format!("twofold_trace_file_added_pages_total{{file_id=\"{file_id}\"}} ");
    let last_added = om
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap();
    assert_eq!(
        last_added.split(' ').next().unwrap(),
        got["added"].to_string(),
        "{om}"
    );
    let series =
        format!("twofold_trace_process_read_bytes_total{{pid=\"{pid}\",comm=\"twofold\"}} ");
    let last_read = om
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap();
    assert_eq!(last_read.split(' ').next().unwrap(), size.to_string());
    if !require(have("promtool"), "promtool (Debian's prometheus package)") {
        return;
    }
    let om_file = dir.path().join("trace.om");
    std::fs::write(&om_file, &om).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&om_file).unwrap())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om_file)
        .arg(dir.path().join("tsdb"))
        .output()
        .unwrap();
    assert!(
        backfill.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&backfill.stderr)
    );
}

/// A traced engine forgets a reader once it has exited and done nothing for a sample: its
/// counters leave the snapshot and the kernel's maps, and what it read stays in the
/// file's totals (`exited_read_bytes`), so totals never go back and rates stay right.
#[test]
fn an_exited_reader_is_folded_into_the_file_totals() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use twofold::engine;
    let size = 8 * MIB;
    let (_dir, file, k, mut e) = engine_on_file(size);
    let mut w = Vec::new();
    e.set_tracing(true).unwrap();
    let s1 = e.snapshot(&mut w).unwrap();
    // A loader that reads the whole file with read() and exits.
    let st = std::process::Command::new(exe())
        .args(["__child", "copy"])
        .arg(&file)
        .args(["--close", "--exit-after-ms", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = st.id() as i32;
    let out = st.wait_with_output().unwrap();
    assert!(out.status.success());
    // The sample after its last event still shows it (it exited meanwhile)...
    let s2 = e.snapshot(&mut w).unwrap();
    let t2 = s2.trace.as_ref().unwrap();
    assert_eq!(t2.io[&(pid, k)].read_bytes, size);
    assert!(t2.pids.contains_key(&pid));
    let r2 = engine::report(&s2, Some(&s1));
    let f2 = r2
        .trace
        .as_ref()
        .unwrap()
        .files
        .iter()
        .find(|f| f.key == k)
        .unwrap()
        .clone();
    assert_eq!(f2.total.read_bytes, Some(size));
    // ...the next one has folded it: gone from the processes, kept in the file's total.
    let s3 = e.snapshot(&mut w).unwrap();
    let t3 = s3.trace.as_ref().unwrap();
    assert!(!t3.io.contains_key(&(pid, k)), "{:?}", t3.io.keys());
    assert!(!t3.pids.contains_key(&pid));
    assert_eq!(t3.exited_read_bytes.get(&k), Some(&size));
    let r3 = engine::report(&s3, Some(&s2));
    let t = r3.trace.as_ref().unwrap();
    assert!(t.processes.iter().all(|p| p.pid != pid));
    let f3 = t.files.iter().find(|f| f.key == k).unwrap();
    assert_eq!(f3.total.read_bytes, Some(size), "the total never goes back");
    assert_eq!(
        f3.delta.read_bytes,
        Some(0),
        "nothing read in this interval"
    );
    // And the kernel's maps forgot it: the next sample has no entry to fold again.
    let s4 = e.snapshot(&mut w).unwrap();
    let t4 = s4.trace.as_ref().unwrap();
    assert!(!t4.io.contains_key(&(pid, k)));
    assert_eq!(t4.exited_read_bytes.get(&k), Some(&size), "folded once");
}
