//! Recorded and hand-written /proc + cgroup trees run through collect → model.
//!
//! `v1-copy-map-cow` was recorded on the development machine (cgroup v1) by
//! `tests/fixtures/capture.sh` with a copying, a mapping and a CoW-writing reader and a
//! kernel thread; its model file no longer exists, so sizes and residency are unknown
//! (null), never 0. `v2-hand` is a hand-written cgroup v2 tree of a llama-server.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use twofold::collect::gather::{gather, Request};
use twofold::collect::Roots;
use twofold::model::{self, MapKind};

/// Messages name fixture paths under the checkout; snapshots must not depend on where
/// the repository is cloned.
fn checkout_redacted(value: insta::internals::Content, _: insta::internals::ContentPath) -> String {
    value
        .as_str()
        .unwrap_or_default()
        .replace(env!("CARGO_MANIFEST_DIR"), "[checkout]")
}

fn fixture(name: &str) -> Roots {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Roots {
        proc: base.join("proc"),
        cgroup: base.join("cgroup"),
    }
}

fn run(roots: &Roots, req: &Request) -> (model::Report, Vec<twofold::sample::Warning>) {
    let mut warnings = Vec::new();
    let sample = gather(roots, req, &mut warnings).unwrap();
    (model::from_sample(&sample), warnings)
}

#[test]
fn v1_recorded_tree() {
    let roots = fixture("v1-copy-map-cow");
    let (report, warnings) = run(&roots, &Request::default());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(report.files.len(), 1);
    let f = &report.files[0];
    // The recorded file is gone: unknown, not zero.
    assert_eq!(f.size_bytes, None);
    assert_eq!(f.resident_bytes, None);
    assert!(f.residency_unknown_reason.is_some());
    // map child: MAP_SHARED read-only; private-write child: MAP_PRIVATE with 1 MiB CoW.
    let shared: Vec<_> = f
        .mappers
        .iter()
        .filter(|m| m.kind == MapKind::Shared)
        .collect();
    let private: Vec<_> = f
        .mappers
        .iter()
        .filter(|m| m.kind == MapKind::Private)
        .collect();
    assert_eq!(shared.len(), 1);
    assert_eq!(private.len(), 1);
    assert_eq!(private[0].cow_anon_bytes, Some(1 << 20));
    assert!(private[0].writable);
    // The copy child's fd points at the deleted file: no (dev, inode), so it is not
    // claimed as a holder (the live tests cover fd holders).
    assert!(f.holders.is_empty());
    // The kernel thread is not listed (nothing to hold) and nothing was skipped.
    assert!(report.processes.iter().all(|p| p.pid != 2));
    assert_eq!(report.skipped.gone, 0);
    assert_eq!(report.cgroups.len(), 1);
    assert!(report
        .findings
        .iter()
        .any(|x| x.code == "cow-in-private-mapping"));
    insta::assert_json_snapshot!("v1_recorded_tree", report, {
        ".files[].residency_unknown_reason" => "[reason]",
        ".system.page_size_bytes" => "[page]",
        ".findings[].message" => insta::dynamic_redaction(checkout_redacted),
    });
}

#[test]
fn v1_kernel_thread_listed_when_asked() {
    let roots = fixture("v1-copy-map-cow");
    let req = Request {
        pids: vec![2],
        ..Request::default()
    };
    let (report, _) = run(&roots, &req);
    let p = &report.processes[0];
    assert_eq!(p.comm, "kthreadd");
    assert_eq!(p.rss_bytes, None);
    assert_eq!(p.pss_bytes, None);
}

#[test]
fn v2_hand_written_tree() {
    let roots = fixture("v2-hand");
    let (report, warnings) = run(&roots, &Request::default());
    assert!(warnings.is_empty(), "{warnings:?}");
    let c = &report.cgroups[0];
    assert_eq!(c.path, "/system.slice/llama.service");
    assert_eq!(c.limit_bytes, Some(6 << 30));
    assert_eq!(c.peak_bytes, Some(5 << 30));
    assert_eq!(c.anon_bytes, Some(512 << 20));
    assert_eq!(c.file_mapped_bytes, Some(4 << 30));
    assert_eq!(c.refaults_file, Some(1200));
    assert_eq!(c.oom_kills, Some(1));
    let f = &report.files[0];
    assert_eq!(f.path, "/models/llama-3-8b.Q4_K_M.gguf");
    assert_eq!(f.mappers[0].thp_bytes, Some(2 << 30));
    assert_eq!(f.mappers[0].resident_bytes, Some(4 << 30));
    let codes: Vec<&str> = report.findings.iter().map(|x| x.code.as_str()).collect();
    assert!(codes.contains(&"cgroup-oom-kills"), "{codes:?}");
    assert!(codes.contains(&"file-thp"), "{codes:?}");
    let p = &report.processes[0];
    assert_eq!(p.uss_bytes, Some((4 << 30) + (512 << 20)));
    insta::assert_json_snapshot!("v2_hand_written_tree", report, {
        ".files[].residency_unknown_reason" => "[reason]",
        ".system.page_size_bytes" => "[page]",
        ".findings[].message" => insta::dynamic_redaction(checkout_redacted),
    });
    // Restricting to the cgroup keeps the process; another cgroup excludes it.
    let req = Request {
        cgroup: Some(PathBuf::from("/system.slice")),
        ..Request::default()
    };
    assert_eq!(run(&roots, &req).0.processes.len(), 1);
}

