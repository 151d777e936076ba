//! The task iterator (`ebpf/tasks.bpf.c`, `collect::bpf::tasks`): every process's stamp
//! in one read, checked against `/proc`'s own files for stopped children (whose counters
//! cannot move between the two reads): `rchar` against `/proc/PID/io`, run time against
//! each thread's `schedstat`, faults against `stat`, the address space's sizes against
//! `statm`, and the list of processes against a listing of `/proc`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

use super::serial;
use super::support::*;
use twofold::collect::bpf::tasks::{TaskIter, TaskStamps};

fn stat_fields(pid: i32) -> Vec<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Field 3 (state) is not a number: 0 stands for it; index n - 3 is field n.
    t.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect()
}

fn statm(pid: i32) -> Vec<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn rchar(pid: i32) -> u64 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    t.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn run_time(pid: i32) -> (u64, usize) {
    let mut sum = 0;
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let s = std::fs::read_to_string(t.unwrap().path().join("schedstat")).unwrap();
        sum += s.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        n += 1;
    }
    (sum, n)
}

fn stop(pid: i32) {
    let p = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .contains(") T ")
    {
        assert!(t0.elapsed().as_secs() < 30, "pid {pid} did not stop");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn listed() -> BTreeSet<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn task_stamps_are_the_counters_proc_shows() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let mut it = TaskIter::load(Path::new("/proc")).unwrap();
    // One child with 16 MiB of its own, one with four threads that each read() a file
    // (rchar of live threads, and of one that exited: the signal's share).
    let mut anon = Armed::start("anon", None, &["--bytes", &(16u64 << 20).to_string()]);
    assert_eq!(anon.go(), "ready");
    let script = "import threading,sys\n\
        def r():\n    open('/proc/self/maps').read()\n\
        t=threading.Thread(target=r); t.start(); t.join()\n\
        ts=[threading.Thread(target=lambda: (r(), threading.Event().wait())) for _ in range(3)]\n\
        [x.start() for x in ts]\n\
        sys.stdout.write('ready\\n'); sys.stdout.flush(); threading.Event().wait()\n";
    let mut py = Command::new("python3")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(py.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let pids = [anon.pid(), py.id() as i32];
    for &p in &pids {
        stop(p);
    }
    let before = listed();
    let stamps: TaskStamps = it.read().unwrap();
    let after = listed();
    for &pid in &pids {
        let s = stamps
            .get(pid)
            .unwrap_or_else(|| panic!("no stamp of {pid}"));
        let f = stat_fields(pid);
        let m = statm(pid);
        let (ran, threads) = run_time(pid);
        assert_eq!(s.rchar, rchar(pid), "rchar of {pid}");
        assert_eq!(s.run_ns, ran, "run time of {pid}'s {threads} threads");
        assert_eq!(s.faults, f[10 - 3] + f[12 - 3], "minflt + majflt of {pid}");
        assert_eq!(s.total_vm, m[0], "statm size of {pid}");
        assert_eq!(s.data, m[5], "statm data of {pid}");
        let tick = 1_000_000_000
            / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .unwrap()
                .unwrap() as u64;
        assert_eq!(s.start_ns / tick, f[22 - 3], "start time of {pid}");
        assert!(s.has_mm);
        // The resident counters' global parts: `statm` adds each CPU's share, at most
        // the kernel's batch (32 pages, or twice the CPUs) per CPU and counter.
        let cpus = std::thread::available_parallelism().unwrap().get() as u64;
        let slack = 3 * cpus * 32u64.max(2 * cpus);
        let rss: u64 = s.rss.iter().sum();
        assert!(
            rss.abs_diff(m[1]) <= slack,
            "resident of {pid}: {rss} against statm {}",
            m[1]
        );
        assert!(rss >= (16u64 << 20) / 4096 || pid != anon.pid());
    }
    assert!(run_time(pids[1]).1 >= 4, "the threads are there");
    // Every process listed before and after the read has a stamp (1 is added: the
    // kernel's iterator skips it on 6.18), and nothing else but processes that came or
    // went during the read.
    let got: BTreeSet<i32> = stamps.pids().into_iter().collect();
    let stable: BTreeSet<i32> = before.intersection(&after).copied().collect();
    assert!(
        stable.is_subset(&got),
        "missing: {:?}",
        stable.difference(&got).collect::<Vec<_>>()
    );
    let strays: Vec<i32> = got
        .difference(&before.union(&after).copied().collect())
        .copied()
        .collect();
    assert!(
        strays.len() <= 16,
        "stamps of processes never listed: {strays:?}"
    );
    let _ = py.kill();
    let _ = py.wait();
}

/// `fincore`'s resident bytes of `path` (util-linux: the peer tool's own count).
fn fincore_bytes(path: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The page count of each file this process holds open, from one read of the
/// `iter/task_file` program linked to this process alone, against `fincore` and `mincore`
/// of the same files: one evicted, one half read back, one whole in the page cache.
#[test]
fn held_pages_are_the_page_counts_fincore_shows() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let mut it = TaskIter::load(Path::new("/proc")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, mib) in [2u64, 4, 8].into_iter().enumerate() {
        let path = dir.path().join(format!("m{i}.bin"));
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk: Vec<u8> = (0..1u32 << 20).map(|b| (b as u8) ^ (i as u8 + 1)).collect();
        for _ in 0..mib {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: advice on our own descriptor; it changes nothing but this file's cache.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        files.push((path, f, mib << 20));
    }
    // The second half read back, the third whole; the first stays evicted.
    let mut half = vec![0u8; (files[1].2 / 2) as usize];
    std::fs::File::open(&files[1].0)
        .unwrap()
        .read_exact(&mut half)
        .unwrap();
    std::fs::read(&files[2].0).unwrap();
    let fds_before: BTreeSet<i32> = own_fds();
    let pages = it.held_pages().unwrap();
    let fds_after: BTreeSet<i32> = own_fds();
    for (path, f, size) in &files {
        let (ino, n) = pages[&f.as_raw_fd()];
        assert_eq!(ino, f.metadata().unwrap().ino(), "{}", path.display());
        assert_eq!(n, resident_pages(path), "{} (mincore)", path.display());
        assert_eq!(
            n * 4096,
            fincore_bytes(path),
            "{} (fincore)",
            path.display()
        );
        assert!(n * 4096 <= *size);
    }
    assert_eq!(pages[&files[0].1.as_raw_fd()].1, 0, "evicted");
    assert_eq!(pages[&files[2].1.as_raw_fd()].1 * 4096, files[2].2, "whole");
    // This process's descriptors only (the link's pid), not the host's.
    assert!(
        pages
            .keys()
            .all(|fd| fds_before.contains(fd) || fds_after.contains(fd)),
        "{:?} not all in {fds_before:?}",
        pages.keys()
    );
}

fn own_fds() -> BTreeSet<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}
