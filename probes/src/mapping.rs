//! The file mapping every probe reads: `mmap(PROT_READ, MAP_SHARED)`, so the pages stay
//! the page cache's own (see mmap(2)), and the arithmetic of cutting it into ranges.

use std::fs::File;
use std::io;
use std::path::Path;

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
