//! Prompt stops: SIGTERM to `serve` or `record` in the middle of a snapshot's proof (a
//! process holding a large private copy, searched byte by byte) ends the process at the
//! next window of memory, not when the proof would have finished; `record` does not write
//! the snapshot its stop cut short.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Starts `args` with the collection's profile on stderr, waits until the gather of the
/// first snapshot is done (its proof starts next), sends SIGTERM, and returns how long
/// the process took to exit and what it printed on stderr.
fn stop_mid_proof(args: &[&str]) -> (Duration, String) {
    let mut c = Command::new(exe())
        .args(args)
        .env("TWOFOLD_PROFILE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "{said}");
        said.push_str(&line);
        if line.starts_with("gather: cgroups") {
            break;
        }
    }
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    let sent = Instant::now();
    let status = c.wait().unwrap();
    let took = sent.elapsed();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    said.push_str(&rest);
    assert!(status.success(), "{status:?}: {said}");
    (took, said)
}

#[test]
fn serve_and_record_stop_mid_proof() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 128 * MIB, Fill::Random(11)),
            ("b", 128 * MIB, Fill::Random(12)),
        ],
    );
    // A mapper keeps the file of interest; a copier holds 256 MiB to search.
    let _map = reader("map", Some(&file), &[]);
    let _copy = reader("copy", Some(&file), &[]);

    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let (took, said) = stop_mid_proof(&[
        "serve",
        "--listen",
        &listen,
        "--interval",
        "60s",
        "--prove-budget",
        "60s",
    ]);
    assert!(took < Duration::from_secs(1), "serve took {took:?}: {said}");

    let store = dir.path().join("store");
    let (took, said) = stop_mid_proof(&[
        "record",
        "--store",
        store.to_str().unwrap(),
        "--interval",
        "60s",
        "--prove-budget",
        "60s",
    ]);
    assert!(
        took < Duration::from_secs(1),
        "record took {took:?}: {said}"
    );
    // The snapshot the stop cut short was not written (its proof was not whole).
    let out = Command::new(exe())
        .args([
            "replay",
            "--json",
            "--store",
            store.to_str().unwrap(),
            "--at",
            "now",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}: {said}");
    assert!(err.contains("holds no snapshot"), "{err}");
}
