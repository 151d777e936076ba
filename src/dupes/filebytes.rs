//! Reading a model file's bytes without changing its page-cache state.
//!
//! The proof compares process memory with the file. Reading a file page that is not cached
//! the ordinary way would add it to the page cache: the very residency twofold reports. So
//! each range (at most 1 MiB at a time) is read from the cache only when `cachestat` (or
//! `mincore`) says every page of it is cached, and then out of a `MADV_RANDOM` mapping
//! ([`super::cachedcopy`]: a buffered read, even `preadv2(RWF_NOWAIT)`, of a cached page
//! that carries a readahead mark starts readahead of the next window, and a reader walking
//! the file follows it to the end). Every other range, and any range whose state cannot be
//! told, is read with `O_DIRECT`, which bypasses the page cache. Where a file system refuses
//! `O_DIRECT` (tmpfs, whose pages are memory anyway) plain `pread` is used.
//!
//! Container headers are parsed through the same reads ([`FileBytes`] is a
//! [`crate::container::Source`]), so no read of twofold's adds a page to a model's cache
//! except one evicted between the check and the copy.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sample::FileKey;

/// `O_DIRECT` transfers are done in blocks of this size and alignment.
const BLOCK: u64 = 4096;
/// Largest `O_DIRECT` read at once.
const DIRECT_MAX: usize = 1 << 20;

pub struct FileBytes {
    file: File,
    direct: Option<File>,
    /// The file mapped, to copy cached ranges from (with `direct` only).
    mapped: Option<super::cachedcopy::CachedCopy>,
    pub size: u64,
    /// The version opened (device, inode, size, mtime, ctime): what comparisons keep
    /// the hashes of its bytes under ([`super::chunkmemo`]).
    pub version: super::pointcache::Version,
    /// This opening, and how many times it was released: a thread's block of it
    /// ([`BLOCK_BUF`]) is good for one (id, generation).
    id: u64,
    generation: AtomicU64,
}

/// Reads up to this size are served from a block of [`DIRECT_MAX`] bytes read at once and
/// kept by the reading thread: the index reads 2 KiB every 2 KiB (or every few pages), and
/// one `O_DIRECT` read per 4 KiB block made an index of an evicted 1 GiB file take 17 s.
const SMALL_READ: usize = 64 << 10;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The last block a thread read of a file: (opening id, generation, offset, bytes).
#[derive(Default)]
struct Block {
    id: u64,
    generation: u64,
    start: u64,
    data: Vec<u8>,
}

thread_local! {
    static BLOCK_BUF: RefCell<Block> = RefCell::new(Block::default());
}

impl FileBytes {
    /// Opens `path` read-only (and a second, `O_DIRECT` descriptor where allowed).
    pub fn open(path: &Path) -> io::Result<FileBytes> {
        // O_NONBLOCK: opening a FIFO for reading would block until a writer comes; the
        // fstat of the very descriptor opened then refuses anything but a regular file.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        let m = file.metadata()?;
        if !m.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        // Readahead off for this descriptor, should a plain read be needed (tmpfs); advice,
        // so no error.
        // SAFETY: a plain syscall on our own open descriptor.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .ok();
        let mapped = direct
            .as_ref()
            .and_then(|_| super::cachedcopy::CachedCopy::new(&file, m.len()));
        let version = {
            use std::os::unix::fs::MetadataExt;
            super::pointcache::version(FileKey::from_dev(m.dev(), m.ino()), &m)
        };
        Ok(FileBytes {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            file,
            direct,
            mapped,
            size: m.len(),
            version,
        })
    }

    /// Done reading for now: twofold maps none of the file's pages any more (see
    /// [`super::cachedcopy::CachedCopy::release`]). A kept index calls it after each use.
    pub fn release(&self) {
        // Blocks threads kept are read again (the file may change between uses).
        self.generation.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.mapped {
            m.release();
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Fills `buf` from offset `off`; never adds pages to the page cache where the file
    /// system allows `O_DIRECT` (but one evicted between the check and the copy).
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if off
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than expected",
            ));
        }
        if self.direct.is_some() && buf.len() <= SMALL_READ {
            return self.read_small(buf, off);
        }
        self.read_span(buf, off)
    }

    /// A small read, from the thread's block of this file (read whole when missing).
    fn read_small(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let generation = self.generation.load(Ordering::Relaxed);
        BLOCK_BUF.with(|b| {
            let mut b = b.borrow_mut();
            let mut done = 0usize;
            while done < buf.len() {
                let at = off + done as u64;
                let have = b.id == self.id
                    && b.generation == generation
                    && at >= b.start
                    && at < b.start + b.data.len() as u64;
                if !have {
                    let start = at / DIRECT_MAX as u64 * DIRECT_MAX as u64;
                    let len = (DIRECT_MAX as u64).min(self.size - start) as usize;
                    b.id = 0;
                    b.data.resize(len, 0);
                    self.read_span(&mut b.data, start)?;
                    (b.id, b.generation, b.start) = (self.id, generation, start);
                }
                let from = (at - b.start) as usize;
                let take = (b.data.len() - from).min(buf.len() - done);
                buf[done..done + take].copy_from_slice(&b.data[from..from + take]);
                done += take;
            }
            Ok(())
        })
    }

    /// Fills `buf` from `off`, at most [`DIRECT_MAX`] at a time: a part every page of
    /// which is cached out of the mapping, any other with `O_DIRECT`.
    fn read_span(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = off + done as u64;
            let len = (buf.len() - done).min(DIRECT_MAX);
            let part = &mut buf[done..done + len];
            let got = match (&self.direct, &self.mapped) {
                // Without O_DIRECT (tmpfs) there is no other way to read.
                (None, _) => self.file.read_at(part, at)?,
                (Some(_), Some(map))
                    if crate::collect::residency::range_cached(&self.file, at, len as u64)
                        == Some(true) =>
                {
                    map.copy(part, at)?;
                    len
                }
                (Some(_), _) => self.read_uncached(part, at)?,
            };
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shorter than expected",
                ));
            }
            done += got;
        }
        Ok(())
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

/// Container headers parsed through the same reads as the proof's: a first look at an
/// evicted model leaves its page cache as it was.
impl crate::container::Source for FileBytes {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<std::borrow::Cow<'_, [u8]>, crate::container::ContainerError> {
        crate::container::source::check_range(offset, len, self.size, what)?;
        let n = usize::try_from(len).map_err(|_| crate::container::ContainerError::Truncated {
            what,
            offset,
            needed: len,
            size: self.size,
        })?;
        let mut buf = vec![0u8; n];
        self.read_exact_at(&mut buf, offset).map_err(|source| {
            crate::container::ContainerError::Read {
                offset,
                len,
                source,
            }
        })?;
        Ok(std::borrow::Cow::Owned(buf))
    }
}

/// Opens `path` ([`FileBytes::open`]) and parses its container headers through it.
pub fn open_container(
    path: &Path,
) -> Result<(FileBytes, crate::container::Container), crate::container::ContainerError> {
    let bytes = FileBytes::open(path).map_err(|source| crate::container::ContainerError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let c = crate::container::parse(&bytes)?;
    Ok((bytes, c))
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
