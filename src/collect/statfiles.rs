//! `/proc/PID/stat` of the processes a long-lived engine watches, kept open between
//! snapshots: every snapshot reads `stat` of every process (the stamp of
//! [`super::cache`]), and opening it by path each time cost more than reading it (a path
//! walk through `/proc`, `statx` to size the buffer, `close`: 20% of `record`'s CPU on the
//! moving host of `bench/host.sh`, measured with `perf`). A kept descriptor is read again
//! with `pread` at offset 0, which makes the kernel render the file afresh
//! (`seq_read_iter` restarts at position 0).
//!
//! A descriptor of `/proc/PID/stat` names the process it was opened for, not the pid:
//! once that process is gone, reading it fails (`ESRCH`) even where the pid now names
//! another process, so a kept descriptor never reads a stranger. On a failed read the path
//! is opened again.
//!
//! Descriptors are kept up to a budget: half of the soft `RLIMIT_NOFILE` less 64, at most
//! [`MAX_KEPT`]; past it `stat` is opened by path as before. The limit itself is not
//! raised (processes that twofold starts inherit it).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::cache::{parse_stat, StatStamp};

/// Descriptors kept at most, whatever the limit.
pub const MAX_KEPT: usize = 16_384;

pub struct StatFiles {
    files: HashMap<i32, File>,
    budget: usize,
}

impl Default for StatFiles {
    fn default() -> Self {
        StatFiles::new()
    }
}

/// How many descriptors may be kept under the soft `RLIMIT_NOFILE` now.
fn budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into our own struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    let soft = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    (soft / 2).saturating_sub(64).min(MAX_KEPT)
}

impl StatFiles {
    pub fn new() -> Self {
        StatFiles {
            files: HashMap::new(),
            budget: budget(),
        }
    }

    /// Reads and parses `stat` of `pid` under `root`: through the kept descriptor when
    /// there is one and it still reads, else by path. A descriptor opened here is returned,
    /// for [`StatFiles::keep`]. `None` when the process is gone or its `stat` does not
    /// parse.
    pub fn read(&self, root: &Path, pid: i32) -> Option<(StatStamp, Option<File>)> {
        if let Some(f) = self.files.get(&pid) {
            if let Some(s) = read_from(f) {
                return Some((s, None));
            }
        }
        let f = File::open(root.join(pid.to_string()).join("stat")).ok()?;
        let s = read_from(&f)?;
        Some((s, Some(f)))
    }

    /// Keeps a descriptor [`StatFiles::read`] opened (within the budget).
    pub fn keep(&mut self, pid: i32, f: File) {
        if self.files.len() < self.budget || self.files.contains_key(&pid) {
            self.files.insert(pid, f);
        }
    }

    /// Drops the descriptor of a process that is gone.
    pub fn forget(&mut self, pid: i32) {
        self.files.remove(&pid);
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// The whole file from offset 0, parsed (a name that is not UTF-8 is read lossily).
fn read_from(f: &File) -> Option<StatStamp> {
    let mut stack = [0u8; 1024];
    let mut heap = Vec::new();
    let mut n = 0usize;
    loop {
        let buf: &mut [u8] = if heap.is_empty() {
            &mut stack[n..]
        } else {
            &mut heap[n..]
        };
        let got = f.read_at(buf, n as u64).ok()?;
        if got == 0 {
            break;
        }
        n += got;
        if heap.is_empty() && n == stack.len() {
            heap = stack.to_vec();
            heap.resize(stack.len() * 4, 0);
        } else if !heap.is_empty() && n == heap.len() {
            heap.resize(heap.len() * 2, 0);
        }
    }
    let bytes = if heap.is_empty() {
        &stack[..n]
    } else {
        &heap[..n]
    };
    parse_stat(&String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_descriptor_reads_the_live_counters_again() {
        let me = std::process::id() as i32;
        let mut files = StatFiles::new();
        let (first, opened) = files.read(Path::new("/proc"), me).unwrap();
        let f = opened.expect("opened by path the first time");
        // The same values as a read by path.
        let by_path = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        assert_eq!(first.start_time, parse_stat(&by_path).unwrap().start_time);
        files.keep(me, f);
        assert_eq!(files.len(), 1);
        // Fault in fresh pages: minflt moves, and the kept descriptor sees it.
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let (again, opened) = files.read(Path::new("/proc"), me).unwrap();
        assert!(opened.is_none(), "read through the kept descriptor");
        assert!(
            again.minflt > first.minflt,
            "{} !> {}",
            again.minflt,
            first.minflt
        );
        assert_eq!(again.start_time, first.start_time);
        files.forget(me);
        assert!(files.is_empty());
    }

    #[test]
    fn a_kept_descriptor_of_an_exited_process_fails_and_the_path_is_opened_again() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut files = StatFiles::new();
        let (stamp, f) = files.read(Path::new("/proc"), pid).unwrap();
        files.keep(pid, f.unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: the kept descriptor reads nothing, and the path names no process (or,
        // were the pid taken again at once, another one).
        assert!(read_from(files.files.get(&pid).unwrap()).is_none());
        let again = files.read(Path::new("/proc"), pid);
        assert!(again.is_none_or(|(s, _)| s.start_time != stamp.start_time));
    }
}
