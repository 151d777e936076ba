//! `scan --trace` and `trace` with real loaders: who copied a file and how (read(), the
//! JSON Lines records, a comm that changes across exec, the read() ledger of a loader that
//! closed its file), and what an unprivileged user gets.

use std::process::Command;

use crate::common::*;
use crate::support::*;
use crate::{serial, twofold_cmd};

#[test]
fn trace_json_lines_parse_into_typed_records() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    use twofold::render::trace::{Line, Record};
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.npy", size);
    let k = key(&file);
    evict(&file);
    let mut copy = Armed::start("copy", Some(&file), &[]);
    let mut trace = twofold_cmd()
        .args(["trace", "--json", "--interval", "300ms", "--duration", "3s"])
        .args(["--pid", &copy.pid().to_string(), "--file"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(trace.stdout.take().unwrap()).lines();
    let first: Line = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let Record::Attached(a) = first.record else {
        panic!("first record {first:?}")
    };
    assert_eq!(first.schema_version, twofold::render::trace::SCHEMA_VERSION);
    assert!(a.unavailable.is_empty(), "{:?}", a.unavailable);
    assert_eq!(a.pids, [copy.pid()]);
    assert_eq!(copy.go(), "ready");
    let records: Vec<Record> = lines
        .map(|l| serde_json::from_str::<Line>(&l.unwrap()).unwrap().record)
        .collect();
    assert!(trace.wait().unwrap().success());
    let intervals = records
        .iter()
        .filter(|r| matches!(r, Record::Interval(_)))
        .count();
    assert!(intervals >= 5, "{intervals} intervals in 3 s");
    let Some(Record::Summary(m)) = records.last() else {
        panic!("no summary last")
    };
    let f = m.files.iter().find(|f| f.inode == k.inode).unwrap();
    assert!(f.of_interest);
    assert_eq!(f.total.read_bytes, Some(size));
    assert_eq!(f.total.added_pages, Some(pages(size)));
    let p = m.processes.iter().find(|p| p.pid == copy.pid()).unwrap();
    assert_eq!(p.total.read_bytes, Some(size));
    assert_eq!(p.files[0].path.as_deref(), file.to_str());
    // Rates over the intervals add up to the totals.
    let sum: f64 = records
        .iter()
        .filter_map(|r| match r {
            Record::Interval(m) => m
                .files
                .iter()
                .find(|f| f.inode == k.inode)
                .and_then(|f| f.delta.read_bytes),
            _ => None,
        })
        .map(|v| v as f64)
        .sum();
    assert_eq!(sum, size as f64);
}

#[test]
fn scan_trace_names_the_copying_loader() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 80 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    // It reads the file during the window and closes it: the read() ledger is the only
    // trace of where its copy came from.
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut scan = twofold_cmd()
        .args(["scan", "--json", "--trace", "2s", "--prove-budget", "120s"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Lines before the window's (warnings) are kept for the failure message.
    let mut err = std::io::BufReader::new(scan.stderr.take().unwrap());
    let mut before = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "no window: {before}");
        if line.starts_with("twofold: tracing for 2.0 s") {
            break;
        }
        before.push_str(&line);
    }
    assert_eq!(copy.go(), "ready");
    // The rest of stderr on a thread: the report on stdout can fill its pipe first.
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        rest
    });
    let out = scan.wait_with_output().unwrap();
    let rest = rest.join().unwrap();
    assert!(out.status.success(), "{before}{rest}");
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    // Everything the scan said, for any assertion below that fails.
    let why = format!(
        "stderr: {before}{rest}\nreport: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let t = r.trace.as_ref().expect(&why);
    let p = t
        .processes
        .iter()
        .find(|p| p.pid == copy.pid())
        .expect(&why);
    assert_eq!(p.total.read_bytes, Some(size), "{why}");
    let f = r
        .findings
        .iter()
        .find(|f| f.code == "read-copy")
        .expect(&why);
    assert_eq!(
        f.message(),
        format!(
            "pid {} (twofold) read 80.0 MiB of 'model.gguf' with read() in {:.1} s: a copying loader",
            copy.pid(),
            t.interval_secs
        ),
        "{why}"
    );
    // The copy is proven, counted, and the ledger is its evidence.
    let file_model = r
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .expect(&why);
    let c = file_model
        .proven_copies
        .iter()
        .find(|c| c.pid == copy.pid())
        .expect(&why);
    assert_eq!(c.traced_read_bytes, Some(size), "{why}");
    assert!(c.fraction > 0.99, "{why}");
    // The count is the page cache (all of it, unless something reclaimed part of the
    // file since the child read it: the count follows) plus this one copy.
    let reps = &file_model.representations;
    let cache = reps.page_cache.expect(&why);
    assert!(cache > 0.5, "{why}");
    assert!((reps.private_copies - c.fraction).abs() < 0.01, "{why}");
    assert!(
        (reps.proven.expect(&why) - (cache + reps.cow.unwrap_or(0.0) + c.fraction)).abs() < 0.01,
        "{why}"
    );
    let proven = r
        .findings
        .iter()
        .find(|f| f.code == "proven-private-copy")
        .expect(&why);
    assert!(
        proven
            .message()
            .contains("read() 100% of the file during the trace"),
        "{why}"
    );
}

