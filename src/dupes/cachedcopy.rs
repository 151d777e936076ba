//! Copying a file's *cached* pages without starting readahead.
//!
//! A buffered `read()` (even `preadv2(RWF_NOWAIT)` on a descriptor advised
//! `POSIX_FADV_RANDOM`) of a cached page that carries the readahead mark (`PG_readahead`,
//! set on one folio of every readahead window) starts asynchronous readahead of the next
//! window: `filemap_get_pages` → `filemap_readahead` → `page_cache_async_ra`, which looks
//! neither at `RWF_NOWAIT` nor at `FMODE_RANDOM`. The new window is cached at once and marked
//! in turn, so a reader that walks a file and reads only what `cachestat` says is cached
//! follows the readahead it started, to the end of the file. Measured on kernel 6.18 (ext4):
//! an evicted 64 MiB file, a 1,320-byte header read (4 pages cached), then 2,064-byte
//! `RWF_NOWAIT` reads every 2 KiB wherever `cachestat` said cached: 16,385 pages cached
//! afterwards. This is what made `scan --exact` of an evicted model cache all of it.
//!
//! A fault on a mapping advised `MADV_RANDOM` (`VM_RAND_READ`) never starts readahead,
//! synchronous or asynchronous (`do_sync_mmap_readahead` and `do_async_mmap_readahead`
//! return at once), and fault-around maps only pages already cached and up to date. So the
//! cached pages are copied out of a read-only shared mapping of the file (the same reads
//! done this way: 4 pages before, 4 after); a page evicted between the caller's check and
//! the copy costs that one page. The mapping's page tables are dropped every 16 MiB copied
//! and when a caller is done with the file ([`CachedCopy::release`]; `MADV_DONTNEED` on a
//! shared file mapping unmaps, it never evicts), so twofold does not stay a mapper of it.
//!
//! A mapping raises `SIGBUS` where the file was truncated under it (or its storage fails).
//! A handler installed once turns such a fault, inside a copy of this module only, into a
//! zero page over the faulting address and a failed copy; anywhere else it restores the
//! default action, so the fault kills the process as it would have.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Once, OnceLock, RwLock, RwLockReadGuard};

thread_local! {
    /// Set while this thread copies from a file mapping.
    static COPYING: Cell<bool> = const { Cell::new(false) };
    /// Set by the handler when the copy faulted.
    static FAULTED: Cell<bool> = const { Cell::new(false) };
    /// The page size, for the handler.
    static PAGE: Cell<u64> = const { Cell::new(0) };
}

