//! Per-process files that a long-lived engine reads at every snapshot, kept open between
//! snapshots: `/proc/PID/statm` of every process (with `stat` where it moved, the stamp of
//! [`super::cache`]) and
//! `/proc/PID/io` of every process that maps or holds a file of interest (`rchar`, in its
//! proofs' fingerprints). Opening them by path each time cost more than reading them (a
//! path walk through `/proc`, `statx` to size the buffer, `close`: 20% of `record`'s CPU
//! on the moving host of `bench/host.sh`, measured with `perf`). A kept descriptor is read
//! again with `pread` at offset 0, which makes the kernel render the file afresh
//! (`seq_read_iter` restarts at position 0); `io` checks ptrace access at every read.
//!
//! A descriptor of `/proc/PID/...` names the process it was opened for, not the pid: once
//! that process is gone, reading it fails (`ESRCH`) even where the pid now names another
//! process, so a kept descriptor never reads a stranger. On a failed read the path is
//! opened again. Nothing but `/proc` is held open here: model files are kept by
//! [`super::heldfiles`], which closes one at the snapshot that sees it unlinked.
//!
//! Descriptors are kept up to a budget, a share of the soft `RLIMIT_NOFILE` (`statm` half
//! of it less 64, `io` a quarter), at most [`MAX_KEPT`] each; past it the file is opened
//! by path as before. The limit itself is not raised (processes that twofold starts
//! inherit it).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What `/proc/PID/stat` says that a cached entry depends on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatStamp {
    pub comm: String,
    pub ppid: i32,
    /// Clock ticks after boot: with the pid, names one process.
    pub start_time: u64,
    pub minflt: u64,
    pub majflt: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
    /// `/proc/PID/statm` read with it (see `ProcCache::read_stamp`).
    pub statm: Option<Statm>,
}

/// `/proc/PID/statm`: size, resident, shared (file and shmem), text and data pages, from
/// the address space's counters alone (no walk of the threads, unlike `stat`'s fault and
/// CPU counts): about a fifth of the cost of `stat`.
pub type Statm = [u64; 5];

/// Parses `/proc/PID/statm` (its first five fields; the sixth and seventh are always 0).
pub fn parse_statm(text: &str) -> Option<Statm> {
    let mut f = text.split_ascii_whitespace().map(|v| v.parse::<u64>().ok());
    let mut out = [0u64; 5];
    for o in &mut out {
        *o = f.next()??;
    }
    Some(out)
}

/// Parses `/proc/PID/stat`: the name (field 2) is in parentheses and may hold spaces and
/// parentheses, so fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<StatStamp> {
    let (head, rest) = text.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    // rest starts at field 3 (state): field n is the (n - 3)th, walked once in order.
    let mut f = rest.split_ascii_whitespace();
    let mut at = 3usize;
    let mut num = |n: usize| -> Option<u64> {
        let v = f.nth(n - at)?;
        at = n + 1;
        v.parse::<u64>().ok()
    };
    let ppid = i32::try_from(num(4)?).ok()?;
    let minflt = num(10)?;
    let majflt = num(12)?;
    let start_time = num(22)?;
    let vsize_bytes = num(23)?;
    let rss_pages = num(24)?;
    Some(StatStamp {
        comm: comm.to_string(),
        ppid,
        minflt,
        majflt,
        start_time,
        vsize_bytes,
        rss_pages,
        statm: None,
    })
}

/// The time every thread of `pid` under `root` has run on a CPU since it started, in
/// nanoseconds: the first field of each `/proc/PID/task/TID/schedstat` (the scheduler's
/// own clock, exact, unlike the tick-sampled `utime`/`stime`), summed. A process whose sum
/// stands still did not run: nothing of its own wrote its memory. `None` when the process
/// is gone, a thread's file cannot be read, or the kernel keeps no schedstat.
pub fn run_time_ns(root: &Path, pid: i32) -> Option<u64> {
    let tasks = root.join(pid.to_string()).join("task");
    let mut sum = 0u64;
    let mut any = false;
    for t in std::fs::read_dir(&tasks).ok()? {
        let t = t.ok()?;
        let text = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
        sum = sum.wrapping_add(text.split_ascii_whitespace().next()?.parse::<u64>().ok()?);
        any = true;
    }
    any.then_some(sum)
}

