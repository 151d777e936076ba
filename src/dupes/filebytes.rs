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
//! Holes of a sparse file (`SEEK_DATA`/`SEEK_HOLE`, found once when it is opened) are not
//! read at all: their bytes are zeros, given as such. A 15 TiB sparse file with a few MiB
//! of data is indexed in the time of its data, not in hours of reads of zeros.
//!
//! Container headers are parsed through the same reads ([`FileBytes`] is a
//! [`crate::container::Source`]), so no read of twofold's adds a page to a model's cache
//! except one evicted between the check and the copy.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::collect::answer::{self, Place};
use crate::sample::FileKey;

/// `O_DIRECT` transfers are done in blocks of this size and alignment.
const BLOCK: u64 = 4096;
/// Largest `O_DIRECT` read at once.
const DIRECT_MAX: usize = 1 << 20;

/// Why a file on FUSE is not opened.
pub const ON_FUSE: &str =
    "not opened: it is on a FUSE filesystem, where opening a file drops its page cache";

pub struct FileBytes {
    file: Arc<File>,
    direct: Option<Arc<File>>,
    /// The file mapped, to copy cached ranges from (with `direct` only).
    mapped: Option<super::cachedcopy::CachedCopy>,
    pub size: u64,
    /// The version opened (device, inode, size, mtime, ctime): what comparisons keep
    /// the hashes of its bytes under ([`super::chunkmemo`]).
    pub version: super::pointcache::Version,
    /// Blocks of it read at once, for small reads ([`super::blocks`]).
    blocks: super::blocks::Blocks,
    /// Its holes, `[start, end)` page-aligned and sorted (at most [`MAX_HOLES`]).
    holes: Vec<(u64, u64)>,
    /// Where its reads go (its device) and the name they are said by: every read of
    /// storage runs under [`answer::within`]'s deadline, so a filesystem that stops
    /// answering mid-read fails the read (`TimedOut`, "the filesystem did not answer"),
    /// never the caller.
    place: Place,
    path: PathBuf,
    /// Set, with the sentence, when a read of it did not answer ([`FileBytes::hung`]).
    hung: Hung,
}

/// Whether a file's filesystem stopped answering while it was read: the sentence that
/// says so once it did (shared, so a caller that gave the file away can still ask).
pub type Hung = Arc<std::sync::OnceLock<String>>;

/// Holes remembered per file; past them the rest of the file is read as data. Bounds the
/// memory a file of millions of holes could make twofold allocate (16 bytes each).
const MAX_HOLES: usize = 65_536;

/// The holes of `file` (of `size` bytes) as `SEEK_DATA`/`SEEK_HOLE` tell them, page
/// aligned inwards; none where the file system cannot tell (then all of it is data).
fn holes_of(file: &File, size: u64) -> Vec<(u64, u64)> {
    let ps = crate::collect::system::page_size();
    let mut holes = Vec::new();
    let mut at = 0u64;
    while at < size && holes.len() < MAX_HOLES {
        let (data, hole) = crate::collect::residency::next_data(file, at, size, ps);
        if data > at {
            holes.push((at, data));
        }
        if hole <= at.max(data) {
            break; // no progress: the rest is data
        }
        at = hole;
    }
    holes
}

/// Why `path` could not be opened or read, in words: a filesystem that did not answer
/// says so (and names the path) on its own; any other error is said with the path.
pub fn cannot(path: &Path, e: &io::Error) -> String {
    if answer::is_not_answering(e) {
        e.to_string()
    } else {
        format!("cannot open '{}': {e}", path.display())
    }
}

/// What the helper thread of an open gives: the descriptors, the `fstat`, the holes.
type Parts = (File, Option<File>, std::fs::Metadata, Vec<(u64, u64)>);

/// Opens `path` (on the helper thread of [`FileBytes::open`]): refused on FUSE unless
/// `on_fuse`, a regular file only, with a second `O_DIRECT` descriptor where allowed.
fn open_parts(path: &Path, on_fuse: bool) -> io::Result<Parts> {
    if !on_fuse
        && nix::sys::statfs::statfs(path)
            .is_ok_and(|s| s.filesystem_type().0 == answer::FUSE_SUPER_MAGIC)
    {
        return Err(io::Error::other(ON_FUSE));
    }
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
    // `SEEK_DATA` asks the filesystem (FUSE sends `LSEEK`): here, under the deadline.
    let holes = holes_of(&file, m.len());
    Ok((file, direct, m, holes))
}

impl FileBytes {
    /// Opens `path` read-only (and a second, `O_DIRECT` descriptor where allowed); refuses
    /// a file on FUSE, where opening it drops its page cache ([`FileBytes::open_even_on_fuse`]).
    /// The open runs under [`answer::within`]'s deadline: a filesystem that does not
    /// answer fails it (`TimedOut`).
    pub fn open(path: &Path) -> io::Result<FileBytes> {
        Self::open_on(path, false)
    }

