//! The page cache a campaign starts from.
//!
//! Loading a model that is already in the page cache charges no page cache to the
//! campaign's cgroup, so a footprint ratio or a load rate only means what it says from a
//! cold cache. Before each round the model's pages are dropped with one whole-file
//! `posix_fadvise(POSIX_FADV_DONTNEED)`
//! (<https://man7.org/linux/man-pages/man2/posix_fadvise.2.html>), unless `--warm` asks to
//! keep them, or a process maps the file (found by its dev+inode in `/proc/PID/maps`):
//! DONTNEED does not drop pages that are mapped, so the round would start warm anyway, and
//! the report says so, naming the pids. The resident fraction at the start is measured by
//! `cachestat(2)` (or `mincore(2)`) right after, and reported whatever happened.
//!
//! Partial ranges are never advised: over part of a large folio (up to 2 MiB in the page
//! cache) DONTNEED evicts nothing of it, so only whole files are evicted.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::collect::process::ProcReader;
use crate::collect::residency;
use crate::sample::FileKey;

/// What a round asks of the model's page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Evict the model's pages first (the default).
    Cold,
    /// Keep the page cache as it is (`--warm`).
    Warm,
}

/// A process that maps the model file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapper {
    pub pid: i32,
    pub comm: String,
}

/// The model's page cache at the start of a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartCache {
    pub path: String,
    /// What was asked: `cold` (the default) or `warm` (`--warm`).
    pub requested: CacheMode,
    /// Whether the whole file was advised out of the page cache before the round.
    pub evicted: bool,
    /// Why it was not evicted: `--warm`, or the processes that map the file.
    pub eviction_skipped: Option<String>,
    /// Processes that mapped the file when the eviction was due.
    pub mapped_by: Vec<Mapper>,
    /// Bytes of the file in the page cache at the start of the round.
    pub resident_bytes: Option<u64>,
    /// `resident_bytes` / file size (`null` when unknown; 1 for an empty file).
    pub resident_fraction: Option<f64>,
}

impl StartCache {
    /// One line for the human reports: `cold (evicted), 0% resident`.
    pub fn describe(&self) -> String {
        let state = match (&self.eviction_skipped, self.requested) {
            (None, _) if self.evicted => "cold start (evicted)".to_string(),
            (_, CacheMode::Warm) => "warm start (--warm: not evicted)".to_string(),
            (Some(why), _) => format!("not evicted: {why}"),
            (None, _) => "not evicted".to_string(),
        };
        let resident = self
            .resident_fraction
            .map(|f| format!("{:.0}%", f * 100.0))
            .unwrap_or_else(|| "n/a".into());
        format!("{state}; {resident} of the model resident at the start")
    }
}

/// Why a cold start was impossible: the processes that map the file.
pub fn mapped_reason(mappers: &[Mapper]) -> String {
    let who: Vec<String> = mappers
        .iter()
        .map(|m| format!("pid {} ({})", m.pid, m.comm))
        .collect();
    format!(
        "the file is mapped by {} (mapped pages cannot be evicted)",
        who.join(", ")
    )
}

/// Processes whose `/proc/PID/maps` (under `proc_root`) has a mapping of `key`. A
/// process whose maps cannot be read (it exited, or no rights) is not listed, nor is
/// another twofold (it carries the observer mark): it maps a model only for the moment it
/// reads it, and keeps none of its pages.
pub fn mappers(proc_root: &Path, key: FileKey) -> Vec<Mapper> {
    let procs = ProcReader::new(proc_root);
    let Ok(pids) = procs.pids() else {
        return Vec::new();
    };
    pids.into_iter()
        .filter(|pid| {
            procs.maps(*pid).is_ok_and(|maps| {
                maps.iter().any(|m| m.key() == key)
                    && !maps
                        .iter()
                        .any(|m| m.path == crate::collect::observer::MARK)
            })
        })
        .map(|pid| Mapper {
            pid,
            comm: std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_else(|_| "?".into()),
        })
        .collect()
}

