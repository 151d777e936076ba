//! Models on a FUSE filesystem that stops answering or answers slowly (#41), mounted by
//! the test itself: `tests/helpers/slowfuse.py` (fusepy) mirrors a directory, sleeps
//! before the operations its control file names, and logs every open and read it
//! answers (the daemon's own count, the ground truth of what twofold asked of it).
//! "Hung" is the daemon stopped with SIGSTOP (every request waits in the kernel's queue),
//! "slow" a read that sleeps before it answers.
//!
//! Every mount is undone by [`Fuse`]'s drop (the daemon continued, `fusermount -u -z`,
//! the daemon killed): a stale FUSE mount would stall every whole-host scan on the host.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use twofold::spawn::Reader;

use crate::common::*;

const GROUP: &str = module_path!();

/// The tests here one at a time: a whole-host scan of one must not meet another's
/// stopped daemon (two hung mounts are two deadlines).
fn one_at_a_time() -> (GroupGuard, std::sync::MutexGuard<'static, ()>) {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = group(GROUP);
    (g, ONE.lock().unwrap_or_else(|e| e.into_inner()))
}
/// `TWOFOLD_FS_DEADLINE` of the twofold runs here, in seconds.
const DEADLINE: u64 = 2;
/// What a loaded 2-core host may add to a run's time beyond what is asserted.
const SLACK: Duration = Duration::from_secs(5);
const MODEL: u64 = 32 << 20;
/// The largest read the kernel sends a libfuse 2 daemon: 32 pages (it negotiates no
/// `max_pages`; `FUSE_DEFAULT_MAX_PAGES_PER_REQ`).
const FUSE_READ_MAX: u64 = 128 << 10;

/// What these tests need: the kernel's FUSE device, the mount helper and fusepy (which
/// `scripts/test.sh` installs).
fn fuse_ready() -> bool {
    require(Path::new("/dev/fuse").exists(), "/dev/fuse")
        && require(have("fusermount"), "fusermount")
        && python_has("fuse")
}

/// A FUSE mount of a directory holding one model, by `slowfuse.py`.
struct Fuse {
    /// Processes that map the model (`twofold __child map`), ended after the daemon is
    /// continued: a holder's exit flushes its descriptor, a request the daemon must answer.
    holders: Vec<Reader>,
    daemon: Option<Reader>,
    pid: i32,
    mnt: PathBuf,
    ctl: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Fuse {
    /// Mounts a directory holding a random safetensors of [`MODEL`] bytes.
    fn mount() -> Fuse {
        let dir = tempfile::tempdir().unwrap();
        let (back, mnt) = (dir.path().join("back"), dir.path().join("mnt"));
        std::fs::create_dir(&back).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        safetensors(&back, &[("w", MODEL, Fill::Random(41))]);
        let (ctl, log) = (dir.path().join("ctl"), dir.path().join("log"));
        std::fs::write(&ctl, "").unwrap();
        let helper = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/helpers/slowfuse.py");
        let mut cmd = Command::new("python3");
        cmd.arg(helper).args([&back, &mnt, &ctl, &log]);
        let (daemon, line) = Reader::spawn(cmd, Duration::from_secs(30)).unwrap();
        let fuse = Fuse {
            holders: Vec::new(),
            pid: daemon.pid(),
            daemon: Some(daemon),
            mnt,
            ctl,
            log,
            dir,
        };
        assert_eq!(line.trim(), "mounted", "slowfuse.py did not mount");
        fuse
    }

    /// Starts a process that maps the model and touches every page of it; its pid.
    fn hold(&mut self) -> i32 {
        let r = reader("map", Some(&self.file()), &[]);
        let pid = r.pid();
        self.holders.push(r);
        pid
    }

    /// The model's size, from its backing file.
    fn size(&self) -> u64 {
        let back = self.dir.path().join("back/model.safetensors");
        std::fs::metadata(back).unwrap().len()
    }

    /// The model, as the mount shows it.
    fn file(&self) -> PathBuf {
        self.mnt.join("model.safetensors")
    }

    fn signal(&self, s: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), s).unwrap();
    }

    /// The daemon stopped: every request to the mount waits.
    fn stop(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lines of `OP SECONDS` for the daemon to sleep before each such operation.
    fn slow(&self, lines: &str) {
        std::fs::write(&self.ctl, lines).unwrap();
    }

    /// How far the daemon's log is now.
    fn mark(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |s| s.len())
    }

    /// The daemon's log lines after `mark`.
    fn since(&self, mark: usize) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text[mark.min(text.len())..]
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        // Continued and quick again, so the requests waiting end; then unmounted, then
        // the daemon gone.
        let _ = std::fs::write(&self.ctl, "");
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.holders.clear();
        let _ = Command::new("fusermount")
            .arg("-u")
            .arg("-z")
            .arg(&self.mnt)
            .status();
        self.daemon.take();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let left = mounts.contains(&*self.mnt.to_string_lossy());
        if left && !std::thread::panicking() {
            panic!("'{}' is still mounted", self.mnt.display());
        }
    }
}

