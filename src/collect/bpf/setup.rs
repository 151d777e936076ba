//! What attaching needs from the host: the privilege (CAP_BPF and CAP_PERFMON, or
//! CAP_SYS_ADMIN), tracefs mounted, RLIMIT_MEMLOCK raised, and the clock BPF stamps with.

use std::path::Path;

use super::{TraceError, TRACEFS};

/// CLOCK_MONOTONIC in nanoseconds (the clock BPF timestamps use).
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Effective capabilities of this process, from `/proc/self/status` (`CapEff`).
fn effective_caps(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("self/status")).ok()?;
    let hex = text.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `Err` with the missing capabilities when this process may not load tracing programs.
pub fn check_privilege(proc_root: &Path) -> Result<(), TraceError> {
    let Some(caps) = effective_caps(proc_root) else {
        return Ok(()); // Unknown: let the kernel decide.
    };
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| *n)
        .collect();
    Err(TraceError::Privilege {
        what: format!("this process lacks {}", missing.join(" and ")),
    })
}

/// Mounts tracefs at [`TRACEFS`] unless it (or the debugfs copy) is already there.
pub(super) fn ensure_tracefs() -> Result<(), TraceError> {
    let mounted = |p: &str| {
        std::fs::read_dir(p)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    };
    if mounted(TRACEFS) || mounted("/sys/kernel/debug/tracing") {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).unwrap_or_default();
    let (src, target, fstype) = (c("nodev"), c(TRACEFS), c("tracefs"));
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call and no data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TraceError::Tracefs {
            path: TRACEFS.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

pub(super) fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass; failure is harmless (kernels since 5.11
    // charge BPF memory to the memory cgroup, not to RLIMIT_MEMLOCK).
    unsafe {
        libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited);
    }
}
