//! Per-process readers over a procfs root (`/proc` on a live system, a fixture tree in tests).
//!
//! - `/proc/PID/status`: `Name`, `Uid`, `VmRSS`, `RssAnon`, `RssFile`, `RssShmem`, `VmSwap`,
//!   `HugetlbPages` (kB → bytes). World-readable.
//! - `/proc/PID/smaps_rollup`: sums of the `smaps` fields (Linux ≥ 4.14; `Pss_Anon`,
//!   `Pss_File`, `Pss_Shmem` since 5.x). Needs `PTRACE_MODE_READ` (same user, or root /
//!   `CAP_SYS_PTRACE`); empty for kernel threads.
//! - `/proc/PID/maps`, `/proc/PID/smaps`: see [`super::maps`].
//! - `/proc/PID/fd/*`: symlinks to open files; `stat` through them gives (dev, inode, size).
//! - `/proc/PID/cgroup`: `hierarchy:controllers:path` lines.
//! - `/proc/PID/stat`: field 22, the start time in clock ticks after boot ([`start_time`]).
//!
//! Kernel documentation: <https://www.kernel.org/doc/html/latest/filesystems/proc.html>.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::error::{CollectError, Result};
use super::keyvalue;
use super::maps;
use crate::sample::{CgroupRef, CgroupVersion, FileKey, MappingSample, RollupSample, StatusSample};

/// `status` plus the name and whether it is a kernel thread.
#[derive(Debug, Clone, Default)]
pub struct StatusRead {
    pub comm: String,
    pub kernel_thread: bool,
    pub status: StatusSample,
}

/// An open regular file seen through `/proc/PID/fd/N`.
#[derive(Debug, Clone)]
pub struct FdTarget {
    pub fd: i32,
    pub path: String,
    pub key: FileKey,
    pub size_bytes: u64,
}

/// Reads processes under one procfs root.
#[derive(Debug, Clone)]
pub struct ProcReader {
    root: PathBuf,
    /// This process's pid, taken once (`getpid` is a system call; it is compared with
    /// every process at every snapshot).
    own_pid: i32,
    /// Overlay files resolved to the files that hold their bytes (see
    /// [`super::overlay`]): every identity read here is the real file's.
    overlays: std::sync::Arc<super::overlay::Overlays>,
}

