//! What every twofold carries whatever its build, name or path: one page of a memfd named
//! `twofold-observer`, mapped by each observing command at its start. Another twofold's
//! `/proc/PID/maps` shows it (`/memfd:twofold-observer (deleted)`), so a renamed binary,
//! another checkout's build or a container image's is an observer, never a holder or a
//! candidate ([`super::interest`]). (A memfd, not a named anonymous mapping: kernels built
//! without `CONFIG_ANON_VMA_NAME`, as this project's machines are, cannot name those.)

/// The mark, as `maps` shows it.
pub const MARK: &str = "/memfd:twofold-observer (deleted)";

/// Maps the mark for the life of this process (once; errors are ignored: the mark is a
/// courtesy to other twofolds, never needed by this one).
pub fn mark() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let len = 4096;
        // SAFETY: a memfd of our own, sized to one page and mapped read-only for the life
        // of the process (never unmapped); its descriptor is closed once mapped.
        unsafe {
            let fd = libc::memfd_create(c"twofold-observer".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return;
            }
            if libc::ftruncate(fd, len as libc::off_t) == 0 {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
            }
            libc::close(fd);
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
        assert_eq!(named, 1, "{maps}");
        assert!(marked(&maps));
        assert!(!marked(
            "7f00-7f01 r--s 00000000 00:01 9 /memfd:other (deleted)\n"
        ));
    }
}
