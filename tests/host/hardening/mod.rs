//! Hostile input at the command line: FIFOs, devices, directories, absurd numbers and
//! sizes. Every case must end in time with exit 2, one line on stderr naming the
//! offending thing, nothing on stdout, and never a panic.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::tmux::Tmux;
use crate::common::*;

mod store;
mod terminal;

/// The tests here and in `terminal` run as one group (beside each other, never beside
/// another module's).
const GROUP: &str = module_path!();

/// Runs twofold with `args`; kills it (and fails) if it takes longer than `limit`, which a
/// blocking open of a FIFO or an endless read of /dev/zero would.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let (status, out, err) = bounded(Command::new(exe()).args(args), limit);
    (status.code(), out, err)
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

/// Whether `pid` is gone (or a zombie, done and waiting for its parent to reap it).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
    }
}

/// Runs twofold to the end with `args`, as a pipe: (exit code, stdout bytes, stderr).
fn run_raw(args: &[&std::ffi::OsStr]) -> (Option<i32>, Vec<u8>, String) {
    let out = Command::new(exe())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn files_that_are_not_regular_are_refused_without_blocking() {
    let _group = crate::common::group(GROUP);
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
    let _group = crate::common::group(GROUP);
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
    let _group = crate::common::group(GROUP);
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
    let _group = crate::common::group(GROUP);
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
    for v in ["NaN", "-0.1", "0", "1", "inf"] {
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
        (vec![], "no command given: one of scan, "),
        (vec!["top", "--filter", "anon>>>1Q"], "--filter 'anon>>>1Q'"),
        (vec!["top", "--sort", "nope"], "column 'nope'"),
    ];
    cases.extend(more);
    eprintln!("bad-argument battery: {} command lines", cases.len());
    for (args, needle) in &cases {
        assert_refused(args, needle);
    }
}

#[test]
fn misleading_wording_is_fixed() {
    let _group = crate::common::group(GROUP);
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

/// A process started by a test, SIGKILLed and reaped on drop whatever the test found.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn record_validates_everything_before_it_prints_or_creates_the_store() {
    let _group = crate::common::group(GROUP);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let fifo = format!("{d}/fifo");
    mkfifo(Path::new(&fifo));
    let store = format!("{d}/S");
    let cases: &[(&[&str], &str)] = &[
        (&["/nonexistent"], "cannot access '/nonexistent'"),
        (&["--pid", "99999999"], "no process with pid '99999999'"),
        (&[&fifo], "is not a regular file or directory"),
        (&["/dev/zero"], "'/dev/zero' is a device"),
        (&["/proc/self/mem"], "is on procfs"),
        (&["--count", "0"], "'0'"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["record", "--count", "1", "--store", &store];
        if extra[0] == "--count" {
            args.truncate(1);
            args.extend(["--store", &store]);
        }
        args.extend_from_slice(extra);
        assert_refused(&args, needle);
        assert!(!Path::new(&store).exists(), "{args:?} created the store");
    }
    // A store path under a regular file fails before anything is written either.
    let file = format!("{d}/plain");
    std::fs::write(&file, b"x").unwrap();
    let under = format!("{file}/S");
    assert_refused(
        &["record", "--count", "1", "--store", &under, "/nonexistent"],
        "cannot access",
    );
    assert_refused(
        &["record", "--count", "1", "--store", &under, d],
        "is not a directory",
    );
}

#[test]
fn one_size_parser_refuses_overflow_on_every_size_flag() {
    let _group = crate::common::group(GROUP);
    let big = "18446744073709551616";
    let cases: &[&[&str]] = &[
        &["scan", "--min-size", big],
        &["trace", "--min-size", big],
        &["record", "--min-size", big],
        &["record", "--max-size", big],
        &["serve", "--min-size", big],
        &["probe", "--working-set", big],
        &["probe", "--chunk", big],
        &["probe", "--size", big],
        &["demo", "--size", big],
    ];
    for args in cases {
        assert_refused(args, "is out of range");
    }
}

#[test]
fn kernel_interface_files_are_not_models() {
    let _group = crate::common::group(GROUP);
    let mem = "/proc/self/mem";
    let cases: &[&[&str]] = &[
        &["inspect", mem],
        &["residency", mem],
        &["scan", mem],
        &["scan", "/sys/kernel"],
        &["run", "--model", mem, "--", "true"],
        &["compare", "--model", mem, "--", "true", ":::", "true"],
        &["pressure", mem],
    ];
    for args in cases {
        assert_refused(args, "is on ");
    }
    let me = std::process::id().to_string();
    assert_refused(&["dupes", "--pid", &me, mem], "is on procfs");
    if is_root() {
        assert_refused(
            &["trace", "--duration", "1s", "--file", mem],
            "is on procfs",
        );
    }
}

#[test]
fn a_named_pid_that_is_a_kernel_thread_or_gone_is_an_error() {
    let _group = crate::common::group(GROUP);
    let kthreadd = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
    if kthreadd.trim() == "kthreadd" {
        for cmd in ["scan", "dupes"] {
            assert_refused(
                &[cmd, "--pid", "2"],
                "pid '2' is the kernel thread 'kthreadd'",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("S");
        let s = store.to_str().unwrap();
        assert_refused(
            &["record", "--count", "1", "--store", s, "--pid", "2"],
            "kernel thread",
        );
        assert!(!store.exists());
    } else {
        println!("SKIPPED: pid 2 is not kthreadd here (a pid namespace)");
    }
    // A zombie (exited, not yet reaped) and a reaped child.
    let zombie = Command::new("true").spawn().unwrap();
    let zpid = zombie.id() as i32;
    let start = Instant::now();
    while !gone(zpid) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let z = zpid.to_string();
    assert_refused(&["dupes", "--pid", &z], &format!("pid '{z}'"));
    assert_refused(&["scan", "--pid", &z], "has exited");
    let mut zombie = zombie;
    zombie.wait().unwrap();
    assert_refused(
        &["dupes", "--pid", &z],
        &format!("no process with pid '{z}'"),
    );
}

#[test]
fn pressure_checks_out_before_any_experiment() {
    let _group = crate::common::group(GROUP);
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "m.bin", MIB);
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let out = plain.join("out");
    let started = Instant::now();
    assert_refused(
        &[
            "pressure",
            model.to_str().unwrap(),
            "--experiment",
            "integrity",
            "--out",
            out.to_str().unwrap(),
        ],
        "cannot create --out",
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A tiny tmpfs mounted on a temp dir (root only), unmounted on drop.
struct TinyFs(tempfile::TempDir);

impl TinyFs {
    fn mount() -> Option<TinyFs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tinyfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(TinyFs(dir))
    }

    /// Fills the file system until a write fails with ENOSPC.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.path().join("filler")).unwrap();
        loop {
            if let Err(e) = f.write_all(&[7u8; 4096]) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                return;
            }
        }
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_leaves_no_temp_file_behind() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root (to mount a tiny tmpfs)") {
        return;
    }
    let Some(fs) = TinyFs::mount() else {
        println!("SKIPPED: cannot mount a tmpfs here");
        return;
    };
    fs.fill();
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "m.gguf", MIB);
    let store = fs.0.path().join("S");
    let (code, _, err) = run_raw(&[
        "record".as_ref(),
        "--count".as_ref(),
        "1".as_ref(),
        "--no-prove".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        model.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&store)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !left.iter().any(|n| n.to_string_lossy().ends_with(".tmp")),
        "left behind: {left:?}"
    );
}