impl ProcReader {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        ProcReader {
            overlays: std::sync::Arc::new(super::overlay::Overlays::new(&root)),
            root,
            own_pid: std::process::id() as i32,
        }
    }

    /// The overlay resolver this reader's identities go through.
    pub fn overlays(&self) -> &super::overlay::Overlays {
        &self.overlays
    }

    /// A mapping's identity made the real file's (see [`super::overlay`]).
    pub(super) fn real_mapping(&self, pid: i32, m: &mut MappingSample) {
        if m.major == 0 {
            let k = self.overlays.translate(pid, m.key(), &m.path);
            (m.major, m.minor, m.inode) = (k.major, k.minor, k.inode);
        }
    }

    /// This process's pid (when the reader was made).
    pub fn own_pid(&self) -> i32 {
        self.own_pid
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file(&self, pid: i32, name: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(name)
    }

    /// All numeric entries of the root, ascending.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let dir = std::fs::read_dir(&self.root).map_err(|e| CollectError::io(&self.root, e))?;
        let mut pids: Vec<i32> = dir
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
            .collect();
        pids.sort_unstable();
        Ok(pids)
    }

    pub fn exists(&self, pid: i32) -> bool {
        self.root.join(pid.to_string()).is_dir()
    }

    pub fn status(&self, pid: i32) -> Result<StatusRead> {
        let path = self.file(pid, "status");
        keyvalue::with_text(&path, |text| parse_status(&path, text))
    }

    /// `None` for kernel threads (the kernel prints nothing for them).
    pub fn rollup(&self, pid: i32) -> Result<Option<RollupSample>> {
        let path = self.file(pid, "smaps_rollup");
        keyvalue::with_text(&path, |text| parse_rollup(&path, text))
    }

    pub fn maps(&self, pid: i32) -> Result<Vec<MappingSample>> {
        self.maps_marked(pid).map(|m| m.0)
    }

    /// [`ProcReader::maps`], and whether the process carries twofold's observer mark
    /// ([`super::observer`]).
    pub fn maps_marked(&self, pid: i32) -> Result<(Vec<MappingSample>, bool)> {
        let path = self.file(pid, "maps");
        let (mut maps, marked) = keyvalue::with_text(&path, |text| {
            maps::parse_maps(&path, text).map(|m| (m, super::observer::marked(text)))
        })?;
        for m in &mut maps {
            self.real_mapping(pid, m);
        }
        Ok((maps, marked))
    }

    /// The VMAs of `wanted` files, and process totals summed over all VMAs.
    pub fn smaps(
        &self,
        pid: i32,
        wanted: &HashSet<FileKey>,
    ) -> Result<(Vec<MappingSample>, RollupSample)> {
        let path = self.file(pid, "smaps");
        let real = |m: &mut MappingSample| self.real_mapping(pid, m);
        keyvalue::with_text(&path, |text| {
            maps::parse_smaps_with(&path, text, wanted, &real)
        })
    }

    /// By hand rather than procfs's `Process::cmdline`, which fails on an argument that is
    /// not UTF-8; here it is read lossily, as every name from outside is.
    pub fn cmdline(&self, pid: i32) -> Result<Vec<String>> {
        let path = self.file(pid, "cmdline");
        keyvalue::with_bytes(&path, |bytes| {
            Ok::<_, std::convert::Infallible>(
                bytes
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )
        })
        .map_err(|e| match e {
            keyvalue::Reading::Io(e) => CollectError::io(&path, e),
            keyvalue::Reading::Parse(never) => match never {},
        })
    }

    /// `/proc/PID/io` `rchar`: bytes read with read(2) and the like over the process's
    /// life. Needs ptrace read access (same user, or root).
    pub fn rchar(&self, pid: i32) -> Result<Option<u64>> {
        let path = self.file(pid, "io");
        keyvalue::with_text(&path, |text| Ok(parse_rchar(text)))
    }

    /// How many descriptors the process has open: the size `stat` gives its `fd`
    /// directory (Linux 6.2 and later). `None` where that reads 0 (an older kernel, or no
    /// descriptor open) or cannot be read.
    pub fn fd_count(&self, pid: i32) -> Option<u64> {
        let m = std::fs::metadata(self.file(pid, "fd")).ok()?;
        (m.len() > 0).then_some(m.len())
    }

    /// The current directory of the process, for relative paths on its command line.
    pub fn cwd(&self, pid: i32) -> Option<PathBuf> {
        std::fs::read_link(self.file(pid, "cwd")).ok()
    }

    /// The memory cgroup: the v1 `memory` hierarchy line if present, else the v2 `0::` line.
    pub fn cgroup(&self, pid: i32) -> Result<Option<CgroupRef>> {
        let path = self.file(pid, "cgroup");
        keyvalue::with_text(&path, |text| parse_cgroup(&path, text))
    }

    /// Regular files the process holds open, with (dev, inode) and size from `stat`
    /// through the fd link (which works for files outside our mount namespace too).
    pub fn open_files(&self, pid: i32) -> Result<Vec<FdTarget>> {
        use nix::fcntl::{readlinkat, OFlag};
        use std::os::fd::AsRawFd;
        // One open of the fd directory, then each fd relative to it: `fstatat` first (most
        // fds are sockets, pipes and terminals: no link to read), `readlinkat` for the
        // regular files only.
        let fd_dir = self.root.join(pid.to_string()).join("fd");
        let errno = |e: nix::errno::Errno| CollectError::io(&fd_dir, std::io::Error::from(e));
        let mut dir = nix::dir::Dir::open(
            &fd_dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(errno)?;
        let raw = dir.as_raw_fd();
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name();
            let Some(fd) = name.to_str().ok().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            // An fd closed while we iterate is skipped.
            // `AT_STATX_DONT_SYNC`: a hung FUSE or NFS mount answers from its cached
            // attributes, so it cannot stop the walk of every process's fds.
            let meta = match super::answer::stat_cached_at(raw, name) {
                Ok(m) => m,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(errno(e)),
            };
            if meta.st_mode & libc::S_IFMT != libc::S_IFREG {
                continue;
            }
            let target = match readlinkat(Some(raw), name) {
                Ok(t) => t,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(errno(e)),
            };
            let target = target.to_string_lossy();
            if !target.starts_with('/') {
                continue;
            }
            let key = FileKey::from_dev(meta.st_dev, meta.st_ino);
            let key = self.overlays.translate(pid, key, &target);
            out.push(FdTarget {
                fd,
                path: target.into_owned(),
                key,
                size_bytes: meta.st_size as u64,
            });
        }
        out.sort_by_key(|t| t.fd);
        Ok(out)
    }
}

