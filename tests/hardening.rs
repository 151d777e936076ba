//! Hostile input at the command line: FIFOs, devices, directories, absurd numbers and
//! sizes. Every case must end in time with exit 2, one line on stderr naming the
//! offending thing, nothing on stdout, and never a panic.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs twofold with `args`; kills it (and fails) if it takes longer than `limit`, which a
/// blocking open of a FIFO or an endless read of /dev/zero would.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let mut child = Command::new(exe())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), out, err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Exit 2, exactly one line on stderr containing `needle`, no panic, empty stdout.
fn assert_refused(args: &[&str], needle: &str) {
    let (code, out, err) = run_bounded(args, Duration::from_secs(20));
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("twofold: error: "), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: want '{needle}' in {err}");
    assert!(out.is_empty(), "{args:?}: stdout {out}");
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

#[test]
fn files_that_are_not_regular_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let fifo = format!("{d}/fifo");
    mkfifo(Path::new(&fifo));
    let missing = format!("{d}/missing");
    let model = format!("{d}/m.bin");
    std::fs::write(&model, vec![1u8; 8192]).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["probe", "--report", "/dev/zero"],
            "'/dev/zero' is a device",
        ),
        (&["probe", "--report", &fifo], "is a pipe"),
        (&["probe", "--report", d], "is a directory"),
        (&["probe", "--backend", "fake", d], "is a directory"),
        (&["probe", "--backend", "fake", "/dev/zero"], "is a device"),
        (&["probe", "--backend", "fake", &fifo], "is a pipe"),
        (&["run", "--model", &fifo, "--", "true"], "--model '"),
        (&["run", "--model", &fifo, "--", "true"], "is a pipe"),
        (&["run", "--model", d, "--", "true"], "is a directory"),
        (&["run", "--watch", &fifo, "--", "true"], "--watch '"),
        (&["run", "--watch", &missing, "--", "true"], "missing'"),
        (
            &["run", "--out", "/dev/zero", "--", "true"],
            "--out '/dev/zero' exists and is not a directory",
        ),
        (
            &["compare", "--model", &fifo, "--", "true", ":::", "true"],
            "is a pipe",
        ),
        (&["inspect", &fifo], "is not a regular file"),
        (&["residency", &fifo], "is not a regular file"),
        (&["pressure", &fifo], "is a pipe"),
        (&["pressure", d], "is a directory"),
        (&["pressure", &model, "--reference", &fifo], "--reference '"),
        (&["dupes", "--pid", "1", &fifo], "is a pipe"),
    ];
    for (args, needle) in cases {
        assert_refused(args, needle);
    }
}

#[test]
fn generated_models_must_fit_on_disk_and_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for args in [
        &["demo", "--dir", d, "--size", "18446744073709551615"][..],
        &["demo", "--dir", d, "--size", "60T"],
        &["probe", "--backend", "fake", "--dir", d, "--size", "60T"],
    ] {
        assert_refused(args, "--size '");
    }
    let file = format!("{d}/w.safetensors");
    assert_refused(&["__bench", "write-model", &file, "60T"], "size '60.0 TiB'");
    // Nothing half-written.
    assert!(std::fs::read_dir(d).unwrap().next().is_none());
}

#[test]
fn one_memory_max_rule_for_every_campaign() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.bin");
    std::fs::write(&model, vec![1u8; 8192]).unwrap();
    let m = model.to_str().unwrap();
    let huge = "1000T";
    for args in [
        &["run", "--memory-max", huge, "--", "true"][..],
        &["compare", "--memory-max", huge, "--", "true", ":::", "true"],
        &[
            "pressure",
            m,
            "--experiment",
            "integrity",
            "--memory-max",
            huge,
        ],
        &[
            "pressure",
            m,
            "--experiment",
            "readers",
            "--memory-max",
            huge,
        ],
    ] {
        assert_refused(args, "is more than MemAvailable");
    }
}

