//! `serve --trace`: per-file eBPF counters against a copying reader the test started after
//! the exporter attached (root, tracefs). Ground truth: the reader read() the whole file
//! once, from a cold page cache (the test evicted it), so the file's read bytes are its
//! size and the page cache gained every page of it (`fincore` says the file is resident).

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn metrics(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: x\r\nAccept: text/plain; version=0.0.4\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

fn value(body: &str, name: &str, id: &str) -> Option<f64> {
    let prefix = format!("{name}{{file_id=\"{id}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn trace_counters_count_a_cold_read_of_the_whole_file() {
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
    let id = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&file).unwrap();
        format!(
            "{}:{}:{}",
            libc::major(m.dev()),
            libc::minor(m.dev()),
            m.ino()
        )
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let glob = dir.path().join("*.safetensors");
    let mut child = Command::new(exe())
        .args(["serve", "--trace", "--no-prove"])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--interval", "1s"])
        .args(["--model-glob", glob.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let poll = |pred: &dyn Fn(&str) -> bool| -> String {
        let until = Instant::now() + Duration::from_secs(90);
        let mut last = String::new();
        while Instant::now() < until {
            if let Some(b) = metrics(port) {
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
    // The page cache holds the whole file now (peer tool).
    if have("fincore") {
        let f = Command::new("fincore")
            .args(["-b", "-n", "-o", "RES"])
            .arg(&file)
            .output()
            .unwrap();
        let res: u64 = String::from_utf8_lossy(&f.stdout).trim().parse().unwrap();
        assert_eq!(res, size, "fincore");
    }
    drop(copy);
}
