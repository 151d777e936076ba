//! The file mapping every probe reads: `mmap(PROT_READ, MAP_SHARED)`, so the pages stay
//! the page cache's own (see mmap(2)), the writable and copy-on-write views an import
//! test may fall back to, and the arithmetic of cutting a mapping into ranges.

use std::fs::File;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// How a file is mapped for an import attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MappingKind {
    /// `PROT_READ`, `MAP_SHARED`: the page cache's own pages, read-only.
    #[default]
    SharedReadOnly,
    /// `PROT_READ|PROT_WRITE`, `MAP_SHARED` (file opened read-write): still the page
    /// cache's pages, but a driver that pins them for writing dirties them.
    SharedReadWrite,
    /// `PROT_READ|PROT_WRITE`, `MAP_PRIVATE`: a driver that pins it for writing gets
    /// anonymous copies of every page (the copy comes back).
    PrivateCopyOnWrite,
}

impl MappingKind {
    pub fn name(self) -> &'static str {
        match self {
            MappingKind::SharedReadOnly => "shared-read-only",
            MappingKind::SharedReadWrite => "shared-read-write",
            MappingKind::PrivateCopyOnWrite => "private-copy-on-write",
        }
    }
}

/// A mapping of any kind, read as bytes.
pub enum Mapped {
    ReadOnly(memmap2::Mmap),
    Writable(memmap2::MmapMut),
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Mapped::ReadOnly(m) => m,
            Mapped::Writable(m) => m,
        }
    }
}

/// The first `len` bytes of `path`, mapped as `kind` says.
pub fn map(path: &Path, len: u64, kind: MappingKind) -> io::Result<Mapped> {
    if kind == MappingKind::SharedReadOnly {
        return map_shared_read_only(path, len).map(Mapped::ReadOnly);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(kind == MappingKind::SharedReadWrite)
        .open(path)?;
    let size = file.metadata()?.len();
    if len > size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{}' has {size} bytes, fewer than {len}", path.display()),
        ));
    }
    let mut o = memmap2::MmapOptions::new();
    o.len(len as usize);
    // SAFETY: as in `map_shared_read_only`; nothing here writes through the mapping (a
    // private one would only change this process's copy anyway).
    let m = unsafe {
        match kind {
            MappingKind::SharedReadWrite => o.map_mut(&file),
            _ => o.map_copy(&file),
        }
    }?;
    Ok(Mapped::Writable(m))
}

/// The first `len` bytes of `path`, mapped read-only and shared.
pub fn map_shared_read_only(path: &Path, len: u64) -> io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    if len > size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "'{}' has {size} bytes, fewer than the {len} asked for",
                path.display()
            ),
        ));
    }
    let len = usize::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
    // SAFETY: a read-only shared mapping of a regular file. If another process truncates
    // the file while we read it we get SIGBUS; the probe runs in a child process exactly
    // so that such an accident (or a driver hang) cannot take the caller down.
    unsafe { memmap2::MmapOptions::new().len(len).map(&file) }
}

/// Cuts `[0, total)` into consecutive `(offset, len)` ranges of at most `limit` bytes;
/// every range but the last is a multiple of `align` long, so every offset is aligned.
pub fn split(total: u64, limit: u64, align: u64) -> Vec<(u64, u64)> {
    let align = align.max(1);
    let step = (limit / align * align).max(align);
    let mut out = Vec::new();
    let mut at = 0;
    while at < total {
        let len = step.min(total - at);
        out.push((at, len));
        at += len;
    }
    out
}

/// `v` rounded down to a multiple of `align`.
pub fn align_down(v: u64, align: u64) -> u64 {
    v / align.max(1) * align.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_respect_limit_and_alignment() {
        let r = split(300, 128, 16);
        assert_eq!(r, vec![(0, 128), (128, 128), (256, 44)]);
        let r = split(100, 50, 16);
        assert_eq!(r, vec![(0, 48), (48, 48), (96, 4)]);
        assert!(split(0, 10, 1).is_empty());
        assert_eq!(split(10, 4, 16), vec![(0, 10)]);
    }

    #[test]
    fn refuses_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [1u8; 100]).unwrap();
        assert!(map_shared_read_only(&p, 101).is_err());
        assert_eq!(map_shared_read_only(&p, 100).unwrap().len(), 100);
    }
}