#[test]
fn without_privileges_trace_fails_cleanly_and_scan_goes_on() {
    let _serial = serial();
    let Some((_dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    let nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .output()
            .unwrap()
    };
    let out = nobody(&["trace", "--duration", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("twofold: error: eBPF tracing needs root, or CAP_BPF and CAP_PERFMON"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = nobody(&["scan", "--json", "--trace", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--trace: eBPF tracing needs root"), "{err}");
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r.trace.is_none());
}

#[test]
fn trace_json_follows_the_comm_across_exec() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::{BufRead, Write};
    use twofold::render::trace::{Line, Record};
    // A shell that waits for a line, then becomes `sleep`: comm 'sh', then 'sleep'.
    let mut sh = Command::new("sh")
        .args(["-c", "read x; exec sleep 30"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sh.id() as i32;
    let mut trace = twofold_cmd()
        .args(["trace", "--json", "--interval", "200ms", "--duration", "4s"])
        .args(["--pid", &pid.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let comm_in = |r: &Record| match r {
        Record::Interval(m) | Record::Summary(m) => m
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.comm.clone()),
        Record::Attached(_) => None,
    };
    let mut lines = std::io::BufReader::new(trace.stdout.take().unwrap()).lines();
    let mut next = || {
        serde_json::from_str::<Line>(&lines.next().unwrap().unwrap())
            .unwrap()
            .record
    };
    assert!(matches!(next(), Record::Attached(_)));
    let first = next();
    assert!(matches!(first, Record::Interval(_)), "{first:?}");
    assert_eq!(comm_in(&first).as_deref(), Some("sh"));
    // Exec, and wait for it to show in /proc before reading on.
    sh.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let start = std::time::Instant::now();
    while comm().trim() != "sleep" {
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut rest = Vec::new();
    for l in lines {
        rest.push(serde_json::from_str::<Line>(&l.unwrap()).unwrap().record);
    }
    assert!(trace.wait().unwrap().success());
    let _ = sh.kill();
    let _ = sh.wait();
    // Every record after the exec was seen carries the new comm, the summary too.
    let last = rest.last().unwrap();
    assert!(matches!(last, Record::Summary(_)), "{last:?}");
    assert_eq!(comm_in(last).as_deref(), Some("sleep"));
    let before_last = &rest[rest.len() - 2];
    assert_eq!(comm_in(before_last).as_deref(), Some("sleep"));
}

#[test]
fn record_trace_keeps_the_read_ledger_of_a_loader_that_closed_the_file() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    let store = dir.path().join("store");
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut rec = twofold_cmd()
        .args(["record", "--trace", "--interval", "300ms", "--store"])
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
    assert_eq!(copy.go(), "ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // A stop cuts short the snapshot it comes in (not written): on a loaded host the
    // first one may take longer than 1.5 s, so the store's first two are waited for.
    let waited = std::time::Instant::now();
    while waited.elapsed() < std::time::Duration::from_secs(120) {
        let n = twofold_cmd()
            .args(["dump", "--format", "json", "--store"])
            .arg(&store)
            .output()
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let mut at: Vec<String> = text
                    .lines()
                    .filter_map(|l| l.split("\"at\":\"").nth(1))
                    .map(|r| r.chars().take(24).collect())
                    .collect();
                at.dedup();
                at.len()
            })
            .unwrap_or(0);
        if n >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(rec.wait().unwrap().code(), Some(0));
    let out = twofold_cmd()
        .args(["replay", "--json", "--at", "now", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    let f = r
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .unwrap();
    let c = f
        .proven_copies
        .iter()
        .find(|c| c.pid == copy.pid())
        .unwrap();
    assert_eq!(c.traced_read_bytes, Some(size));
    assert_eq!(c.how, twofold::model::CopyHow::Read);
}
