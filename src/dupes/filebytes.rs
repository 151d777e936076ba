//! Reading a model file's bytes without changing its page-cache state.
//!
//! The proof compares process memory with the file. Reading a file page that is not cached
//! the ordinary way would add it to the page cache: the very residency twofold reports.
//! `preadv2(RWF_NOWAIT)` alone does not prevent that: on a page that is not cached it
//! returns `EAGAIN`, but only after starting readahead of it (`filemap_get_pages` calls
//! `page_cache_sync_ra` for `IOCB_NOWAIT` too), and the pages come in anyway (measured: a
//! scan of a 512 MiB file half evicted brought it back to 99%). So a range is read from the
//! cache only when `cachestat` (or `mincore`) says every page of it is cached, with
//! `preadv2(RWF_NOWAIT)` on a descriptor advised `POSIX_FADV_RANDOM` (a page evicted in
//! between then costs at most the pages asked for, no readahead window); the rest with
//! `O_DIRECT`, which bypasses the page cache. Where a file system refuses `O_DIRECT`
//! (tmpfs, whose pages are memory anyway) plain `pread` is used.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::sample::FileKey;

/// `O_DIRECT` transfers are done in blocks of this size and alignment.
const BLOCK: u64 = 4096;
/// Largest `O_DIRECT` read at once.
const DIRECT_MAX: usize = 1 << 20;

pub struct FileBytes {
    file: File,
    direct: Option<File>,
    pub size: u64,
    /// The version opened (device, inode, size, mtime, ctime): what comparisons keep
    /// the hashes of its bytes under ([`super::chunkmemo`]).
    pub version: super::pointcache::Version,
}

impl FileBytes {
    /// Opens `path` read-only (and a second, `O_DIRECT` descriptor where allowed).
    pub fn open(path: &Path) -> io::Result<FileBytes> {
        let file = File::open(path)?;
        // Readahead off for this descriptor (see the module docs); advice, so no error.
        // SAFETY: a plain syscall on our own open descriptor.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        let m = file.metadata()?;
        let version = {
            use std::os::unix::fs::MetadataExt;
            super::pointcache::version(FileKey::from_dev(m.dev(), m.ino()), &m)
        };
        Ok(FileBytes {
            file,
            direct,
            size: m.len(),
            version,
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Fills `buf` from offset `off`; never adds pages to the page cache where the file
    /// system allows `O_DIRECT`.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = off + done as u64;
            let rest = (buf.len() - done) as u64;
            // Without O_DIRECT (tmpfs) there is no other way to read: no need to ask.
            let uncached = self.direct.is_some()
                && crate::collect::residency::range_cached(&self.file, at, rest) == Some(false);
            let got = if uncached {
                Err(io::Error::from_raw_os_error(libc::EAGAIN))
            } else {
                self.read_cached(&mut buf[done..], at)
            };
            match got {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file shorter than expected",
                    ))
                }
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    done += self.read_uncached(&mut buf[done..], at)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_cached(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: `iov` describes our own writable buffer; the fd is open for reading.
        let n = unsafe {
            libc::preadv2(
                self.file.as_raw_fd(),
                &iov,
                1,
                off as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return self.file.read_at(buf, off);
            }
            return Err(e);
        }
        Ok(n as usize)
    }

    /// Reads at least one byte at `off` through `O_DIRECT` (plain `pread` without it).
    fn read_uncached(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let Some(direct) = &self.direct else {
            return self.file.read_at(buf, off);
        };
        let start = off / BLOCK * BLOCK;
        let end = (off + buf.len() as u64).next_multiple_of(BLOCK);
        let len = ((end - start) as usize).min(DIRECT_MAX);
        // Over-allocated by one block, for alignment.
        let mut scratch = vec![0u8; len + BLOCK as usize];
        let pad = scratch.as_ptr().align_offset(BLOCK as usize);
        let aligned = &mut scratch[pad..pad + len];
        let n = match direct.read_at(aligned, start) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return self.file.read_at(buf, off);
            }
            Err(e) => return Err(e),
        };
        let skip = (off - start) as usize;
        if n <= skip {
            return Ok(0);
        }
        let take = (n - skip).min(buf.len());
        buf[..take].copy_from_slice(&aligned[skip..skip + take]);
        Ok(take)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_any_range_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let fb = FileBytes::open(&path).unwrap();
        for (off, len) in [(0, 16), (4090, 20), (12345, 9000), (69_990, 10)] {
            let mut buf = vec![0u8; len];
            fb.read_exact_at(&mut buf, off as u64).unwrap();
            assert_eq!(buf, data[off..off + len]);
            // And the uncached path on its own.
            let mut buf2 = vec![0u8; len];
            let mut done = 0;
            while done < len {
                done += fb
                    .read_uncached(&mut buf2[done..], (off + done) as u64)
                    .unwrap();
            }
            assert_eq!(buf2, data[off..off + len]);
        }
        let mut past = [0u8; 4];
        assert!(fb.read_exact_at(&mut past, 69_998).is_err());
    }
}
