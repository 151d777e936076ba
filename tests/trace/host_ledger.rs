//! One tracer per host (#44): a resident `record --trace-uploads` keeps its upload ledger
//! where a later plain `scan` (another process, no tracing of its own) reads it, with real
//! uprobes on the stand-in `libcuda.so.1` (tests/trace/cuda/). Ground truth as in
//! [`crate::device_copies`]: the stand-in's own dump of each allocation's bytes.

use std::path::Path;

use crate::device_copies::{device_memory, held_bytes, model, proven, uploader};
use crate::serial;
use crate::uploads::{file, fixture, standin};
use twofold::model::Report;

/// A plain `scan M` (no tracing of its own) with the test's ledger directory and GPU.
fn plain_scan(m: &Path, ledgers: &Path, gpu: &Path, json: bool) -> String {
    let mut cmd = std::process::Command::new(crate::common::exe());
    cmd.arg("scan").arg(m);
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .env("TWOFOLD_UPLOADS_DIR", ledgers)
        .env("TWOFOLD_GPU_FIXTURE", gpu)
        .env_remove("TWOFOLD_LIBCUDA")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A resident `record --trace-uploads` keeps its ledger for the host: a later plain `scan`
/// (another process, no tracing of its own) shows the proven device copy and the clone
/// from it and names the tracer; once the uploader exits it shows neither; the ledger
/// goes when the recorder stops.
#[test]
fn a_plain_scan_proves_device_copies_from_the_resident_tracers_ledger() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let _serial = serial();
    let Some(s) = standin() else { return };
    let d = s.dir.path();
    let m = d.join("m.safetensors");
    let ranges = model(&m, "F16");
    let image = std::fs::read(&m).unwrap();
    let ledgers = d.join("ledgers");
    let mut up = uploader(
        &s,
        "resident",
        "heap",
        &m,
        &ranges,
        &[("UPLOADER_CLONE", "dtod")],
    );
    let gpu = fixture(d, &[(up.pid(), 80 << 20)]);
    let mut rec = Command::new(crate::common::exe())
        .args([
            "record",
            "--trace-uploads",
            "--interval",
            "1s",
            "--no-prove",
            "--store",
        ])
        .arg(d.join("store"))
        .arg(&m)
        .env("TWOFOLD_LIBCUDA", &s.lib)
        .env("TWOFOLD_GPU_FIXTURE", &gpu)
        .env("TWOFOLD_UPLOADS_DIR", &ledgers)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let rec_pid = rec.id() as i32;
    let ledger_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&ledgers)
            .map(|r| {
                r.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let t0 = Instant::now();
    while ledger_files().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "record wrote no ledger"
        );
        assert!(rec.try_wait().unwrap().is_none(), "record exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut rec = Stop(rec);
    up.go();
    let truth = held_bytes(&device_memory(&mut up), &image);
    assert!(truth > 0);
    // The ledger is written within a second of a change: scan until it shows the copies.
    let t0 = Instant::now();
    let r = loop {
        let r: Report = serde_json::from_str(&plain_scan(&m, &ledgers, &gpu, true)).unwrap();
        if proven(file(&r, &m), up.pid()).0 == truth || t0.elapsed() > Duration::from_secs(30) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let f = file(&r, &m);
    let (bytes, mut via) = proven(f, up.pid());
    via.sort();
    assert_eq!(
        (bytes, via),
        (truth, vec!["clone".to_string(), "upload".into()]),
        "{:?}",
        f.device_copies
    );
    let t = r
        .gpus
        .uploads
        .as_ref()
        .and_then(|u| u.tracer.clone())
        .unwrap();
    assert_eq!((t.pid, t.command.as_str()), (rec_pid, "record"));
    let text = plain_scan(&m, &ledgers, &gpu, false);
    assert!(
        text.contains(&format!(
            "uploads traced by pid {rec_pid} (twofold record) since "
        )),
        "{text}"
    );
    assert!(text.contains("proven device copy"), "{text}");
    // The uploader exits: nothing of it is shown, at once.
    let gone = up.pid();
    drop(up);
    let r: Report = serde_json::from_str(&plain_scan(&m, &ledgers, &gpu, true)).unwrap();
    let f = file(&r, &m);
    assert!(
        f.device_copies.iter().all(|c| c.pid != gone),
        "{:?}",
        f.device_copies
    );
    assert!(f.uploads.iter().all(|u| u.pid != gone), "{:?}", f.uploads);
    assert_eq!(f.representations.device, Some(0.0));
    // The recorder stops: its ledger goes with it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = rec.0.wait().unwrap();
    assert!(
        status.success() || status.code() == Some(128 + 15),
        "{status:?}"
    );
    assert!(ledger_files().is_empty(), "{:?}", ledger_files());
    let r: Report = serde_json::from_str(&plain_scan(&m, &ledgers, &gpu, true)).unwrap();
    assert!(r.gpus.uploads.is_none());
}