/// Descriptors kept at most, whatever the limit.
pub const MAX_KEPT: usize = 16_384;

/// One file of each process (`stat`, `io`), kept open.
pub struct KeptFiles {
    name: &'static str,
    files: HashMap<i32, File>,
    budget: usize,
}

/// The soft `RLIMIT_NOFILE` now.
pub(crate) fn soft_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into our own struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

impl KeptFiles {
    /// `/proc/PID/statm` (the cache's stamp, read first).
    pub fn statm() -> Self {
        KeptFiles {
            name: "statm",
            files: HashMap::new(),
            budget: (soft_limit() / 2).saturating_sub(64).min(MAX_KEPT),
        }
    }

    /// `/proc/PID/io`.
    pub fn io() -> Self {
        KeptFiles {
            name: "io",
            files: HashMap::new(),
            budget: (soft_limit() / 4).min(MAX_KEPT),
        }
    }

    /// Reads the file of `pid` under `root` and parses it with `parse`: through the kept
    /// descriptor when there is one and it still reads, else by path. A descriptor opened
    /// here is returned, for [`KeptFiles::keep`]. `None` when the process is gone, the
    /// file cannot be read or does not parse.
    pub fn read<T>(
        &self,
        root: &Path,
        pid: i32,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<(T, Option<File>)> {
        if let Some(f) = self.files.get(&pid) {
            if let Some(s) = read_from(f, &parse) {
                return Some((s, None));
            }
        }
        let f = File::open(root.join(pid.to_string()).join(self.name)).ok()?;
        let s = read_from(&f, &parse)?;
        Some((s, Some(f)))
    }

    /// Reads through (and keeps) a descriptor: [`KeptFiles::read`] then
    /// [`KeptFiles::keep`].
    pub fn read_keep<T>(
        &mut self,
        root: &Path,
        pid: i32,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let (v, opened) = self.read(root, pid, parse)?;
        if let Some(f) = opened {
            self.keep(pid, f);
        }
        Some(v)
    }

    /// Keeps a descriptor [`KeptFiles::read`] opened (within the budget).
    pub fn keep(&mut self, pid: i32, f: File) {
        if self.files.len() < self.budget || self.files.contains_key(&pid) {
            self.files.insert(pid, f);
        }
    }

    /// Drops the descriptor of a process that is gone.
    pub fn forget(&mut self, pid: i32) {
        self.files.remove(&pid);
    }

    /// The processes whose file is kept open.
    pub fn pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.files.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// The whole file from offset 0, parsed (bytes that are not UTF-8, as in a process name,
/// are read lossily).
fn read_from<T>(f: &File, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    // `stat` is a few hundred bytes; the buffer doubles for anything longer. `stat` and
    // `io` are one record each (`single_open`): a read that returns less than it asked for
    // is the end, and reading on to a read of 0 would have the kernel generate the whole
    // file again.
    let mut stack = [0u8; 1024];
    let mut heap = Vec::new();
    let mut n = 0usize;
    loop {
        let buf: &mut [u8] = if heap.is_empty() {
            &mut stack
        } else {
            &mut heap
        };
        let got = f.read_at(&mut buf[n..], n as u64).ok()?;
        n += got;
        if got == 0 || n < buf.len() {
            break;
        }
        let len = buf.len();
        if heap.is_empty() {
            heap = stack.to_vec();
        }
        heap.resize(len * 2, 0);
    }
    let bytes = if heap.is_empty() {
        &stack[..n]
    } else {
        &heap[..n]
    };
    parse(&String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_parentheses() {
        let text = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1234 0 7 0 10 5 0 0 20 0 1 0 \
                    98765 8392704 512 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.comm, "a) b (c)");
        assert_eq!(s.ppid, 1);
        assert_eq!(s.minflt, 1234);
        assert_eq!(s.majflt, 7);
        assert_eq!(s.start_time, 98765);
        assert_eq!(s.vsize_bytes, 8392704);
        assert_eq!(s.rss_pages, 512);
        assert_eq!(parse_stat("12 (x) S 1 2"), None);
    }

    #[test]
    fn a_kept_descriptor_reads_the_live_counters_again() {
        let me = std::process::id() as i32;
        let mut files = KeptFiles::statm();
        let root = Path::new("/proc");
        let (first, opened) = files.read(root, me, parse_statm).unwrap();
        let f = opened.expect("opened by path the first time");
        // The same size as a read by path (the address space's, in pages).
        let by_path = std::fs::read_to_string(format!("/proc/{me}/statm")).unwrap();
        assert_eq!(first[0], parse_statm(&by_path).unwrap()[0]);
        files.keep(me, f);
        assert_eq!(files.len(), 1);
        // Fault in fresh pages: resident moves, and the kept descriptor sees it.
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let (again, opened) = files.read(root, me, parse_statm).unwrap();
        assert!(opened.is_none(), "read through the kept descriptor");
        assert!(again[1] >= first[1] + 8192, "{again:?} against {first:?}");
        files.forget(me);
        assert!(files.is_empty());
    }

    #[test]
    fn a_kept_descriptor_of_an_exited_process_fails() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut files = KeptFiles::statm();
        let (_, f) = files.read(Path::new("/proc"), pid, parse_statm).unwrap();
        files.keep(pid, f.unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: the kept descriptor reads nothing (the pid, taken again, would be
        // opened by path: the cache's start time tells the processes apart).
        assert!(read_from(files.files.get(&pid).unwrap(), parse_statm).is_none());
    }

    #[test]
    fn statm_fields() {
        assert_eq!(parse_statm("10 5 3 1 4 0 0\n"), Some([10, 5, 3, 1, 4]));
        assert_eq!(parse_statm("10 5 3"), None);
    }

    #[test]
    fn run_time_moves_only_while_a_process_runs() {
        let root = Path::new("/proc");
        let me = std::process::id() as i32;
        let before = run_time_ns(root, me).expect("schedstat of this process");
        // Spin for 30 ms of this thread's own CPU time (not of the clock: on a loaded
        // machine the thread waits for a CPU part of the time).
        let t = crate::collect::thread_cpu();
        let mut x = 0u64;
        while crate::collect::thread_cpu() < t + std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(run_time_ns(root, me).unwrap() >= before + 20_000_000);
        // A child that sleeps on a pipe read runs no more once it blocks.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(200));
        let a = run_time_ns(root, pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let b = run_time_ns(root, pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(a > 0);
        assert_eq!(a, b, "a sleeping process did not run");
        assert_eq!(run_time_ns(root, pid), None, "gone");
    }

    #[test]
    fn rchar_through_a_kept_io_descriptor_moves_with_reads() {
        use std::io::Read;
        let me = std::process::id() as i32;
        let mut io = KeptFiles::io();
        let root = Path::new("/proc");
        let before = io
            .read_keep(root, me, super::super::process::parse_rchar)
            .unwrap();
        assert_eq!(io.len(), 1);
        let mut buf = vec![0u8; 1 << 20];
        let mut f = File::open("/proc/self/exe").unwrap();
        let n = f.read(&mut buf).unwrap() as u64;
        let (after, opened) = io
            .read(root, me, super::super::process::parse_rchar)
            .unwrap();
        assert!(opened.is_none(), "read through the kept descriptor");
        assert!(after >= before + n, "{after} < {before} + {n}");
    }
}