/// The model's bytes in whole pages (what a holder that touched it all has resident).
fn pages_of(fuse: &Fuse) -> u64 {
    fuse.size().next_multiple_of(4096)
}

/// A child killed and reaped on drop (`serve`).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `Rss` (bytes) of `pid`'s mappings of `path`, from its `smaps` (the ground truth).
fn mapped_rss(pid: i32, path: &Path) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let want = path.to_string_lossy();
    let mut inside = false;
    let mut kib = 0;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = line.ends_with(&*want);
        } else if inside {
            if let Some(v) = line.strip_prefix("Rss:") {
                kib += v
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib * 1024
}

/// twofold with the tests' deadline.
fn twofold(args: &[&str], files: &[&Path]) -> Command {
    let mut c = Command::new(exe());
    c.args(args)
        .args(files)
        .env("TWOFOLD_FS_DEADLINE", DEADLINE.to_string());
    c
}

/// Runs `cmd` (at most 120 s): (exit code, stdout, stderr, how long it took).
fn timed(mut cmd: Command) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    let (status, out, err) = bounded(&mut cmd, Duration::from_secs(120));
    (status.code(), out, err, start.elapsed())
}

/// The file at `path` in a `scan --json` report.
fn file_in<'a>(report: &'a serde_json::Value, path: &Path) -> &'a serde_json::Value {
    let files = report["files"].as_array().unwrap();
    files
        .iter()
        .find(|f| f["path"].as_str() == path.to_str())
        .unwrap_or_else(|| panic!("'{}' not in the report", path.display()))
}

#[test]
fn a_stopped_fuse_daemon_costs_a_scan_one_deadline_and_its_file_s_count() {
    let _one = one_at_a_time();
    if !fuse_ready() {
        return;
    }
    let mut fuse = Fuse::mount();
    let file = fuse.file();
    let holder = fuse.hold();
    let scan = ["scan", "--json", "--prove-budget", "1s"];
    // The same whole-host scan with the daemon answering, for the host's own pace.
    let (code, out, err, base) = timed(twofold(&scan, &[]));
    assert_eq!(code, Some(0), "{err}");
    let answered: serde_json::Value = serde_json::from_str(&out).unwrap();
    let reason = file_in(&answered, &file)["residency_unknown_reason"].to_string();
    assert!(reason.contains("FUSE"), "{reason}");

    fuse.stop();
    let (code, out, err, took) = timed(twofold(&scan, &[]));
    eprintln!("whole-host scan: {base:?} answering, {took:?} with the daemon stopped");
    assert_eq!(code, Some(0), "{err}");
    let deadline = Duration::from_secs(DEADLINE);
    assert!(
        took < base + deadline + SLACK,
        "{took:?}: more than one deadline over {base:?}"
    );
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = file_in(&report, &file);
    let why = f["residency_unknown_reason"].as_str().unwrap();
    let said = format!(
        "'{}': the filesystem did not answer in {DEADLINE} s",
        file.display()
    );
    assert_eq!(why, said);
    assert!(f["resident_bytes"].is_null(), "{f}");
    // Its holder is still known, from /proc alone.
    let mappers = f["mappers"].as_array().unwrap();
    assert!(mappers.iter().any(|m| m["pid"] == holder), "{f}");
    assert_eq!(mapped_rss(holder, &file), pages_of(&fuse));

    // `scan FILE`, `dupes FILE` and `residency FILE` name it in one deadline.
    let cases: [(&[&str], Option<i32>); 3] = [
        (&["scan", "--prove-budget", "1s"], Some(2)),
        (&["dupes", "--pid", &holder.to_string()], Some(2)),
        (&["residency"], Some(0)),
    ];
    for (args, want) in cases {
        let (code, out, err, took) = timed(twofold(args, &[&file]));
        eprintln!("{args:?}: {took:?}");
        assert_eq!(code, want, "{args:?}: {out}{err}");
        assert!(err.contains(&said), "{args:?}: {err}");
        assert!(took < deadline + SLACK, "{args:?} took {took:?}");
    }
}

