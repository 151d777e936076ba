//! Page-cache residency of a file.
//!
//! First choice is `cachestat(2)` (Linux ≥ 6.5, syscall 451): one call returns the number
//! of cached, dirty, writeback, evicted and recently evicted pages of a range, without
//! mapping anything (<https://man7.org/linux/man-pages/man2/cachestat.2.html>). Where it is
//! missing (`ENOSYS`), a read-only `MAP_SHARED` mapping is made window by window and
//! `mincore(2)` reports which pages are in the page cache; nothing is ever read from or
//! written to the file. `mincore` is also what draws the per-page map (`--map`).
//!
//! The kernel only reveals page-cache state of files the caller owns or may write to
//! (`can_do_mincore`; newer kernels apply the same rule to `cachestat`). Otherwise the
//! answer is "unknown" with the reason, never 0.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::system::page_size;
use crate::sample::{FileKey, ResidencySample, ResidencySource};

/// Size of each mapping window used by `mincore`: bounds address space and the vector.
const WINDOW_BYTES: u64 = 1 << 30;

#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
#[derive(Default)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Which interface to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// `cachestat`, falling back to `mincore` where the kernel lacks it.
    #[default]
    Auto,
    Cachestat,
    Mincore,
}

/// Why residency is unknown.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("cannot open '{path}' read-only")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("'{path}' is not a regular file")]
    NotRegular { path: String },
    #[error(
        "the kernel does not reveal page-cache state of '{path}' to this user (needs ownership, write access, or root)"
    )]
    NotRevealed { path: String },
    #[error("{call} failed on '{path}'")]
    Syscall {
        call: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Opens a file read-only for residency queries; refuses what is not a regular file.
/// Returns it with its size and identity (device, inode), from one `fstat`.
pub fn open(path: &Path) -> Result<(File, u64, FileKey), ResidencyError> {
    let (file, st) = open_stat(path)?;
    Ok((
        file,
        st.st_size as u64,
        FileKey::from_dev(st.st_dev, st.st_ino),
    ))
}

/// [`open`], with the whole `fstat`.
pub fn open_stat(path: &Path) -> Result<(File, nix::sys::stat::FileStat), ResidencyError> {
    let err = |source: io::Error| ResidencyError::Open {
        path: path.display().to_string(),
        source,
    };
    // O_NONBLOCK: a FIFO opens at once (and is then refused) instead of blocking.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(err)?;
    // fstat(2): cheaper than statx on an empty path, and this runs once per file.
    let st = nix::sys::stat::fstat(file.as_raw_fd()).map_err(|e| err(io::Error::from(e)))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(ResidencyError::NotRegular {
            path: path.display().to_string(),
        });
    }
    Ok((file, st))
}

