//! Leftovers of earlier twofold runs: cgroups and temp dirs named `twofold-PID-sSTART-...`,
//! where PID and START (field 22 of `/proc/PID/stat`, clock ticks since boot) name the
//! process that made them. Once that process is gone (a `kill -9`, a power cut of the
//! terminal), nothing removes them but the next campaign, which finds them here, kills
//! what still runs inside the cgroups and removes them.
//! <https://docs.kernel.org/admin-guide/cgroup-v2.html#core-interface-files> (`cgroup.kill`)
//!
//! Cgroups named by older versions (`twofold-PID-N`, no start time) count as leftovers once
//! PID is gone. Temp dirs must carry the start time: a bare pid is too weak a claim to
//! delete a directory on.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::pidfd::PidFd;

/// The process that made a cgroup or temp dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    /// Start time in clock ticks after boot; `None` in names of older versions.
    pub start: Option<u64>,
}

/// Start time of a process: it tells a live owner from a later process with its pid.
pub use crate::collect::process::start_time;

/// `PID-sSTART` of this process (just `PID` if /proc cannot say), for names of what it
/// creates.
pub fn owner_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id() as i32;
        match start_time(Path::new("/proc"), pid) {
            Some(s) => format!("{pid}-s{s}"),
            None => pid.to_string(),
        }
    })
}

/// The owner named by `twofold-PID-sSTART-...` or `twofold-PID-N` (pure).
pub fn parse_owner(name: &str) -> Option<Owner> {
    let mut parts = name.strip_prefix("twofold-")?.split('-');
    let pid: i32 = parts.next()?.parse().ok()?;
    let start = parts
        .next()
        .and_then(|p| p.strip_prefix('s'))
        .and_then(|s| s.parse().ok());
    (pid > 0).then_some(Owner { pid, start })
}

/// Whether the owner still runs: its pid exists and, where the name says, started then.
pub fn owner_alive(proc_root: &Path, owner: Owner) -> bool {
    match owner.start {
        Some(s) => start_time(proc_root, owner.pid) == Some(s),
        None => proc_root.join(owner.pid.to_string()).exists(),
    }
}

/// What is left of an earlier run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftover {
    Cgroup(PathBuf),
    Dir(PathBuf),
}

/// Leftovers under the given cgroup parents and temp parents whose owner is gone.
pub fn find(
    proc_root: &Path,
    cgroup_parents: &[PathBuf],
    temp_parents: &[PathBuf],
) -> Vec<Leftover> {
    let dead = |name: &str, need_start: bool| {
        parse_owner(name)
            .filter(|o| !need_start || o.start.is_some())
            .is_some_and(|o| !owner_alive(proc_root, o))
    };
    let mut out = Vec::new();
    for (parents, is_cgroup) in [(cgroup_parents, true), (temp_parents, false)] {
        for parent in parents {
            let Ok(rd) = std::fs::read_dir(parent) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // A real directory, never a symlink to one.
                let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                if !is_dir || !dead(&name, !is_cgroup) {
                    continue;
                }
                out.push(if is_cgroup {
                    Leftover::Cgroup(e.path())
                } else {
                    Leftover::Dir(e.path())
                });
            }
        }
    }
    out
}

/// Pids listed in a cgroup's `cgroup.procs`.
pub fn cgroup_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILLs every process in the cgroup: `cgroup.kill` where the kernel has it (v2, 5.14+),
/// else each pid of `cgroup.procs` through a pidfd opened while it was listed (so a pid
/// reused meanwhile is not hit). Returns how many processes were inside.
pub fn kill_cgroup(dir: &Path) -> usize {
    let pids = cgroup_pids(dir);
    if pids.is_empty() {
        return 0;
    }
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return pids.len();
    }
    let fds: Vec<PidFd> = pids.iter().filter_map(|p| PidFd::open(*p).ok()).collect();
    // Still listed after the pidfd was opened: the pidfd is of a process inside.
    let now = cgroup_pids(dir);
    for fd in fds.iter().filter(|f| now.contains(&f.pid())) {
        let _ = fd.signal(libc::SIGKILL);
    }
    pids.len()
}

/// Kills every process in a cgroup, waits until none is left, then removes it, retrying
/// `rmdir` (EBUSY while the last ones exit) for up to `within`. Ok once it is gone.
pub fn remove_cgroup_within(dir: &Path, within: Duration) -> io::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if !dir.exists() {
            return Ok(());
        }
        let inside = kill_cgroup(dir);
        if inside == 0 {
            match std::fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
        } else if Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{inside} process(es) still inside after {within:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<PathBuf>,
    pub killed: usize,
    pub failed: Vec<String>,
}