#[test]
fn serve_keeps_collecting_while_a_fuse_daemon_is_stopped() {
    let _one = one_at_a_time();
    if !fuse_ready() {
        return;
    }
    let mut fuse = Fuse::mount();
    let holder = fuse.hold();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = twofold(
        &[
            "serve",
            "--listen",
            &listen,
            "--interval",
            "1s",
            "--prove-budget",
            "1s",
        ],
        &[],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let serve = Killed(serve);
    let spid = serve.0.id();
    let count = |b: &str| metric(b, "twofold_collect_duration_seconds_count", "");
    let first = Instant::now();
    let body = loop {
        match metrics_text(port) {
            Some(b) if count(&b) >= 1.0 => break b,
            _ if first.elapsed() > Duration::from_secs(90) => panic!("no collection in 90 s"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let before = (count(&body), residency_errors(&body), in_fuse(spid));

    fuse.stop();
    let stopped = Instant::now();
    let mut last = body;
    while stopped.elapsed() < Duration::from_secs(15) {
        let t = Instant::now();
        last = metrics_text(port).expect("a scrape while the daemon is stopped");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a scrape took {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = (count(&last), residency_errors(&last), in_fuse(spid));
    let age = metric(&last, "twofold_collect_last_success_age_seconds", "");
    eprintln!("{before:?} -> {after:?} (collections, residency errors, threads waiting on FUSE), last good collection {age} s ago");
    // Collections went on (one a second, the deadline once), each saying the file's
    // residency is unknown.
    assert!(after.0 >= before.0 + 4.0, "{before:?} -> {after:?}");
    assert!(after.1 >= before.1 + 4.0, "{before:?} -> {after:?}");
    assert!(age < 8.0, "last good collection {age} s ago");
    // The kernel's word: threads of serve wait on the stopped daemon (the mount was met),
    // the helpers of that one deadline only, not one more per collection.
    assert!(
        before.2 == 0 && (1..=3).contains(&after.2),
        "{before:?} -> {after:?}"
    );
    // It never mapped nor opened the file: its holder's pages are all there.
    assert_eq!(mapped_rss(holder, &fuse.file()), pages_of(&fuse));
}

/// Threads of `pid` waiting for a FUSE daemon's answer (`wchan`).
fn in_fuse(pid: u32) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("wchan")).ok())
        .filter(|w| w.contains("request_wait_answer"))
        .count()
}

/// The counter of files whose residency was unknown.
fn residency_errors(body: &str) -> f64 {
    metric(body, "twofold_collect_errors_total", "kind=\"residency\"")
}

/// A series' value in a Prometheus text body (0 when absent).
fn metric(body: &str, name: &str, labels: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let ok = if labels.is_empty() {
                rest.starts_with(' ')
            } else {
                rest.starts_with(&format!("{{{labels}}}"))
            };
            ok.then(|| l.rsplit(' ').next()?.parse().ok())?
        })
        .unwrap_or(0.0)
}

#[test]
fn a_slow_fuse_file_keeps_its_holder_s_pages_and_is_said_not_read() {
    let _one = one_at_a_time();
    if !fuse_ready() {
        return;
    }
    let mut fuse = Fuse::mount();
    let file = fuse.file();
    let holder = fuse.hold();
    let resident = mapped_rss(holder, &file);
    assert_eq!(resident, pages_of(&fuse), "the holder maps it all");
    // Any open or read of it would now wait 30 s (and an open drop its cache).
    fuse.slow("open 30\nread 30\n");
    let mark = fuse.mark();
    let (code, out, err, took) = timed(twofold(&["residency", "--json"], &[&file]));
    assert_eq!(code, Some(0), "{err}");
    assert!(took < SLACK, "residency took {took:?}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &r["files"][0];
    assert!(f["resident_bytes"].is_null(), "never 0: {f}");
    let why = f["unknown_reason"].as_str().unwrap();
    assert!(
        why.starts_with("not read: ") && why.contains("FUSE"),
        "{why}"
    );
    assert_eq!(r["unknown_files"], 1);

    let (code, out, err, took) = timed(twofold(
        &["scan", "--json", "--prove-budget", "1s"],
        &[&file],
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(took < Duration::from_secs(10) + SLACK, "scan took {took:?}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = file_in(&report, &file);
    assert!(f["resident_bytes"].is_null(), "never 0: {f}");
    let why = f["residency_unknown_reason"].as_str().unwrap();
    // Not read, and what its holder maps (32 MiB) is said as the least that is cached.
    assert!(
        why.starts_with("not read: ") && why.contains("32.0 MiB"),
        "{why}"
    );

    // The holder's pages are still there, and the daemon was asked for nothing.
    let after = mapped_rss(holder, &file);
    assert!(
        after * 10 >= resident * 9,
        "holder's Rss {resident} -> {after}"
    );
    let asked: Vec<String> = fuse.since(mark);
    assert!(asked.is_empty(), "the daemon was asked: {asked:?}");
}

#[test]
fn dupes_reads_a_fuse_file_in_large_requests() {
    let _one = one_at_a_time();
    if !fuse_ready() {
        return;
    }
    let mut fuse = Fuse::mount();
    let file = fuse.file();
    let holder = fuse.hold();
    // 20 ms a read: 4 KiB requests (24,576 for 32 MiB, as before) would take minutes.
    fuse.slow("read 0.02\n");
    let mark = fuse.mark();
    let pid = holder.to_string();
    let (code, out, err, took) = timed(twofold(&["dupes", "--json", "--pid", &pid], &[&file]));
    assert_eq!(code, Some(0), "{out}{err}");
    let size = fuse.size();
    let reads: Vec<(u64, u64)> = fuse
        .since(mark)
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0] == "read").then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        })
        .collect();
    let bytes: u64 = reads.iter().map(|r| r.1).sum();
    eprintln!(
        "dupes on FUSE: {} reads, {bytes} bytes, {took:?}",
        reads.len()
    );
    assert!(bytes >= size, "the file was read: {bytes} bytes of {size}");
    // Every request as large as the kernel sends this daemon, but the file's last.
    let small: Vec<&(u64, u64)> = reads
        .iter()
        .filter(|(off, len)| *len < FUSE_READ_MAX && off + len < size)
        .collect();
    assert!(small.is_empty(), "small reads: {small:?}");
    let passes = reads.len() as u64 / size.div_ceil(FUSE_READ_MAX);
    assert!(passes <= 4, "{} reads of a {size}-byte file", reads.len());
}

#[test]
fn a_fuse_read_that_hangs_mid_file_fails_dupes_in_one_deadline() {
    let _one = one_at_a_time();
    if !fuse_ready() {
        return;
    }
    let mut fuse = Fuse::mount();
    let file = fuse.file();
    let holder = fuse.hold();
    // The header answers; every read from 1 MiB on waits 8 s.
    fuse.slow("read>=1048576 8\n");
    let pid = holder.to_string();
    let (code, out, err, took) = timed(twofold(&["dupes", "--pid", &pid], &[&file]));
    eprintln!("dupes, reads hanging mid-file: {took:?}");
    assert_eq!(code, Some(2), "{out}{err}");
    let said = format!(
        "'{}': the filesystem did not answer in {DEADLINE} s",
        file.display()
    );
    assert!(err.contains(&said), "{err}");
    // The read the daemon took cannot be abandoned by the kernel: the process ends when
    // it answers (8 s), not one read after another.
    assert!(took < Duration::from_secs(8) + SLACK, "{took:?}");
    let mut log = String::new();
    std::fs::File::open(&fuse.log)
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.lines().any(|l| l.starts_with("read ")), "{log}");
}
