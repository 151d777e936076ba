//! System-wide counters: `/proc/meminfo` (kB → bytes), `/proc/vmstat` (event counts and
//! `nr_*` page counts, kept as read) and `/proc/pressure/memory` (PSI `some`/`full`
//! `avg10`, percent). See
//! <https://www.kernel.org/doc/html/latest/filesystems/proc.html> (§1.2, "meminfo") and
//! <https://docs.kernel.org/accounting/psi.html>.

use std::path::Path;

use anyhow::Context as _;

use super::error::Result;
use super::keyvalue;
use crate::sample::{PressureSample, SystemSample};

/// `meminfo` and `vmstat` as maps of every key the kernel prints (a snapshot keeps them
/// all), read by `keyvalue` rather than procfs: procfs's `Meminfo` is a struct of the fields it
/// knows (newer keys are dropped) that fails when one of a dozen is missing, and its
/// `VmStat` fails on the first odd line without saying which.
/// The keys of `/proc/meminfo` that a sample keeps: those the model reads (the host line,
/// `model::build`) and the probe's `MemAvailable`. A live view read the whole file and
/// `/proc/vmstat` into maps at every snapshot, some 230 keys (8% of `top`'s CPU on the
/// moving host of `bench/host.sh`, perf), and recordings stored them all.
pub const MEMINFO_KEYS: &[&str] = &[
    "MemTotal",
    "MemAvailable",
    "Cached",
    "AnonPages",
    "Mapped",
    "Shmem",
    "Dirty",
];
/// The keys of `/proc/vmstat` that a sample keeps: refaults and major faults (the host
/// line and its rates, `model::rates`).
pub const VMSTAT_KEYS: &[&str] = &[
    "workingset_refault_file",
    "workingset_refault",
    "pgmajfault",
];

/// The fields of `path` named in `keys`.
fn read_keys(path: &Path, keys: &[&str]) -> Result<std::collections::BTreeMap<String, u64>> {
    keyvalue::with_text(path, |text| {
        let mut map = std::collections::BTreeMap::new();
        keyvalue::for_each_field(path, text, &[], |k, v| {
            if keys.contains(&k) {
                map.insert(k.to_string(), v);
            }
        })?;
        Ok(map)
    })
}

pub fn read(proc_root: &Path) -> Result<SystemSample> {
    let mut s = SystemSample {
        page_size: page_size(),
        ..SystemSample::default()
    };
    s.meminfo = read_keys(&proc_root.join("meminfo"), MEMINFO_KEYS)?;
    s.vmstat = read_keys(&proc_root.join("vmstat"), VMSTAT_KEYS)?;
    // Kernels without PSI (or with it off) have no such file: unknown.
    s.pressure = std::fs::read_to_string(proc_root.join("pressure/memory"))
        .ok()
        .and_then(|t| PressureSample::parse(&t));
    Ok(s)
}

/// The system's page size (`sysconf(_SC_PAGESIZE)`): the one place it is read. It goes
/// into every sample (`SystemSample::page_size`), from which the model counts pages, so a
/// test injects another one by setting it there (see `model::tests`); the pagemap reader
/// takes it as an argument too (`memory::expand_entries`).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        crate::sample::PAGE_BYTES
    }
}

/// The host's `MemAvailable` and `MemTotal`.
pub fn host_memory(proc_root: &Path) -> anyhow::Result<(u64, u64)> {
    let mi = keyvalue::read_map(&proc_root.join("meminfo"))?;
    let avail = *mi
        .get("MemAvailable")
        .context("no MemAvailable in meminfo")?;
    let total = *mi.get("MemTotal").context("no MemTotal in meminfo")?;
    Ok((avail, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_the_model_reads_are_kept_as_proc_gives_them() {
        let s = read(Path::new("/proc")).unwrap();
        let whole = keyvalue::read_map(Path::new("/proc/meminfo")).unwrap();
        for k in ["MemTotal", "Cached", "AnonPages"] {
            assert!(s.meminfo.contains_key(k), "{k}");
        }
        assert_eq!(s.meminfo.get("MemTotal"), whole.get("MemTotal"));
        assert!(s.meminfo.keys().all(|k| MEMINFO_KEYS.contains(&k.as_str())));
        assert!(s.vmstat.contains_key("pgmajfault"));
        assert!(s.vmstat.keys().all(|k| VMSTAT_KEYS.contains(&k.as_str())));
    }

    #[test]
    fn memory_pressure_is_read_where_the_kernel_has_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("meminfo"), "MemTotal: 1024 kB\n").unwrap();
        std::fs::write(dir.path().join("vmstat"), "pgmajfault 3\n").unwrap();
        assert_eq!(read(dir.path()).unwrap().pressure, None, "no PSI: unknown");
        std::fs::create_dir(dir.path().join("pressure")).unwrap();
        std::fs::write(
            dir.path().join("pressure/memory"),
            "some avg10=1.25 avg60=0.50 avg300=0.10 total=123\nfull avg10=0.75 avg60=0.00 avg300=0.00 total=45\n",
        )
        .unwrap();
        assert_eq!(
            read(dir.path()).unwrap().pressure,
            Some(PressureSample {
                some_avg10: 1.25,
                full_avg10: Some(0.75)
            })
        );
    }
}