/// Page-cache state of an open file of `size` bytes.
pub fn query(
    file: &File,
    path: &Path,
    size: u64,
    method: Method,
) -> Result<ResidencySample, ResidencyError> {
    if method != Method::Mincore {
        match cachestat(file, path) {
            Ok(s) => return Ok(s),
            Err(e) if method == Method::Cachestat => return Err(e),
            Err(ResidencyError::Syscall { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let map = mincore_map(file, path, size)?;
    Ok(ResidencySample {
        source: ResidencySource::Mincore,
        cached_bytes: map.resident_pages() * map.page_size,
        ..ResidencySample::default()
    })
}

fn cachestat(file: &File, path: &Path) -> Result<ResidencySample, ResidencyError> {
    cachestat_range(file, path, 0, 0) // len 0: to the end of the file
}

/// Bytes of `[0, len)` of the file in the page cache: `cachestat` over that range, or
/// `mincore` where the kernel lacks it.
pub fn resident_prefix(file: &File, path: &Path, len: u64) -> Result<u64, ResidencyError> {
    match cachestat_range(file, path, 0, len) {
        Ok(s) => Ok(s.cached_bytes.min(len)),
        Err(ResidencyError::Syscall { source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            let map = mincore_map(file, path, len)?;
            Ok((map.resident_pages() * map.page_size).min(len))
        }
        Err(e) => Err(e),
    }
}

/// Whether every page of `[off, off + len)` of `file` is in the page cache now
/// (`cachestat`, else `mincore` of a mapping that is never touched); `None` when neither
/// can tell. Reading the file's own bytes needs this: a read of an uncached page, even
/// `preadv2(RWF_NOWAIT)`, starts readahead and adds pages (`dupes::filebytes`).
pub fn range_cached(file: &File, off: u64, len: u64) -> Option<bool> {
    let page = crate::collect::system::page_size().max(4096);
    let (first, end) = (off / page * page, (off + len).next_multiple_of(page));
    if end <= first {
        return Some(true);
    }
    let pages = (end - first) / page;
    if let Ok(cs) = cachestat_raw(file, first, end - first) {
        return Some(cs.nr_cache >= pages);
    }
    // SAFETY: a shared read-only mapping of our own descriptor, never dereferenced: mincore
    // reads the page cache state of the range, and the mapping is removed before return.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            (end - first) as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            first as libc::off_t,
        );
        if at == libc::MAP_FAILED {
            return None;
        }
        let mut vec = vec![0u8; pages as usize];
        let rc = libc::mincore(at, (end - first) as usize, vec.as_mut_ptr());
        libc::munmap(at, (end - first) as usize);
        (rc == 0).then(|| vec.iter().all(|v| v & 1 != 0))
    }
}

/// `cachestat(2)` of `[off, off + len)` of `file`.
fn cachestat_raw(file: &File, off: u64, len: u64) -> io::Result<Cachestat> {
    let range = CachestatRange { off, len };
    let mut cs = Cachestat::default();
    // SAFETY: both pointers refer to live, correctly laid-out structs for the duration of
    // the call; the kernel writes only `cs`.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if rc == 0 {
        Ok(cs)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn cachestat_range(
    file: &File,
    path: &Path,
    off: u64,
    len: u64,
) -> Result<ResidencySample, ResidencyError> {
    let cs = match cachestat_raw(file, off, len) {
        Ok(cs) => cs,
        Err(source) => {
            if matches!(
                source.raw_os_error(),
                Some(libc::EPERM) | Some(libc::EACCES)
            ) {
                return Err(ResidencyError::NotRevealed {
                    path: path.display().to_string(),
                });
            }
            return Err(ResidencyError::Syscall {
                call: "cachestat",
                path: path.display().to_string(),
                source,
            });
        }
    };
    let ps = page_size();
    Ok(ResidencySample {
        source: ResidencySource::Cachestat,
        cached_bytes: cs.nr_cache * ps,
        dirty_bytes: Some(cs.nr_dirty * ps),
        writeback_bytes: Some(cs.nr_writeback * ps),
        evicted_bytes: Some(cs.nr_evicted * ps),
        recently_evicted_bytes: Some(cs.nr_recently_evicted * ps),
    })
}

/// Whether `mincore` on a mapping of this file reports the page cache: the kernel's
/// `can_do_mincore` (owner, write permission, or root); otherwise it only reports pages
/// mapped by the caller, which would read as 0.
fn mincore_reveals(file: &File, path: &Path) -> bool {
    let euid = nix::unistd::geteuid();
    if euid.is_root() {
        return true;
    }
    if file.metadata().is_ok_and(|m| m.uid() == euid.as_raw()) {
        return true;
    }
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}

pub use crate::model::residency::ResidencyMap;

/// Maps the file read-only in windows and asks `mincore` which pages are cached. Holes of
/// a sparse file (`SEEK_DATA`/`SEEK_HOLE`) are skipped when `cachestat` says none of their
/// pages is cached (reading a hole can cache zero pages), so a 1 TiB sparse file takes as
/// long as its data.
pub fn mincore_map(file: &File, path: &Path, size: u64) -> Result<ResidencyMap, ResidencyError> {
    if !mincore_reveals(file, path) {
        return Err(ResidencyError::NotRevealed {
            path: path.display().to_string(),
        });
    }
    let ps = page_size();
    let pages = size.div_ceil(ps);
    let mut bits = vec![0u64; pages.div_ceil(64) as usize];
    let mut vec = Vec::new();
    let mut at = 0u64;
    while at < size {
        let (data, hole) = next_data(file, at, size, ps);
        if data > at {
            hole_range(file, path, at, data, &mut bits, &mut vec)?;
        }
        if data < hole {
            mincore_range(file, path, data, hole, &mut bits, &mut vec)?;
        }
        at = hole.max(data);
    }
    Ok(ResidencyMap::from_bits(ps, pages, bits))
}

/// A hole below which `mincore` is asked directly rather than bisected further.
const HOLE_LEAF_BYTES: u64 = 64 << 20;

/// Sets the bits of the cached pages of the hole `[from, to)`. Reading a hole caches zero
/// pages, so a hole may hold some: halves that `cachestat` says hold none are skipped, so
/// the cost follows the cached pages, not the hole's size (a 15 TiB hole with 3 GiB of
/// cached zeros is a few thousand `cachestat` calls, not 15 TiB of `mincore`). Without
/// `cachestat`, `mincore` covers the whole hole.
fn hole_range(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
    bits: &mut [u64],
    vec: &mut Vec<u8>,
) -> Result<(), ResidencyError> {
    let ps = page_size();
    let mut todo = vec![(from, to)];
    while let Some((a, b)) = todo.pop() {
        match cachestat_range(file, path, a, b - a).map(|s| s.cached_bytes) {
            Ok(0) => {}
            Ok(_) if b - a > HOLE_LEAF_BYTES => {
                let mid = (a + (b - a) / 2) / ps * ps;
                // Upper half pushed first: the lower one is taken next, in file order.
                todo.push((mid, b));
                todo.push((a, mid));
            }
            _ => mincore_range(file, path, a, b, bits, vec)?,
        }
    }
    Ok(())
}

/// The next data extent at or after `at` (page-aligned, within `size`): `(data, hole)`,
/// `(size, size)` when only a hole is left, `(at, size)` where the file system cannot say.
pub(crate) fn next_data(file: &File, at: u64, size: u64, ps: u64) -> (u64, u64) {
    let seek = |off: u64, whence| {
        // SAFETY: lseek on a descriptor we own; it moves only this descriptor's offset,
        // which nothing else here uses (every read is positioned).
        let r = unsafe { libc::lseek(file.as_raw_fd(), off as libc::off_t, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    };
    let data = match seek(at, libc::SEEK_DATA) {
        Ok(d) => (d / ps * ps).clamp(at, size),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return (size, size),
        Err(_) => return (at, size),
    };
    let hole = match seek(data, libc::SEEK_HOLE) {
        Ok(h) => h.next_multiple_of(ps).min(size),
        Err(_) => size,
    };
    if hole <= data {
        return (data, size);
    }
    (data, hole)
}

/// Sets the bits of the cached pages of `[from, to)` (`from` page-aligned).
fn mincore_range(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
    bits: &mut [u64],
    vec: &mut Vec<u8>,
) -> Result<(), ResidencyError> {
    let ps = page_size();
    let size = to;
    let mut offset = from;
    while offset < size {
        let len = (size - offset).min(WINDOW_BYTES);
        // SAFETY: a read-only shared mapping of a file we opened read-only; it is never
        // dereferenced (mincore only inspects page tables and the page cache), so a file
        // that shrinks meanwhile cannot fault us.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len as usize)
                .map(file)
        }
        .map_err(|source| ResidencyError::Syscall {
            call: "mmap",
            path: path.display().to_string(),
            source,
        })?;
        let npages = len.div_ceil(ps) as usize;
        vec.clear();
        vec.resize(npages, 0u8);
        // SAFETY: the address and length describe the live mapping above and `vec` holds
        // one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                len as usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(ResidencyError::Syscall {
                call: "mincore",
                path: path.display().to_string(),
                source: io::Error::last_os_error(),
            });
        }
        let first = offset / ps;
        for (i, b) in vec.iter().enumerate() {
            if b & 1 != 0 {
                let p = first + i as u64;
                bits[(p / 64) as usize] |= 1 << (p % 64);
            }
        }
        offset += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_counts_bits() {
        let m = ResidencyMap::from_bools(4096, &[true, false, true, true]);
        assert_eq!(m.resident_pages(), 3);
        assert!(m.is_resident(0) && !m.is_resident(1) && !m.is_resident(4));
        assert_eq!(m.resident_in(1, 4), 2);
    }

    /// Word-wise counting agrees with page-by-page counting on every range of a
    /// pseudo-random map spanning several words.
    #[test]
    fn resident_in_matches_a_page_by_page_count() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let pages: Vec<bool> = (0..300)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x & 1 == 1
            })
            .collect();
        let m = ResidencyMap::from_bools(4096, &pages);
        for first in 0..310u64 {
            for last in (first..320).step_by(7) {
                let naive = (first..last.min(300)).filter(|p| m.is_resident(*p)).count();
                assert_eq!(m.resident_in(first, last), naive as u64, "{first}..{last}");
            }
        }
    }

    #[test]
    fn cachestat_and_mincore_agree_on_a_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let (file, size, _) = open(&path).unwrap();
        let a = query(&file, &path, size, Method::Auto).unwrap();
        let b = query(&file, &path, size, Method::Mincore).unwrap();
        // Just written: fully cached and (until writeback) possibly dirty.
        assert_eq!(a.cached_bytes, 1 << 20);
        assert_eq!(b.cached_bytes, 1 << 20);
        assert_eq!(b.source, ResidencySource::Mincore);
        assert_eq!(resident_prefix(&file, &path, 8192).unwrap(), 8192);
    }

    #[test]
    fn directory_is_not_regular() {
        let dir = tempfile::tempdir().unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
