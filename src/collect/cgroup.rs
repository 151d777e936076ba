//! Memory cgroups, v1 and v2, over a cgroupfs root (`/sys/fs/cgroup`).
//!
//! - v2 (<https://docs.kernel.org/admin-guide/cgroup-v2.html>, "Memory"): `memory.current`,
//!   `memory.max` (`max` = unlimited), `memory.peak` (Linux ≥ 5.19), `memory.stat`
//!   (`anon`, `file`, `file_mapped`, `shmem`, `workingset_refault_file`, bytes or counts),
//!   `memory.events` (`oom`, `oom_kill`, ...), `memory.min`, `memory.low`, `memory.high`
//!   (bytes, `max`), `memory.pressure` (PSI `avg10`, percent).
//! - v1 (<https://docs.kernel.org/admin-guide/cgroup-v1/memory.html>):
//!   `memory.usage_in_bytes`, `memory.limit_in_bytes` (PAGE_COUNTER_MAX = unlimited),
//!   `memory.max_usage_in_bytes`, `memory.stat` (`rss`, `cache`, `mapped_file`, `shmem` and
//!   hierarchical `total_*`), `memory.oom_control` (`oom_kill`), `memory.failcnt`.
//!
//! Layouts found: pure v2 at the root (`cgroup.controllers` there); hybrid, with v1
//! controllers in `<root>/<controller>` and v2 at `<root>/unified`.

use std::path::{Path, PathBuf};

use super::error::{CollectError, Result};
use super::keyvalue;
use crate::sample::{CgroupRef, CgroupSample, CgroupVersion};

/// v1 reports "no limit" as PAGE_COUNTER_MAX pages; anything at or above 2^62 is that.
const V1_UNLIMITED: u64 = 1 << 62;

/// Reads memory cgroups under one cgroupfs root.
#[derive(Debug, Clone)]
pub struct CgroupReader {
    root: PathBuf,
}

impl CgroupReader {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CgroupReader { root: root.into() }
    }

    /// Directory of a cgroup named as `/proc/PID/cgroup` names it.
    pub fn dir_of(&self, cg: &CgroupRef) -> PathBuf {
        let rel = cg.path.trim_start_matches('/');
        match cg.version {
            CgroupVersion::V1 => self.root.join("memory").join(rel),
            CgroupVersion::V2 => {
                if self.root.join("cgroup.controllers").exists() {
                    self.root.join(rel)
                } else {
                    self.root.join("unified").join(rel)
                }
            }
        }
    }

    /// Reads the cgroup a process belongs to.
    pub fn read(&self, cg: &CgroupRef) -> Result<CgroupSample> {
        let dir = self.dir_of(cg);
        let mut s = read_dir(&dir, Some(cg.version))?;
        s.path = cg.path.clone();
        Ok(s)
    }

    /// Resolves a user-given cgroup: a directory under the root, or a path inside a
    /// hierarchy (`/system.slice/x`), tried in v2 then v1 layouts.
    pub fn resolve(&self, given: &Path) -> Option<(PathBuf, CgroupRef)> {
        let candidates: Vec<(PathBuf, CgroupVersion)> = if given.starts_with(&self.root) {
            let v = detect(given)?;
            vec![(given.to_path_buf(), v)]
        } else {
            let rel = given.to_string_lossy().trim_start_matches('/').to_string();
            vec![
                (self.root.join(&rel), CgroupVersion::V2),
                (self.root.join("unified").join(&rel), CgroupVersion::V2),
                (self.root.join("memory").join(&rel), CgroupVersion::V1),
            ]
        };
        for (dir, _) in candidates {
            let Some(version) = detect(&dir) else {
                continue;
            };
            let path = self.inner_path(&dir, version);
            return Some((dir, CgroupRef { version, path }));
        }
        None
    }

    fn inner_path(&self, dir: &Path, version: CgroupVersion) -> String {
        let base = match version {
            CgroupVersion::V1 => self.root.join("memory"),
            CgroupVersion::V2 if self.root.join("cgroup.controllers").exists() => self.root.clone(),
            CgroupVersion::V2 => self.root.join("unified"),
        };
        let rel = dir.strip_prefix(&base).unwrap_or(dir);
        format!("/{}", rel.to_string_lossy())
    }
}