/// `status`, by hand rather than with procfs's `Status::from_buf_read`: that one requires
/// some twenty fields (`Tgid`, `FDSize`, `Groups`, `SigQ`, ...) and fails when one is
/// missing or odd, where twofold reads the seven it needs, takes a missing one as unknown
/// (`None`; kernels before 4.5 have no `RssAnon`), and names the malformed line of a
/// field it needs (the hand-written fixture trees hold only those fields).
/// `rchar` of a `/proc/PID/io` text.
pub fn parse_rchar(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
}

pub fn parse_status(path: &Path, text: &str) -> Result<StatusRead> {
    let mut read = StatusRead {
        kernel_thread: true,
        ..StatusRead::default()
    };
    let s = &mut read.status;
    let numeric = [
        "VmRSS",
        "RssAnon",
        "RssFile",
        "RssShmem",
        "VmSwap",
        "VmSize",
        "HugetlbPages",
    ];
    let mut saw_vm = false;
    keyvalue::for_each_field(path, text, &numeric, |k, v| match k {
        "VmSize" => saw_vm = true,
        "VmRSS" => s.vm_rss_bytes = Some(v),
        "RssAnon" => s.rss_anon_bytes = Some(v),
        "RssFile" => s.rss_file_bytes = Some(v),
        "RssShmem" => s.rss_shmem_bytes = Some(v),
        "VmSwap" => s.vm_swap_bytes = Some(v),
        "HugetlbPages" => s.hugetlb_bytes = Some(v),
        _ => {}
    })?;
    read.kernel_thread = !saw_vm;
    for (i, line) in text.lines().enumerate() {
        if let Some(name) = line.strip_prefix("Name:") {
            read.comm = name.trim().to_string();
        } else if let Some(uids) = line.strip_prefix("Uid:") {
            let real = uids.split_whitespace().next();
            read.status.uid = Some(
                real.and_then(|u| u.parse().ok())
                    .ok_or_else(|| CollectError::parse(path, i + 1, line))?,
            );
        }
    }
    Ok(read)
}

/// `smaps_rollup` of one process under `root` (`None`: gone, denied, a kernel thread).
pub fn rollup_of(root: &Path, pid: i32) -> Option<RollupSample> {
    let path = root.join(pid.to_string()).join("smaps_rollup");
    keyvalue::with_text(&path, |text| parse_rollup(&path, text))
        .ok()
        .flatten()
}

pub fn parse_rollup(path: &Path, text: &str) -> Result<Option<RollupSample>> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    // The first line is the `[rollup]` header, like a maps line.
    let body = match text.split_once('\n') {
        Some((first, rest)) if maps::parse_header(first).is_some() => rest,
        _ => text,
    };
    let mut r = RollupSample::default();
    let (mut rss, mut pss) = (None, None);
    keyvalue::for_each_field(path, body, &["Rss", "Pss"], |k, v| match k {
        "Rss" => rss = Some(v),
        "Pss" => pss = Some(v),
        "Pss_Anon" => r.pss_anon_bytes = Some(v),
        "Pss_File" => r.pss_file_bytes = Some(v),
        "Pss_Shmem" => r.pss_shmem_bytes = Some(v),
        "Shared_Clean" => r.shared_clean_bytes = v,
        "Shared_Dirty" => r.shared_dirty_bytes = v,
        "Private_Clean" => r.private_clean_bytes = v,
        "Private_Dirty" => r.private_dirty_bytes = v,
        "Anonymous" => r.anonymous_bytes = Some(v),
        "Swap" => r.swap_bytes = Some(v),
        "SwapPss" => r.swap_pss_bytes = Some(v),
        _ => {}
    })?;
    match (rss, pss) {
        (Some(rss), Some(pss)) => {
            r.rss_bytes = rss;
            r.pss_bytes = pss;
            Ok(Some(r))
        }
        _ => Err(CollectError::parse(path, 1, "missing 'Rss' or 'Pss'")),
    }
}

