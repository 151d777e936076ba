//! What every twofold carries whatever its build, name or path: one page of anonymous
//! memory named `[anon:twofold-observer]` (`PR_SET_VMA_ANON_NAME`, Linux 5.17), mapped by
//! each observing command at its start. Another twofold's `/proc/PID/maps` shows it, so a
//! renamed binary, another checkout's build or a container image's is an observer, never a
//! holder or a candidate ([`super::interest`]). Where the kernel cannot name anonymous
//! memory the mark is missing and the name rule (`twofold` running an observing command)
//! still applies.

/// The name of the mark, as `maps` shows it.
pub const MARK: &str = "[anon:twofold-observer]";

/// Maps and names the mark for the life of this process (once; errors are ignored: the
/// mark is a courtesy to other twofolds, never needed by this one).
pub fn mark() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        const PR_SET_VMA: libc::c_int = 0x5356_4d41;
        const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
        let len = 4096;
        // SAFETY: a fresh private anonymous mapping of one page, never unmapped (it lives
        // as long as the process); prctl only names it.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if at == libc::MAP_FAILED {
                return;
            }
            let name = c"twofold-observer";
            libc::prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                at as libc::c_ulong,
                len as libc::c_ulong,
                name.as_ptr() as libc::c_ulong,
            );
        }
    });
}

/// Whether a `maps` text holds the mark.
pub fn marked(maps: &str) -> bool {
    maps.lines().any(|l| l.trim_end().ends_with(MARK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_carries_the_mark_once_made() {
        mark();
        mark();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let named = maps.lines().filter(|l| l.ends_with(MARK)).count();
        // Kernels without anonymous VMA names (before 5.17, or CONFIG_ANON_VMA_NAME off)
        // show none; this one names it once.
        let supported = std::path::Path::new("/proc/self/maps").exists()
            && std::fs::read_to_string("/proc/version")
                .ok()
                .and_then(|v| {
                    let r = v.split_whitespace().nth(2)?.to_string();
                    let mut n = r.split(|c: char| !c.is_ascii_digit());
                    Some((
                        n.next()?.parse::<u32>().ok()?,
                        n.next()?.parse::<u32>().ok()?,
                    ))
                })
                .is_some_and(|v| v >= (5, 17));
        if supported {
            assert_eq!(named, 1, "{maps}");
            assert!(marked(&maps));
        }
        assert!(!marked("7f00-7f01 r--p 00000000 00:00 0 [anon:other]\n"));
    }
}
