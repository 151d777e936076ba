//! A fresh memory cgroup for one campaign: v2 where the host has the memory controller
//! there, else v1; a memory limit; guaranteed removal.
//!
//! Removal (every process SIGKILLed, the directory removed once the last one is gone)
//! happens on drop, so on success, on error and on panic; the [`crate::cleanup`] signal
//! thread does the same on SIGINT, SIGTERM and SIGHUP, and the next campaign after a
//! `kill -9` (the name, `twofold-PID-sSTART-N`, says whose it was). A limit above `MemAvailable` minus a margin is refused: a campaign
//! must never push the host into OOM.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::cleanup::{leftovers, owner_tag, remove_cgroup, Registry};
use crate::collect::{cgroup, Roots};
use crate::sample::{CgroupSample, CgroupVersion};
use crate::units::iec;

/// Headroom kept free on the host: the larger of 512 MiB and a tenth of RAM.
pub fn margin(mem_total: u64) -> u64 {
    (512u64 << 20).max(mem_total / 10)
}

/// Refuses limits the host cannot afford.
pub fn check_limit(limit: u64, mem_available: u64, mem_total: u64) -> anyhow::Result<()> {
    let m = margin(mem_total);
    let allowed = mem_available.saturating_sub(m);
    if limit > allowed {
        bail!(
            "--memory-max '{}' is more than MemAvailable '{}' minus a '{}' margin: a campaign must never push the host into OOM",
            iec(limit),
            iec(mem_available),
            iec(m)
        );
    }
    Ok(())
}

pub use crate::collect::system::host_memory;

pub struct Sandbox {
    pub dir: PathBuf,
    pub version: CgroupVersion,
    pub limit: u64,
    registry: Registry,
}

fn v2_memory_root(root: &Path) -> Option<PathBuf> {
    let ctl = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    ctl.split_whitespace()
        .any(|c| c == "memory")
        .then(|| root.to_path_buf())
}

impl Sandbox {
    pub fn create(roots: &Roots, limit: u64, registry: &Registry) -> anyhow::Result<Sandbox> {
        let (avail, total) = host_memory(&roots.proc)?;
        check_limit(limit, avail, total)?;
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("twofold-{}-{n}", owner_tag());
        let (parent, version) = match v2_memory_root(&roots.cgroup) {
            Some(r) => {
                // Children get the memory controller only if the parent delegates it.
                let _ = std::fs::write(r.join("cgroup.subtree_control"), "+memory");
                (r, CgroupVersion::V2)
            }
            None => (roots.cgroup.join("memory"), CgroupVersion::V1),
        };
        if !parent.exists() {
            bail!(
                "no memory cgroup hierarchy under '{}'",
                roots.cgroup.display()
            );
        }
        let dir = parent.join(name);
        registry.create_cgroup(&dir).with_context(|| {
            format!(
                "cannot create cgroup '{}' (campaigns need root, or a delegated cgroup)",
                dir.display()
            )
        })?;
        let sandbox = Sandbox {
            dir,
            version,
            limit,
            registry: registry.clone(),
        };
        let limit_s = limit.to_string();
        match version {
            CgroupVersion::V2 => {
                sandbox.write("memory.max", &limit_s)?;
                if sandbox.dir.join("memory.swap.max").exists() {
                    sandbox.write("memory.swap.max", "0")?;
                }
            }
            CgroupVersion::V1 => {
                sandbox.write("memory.limit_in_bytes", &limit_s)?;
                if sandbox.dir.join("memory.memsw.limit_in_bytes").exists() {
                    let _ = sandbox.write("memory.memsw.limit_in_bytes", &limit_s);
                }
            }
        }
        Ok(sandbox)
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let p = self.dir.join(file);
        std::fs::write(&p, value)
            .with_context(|| format!("cannot write '{value}' to '{}'", p.display()))
    }

    /// Makes `cmd` start inside the sandbox.
    pub fn enter(&self, cmd: &mut Command) -> anyhow::Result<()> {
        crate::spawn::enter_cgroup(cmd, &self.dir.join("cgroup.procs"))
    }

    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Pids in the sandbox now.
    pub fn pids(&self) -> Vec<i32> {
        leftovers::cgroup_pids(&self.dir)
    }

    pub fn read(&self) -> anyhow::Result<CgroupSample> {
        Ok(cgroup::read_dir(&self.dir, Some(self.version))?)
    }

    /// OOM kills inside the sandbox so far.
    pub fn oom_kills(&self) -> Option<u64> {
        self.read().ok()?.events.get("oom_kill").copied()
    }

    /// SIGKILLs every process inside (the sandbox stays).
    pub fn kill_all(&self) {
        for _ in 0..200 {
            if leftovers::kill_cgroup(&self.dir) == 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        match remove_cgroup(&self.dir) {
            Ok(()) => self.registry.forget_path(&self.dir),
            // Still registered: the signal thread or the next campaign tries again.
            Err(e) => eprintln!(
                "twofold: warning: cannot remove cgroup '{}': {e}",
                self.dir.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_beyond_available_are_refused() {
        let gib = 1u64 << 30;
        assert!(check_limit(4 * gib, 20 * gib, 24 * gib).is_ok());
        let err = check_limit(20 * gib, 20 * gib, 24 * gib).unwrap_err();
        assert!(
            err.to_string()
                .contains("must never push the host into OOM"),
            "{err}"
        );
        // Small machines keep at least 512 MiB.
        assert!(check_limit(gib + (600 << 20), 2 * gib, 2 * gib).is_err());
    }
}