/// Bytes of the file in the page cache and the resident fraction.
pub fn resident(path: &Path) -> (Option<u64>, Option<f64>) {
    let Ok((f, size, _)) = residency::open(path) else {
        return (None, None);
    };
    let Ok(r) = residency::query(&f, path, size, residency::Method::Auto) else {
        return (None, None);
    };
    let page = crate::collect::system::page_size();
    let fraction = crate::model::page_cache_fraction(r.cached_bytes, size, page);
    (Some(r.cached_bytes), Some(fraction))
}

/// Drops the whole file from the page cache (clean, unmapped pages only).
pub fn advise_dontneed(path: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::open(path)
        .with_context(|| format!("cannot open '{}' read-only", path.display()))?;
    // SAFETY: plain syscall on an fd we own; it only drops clean cached pages.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        anyhow::bail!(
            "posix_fadvise(DONTNEED) failed on '{}': {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        );
    }
    Ok(())
}

/// Sets the model's page cache up for a round and says what it was at the start.
pub fn prepare(proc_root: &Path, path: &Path, mode: CacheMode) -> anyhow::Result<StartCache> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot access '{}'", path.display()))?;
    let mut start = StartCache {
        path: path.display().to_string(),
        requested: mode,
        evicted: false,
        eviction_skipped: None,
        mapped_by: Vec::new(),
        resident_bytes: None,
        resident_fraction: None,
    };
    match mode {
        CacheMode::Warm => start.eviction_skipped = Some("--warm".into()),
        CacheMode::Cold => {
            start.mapped_by = mappers(proc_root, FileKey::from_dev(meta.dev(), meta.ino()));
            if start.mapped_by.is_empty() {
                advise_dontneed(path)?;
                // Another twofold reading the file at that instant (its proof maps the
                // cached ranges it copies) keeps those pages: asked again, briefly.
                for _ in 0..20 {
                    if resident(path).0.is_none_or(|b| b == 0) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    advise_dontneed(path)?;
                }
                start.evicted = true;
            } else {
                start.eviction_skipped = Some(mapped_reason(&start.mapped_by));
            }
        }
    }
    (start.resident_bytes, start.resident_fraction) = resident(path);
    Ok(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(evicted: bool, skipped: Option<&str>, fraction: Option<f64>) -> StartCache {
        StartCache {
            path: "m".into(),
            requested: CacheMode::Cold,
            evicted,
            eviction_skipped: skipped.map(String::from),
            mapped_by: Vec::new(),
            resident_bytes: None,
            resident_fraction: fraction,
        }
    }

    #[test]
    fn descriptions_name_the_state_and_the_residency() {
        assert_eq!(
            start(true, None, Some(0.0)).describe(),
            "cold start (evicted); 0% of the model resident at the start"
        );
        assert_eq!(
            start(false, Some("pid 1 maps it"), None).describe(),
            "not evicted: pid 1 maps it; n/a of the model resident at the start"
        );
    }

    #[test]
    fn mapped_reason_names_every_pid() {
        let m = [
            Mapper {
                pid: 42,
                comm: "llama".into(),
            },
            Mapper {
                pid: 7,
                comm: "python3".into(),
            },
        ];
        assert_eq!(
            mapped_reason(&m),
            "the file is mapped by pid 42 (llama), pid 7 (python3) (mapped pages cannot be evicted)"
        );
    }

    #[test]
    fn mappers_are_found_by_dev_and_inode_in_a_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for (pid, comm, maps) in [
            (
                10,
                "reader",
                "7f00-7f10 r--s 00000000 08:01 1234 /models/m.gguf\n",
            ),
            (11, "other", "7f00-7f10 r--s 00000000 08:01 999 /x\n"),
        ] {
            let d = p.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("maps"), maps).unwrap();
            std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
        }
        let key = FileKey {
            major: 8,
            minor: 1,
            inode: 1234,
        };
        assert_eq!(
            mappers(p, key),
            [Mapper {
                pid: 10,
                comm: "reader".into()
            }]
        );
    }
}