impl Swept {
    /// One line for stderr, `None` if there was nothing to do.
    pub fn describe(&self) -> Option<String> {
        if self.removed.is_empty() && self.failed.is_empty() {
            return None;
        }
        let names: Vec<String> = self
            .removed
            .iter()
            .map(|p| format!("'{}'", p.display()))
            .collect();
        let mut s = format!(
            "twofold: removed {} leftover(s) of earlier twofold runs whose process is gone",
            self.removed.len()
        );
        if self.killed > 0 {
            s.push_str(&format!(
                ", killing {} process(es) still inside",
                self.killed
            ));
        }
        if !names.is_empty() {
            s.push_str(&format!(": {}", names.join(", ")));
        }
        if !self.failed.is_empty() {
            s.push_str(&format!("; could not remove {}", self.failed.join(", ")));
        }
        Some(s)
    }
}

/// Removes the leftovers [`find`] reports.
pub fn sweep(proc_root: &Path, cgroup_parents: &[PathBuf], temp_parents: &[PathBuf]) -> Swept {
    let mut s = Swept::default();
    for l in find(proc_root, cgroup_parents, temp_parents) {
        let (path, result) = match &l {
            Leftover::Cgroup(p) => {
                s.killed += cgroup_pids(p).len();
                (p, remove_cgroup_within(p, Duration::from_secs(5)))
            }
            Leftover::Dir(p) => (p, std::fs::remove_dir_all(p)),
        };
        match result {
            Ok(()) => s.removed.push(path.clone()),
            Err(e) => s.failed.push(format!("'{}': {e}", path.display())),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_parsed_from_names() {
        assert_eq!(
            parse_owner("twofold-42-s9000-demo-x1Y"),
            Some(Owner {
                pid: 42,
                start: Some(9000)
            })
        );
        assert_eq!(
            parse_owner("twofold-42-3"),
            Some(Owner {
                pid: 42,
                start: None
            })
        );
        assert_eq!(parse_owner("twofold-demo-abc"), None);
        assert_eq!(parse_owner("twofold-0-1"), None);
        assert_eq!(parse_owner("other-42-s1"), None);
    }

    #[test]
    fn stat_start_time_skips_odd_command_names() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("7");
        std::fs::create_dir(&p).unwrap();
        let mut fields = vec!["S"; 19];
        fields.push("12345");
        fields.push("0");
        let stat = format!("7 (a) b (c) {}\n", fields.join(" "));
        std::fs::write(p.join("stat"), stat).unwrap();
        assert_eq!(start_time(d.path(), 7), Some(12345));
        assert_eq!(start_time(d.path(), 8), None);
    }

    #[test]
    fn only_dirs_of_gone_owners_are_swept() {
        let procs = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        // Pid 7 runs and started at tick 100.
        std::fs::create_dir(procs.path().join("7")).unwrap();
        let mut fields = vec!["S"; 19];
        fields.push("100");
        std::fs::write(
            procs.path().join("7/stat"),
            format!("7 (twofold) {}\n", fields.join(" ")),
        )
        .unwrap();
        let mk = |n: &str| {
            let p = tmp.path().join(n);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("f"), "x").unwrap();
            p
        };
        let alive = mk("twofold-7-s100-demo-a");
        let reused = mk("twofold-7-s99-demo-b"); // pid 7 is now another process
        let gone = mk("twofold-8-s100-competitor-c");
        let legacy = mk("twofold-demo-d"); // no owner: left alone
        let bare = mk("twofold-8-e"); // a temp dir needs the start time
        std::os::unix::fs::symlink(&gone, tmp.path().join("twofold-9-s1-link")).unwrap();
        let s = sweep(procs.path(), &[], &[tmp.path().to_path_buf()]);
        let mut removed = s.removed.clone();
        removed.sort();
        assert_eq!(removed, [reused.clone(), gone.clone()]);
        assert!(alive.exists() && legacy.exists() && bare.exists());
        assert!(!reused.exists() && !gone.exists());
        let line = s.describe().unwrap();
        assert!(line.contains("removed 2 leftover(s)"), "{line}");
        assert_eq!(line.lines().count(), 1);
        assert!(sweep(procs.path(), &[], &[tmp.path().to_path_buf()])
            .describe()
            .is_none());
    }
}