/// The whole battery of bad numbers and shapes: each one line, exit 2, no panic.
#[test]
fn bad_arguments_battery() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.bin");
    std::fs::write(&model, vec![1u8; 8192]).unwrap();
    let m = model.to_str().unwrap();
    let mut cases: Vec<(Vec<&str>, &str)> = Vec::new();
    for v in ["-1", "nan", "inf", "1e308", "0", "99999999999h"] {
        let flag = format!("--timeout={v}");
        let flag: &'static str = Box::leak(flag.into_boxed_str());
        cases.push((vec!["run", flag, "--", "true"], "--timeout"));
        cases.push((
            vec!["compare", flag, "--", "true", ":::", "true"],
            "--timeout",
        ));
        let step = format!("--competitor-step-seconds={v}");
        let step: &'static str = Box::leak(step.into_boxed_str());
        cases.push((vec!["pressure", m, step], "--competitor-step-seconds"));
    }
    for v in ["0", "1", "15M"] {
        cases.push((vec!["run", "--memory-max", v, "--", "true"], "--memory-max"));
        cases.push((vec!["pressure", m, "--memory-max", v], "--memory-max"));
    }
    for v in ["-1", "0", "5", "NaN", "inf"] {
        let f = format!("--competitor-fraction={v}");
        let f: &'static str = Box::leak(f.into_boxed_str());
        cases.push((vec!["pressure", m, f], "--competitor-fraction"));
    }
    for v in ["NaN", "-0.1", "1", "inf"] {
        let f = format!("--tie-band={v}");
        let f: &'static str = Box::leak(f.into_boxed_str());
        cases.push((vec!["probe", m, f], "--tie-band"));
    }
    let more: Vec<(Vec<&str>, &str)> = vec![
        (vec!["pressure", m, "--readers", "0"], "--readers"),
        (vec!["pressure", m, "--readers", "1,0"], "--readers"),
        (vec!["pressure", m, "--cycles", "0"], "--cycles"),
        (
            vec!["pressure", m, "--competitor-steps", "0"],
            "--competitor-steps",
        ),
        (vec!["pressure", m, "--map-readers", "0"], "--map-readers"),
        (vec!["pressure", m, "--interval-ms", "0"], "--interval-ms"),
        (vec!["probe", m, "--chunk", "0"], "--chunk"),
        (vec!["probe", m, "--range-limit", "0"], "--range-limit"),
        (vec!["probe", m, "--range-limit", "1"], "--range-limit"),
        (vec!["probe", m, "--working-set", "0"], "--working-set"),
        (vec!["probe", m, "--timeout", "0"], "--timeout"),
        (vec!["probe", "--size", "0"], "--size"),
        (vec!["scan", "--trace", "99999999999h"], "--trace"),
        (vec!["scan", "--trace", "0"], "--trace"),
        (vec!["trace", "--interval", "0"], "--interval"),
        (vec!["trace", "--duration", "99999999999h"], "--duration"),
        (
            vec!["compare", "--rounds", "0", "--", "a", ":::", "b"],
            "--rounds",
        ),
        (
            vec!["compare", "--", "a", ":::", "b", ":::", "c"],
            "exactly two commands",
        ),
        (vec!["compare", "--", "a", "b"], "':::'"),
        (vec!["compare", "--", "a", ":::"], "two non-empty commands"),
        (vec!["run"], "required"),
    ];
    cases.extend(more);
    eprintln!("bad-argument battery: {} command lines", cases.len());
    for (args, needle) in &cases {
        assert_refused(args, needle);
    }
}

#[test]
fn misleading_wording_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A safetensors cut to 68 bytes: the header runs past the end of the file.
    let header = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.truncate(68);
    let cut = d.join("cut.safetensors");
    std::fs::write(&cut, &f).unwrap();
    assert_refused(
        &["inspect", cut.to_str().unwrap()],
        &format!(
            "header runs past the end of the file: it would end at byte '{}' but the file ends at byte '68'",
            8 + header.len()
        ),
    );
    // 2^63 and 1000 in a 10-byte file: one rule, the same error.
    for len in [1000u64, 1 << 63] {
        let mut f = len.to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        let p = d.join(format!("len{len}.safetensors"));
        std::fs::write(&p, &f).unwrap();
        assert_refused(
            &["inspect", p.to_str().unwrap()],
            "header runs past the end",
        );
    }
    // Identical offsets are malformed, not padding.
    let header = r#"{"a":{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]},"b":{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.resize(f.len() + 4096, 3);
    let p = d.join("overlap.safetensors");
    std::fs::write(&p, &f).unwrap();
    assert_refused(
        &["inspect", p.to_str().unwrap()],
        "tensors 'a' and 'b' overlap",
    );
}
