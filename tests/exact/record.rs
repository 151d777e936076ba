//! Recordings: `scan --record` and `replay` print the same bytes; `record` runs as a daemon
//! (SIGTERM flushes and exits 0); `dump` streams JSON Lines, CSV and OpenMetrics that
//! `promtool` accepts and that a real Prometheus serves back after a backfill.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn twofold(args: &[&str]) -> std::process::Output {
    Command::new(exe()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = twofold(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn replay_prints_exactly_what_scan_printed() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to search the readers' memory)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 16 * MIB);
    let _copy = reader("copy", Some(&file), &["--close"]);
    let _map = reader("map", Some(&file), &[]);
    let f = file.to_str().unwrap();
    for json in [true, false] {
        let store = dir.path().join(format!("store-{json}"));
        let s = store.to_str().unwrap();
        let mut args = vec!["scan", "--record", s, f];
        if json {
            args.push("--json");
        }
        let live = ok(&args);
        let mut args = vec!["replay", "--store", s, "--at", "now"];
        if json {
            args.push("--json");
        }
        let replayed = ok(&args);
        if json {
            assert_eq!(live, replayed);
        } else {
            // The text names the moment shown, then prints what scan printed.
            let (head, rest) = replayed.split_once('\n').unwrap();
            assert_eq!(live, rest);
            let st = twofold::store::Store::open_read_only(&store)
                .unwrap()
                .0
                .stats()
                .unwrap();
            let at = twofold::timespec::format(st.last_ns.unwrap());
            assert_eq!(
                head,
                format!(
                    "twofold replay: the snapshot of {at} (nearest to --at 'now'; the store \
                     holds 1 snapshot from '{at}' to '{at}')"
                )
            );
        }
        if json {
            let r: twofold::model::Report = serde_json::from_str(&live).unwrap();
            let fm = r.files.iter().find(|x| Path::new(&x.path) == file).unwrap();
            assert!((fm.representations.proven.unwrap() - 2.0).abs() < 0.01);
        }
    }
}

/// `replay --at` outside the recording and `dump --what trace` of an untraced one are
/// errors that say what the store holds (exit 2), not an empty or a wrong answer.
#[test]
fn replay_outside_the_store_and_an_untraced_dump_are_errors() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 4 * MIB);
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let f = file.to_str().unwrap();
    ok(&["scan", "--no-prove", "--record", s, f]);
    let st = twofold::store::Store::open_read_only(&store)
        .unwrap()
        .0
        .stats()
        .unwrap();
    let at = twofold::timespec::format(st.first_ns.unwrap());
    for when in ["2020-01-01T00:00:00Z", "2100-01-01T00:00:00Z"] {
        let out = twofold(&["replay", "--store", s, "--at", when]);
        assert_eq!(out.status.code(), Some(2), "{when}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--at '{when}'"))
                && err.contains(&format!("holds 1 snapshot from '{at}' to '{at}'")),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
    // Within the recording: the snapshot, under the moment it was taken.
    let text = ok(&["replay", "--store", s, "--at", &at]);
    assert!(
        text.starts_with(&format!(
            "twofold replay: the snapshot of {at} (nearest to --at '{at}'"
        )),
        "{text}"
    );
    let out = twofold(&["dump", "--store", s, "--what", "trace", "--from", "1h ago"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no trace rows") && err.contains("recorded without 'record --trace'"),
        "{err}"
    );
    // An untraced store still dumps its files (rc 0).
    let files = ok(&["dump", "--store", s, "--what", "files", "--from", "1h ago"]);
    assert!(files.contains("m.gguf"), "{files}");
}

#[test]
fn record_is_a_daemon_and_dump_streams_every_format() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 4 * MIB);
    let _map = reader("map", Some(&file), &[]);
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let f = file.to_str().unwrap();
    let mut rec = Command::new(exe())
        .args([
            "record",
            "--store",
            s,
            "--interval",
            "200ms",
            "--no-prove",
            f,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let index = store.join(format!(
        "{}.index",
        &twofold::timespec::format(twofold::engine::now().0)[..10]
    ));
    // Three snapshots (32-byte index entries), then SIGTERM: flushed, exit 0.
    while std::fs::metadata(&index).map_or(0, |m| m.len()) < 3 * 32 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "record is too slow"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(rec.wait().unwrap().code(), Some(0));
    let n = std::fs::metadata(&index).unwrap().len() / 32;
    assert!(n >= 3);

    // JSON Lines: one file row per snapshot, typed.
    let json = ok(&["dump", "--store", s, "--from", "1h ago", "--what", "files"]);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["data"]["path"] == f)
        .collect();
    assert_eq!(rows.len() as u64, n, "{json}");
    assert!(rows.iter().all(|r| r["type"] == "file"));
    assert_eq!(rows[0]["data"]["size_bytes"], 4 * MIB);
    // CSV: a header and one row per process per snapshot.
    let csv = ok(&[
        "dump",
        "--store",
        s,
        "--what",
        "processes",
        "--format",
        "csv",
        "--top",
        "1",
    ]);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].contains("pid") && lines[0].contains("anon_bytes"));
    assert_eq!(lines.len() as u64, n + 1, "{csv}");
    // A bundle of the range reads back the same.
    let bundle = dir.path().join("bundle");
    ok(&[
        "snapshot",
        "--store",
        s,
        "--from",
        "1h ago",
        "--out",
        bundle.to_str().unwrap(),
    ]);
    let again = ok(&[
        "dump",
        "--store",
        bundle.to_str().unwrap(),
        "--from",
        "1h ago",
    ]);
    assert_eq!(again, json);
    // OpenMetrics: valid, and loadable into a real Prometheus.
    let om = ok(&[
        "dump",
        "--store",
        s,
        "--from",
        "1h ago",
        "--format",
        "openmetrics",
    ]);
    assert!(om.ends_with("# EOF\n"));
    assert!(om.contains("twofold_file_copies{file_id="));
    if !require(have("promtool"), "promtool (Debian's prometheus package)") {
        return;
    }
    let om_file = dir.path().join("dump.om");
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
    let tsdb = dir.path().join("tsdb");
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om_file)
        .arg(&tsdb)
        .output()
        .unwrap();
    assert!(
        backfill.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&backfill.stderr)
    );
    // Serve the blocks and query a recorded value back.
    let port = 19000 + (std::process::id() % 1000) as u16;
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(&cfg, "global:\n  scrape_interval: 1h\n").unwrap();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=3650d")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // An instant query at the present: the last recorded samples are within Prometheus'
    // 5-minute lookback.
    let url = format!("http://127.0.0.1:{port}/api/v1/query?query=twofold_file_size_bytes");
    let start = Instant::now();
    let mut last = String::new();
    let body = loop {
        let out = Command::new("curl").args(["-sf", &url]).output();
        if let Ok(o) = out {
            let b = String::from_utf8_lossy(&o.stdout).to_string();
            if o.status.success() && b.contains(&format!("\"{}\"", 4 * MIB)) {
                break b;
            }
            last = b;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus never returned the recorded size: {last}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(body.contains("\"status\":\"success\""), "{body}");
}