    /// [`FileBytes::open`], on FUSE too (`dupes FILE`, where the user asked for its bytes).
    pub fn open_even_on_fuse(path: &Path) -> io::Result<FileBytes> {
        Self::open_on(path, true)
    }

    fn open_on(path: &Path, on_fuse: bool) -> io::Result<FileBytes> {
        use std::os::unix::fs::MetadataExt;
        let p = path.to_path_buf();
        let (file, direct, m, holes) =
            answer::within(Place::of(path), path, move || open_parts(&p, on_fuse))??;
        let mapped = direct
            .as_ref()
            .and_then(|_| super::cachedcopy::CachedCopy::new(&file, m.len()));
        let key = FileKey::from_dev(m.dev(), m.ino());
        Ok(FileBytes {
            blocks: super::blocks::Blocks::default(),
            holes,
            file: Arc::new(file),
            direct: direct.map(Arc::new),
            mapped,
            size: m.len(),
            version: super::pointcache::version(key, &m),
            place: Place::of_key(key),
            path: path.to_path_buf(),
            hung: Hung::default(),
        })
    }

    /// Done reading for now: twofold maps none of the file's pages any more (see
    /// [`super::cachedcopy::CachedCopy::release`]). A kept index calls it after each use.
    pub fn release(&self) {
        // Blocks kept are unmapped (and read again: the file may change between uses).
        self.blocks.clear();
        if let Some(m) = &self.mapped {
            m.release();
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Fills `buf` from offset `off`; never adds pages to the page cache where the file
    /// system allows `O_DIRECT` (but one evicted between the check and the copy). The
    /// parts in holes are zeros, not read.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.read_exact_at_as(buf, off, false)
    }

    /// [`FileBytes::read_exact_at`] of a chunk far from the others read (a spot check's):
    /// its own pages only, never the [`super::blocks`] block around it (a 4 KiB chunk
    /// would read 1 MiB from storage).
    pub fn read_exact_at_alone(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.read_exact_at_as(buf, off, true)
    }

    fn read_exact_at_as(&self, buf: &mut [u8], off: u64, alone: bool) -> io::Result<()> {
        let Some(end) = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
        else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than expected",
            ));
        };
        // The holes from the first that ends after `off`: zeros; between them, reads.
        let first = self.holes.partition_point(|h| h.1 <= off);
        let part = |from: u64, to: u64| (from - off) as usize..(to - off) as usize;
        let mut at = off;
        for &(a, b) in self.holes[first..].iter().take_while(|h| h.0 < end) {
            if a > at {
                self.read_data(&mut buf[part(at, a)], at, alone)?;
                at = a;
            }
            let to = b.min(end);
            buf[part(at, to)].fill(0);
            at = to;
        }
        if at < end {
            self.read_data(&mut buf[part(at, end)], at, alone)?;
        }
        Ok(())
    }

    /// [`FileBytes::read_exact_at`] of a range with no hole in it.
    fn read_data(&self, buf: &mut [u8], off: u64, alone: bool) -> io::Result<()> {
        if self.direct.is_some() && buf.len() <= super::blocks::SMALL_READ && !alone {
            return self.read_small(buf, off);
        }
        self.read_span(buf, off)
    }

    /// A small read, from a block of this file read whole ([`super::blocks`]).
    fn read_small(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let cached = |part: &mut [u8], at: u64| -> io::Result<bool> {
            match &self.mapped {
                Some(map)
                    if crate::collect::residency::range_cached(
                        &self.file,
                        at,
                        part.len() as u64,
                    ) == Some(true) =>
                {
                    match map.copy(part, at) {
                        Ok(()) => Ok(true),
                        // No mapping to be had (the address space is limited): from storage.
                        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(false),
                        Err(e) => Err(e),
                    }
                }
                _ => Ok(false),
            }
        };
        self.blocks.read(buf, off, self.size, cached, |block, at| {
            self.read_span(block, at)
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
                (None, _) => self.read_plain(part, at)?,
                (Some(_), Some(map))
                    if crate::collect::residency::range_cached(&self.file, at, len as u64)
                        == Some(true) =>
                {
                    match map.copy(part, at) {
                        Ok(()) => len,
                        // No mapping to be had (the address space is limited): from storage.
                        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                            self.read_uncached(part, at)?
                        }
                        Err(e) => return Err(e),
                    }
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

    /// `pread` of `f` into a buffer of its own (`len` bytes, after `pad` bytes that align
    /// it), on a helper thread under the deadline: a read the filesystem leaves hanging
    /// is abandoned (it keeps its buffer) and fails here with `TimedOut`.
    fn pread_within(
        &self,
        f: &Arc<File>,
        len: usize,
        align: usize,
        at: u64,
    ) -> io::Result<(Vec<u8>, usize, usize)> {
        let f = Arc::clone(f);
        let read = move || {
            let mut scratch = vec![0u8; len + align];
            let pad = scratch.as_ptr().align_offset(align.max(1));
            let n = f.read_at(&mut scratch[pad..pad + len], at)?;
            Ok((scratch, pad, n))
        };
        answer::within(self.place.clone(), &self.path, read).map_err(|e| {
            let _ = self.hung.set(e.to_string());
            std::io::Error::from(e)
        })?
    }

    /// Set once a read of this file did not answer in time (with the sentence).
    pub fn hung(&self) -> Hung {
        Arc::clone(&self.hung)
    }

    /// A plain `pread` (under the deadline) into `buf`: at least one byte, 0 at the end.
    fn read_plain(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let (scratch, pad, n) = self.pread_within(&self.file, buf.len(), 1, off)?;
        buf[..n].copy_from_slice(&scratch[pad..pad + n]);
        Ok(n)
    }

    /// Reads at least one byte at `off` through `O_DIRECT` (plain `pread` without it).
    fn read_uncached(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let Some(direct) = &self.direct else {
            return self.read_plain(buf, off);
        };
        let start = off / BLOCK * BLOCK;
        let end = (off + buf.len() as u64).next_multiple_of(BLOCK);
        let len = ((end - start) as usize).min(DIRECT_MAX);
        // Over-allocated by one block, for alignment.
        let (scratch, pad, n) = match self.pread_within(direct, len, BLOCK as usize, start) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return self.read_plain(buf, off);
            }
            Err(e) => return Err(e),
        };
        let aligned = &scratch[pad..pad + len];
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
    let open_err = |source| crate::container::ContainerError::Open {
        path: path.to_path_buf(),
        source,
    };
    // Only a regular file (said as `container::open` says it); FIFOs are not waited on.
    let m = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .and_then(|f| f.metadata())
        .map_err(open_err)?;
    if !m.is_file() {
        return Err(crate::container::ContainerError::NotAFile {
            path: path.to_path_buf(),
            kind: if m.is_dir() {
                "a directory"
            } else {
                "a device, socket or pipe"
            },
        });
    }
    let bytes = FileBytes::open(path).map_err(open_err)?;
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

    /// A spot check's chunk, read alone, reads its own pages: the 1 MiB block around it
    /// (what a search's run of neighbouring chunks is served from) is neither read nor
    /// kept. The file is evicted first, so that both reads go to storage.
    #[test]
    fn a_chunk_read_alone_reads_no_block() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice about our own descriptor's file; no memory is touched.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let fb = FileBytes::open(&path).unwrap();
        assert!(
            fb.direct.is_some(),
            "O_DIRECT on {}: this test needs a disk file system",
            std::env::temp_dir().display()
        );
        let off = (3 << 20) + 4096;
        let mut buf = vec![0u8; 4096];
        fb.read_exact_at_alone(&mut buf, off as u64).unwrap();
        assert_eq!(buf, data[off..off + 4096]);
        assert_eq!(fb.blocks.kept(), 0, "read alone: no block");
        fb.read_exact_at(&mut buf, off as u64).unwrap();
        assert_eq!(buf, data[off..off + 4096]);
        assert_eq!(fb.blocks.kept(), 1, "a search's read: its block kept");
    }

    #[test]
    fn holes_read_as_zeros_without_reading() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let mut f = File::create(&path).unwrap();
        let a: Vec<u8> = (0..65_536u32).map(|i| (i % 251 + 1) as u8).collect();
        f.write_all(&a).unwrap();
        f.seek(SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(&a).unwrap();
        f.set_len(8 << 20).unwrap();
        drop(f);
        let mut want = vec![0u8; 8 << 20];
        want[..a.len()].copy_from_slice(&a);
        want[4 << 20..(4 << 20) + a.len()].copy_from_slice(&a);
        let fb = FileBytes::open(&path).unwrap();
        if fb.holes.is_empty() {
            eprintln!("skipped the hole check: this file system does not report holes");
        } else {
            assert_eq!(
                fb.holes,
                vec![(65_536, 4 << 20), ((4 << 20) + 65_536, 8 << 20)]
            );
        }
        for (off, len) in [
            (0usize, 8 << 20),
            (65_000, 1000),
            (65_536, 4096),
            ((4 << 20) - 10, 100),
            ((4 << 20) + 60_000, 2 << 20),
            ((8 << 20) - 5, 5),
        ] {
            let mut buf = vec![7u8; len];
            fb.read_exact_at(&mut buf, off as u64).unwrap();
            assert!(buf == want[off..off + len], "{off} {len}");
        }
    }
}
