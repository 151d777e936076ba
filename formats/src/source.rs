//! Bounded random access to a container's bytes, from memory or from a file (`pread`).
//!
//! Every read is checked against the size first, so no header field can make a parser
//! allocate more than the file holds or read past its end.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::ContainerError;

/// Random-access bytes of known size.
pub trait Source {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Exactly `len` bytes at `offset`, or [`ContainerError::Truncated`] naming `what`.
    fn read_at(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Cow<'_, [u8]>, ContainerError>;
}

/// `offset + len`, if that range lies within `size`.
pub fn check_range(
    offset: u64,
    len: u64,
    size: u64,
    what: &'static str,
) -> Result<u64, ContainerError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(end),
        _ => Err(ContainerError::Truncated {
            what,
            offset,
            needed: len,
            size,
        }),
    }
}

/// `len` bytes at `offset` of an in-memory buffer.
fn slice_at<'a>(
    b: &'a [u8],
    offset: u64,
    len: u64,
    what: &'static str,
) -> Result<&'a [u8], ContainerError> {
    let size = b.len() as u64;
    let end = check_range(offset, len, size, what)?;
    let truncated = ContainerError::Truncated {
        what,
        offset,
        needed: len,
        size,
    };
    let (Ok(start), Ok(end)) = (usize::try_from(offset), usize::try_from(end)) else {
        return Err(truncated);
    };
    b.get(start..end).ok_or(truncated)
}

impl Source for &[u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Cow<'_, [u8]>, ContainerError> {
        slice_at(self, offset, len, what).map(Cow::Borrowed)
    }
}

impl Source for Vec<u8> {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Cow<'_, [u8]>, ContainerError> {
        slice_at(self, offset, len, what).map(Cow::Borrowed)
    }
}

/// A file read with `pread`, its size taken once at open.
pub struct FileSource {
    file: File,
    size: u64,
}

impl FileSource {
    pub fn new(file: File, size: u64) -> Self {
        FileSource { file, size }
    }
}

impl Source for FileSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(
        &self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Cow<'_, [u8]>, ContainerError> {
        check_range(offset, len, self.size, what)?;
        let n = usize::try_from(len).map_err(|_| ContainerError::Truncated {
            what,
            offset,
            needed: len,
            size: self.size,
        })?;
        let mut buf = vec![0u8; n];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|source| ContainerError::Read {
                offset,
                len,
                source,
            })?;
        Ok(Cow::Owned(buf))
    }
}

/// Default read-ahead of a [`Seq`]: headers are read in chunks of this size.
const CHUNK: u64 = 256 << 10;

/// A little-endian sequential reader over a [`Source`], reading ahead in chunks.
pub struct Seq<'s> {
    src: &'s dyn Source,
    pos: u64,
    win: Cow<'s, [u8]>,
    win_start: u64,
    chunk: u64,
}

impl<'s> Seq<'s> {
    pub fn new(src: &'s dyn Source, pos: u64) -> Self {
        Seq {
            src,
            pos,
            win: Cow::Borrowed(&[]),
            win_start: pos,
            chunk: CHUNK,
        }
    }

    /// Reads ahead at most `chunk` bytes (for small records scattered over a file).
    pub fn with_chunk(mut self, chunk: u64) -> Self {
        self.chunk = chunk.max(1);
        self
    }

    /// Absolute offset of the next byte.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn size(&self) -> u64 {
        self.src.size()
    }

    /// Bytes left before the end of the source.
    pub fn remaining(&self) -> u64 {
        self.src.size().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: u64, what: &'static str) -> Result<&[u8], ContainerError> {
        let end = check_range(self.pos, n, self.src.size(), what)?;
        let win_end = self.win_start + self.win.len() as u64;
        if self.pos < self.win_start || end > win_end {
            let len = n.max(self.chunk).min(self.src.size() - self.pos);
            self.win = self.src.read_at(self.pos, len, what)?;
            self.win_start = self.pos;
        }
        let a = (self.pos - self.win_start) as usize;
        let b = (end - self.win_start) as usize;
        let at = self.pos;
        self.pos = end;
        self.win.get(a..b).ok_or(ContainerError::Truncated {
            what,
            offset: at,
            needed: n,
            size: self.src.size(),
        })
    }

    /// Skips `n` bytes without reading them.
    pub fn skip(&mut self, n: u64, what: &'static str) -> Result<(), ContainerError> {
        self.pos = check_range(self.pos, n, self.src.size(), what)?;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ContainerError> {
        let b = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.iter_mut().zip(b).for_each(|(d, s)| *d = *s);
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, ContainerError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, ContainerError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, ContainerError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, ContainerError> {
        self.array(what).map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_reads_across_chunks_and_stops_at_the_end() {
        let data: Vec<u8> = (0..=255u8).collect();
        let mut s = Seq::new(&data, 0).with_chunk(3);
        assert_eq!(s.u8("x").unwrap(), 0);
        assert_eq!(s.u16("x").unwrap(), u16::from_le_bytes([1, 2]));
        assert_eq!(s.u32("x").unwrap(), u32::from_le_bytes([3, 4, 5, 6]));
        s.skip(200, "x").unwrap();
        assert_eq!(s.take(3, "x").unwrap(), &[207, 208, 209]);
        assert_eq!(s.remaining(), 46);
        let err = s.take(47, "tail").unwrap_err().to_string();
        assert_eq!(
            err,
            "truncated tail: needs '47' bytes at offset '210' but the file has '256'"
        );
        assert!(s.skip(u64::MAX, "x").is_err());
    }

    #[test]
    fn slice_source_rejects_overflowing_ranges() {
        let data = [0u8; 8];
        assert!((&data[..]).read_at(u64::MAX, 2, "x").is_err());
        assert!((&data[..]).read_at(4, 5, "x").is_err());
        assert_eq!((&data[..]).read_at(4, 4, "x").unwrap().len(), 4);
    }
}