/// Which version a cgroup directory is, by the files it has; `None` if it has no memory
/// controller.
pub fn detect(dir: &Path) -> Option<CgroupVersion> {
    if dir.join("memory.usage_in_bytes").exists() {
        Some(CgroupVersion::V1)
    } else if dir.join("memory.stat").exists() {
        Some(CgroupVersion::V2)
    } else {
        None
    }
}

fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(CollectError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Reads one cgroup directory. `version` `None` detects it.
pub fn read_dir(dir: &Path, version: Option<CgroupVersion>) -> Result<CgroupSample> {
    let version = match version.or_else(|| detect(dir)) {
        Some(v) => v,
        None => {
            return Err(CollectError::io(
                &dir.join("memory.stat"),
                std::io::Error::from_raw_os_error(libc::ENOENT),
            ))
        }
    };
    let mut s = CgroupSample {
        version: Some(version),
        path: dir.to_string_lossy().into_owned(),
        stat: keyvalue::read_map(&dir.join("memory.stat"))?,
        ..CgroupSample::default()
    };
    match version {
        CgroupVersion::V2 => {
            s.usage_bytes = optional(keyvalue::read_limit(&dir.join("memory.current")))?.flatten();
            // The root cgroup has no memory.max: it is unlimited.
            s.limit_bytes =
                Some(optional(keyvalue::read_limit(&dir.join("memory.max")))?.flatten());
            s.peak_bytes = optional(keyvalue::read_limit(&dir.join("memory.peak")))?.flatten();
            s.events =
                optional(keyvalue::read_map(&dir.join("memory.events")))?.unwrap_or_default();
            // The root cgroup has none of these: unknown, shown as n/a.
            s.min_bytes = optional(keyvalue::read_limit(&dir.join("memory.min")))?.flatten();
            s.low_bytes = optional(keyvalue::read_limit(&dir.join("memory.low")))?.flatten();
            s.high_bytes = optional(keyvalue::read_limit(&dir.join("memory.high")))?;
            s.pressure = std::fs::read_to_string(dir.join("memory.pressure"))
                .ok()
                .and_then(|t| crate::sample::PressureSample::parse(&t));
        }
        CgroupVersion::V1 => {
            s.usage_bytes =
                optional(keyvalue::read_limit(&dir.join("memory.usage_in_bytes")))?.flatten();
            s.limit_bytes = optional(keyvalue::read_limit(&dir.join("memory.limit_in_bytes")))?
                .map(|l| l.filter(|v| *v < V1_UNLIMITED));
            s.peak_bytes =
                optional(keyvalue::read_limit(&dir.join("memory.max_usage_in_bytes")))?.flatten();
            s.events =
                optional(keyvalue::read_map(&dir.join("memory.oom_control")))?.unwrap_or_default();
            s.failcnt = optional(keyvalue::read_limit(&dir.join("memory.failcnt")))?.flatten();
        }
    }
    Ok(s)
}

/// The counters that change: `memory.stat`, usage and events (a campaign sampler's
/// subset of [`read_dir`]: limit, peak and failcnt are read once at the end).
pub fn read_counters(dir: &Path, version: CgroupVersion) -> Result<CgroupSample> {
    let (usage, events) = match version {
        CgroupVersion::V2 => ("memory.current", "memory.events"),
        CgroupVersion::V1 => ("memory.usage_in_bytes", "memory.oom_control"),
    };
    Ok(CgroupSample {
        version: Some(version),
        path: dir.to_string_lossy().into_owned(),
        stat: keyvalue::read_map(&dir.join("memory.stat"))?,
        usage_bytes: keyvalue::read_limit(&dir.join(usage))?,
        events: optional(keyvalue::read_map(&dir.join(events)))?.unwrap_or_default(),
        ..CgroupSample::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn v2_protection_high_and_pressure() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(root, "cgroup.controllers", "memory\n");
        let d = root.join("svc");
        write(&d, "memory.current", "1048576\n");
        write(&d, "memory.max", "2097152\n");
        write(&d, "memory.stat", "anon 4096\n");
        write(&d, "memory.min", "0\n");
        write(&d, "memory.low", "524288\n");
        write(&d, "memory.high", "max\n");
        write(
            &d,
            "memory.pressure",
            "some avg10=1.50 avg60=0.20 avg300=0.00 total=10\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=3\n",
        );
        let cg = CgroupRef {
            version: CgroupVersion::V2,
            path: "/svc".into(),
        };
        let s = CgroupReader::new(root).read(&cg).unwrap();
        assert_eq!((s.min_bytes, s.low_bytes), (Some(0), Some(512 << 10)));
        assert_eq!(s.high_bytes, Some(None), "max: unlimited");
        let p = s.pressure.unwrap();
        assert_eq!((p.some_avg10, p.full_avg10), (1.5, Some(0.25)));
        let m = crate::model::cgroup::build(&s);
        assert!(m.high_unlimited && m.high_bytes.is_none());
        assert_eq!(m.low_bytes, Some(512 << 10));
        // Without the files (the root cgroup, older kernels): unknown, not 0.
        let d2 = root.join("bare");
        write(&d2, "memory.stat", "anon 0\n");
        let s2 = read_dir(&d2, Some(CgroupVersion::V2)).unwrap();
        assert_eq!(
            (s2.min_bytes, s2.high_bytes, s2.pressure),
            (None, None, None)
        );
    }

    #[test]
    fn v2_unlimited_and_missing_peak() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(root, "cgroup.controllers", "memory\n");
        let d = root.join("svc");
        write(&d, "memory.current", "1048576\n");
        write(&d, "memory.max", "max\n");
        write(&d, "memory.stat", "anon 4096\nfile 8192\n");
        write(
            &d,
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        );
        let r = CgroupReader::new(root);
        let cg = CgroupRef {
            version: CgroupVersion::V2,
            path: "/svc".into(),
        };
        let s = r.read(&cg).unwrap();
        assert_eq!(s.usage_bytes, Some(1 << 20));
        assert_eq!(s.limit_bytes, Some(None));
        assert_eq!(s.peak_bytes, None);
        assert_eq!(s.events["oom_kill"], 1);
        assert_eq!(s.stat["file"], 8192);
        let (_, resolved) = r.resolve(Path::new("/svc")).unwrap();
        assert_eq!(resolved, cg);
    }

    #[test]
    fn v1_unlimited_is_none() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("memory/a");
        write(&d, "memory.usage_in_bytes", "4096\n");
        write(&d, "memory.limit_in_bytes", "9223372036854771712\n");
        write(&d, "memory.max_usage_in_bytes", "8192\n");
        write(&d, "memory.stat", "cache 0\nrss 4096\ntotal_rss 4096\n");
        write(
            &d,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        write(&d, "memory.failcnt", "7\n");
        let s = read_dir(&d, None).unwrap();
        assert_eq!(s.version, Some(CgroupVersion::V1));
        assert_eq!(s.limit_bytes, Some(None));
        assert_eq!(s.events["oom_kill"], 2);
        assert_eq!(s.failcnt, Some(7));
        let r = CgroupReader::new(t.path());
        let (_, cg) = r.resolve(Path::new("/a")).unwrap();
        assert_eq!(cg.version, CgroupVersion::V1);
        assert_eq!(cg.path, "/a");
    }
}