/// The memory cgroup of a `/proc/PID/cgroup` text, parsed by procfs
/// (`ProcessCGroups::from_buf_read`, which reads fixture text as well as `/proc`), one
/// line at a time so that a malformed line is reported with its number.
pub fn parse_cgroup(path: &Path, text: &str) -> Result<Option<CgroupRef>> {
    use procfs::FromBufRead;
    let mut v2 = None;
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let groups = procfs::ProcessCGroups::from_buf_read(line.as_bytes())
            .map_err(|_| CollectError::parse(path, i + 1, line))?;
        for g in groups {
            if g.controllers.iter().any(|c| c == "memory") {
                return Ok(Some(CgroupRef {
                    version: CgroupVersion::V1,
                    path: g.pathname,
                }));
            }
            if g.hierarchy == 0 && g.controllers.is_empty() {
                v2 = Some(CgroupRef {
                    version: CgroupVersion::V2,
                    path: g.pathname,
                });
            }
        }
    }
    Ok(v2)
}

/// Start time of `pid` (field 22 of `/proc/PID/stat`, clock ticks after boot).
pub fn start_time(proc_root: &Path, pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_of_a_kernel_thread_has_no_memory() {
        let text = "Name:\tkworker/0:1\nUmask:\t0000\nState:\tI (idle)\nUid:\t0\t0\t0\t0\n";
        let r = parse_status(Path::new("s"), text).unwrap();
        assert!(r.kernel_thread);
        assert_eq!(r.comm, "kworker/0:1");
        assert_eq!(r.status.rss_anon_bytes, None);
        assert_eq!(r.status.uid, Some(0));
    }

    #[test]
    fn status_of_an_old_kernel_lacks_rss_split() {
        // Kernels before 4.5 print VmRSS but no RssAnon/RssFile/RssShmem.
        let text =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nVmSize:\t 8000 kB\nVmRSS:\t 3000 kB\n";
        let r = parse_status(Path::new("s"), text).unwrap();
        assert!(!r.kernel_thread);
        assert_eq!(r.status.vm_rss_bytes, Some(3000 * 1024));
        assert_eq!(r.status.rss_anon_bytes, None);
        assert_eq!(r.status.uid, Some(1000));
    }

    #[test]
    fn rollup_empty_is_kernel_thread_and_missing_pss_is_error() {
        assert_eq!(parse_rollup(Path::new("r"), "").unwrap(), None);
        let err = parse_rollup(Path::new("r"), "Rss: 4 kB\n").unwrap_err();
        assert!(err.to_string().contains("'r'"));
    }

    #[test]
    fn rollup_of_an_old_kernel_lacks_pss_split() {
        let text = "00400000-ffffffffff601000 ---p 00000000 00:00 0 [rollup]\n\
                    Rss: 800 kB\nPss: 400 kB\nShared_Clean: 400 kB\nShared_Dirty: 0 kB\n\
                    Private_Clean: 200 kB\nPrivate_Dirty: 200 kB\n";
        let r = parse_rollup(Path::new("r"), text).unwrap().unwrap();
        assert_eq!(r.pss_bytes, 400 * 1024);
        assert_eq!(r.pss_anon_bytes, None);
        assert_eq!(r.anonymous_bytes, None);
    }

    #[test]
    fn cgroup_prefers_v1_memory_then_v2() {
        let v1 = "4:memory:/process_api/x\n0::/\n";
        let c = parse_cgroup(Path::new("c"), v1).unwrap().unwrap();
        assert_eq!(c.version, CgroupVersion::V1);
        assert_eq!(c.path, "/process_api/x");
        let v2 = "0::/system.slice/llama.service\n";
        let c = parse_cgroup(Path::new("c"), v2).unwrap().unwrap();
        assert_eq!(c.version, CgroupVersion::V2);
        assert_eq!(c.path, "/system.slice/llama.service");
        let err = parse_cgroup(Path::new("c"), "0::/\ngarbage\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        // A path with colons is kept whole.
        let c = parse_cgroup(Path::new("c"), "0::/a:b\n").unwrap().unwrap();
        assert_eq!(c.path, "/a:b");
    }
}
