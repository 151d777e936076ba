//! Helpers of tests/trace.rs: children that wait for a go, a real memory cgroup, ground
//! truth from /proc, and bpftrace as an independent counter.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use twofold::collect::bpf::{TraceOptions, Tracer};
use twofold::sample::trace::TraceSample;
use twofold::sample::FileKey;

use super::common::*;

/// The tests need root and a kernel that lets root load BPF; in CI both must be there.
pub fn bpf_ready() -> bool {
    require(is_root(), "root (to load eBPF programs)")
}

pub fn attach(pids: &[i32], files: &[FileKey]) -> Tracer {
    Tracer::attach(&TraceOptions {
        pids: pids.to_vec(),
        files: files.to_vec(),
        ..TraceOptions::default()
    })
    .unwrap()
}

pub fn key(path: &Path) -> FileKey {
    let m = std::fs::metadata(path).unwrap();
    FileKey::from_dev(m.dev(), m.ino())
}

/// A `twofold __child MODE --go` process: it says `armed`, waits for [`Armed::go`], does
/// its work and says `ready`. Killed and reaped on drop.
pub struct Armed {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Armed {
    pub fn start(mode: &str, file: Option<&Path>, extra: &[&str]) -> Armed {
        let mut cmd = Command::new(exe());
        cmd.arg("__child").arg(mode);
        if let Some(f) = file {
            cmd.arg(f);
        }
        cmd.args(extra).arg("--go");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "armed");
        Armed { child, out }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Moves it into a memory cgroup (before it allocates anything).
    pub fn join(&self, cg: &TestCgroup) {
        std::fs::write(cg.dir.join("cgroup.procs"), self.pid().to_string()).unwrap();
    }

    /// Lets it work; the line it says when done (`ready`), or "" if it died.
    pub fn go(&mut self) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        let _ = self.out.read_line(&mut line);
        line.trim().to_string()
    }

    /// Stops it (SIGSTOP) and waits until the kernel shows it stopped (`T` in
    /// `/proc/PID/stat`): from then on it takes no fault and makes no syscall, so
    /// counters read from BPF and from `/proc` afterwards, in either order, cover the
    /// same work. (A child that has only said `ready` may still fault on its way back to
    /// its blocking read.)
    pub fn stop(&self) {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let start = Instant::now();
        while proc_state(self.pid()) != 'T' {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "pid {} did not stop",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets a [`Armed::stop`]ped child run again (a blocking read it was in resumes).
    pub fn resume(&self) {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    }

    /// Waits for it to exit; its signal, if killed.
    pub fn wait_killed(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.child.wait().unwrap().signal()
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state letter of a process (`/proc/PID/stat` field 3).
pub fn proc_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap()
}

/// minflt + majflt of a process (`/proc/PID/stat` fields 10 and 12).
pub fn proc_faults(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[7].parse::<u64>().unwrap() + f[9].parse::<u64>().unwrap()
}

pub fn faults(s: &TraceSample, pid: i32) -> u64 {
    s.pids.get(&pid).map_or(0, |c| c.faults())
}

/// A real memory cgroup (v2 if the host has it, else v1), removed on drop.
pub struct TestCgroup {
    pub dir: PathBuf,
    pub v2: bool,
}

impl TestCgroup {
    pub fn new(name: &str, limit: u64) -> TestCgroup {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
        let parent = if v2 {
            "/sys/fs/cgroup"
        } else {
            "/sys/fs/cgroup/memory"
        };
        let dir = Path::new(parent).join(format!("twofold-trace-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let limit_file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(dir.join(limit_file), limit.to_string()).unwrap();
        TestCgroup { dir, v2 }
    }

    /// OOM kills the kernel counted in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Reads the whole file with read() (the page cache gets all of it).
pub fn read_all(path: &Path) -> u64 {
    std::fs::read(path).unwrap().len() as u64
}

/// A running bpftrace program; [`Bpftrace::stop`] returns its `@name: value` lines.
pub struct Bpftrace {
    child: Child,
}

impl Bpftrace {
    /// Starts `script` (with `BEGIN { printf("started\n") }` added) and waits until its
    /// probes are attached.
    pub fn start(script: &str) -> Bpftrace {
        let full = format!("BEGIN {{ printf(\"started\\n\"); }}\n{script}");
        let mut child = Command::new("bpftrace")
            .args(["-e", &full])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // bpftrace 0.17 tries to raise RLIMIT_MEMLOCK to infinity and prints an ERROR line
        // when it may not (this VM's hard limit is 8 MiB, and even root gets EPERM). Since
        // Linux 5.11 BPF memory is charged to the memory cgroup, not to that limit, so the
        // line is noise: everything else bpftrace says is passed through.
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if !line.contains("RLIMIT_MEMLOCK") {
                    eprintln!("{line}");
                }
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let start = Instant::now();
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "bpftrace exited");
            if line.trim() == "started" {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "bpftrace slow");
        }
        child.stdout = Some(out.into_inner());
        Bpftrace { child }
    }

    /// SIGINT, then the maps it prints: `@name: value`.
    pub fn stop(mut self) -> std::collections::BTreeMap<String, u64> {
        // bpftrace's SIGINT handler sets a flag that its event loop reads when it wakes;
        // a signal that lands just before the loop goes back to sleep is missed (seen once
        // under load: it slept on for 16 minutes, and the test with it). So the signal is
        // sent again until it exits; a later one only sets the same flag.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let start = Instant::now();
        'exited: loop {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
            let sent = Instant::now();
            while sent.elapsed() < Duration::from_secs(2) {
                if self.child.try_wait().unwrap().is_some() {
                    break 'exited;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "bpftrace did not exit on SIGINT"
            );
        }
        let mut text = String::new();
        use std::io::Read;
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text.lines()
            .filter_map(|l| {
                let (k, v) = l.strip_prefix('@')?.split_once(": ")?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pages of the file in the page cache now (mincore; the mapping is gone on return).
pub fn resident_pages(path: &Path) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    twofold::collect::residency::mincore_map(&f, path, size)
        .unwrap()
        .resident_pages()
}

/// Reads the whole file with readv() into two 1 MiB buffers per call.
pub fn readv_all(path: &Path) -> u64 {
    use std::io::{IoSliceMut, Read};
    let mut f = std::fs::File::open(path).unwrap();
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut total = 0u64;
    loop {
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        let n = f.read_vectored(&mut bufs).unwrap();
        if n == 0 {
            return total;
        }
        total += n as u64;
    }
}

/// Pages of a file of `bytes`.
pub fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(4096)
}