/// A copy of a fixture tree that a test may alter.
fn scratch(name: &str) -> (tempfile::TempDir, Roots) {
    let src = fixture(name);
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(src.proc.parent().unwrap().join("."))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let roots = Roots {
        proc: dir.path().join("proc"),
        cgroup: dir.path().join("cgroup"),
    };
    (dir, roots)
}

#[test]
fn process_gone_mid_scan_is_counted_not_fatal() {
    let (_d, roots) = scratch("v2-hand");
    // A pid directory whose files vanished: the process exited after listing.
    std::fs::create_dir_all(roots.proc.join("4242")).unwrap();
    let (report, warnings) = run(&roots, &Request::default());
    assert_eq!(report.skipped.gone, 1);
    assert_eq!(report.processes.len(), 1);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn malformed_line_is_a_warning_naming_file_and_line() {
    let (_d, roots) = scratch("v2-hand");
    let status = roots.proc.join("100/status");
    let text = std::fs::read_to_string(&status)
        .unwrap()
        .replace("RssAnon:\t  524288 kB", "RssAnon:\t  lots kB");
    std::fs::write(&status, text).unwrap();
    let (report, warnings) = run(&roots, &Request::default());
    assert!(report.processes.is_empty());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert_eq!(
        w.kind,
        twofold::sample::WarningKind::ProcessUnreadable,
        "{w:?}"
    );
    assert!(
        w.text.contains("malformed line 12 of '") && w.text.contains("100/status'"),
        "{w}"
    );
}

#[test]
fn values_near_u64_limits_do_not_wrap() {
    let (_d, roots) = scratch("v2-hand");
    let dir = roots.cgroup.join("system.slice/llama.service");
    std::fs::write(dir.join("memory.current"), format!("{}\n", u64::MAX)).unwrap();
    std::fs::write(
        dir.join("memory.stat"),
        format!("anon {}\nfile 0\n", u64::MAX - 1),
    )
    .unwrap();
    let (report, _) = run(&roots, &Request::default());
    let c = &report.cgroups[0];
    assert_eq!(c.usage_bytes, Some(u64::MAX));
    assert_eq!(c.anon_bytes, Some(u64::MAX - 1));
}

#[test]
fn unknown_pid_is_an_error() {
    let roots = fixture("v2-hand");
    let req = Request {
        pids: vec![99999],
        ..Request::default()
    };
    let err = gather(&roots, &req, &mut Vec::new()).unwrap_err();
    assert_eq!(err.to_string(), "no process with pid '99999'");
}

/// A snapshot of each recorded and hand-written tree survives the store's JSON round trip
/// unchanged, and so does its report (what `replay` renders).
#[test]
fn snapshots_round_trip_through_json() {
    for name in ["v1-copy-map-cow", "v2-hand"] {
        let roots = fixture(name);
        let req = Request {
            all_processes: true,
            ..Request::default()
        };
        let sample = gather(&roots, &req, &mut Vec::new()).unwrap();
        let snap = twofold::engine::Snapshot {
            version: twofold::engine::SNAPSHOT_VERSION,
            at_unix_ns: 1_764_472_320_123_456_789,
            at_mono_ns: 42,
            sample,
            trace: None,
        };
        let text = serde_json::to_vec(&snap).unwrap();
        let back: twofold::engine::Snapshot = serde_json::from_slice(&text).unwrap();
        assert_eq!(back, snap, "{name}");
        let prev = twofold::engine::Snapshot {
            at_mono_ns: 1,
            ..snap.clone()
        };
        assert_eq!(
            twofold::engine::report(&back, Some(&prev)),
            twofold::engine::report(&snap, Some(&prev)),
            "{name}"
        );
    }
}
