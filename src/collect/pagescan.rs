//! Present ranges of another process's memory from `PAGEMAP_SCAN` (Linux 6.7+, an ioctl on
//! `/proc/PID/pagemap`, <https://docs.kernel.org/admin-guide/mm/pagemap.html>): the kernel
//! walks the page tables and returns runs of pages by category, so a search learns which of
//! 64 GiB are present from a few calls instead of 8 bytes per page.
//!
//! Only reporting is asked for: `flags` is 0, never `PM_SCAN_WP_MATCHING` (which would
//! write-protect the target's pages and make it fault). The walk takes the target's mmap
//! lock for reading, as a read of `pagemap` does; the target neither faults nor copies.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `PAGE_IS_FILE`: the page is file-backed (or shared anonymous: shmem), as pagemap's
/// bit 61.
const PAGE_IS_FILE: u64 = 1 << 2;
/// `PAGE_IS_PRESENT`: the page is in memory (pagemap's bit 63).
const PAGE_IS_PRESENT: u64 = 1 << 3;

/// `struct pm_scan_arg` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `PAGEMAP_SCAN = _IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 = {
    let dir_rw: u64 = 3; // _IOC_READ | _IOC_WRITE
    let size = std::mem::size_of::<PmScanArg>() as u64;
    (dir_rw << 30) | (size << 16) | ((b'f' as u64) << 8) | 16
};

/// Regions returned per call.
const VEC_LEN: usize = 512;

/// The ranges of `[start, end)` (page-aligned) whose pages are present, and, when
/// `anon_only`, not file-backed (the private copies inside a file mapping): sorted, merged.
/// `Ok(None)` when the kernel has no `PAGEMAP_SCAN` (before 6.7: `ENOTTY`/`EINVAL`), so the
/// caller reads pagemap instead.
pub fn present(
    pagemap: &File,
    start: u64,
    end: u64,
    anon_only: bool,
) -> io::Result<Option<Vec<(u64, u64)>>> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut vec = vec![PageRegion::default(); VEC_LEN];
    let mut at = start;
    while at < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: at,
            end,
            vec: vec.as_mut_ptr() as u64,
            vec_len: VEC_LEN as u64,
            category_mask: PAGE_IS_PRESENT | if anon_only { PAGE_IS_FILE } else { 0 },
            category_inverted: if anon_only { PAGE_IS_FILE } else { 0 },
            return_mask: PAGE_IS_PRESENT,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at VEC_LEN writable
        // page_regions that outlive the call; the kernel writes only those and `arg`.
        let n = unsafe {
            libc::ioctl(
                pagemap.as_raw_fd(),
                PAGEMAP_SCAN as libc::c_ulong,
                &mut arg as *mut PmScanArg,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOTTY) | Some(libc::EINVAL) if out.is_empty() && at == start => {
                    Ok(None)
                }
                _ => Err(e),
            };
        }
        for r in &vec[..n as usize] {
            match out.last_mut() {
                Some(last) if last.1 == r.start => last.1 = r.end,
                _ => out.push((r.start, r.end)),
            }
        }
        if arg.walk_end <= at {
            break;
        }
        at = arg.walk_end;
    }
    Ok(Some(out))
}

/// Bytes in `ranges`.
pub fn bytes(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(a, b)| b - a).sum()
}

/// Whether `addr` lies in one of the sorted `ranges`.
pub fn contains(ranges: &[(u64, u64)], addr: u64) -> bool {
    let i = ranges.partition_point(|r| r.1 <= addr);
    ranges.get(i).is_some_and(|r| r.0 <= addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against pagemap itself, in this process: a buffer with every other page touched,
    /// and a private file mapping with one page written (CoW: anonymous) among read ones.
    #[test]
    fn present_ranges_agree_with_pagemap() {
        let pagemap = File::open("/proc/self/pagemap").unwrap_or_else(|e| panic!("{e}"));
        let page = 4096usize;
        let n = 64;
        let mut buf = vec![0u8; (n + 1) * page];
        let base = (buf.as_ptr() as usize).next_multiple_of(page);
        let off = base - buf.as_ptr() as usize;
        // Some pages may already be present (the allocator zeroed them); touch evens.
        for i in (0..n).step_by(2) {
            buf[off + i * page] = 1;
        }
        let (s, e) = (base as u64, (base + n * page) as u64);
        let Some(ranges) = present(&pagemap, s, e, false).unwrap_or_else(|e| panic!("{e}")) else {
            println!("SKIPPED: PAGEMAP_SCAN needs Linux 6.7 (this kernel has none)");
            return;
        };
        let mut entries = vec![0u8; n * 8];
        use std::os::unix::fs::FileExt;
        pagemap
            .read_exact_at(&mut entries, s / 4096 * 8)
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..n {
            let ent = u64::from_le_bytes(entries[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            let addr = s + (i * page) as u64;
            assert_eq!(contains(&ranges, addr), ent >> 63 == 1, "page {i}");
        }
        assert!(bytes(&ranges) >= (n / 2 * page) as u64);
        std::hint::black_box(&buf);
    }

    #[test]
    fn anon_only_keeps_the_written_pages_of_a_private_file_mapping() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap_or_else(|e| panic!("{e}"));
        f.write_all(&vec![7u8; 16 * 4096])
            .unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: a private mapping of a temp file this test owns; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                16 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let s = p as u64;
        // SAFETY: within the 16-page mapping made above.
        unsafe {
            for i in 0..16 {
                std::ptr::read_volatile((p as *const u8).add(i * 4096));
            }
            *(p as *mut u8).add(5 * 4096) = 1;
        }
        let pagemap = File::open("/proc/self/pagemap").unwrap_or_else(|e| panic!("{e}"));
        let all = present(&pagemap, s, s + 16 * 4096, false).unwrap_or_else(|e| panic!("{e}"));
        let anon = present(&pagemap, s, s + 16 * 4096, true).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 16 * 4096) };
        let (Some(all), Some(anon)) = (all, anon) else {
            println!("SKIPPED: PAGEMAP_SCAN needs Linux 6.7 (this kernel has none)");
            return;
        };
        assert_eq!(all, vec![(s, s + 16 * 4096)]);
        assert_eq!(anon, vec![(s + 5 * 4096, s + 6 * 4096)]);
    }
}