static INSTALL: Once = Once::new();
/// The handler before ours (the Rust runtime's, or the default): taken back for a SIGBUS
/// that is not ours.
static BEFORE: OnceLock<libc::sigaction> = OnceLock::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Only reads of const-initialised thread-locals and raw syscalls: async-signal-safe.
    if COPYING.with(Cell::get) && !info.is_null() {
        let page = crate::sample::PAGE_BYTES.max(PAGE.with(Cell::get)) as usize;
        // SAFETY: `info` is the kernel's siginfo for this SIGBUS; `si_addr` is the faulting
        // address inside our own file mapping. Replacing that one page of it by a private
        // zero page lets the interrupted copy finish; the caller discards its result and the
        // whole mapping is unmapped when its `Mmap` is dropped.
        unsafe {
            let addr = ((*info).si_addr() as usize) & !(page - 1);
            let got = libc::mmap(
                addr as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if got != libc::MAP_FAILED {
                FAULTED.with(|f| f.set(true));
                return;
            }
        }
    }
    // Not ours: the handler before ours (or the default action) takes it when the
    // faulting instruction runs again.
    // SAFETY: sigaction and signal are async-signal-safe; `BEFORE` is set before our
    // handler is installed and never changes.
    unsafe {
        match BEFORE.get() {
            Some(before) => {
                libc::sigaction(sig, before, std::ptr::null_mut());
            }
            None => {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction with our handler, SA_SIGINFO for `si_addr`, and
        // SA_NODEFER so that a second fault in the same copy is handled too.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut before: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut before) == 0 {
                let _ = BEFORE.set(before);
            }
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

/// A read-only shared mapping of a whole file, advised `MADV_RANDOM`, to copy cached
/// pages from: made at the first copy and unmapped by [`CachedCopy::release`], so that it
/// exists only while a caller reads (a long-lived index keeps its files open, but no
/// mapping: another tool would see twofold as a mapper, and pages it mapped could not be
/// evicted).
pub struct CachedCopy {
    file: std::fs::File,
    len: u64,
    map: RwLock<Option<memmap2::Mmap>>,
    page: u64,
    /// An upper bound of the bytes mapped since the page tables were last dropped.
    pending: AtomicU64,
    /// The last [`MAP_UNIT`] region of the file copied from (`u64::MAX`: none yet).
    region: AtomicU64,
}

/// The page tables of the mapping are dropped once this many bytes may be mapped (and the
/// mapping removed by [`CachedCopy::release`]): dropping them after every small read (the
/// index reads 2 KiB every 2 KiB) cost a fault and a TLB flush per read, 5x the index's
/// time on a cached file.
const RELEASE_EVERY: u64 = 16 << 20;
/// The most one fault maps: a PMD (2 MiB on x86-64) where the page cache holds the file in
/// folios that large (ext4 and xfs on recent kernels, tmpfs with huge pages: a 256 MiB
/// model read in 2 KiB pieces was mapped whole, 257 MB of RSS), else fault-around's 64 KiB
/// of small pages. Every region of this size touched since the last drop counts whole.
const MAP_UNIT: u64 = 2 << 20;

impl CachedCopy {
    /// For `file` (`len` bytes); `None` where it cannot be mapped (empty).
    pub fn new(file: &std::fs::File, len: u64) -> Option<CachedCopy> {
        if len == 0 {
            return None;
        }
        install();
        Some(CachedCopy {
            file: file.try_clone().ok()?,
            len,
            map: RwLock::new(None),
            page: crate::collect::system::page_size(),
            pending: AtomicU64::new(0),
            region: AtomicU64::new(u64::MAX),
        })
    }

    /// The mapping, made when there is none.
    fn mapped(&self) -> io::Result<RwLockReadGuard<'_, Option<memmap2::Mmap>>> {
        {
            let m = self.map.read().unwrap_or_else(|e| e.into_inner());
            if m.is_some() {
                return Ok(m);
            }
        }
        let mut w = self.map.write().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            // SAFETY: a read-only shared mapping: the file may change under it (we only
            // copy bytes out, checked by the caller's comparisons), and truncation is
            // handled by the SIGBUS handler above.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .len(self.len as usize)
                    .map(&self.file)
            }?;
            map.advise(memmap2::Advice::Random)?;
            *w = Some(map);
        }
        drop(w);
        Ok(self.map.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Copies `buf.len()` bytes at `off` out of the mapping; the caller has checked that
    /// they are cached. Fails where the file was truncated under the mapping.
    pub fn copy(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|e| *e <= self.len)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        // A mapping that cannot be made (an address space limited below the file's size)
        // is said as `Unsupported`: the caller reads from storage instead.
        let guard = self
            .mapped()
            .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e))?;
        let Some(map) = guard.as_ref() else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        PAGE.with(|p| p.set(self.page));
        FAULTED.with(|f| f.set(false));
        COPYING.with(|c| c.set(true));
        // SAFETY: `off..end` lies inside the mapping (checked above), which the read guard
        // keeps; a SIGBUS in the copy is turned into a zero page.
        unsafe {
            std::ptr::copy_nonoverlapping(
                map.as_ptr().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            );
        }
        COPYING.with(|c| c.set(false));
        let faulted = FAULTED.with(Cell::get);
        // What the copy may have mapped: each MAP_UNIT region it touched, but for the one
        // the copy before it ended in (sequential small reads count a region once).
        let (first, last) = (off / MAP_UNIT, (end - 1) / MAP_UNIT);
        let before = self.region.swap(last, Ordering::Relaxed);
        let mapped = (last - first + u64::from(before != first)) * MAP_UNIT;
        if self.pending.fetch_add(mapped, Ordering::Relaxed) + mapped >= RELEASE_EVERY
            && self.pending.swap(0, Ordering::Relaxed) > 0
        {
            // SAFETY: the whole of our own mapping, kept by the guard; MADV_DONTNEED of a
            // shared file mapping only drops our page table entries, it never evicts.
            unsafe {
                libc::madvise(
                    map.as_ptr() as *mut libc::c_void,
                    map.len(),
                    libc::MADV_DONTNEED,
                );
            }
        }
        drop(guard);
        // A file cut below `end` before or while it was copied: where the kernel keeps a
        // large folio across the new end mapped, the copy does not fault and reads what
        // is no longer the file (its size, asked after the copy, says so).
        let cut = !faulted && self.file.metadata().is_ok_and(|m| m.len() < end);
        if faulted || cut {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file changed size while it was read",
            ));
        }
        Ok(())
    }

    /// Removes the mapping: twofold maps none of the file (the page cache stays as it is).
    /// The next copy maps it again.
    pub fn release(&self) {
        self.pending.store(0, Ordering::Relaxed);
        self.map.write().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Pages of the mapping mapped now, from its `Rss` in `/proc/self/smaps` (`mincore`
    /// would report the page cache): for tests of [`CachedCopy::release`].
    #[cfg(test)]
    fn mapped_pages(&self) -> u64 {
        let Some(start) = self.map.read().unwrap().as_ref().map(|m| m.as_ptr() as u64) else {
            return 0;
        };
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let mut inside = false;
        for l in smaps.lines() {
            if let Some((range, _)) = l.split_once(' ') {
                if let Some((a, _)) = range.split_once('-') {
                    if let Ok(a) = u64::from_str_radix(a, 16) {
                        inside = a == start;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = l.strip_prefix("Rss:") {
                    let kb: u64 = kb
                        .trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse()
                        .unwrap_or(0);
                    return kb * 1024 / self.page;
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn copies_and_survives_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..5 * 4096u32).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let c = CachedCopy::new(&f, data.len() as u64).unwrap();
        let mut buf = vec![0u8; 5000];
        c.copy(&mut buf, 4000).unwrap();
        assert_eq!(buf, data[4000..9000]);
        // Truncated under the mapping: the copy past the new end fails, the process lives.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let err = c.copy(&mut buf, 8192).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // The part still in the file is still copied.
        let mut head = vec![0u8; 100];
        c.copy(&mut head, 0).unwrap();
        assert_eq!(head, data[..100]);
        // Released: twofold maps none of the file's pages any more.
        assert!(c.mapped_pages() > 0);
        c.release();
        assert_eq!(c.mapped_pages(), 0);
        // Not even a mapping is left: another tool sees no mapper of the file.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.contains(path.to_str().unwrap()), "{maps}");
    }

    /// Small reads walking a cached 64 MiB file (as the index reads, 2 KiB every 2 KiB
    /// and every 64 KiB): twofold never maps more than RELEASE_EVERY and one region of its
    /// pages, whatever the folio size of the file system under the test directory (ext4
    /// maps 2 MiB at a fault where the page cache holds large folios).
    #[test]
    fn small_reads_never_map_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let len = 64u64 << 20;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // Cached (written just now; read once more in case the file system wrote through).
        std::io::copy(&mut &f, &mut std::io::sink()).unwrap();
        let c = CachedCopy::new(&f, len).unwrap();
        let mut buf = vec![0u8; 2064];
        let mut most = 0;
        for step in [2048u64, 64 << 10] {
            let mut off = 0;
            while off + buf.len() as u64 <= len {
                c.copy(&mut buf, off).unwrap();
                assert_eq!(buf[..], data[off as usize..off as usize + buf.len()]);
                if off % (1 << 20) == 0 {
                    most = most.max(c.mapped_pages() * c.page);
                }
                off += step;
            }
            c.release();
        }
        assert!(most > 0);
        assert!(
            most <= RELEASE_EVERY + 2 * MAP_UNIT,
            "{} MiB of the file mapped at once",
            most >> 20
        );
    }
}
