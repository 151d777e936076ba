//! `serve --trace`: per-file eBPF counters against a copying reader the test started after
//! the exporter attached (root, tracefs). Ground truth: the reader read() the whole file
//! once, from a cold page cache (the test evicted it), so the file's read bytes are its
//! size and the page cache gained every page of it (and `fincore` never sees more).

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn value(body: &str, name: &str, id: &str) -> Option<f64> {
    let prefix = format!("{name}{{file_id=\"{id}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn trace_counters_count_a_cold_read_of_the_whole_file() {
    // One at a time with the other eBPF tests: they disturb the whole host.
    let _serial = crate::serial();
    if !require(is_root(), "root (to attach the eBPF programs)") {
        return;
    }
    let _ = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    let dir = tempfile::tempdir().unwrap();
    let size = 24 * MIB;
    let file = model_file(dir.path(), "traced.safetensors", size);
    evict(&file);
    let id = file_id(&file);
    let port = free_port();
    let glob = dir.path().join("*.safetensors");
    let mut child = Command::new(exe())
        .args(["serve", "--trace", "--no-prove"])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--interval", "1s"])
        .args(["--model-glob", glob.to_str().unwrap()])
        // Its upload ledger (a resident tracer's) in the test's directory.
        .env("TWOFOLD_UPLOADS_DIR", dir.path().join("ledgers"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let poll = |pred: &dyn Fn(&str) -> bool| -> String {
        let until = Instant::now() + Duration::from_secs(90);
        let mut last = String::new();
        while Instant::now() < until {
            if let Some(b) = metrics_text(port) {
                if pred(&b) {
                    return b;
                }
                last = b;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        last
    };
    // Attached, and the (cold, unread) file is exported with its counters at 0.
    let body = poll(&|b| value(b, "twofold_file_read_bytes_total", &id).is_some());
    let before = value(&body, "twofold_file_read_bytes_total", &id);
    let copy = reader("copy", Some(&file), &["--close"]);
    let body =
        poll(&|b| value(b, "twofold_file_read_bytes_total", &id).is_some_and(|v| v >= size as f64));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        before,
        Some(0.0),
        "nothing read before the reader: {stderr}\n{body}"
    );
    let read = value(&body, "twofold_file_read_bytes_total", &id).unwrap();
    assert_eq!(read, size as f64, "{body}");
    let added = value(&body, "twofold_file_page_cache_added_bytes_total", &id).unwrap();
    assert!(
        added >= size as f64 && added <= (size + 64 * 4096) as f64,
        "page cache added {added} for a cold read of {size}: {body}"
    );
    assert!(
        value(&body, "twofold_file_page_cache_evicted_bytes_total", &id).is_some(),
        "{body}"
    );
    // Peer tool: every page of the file now in the page cache was added since the cold
    // start, so fincore's resident bytes can never exceed the exported added bytes.
    if have("fincore") {
        let f = Command::new("fincore")
            .args(["-b", "-n", "-o", "RES"])
            .arg(&file)
            .output()
            .unwrap();
        let res: u64 = String::from_utf8_lossy(&f.stdout).trim().parse().unwrap();
        assert!(
            res > 0 && res as f64 <= added,
            "fincore {res} > added {added}"
        );
    }
    drop(copy);
}
