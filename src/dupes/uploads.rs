//! Which bytes of a model file an upload carried: the content samples the upload probe
//! took of the source at the moment of the copy, matched against the host proof's grid
//! index (the same 16-byte-window points, built with every point and every byte residue)
//! and then confirmed against the file.
//!
//! A copy of `n` bytes is *matched* to `[f, f + n)` of a file when a 16-byte window of its
//! first 2,064 bytes that is no constant run is a point of the grid, and then every byte
//! the probe read (those 2,064 bytes and up to 16 windows of 32 bytes spread over the copy)
//! equals the file's bytes at the offsets that point implies (or their dtype conversion:
//! F16/BF16 widened to F32, F32 narrowed to F16/BF16, F16 ↔ BF16, as `index::Layouts::Dtypes`
//! indexes them). Identical tensors of several files match each of them
//! ([`Matcher::match_all`]). Bytes between the samples are not read: the claim is that
//! every sampled window of the copy is the file's (the sampling rule, `docs/device.md`).
//! A copy that continues the last matched copy of its process (its source or destination
//! right after that copy's) is also confirmed at the file offset right after it
//! ([`Matcher::confirm_at`]): a tensor uploaded in chunks, whose later chunks need not
//! hold a grid point.

use std::path::PathBuf;

use super::grid::{hash, Grid, WIN};
use super::index::{periodic, Convert, CopyKind};
use crate::collect::bpf::uploads::CopyRecord;
use crate::sample::FileKey;

/// A copy matched to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub file: FileKey,
    /// How the device bytes relate to the file's: as they are, or a dtype conversion.
    pub kind: CopyKind,
    /// File bytes `[start, end)` the copy carried.
    pub start: u64,
    pub end: u64,
}

impl Matched {
    /// The dtype conversion the device holds (`None`: the file's bytes as they are).
    pub fn conversion(&self) -> Option<crate::sample::converted::Conversion> {
        self.kind.conversion()
    }
}

/// The grid of a set of model files, to match uploads against.
pub struct Matcher {
    grid: Grid,
    keys: Vec<FileKey>,
}

impl Matcher {
    /// Indexes `files` (path, key); files that cannot be opened or parsed are left out
    /// (returned with the reason).
    pub fn build(files: &[(PathBuf, FileKey)]) -> (Option<Matcher>, Vec<String>) {
        let mut inputs = Vec::new();
        let mut keys = Vec::new();
        let mut warnings = Vec::new();
        for (path, key) in files {
            let opened = super::filebytes::open_container(path).map_err(|e| e.to_string());
            match opened {
                Ok((b, c)) => {
                    keys.push(*key);
                    inputs.push((b, c.tensors, c.format));
                }
                Err(e) => warnings.push(format!(
                    "uploads of '{}' cannot be matched: {e}",
                    path.display()
                )),
            }
        }
        if inputs.is_empty() {
            return (None, warnings);
        }
        match Grid::build(inputs, 1, super::index::Layouts::Dtypes, true) {
            Ok(grid) => (Some(Matcher { grid, keys }), warnings),
            Err(e) => {
                warnings.push(format!("cannot index the model files for uploads: {e}"));
                (None, warnings)
            }
        }
    }

    /// Done matching for now: twofold maps none of the files' pages any more.
    pub fn release(&self) {
        for f in &self.grid.files {
            f.bytes.release();
        }
    }

    /// The files indexed.
    pub fn keys(&self) -> &[FileKey] {
        &self.keys
    }

    /// The file range `c` carried in each file whose bytes its samples are (one match per
    /// file, sorted by file: identical tensors of two files match both, and which one the
    /// upload is counted under is the model's to say, by the uploader's relation to each).
    pub fn match_all(&self, c: &CopyRecord) -> Vec<Matched> {
        let mut out: Vec<Matched> = Vec::new();
        if c.anchor.len() < WIN || c.strided {
            return out;
        }
        let mut hits = Vec::new();
        for pos in 0..=c.anchor.len() - WIN {
            let w = &c.anchor[pos..pos + WIN];
            if periodic(w) {
                continue;
            }
            let key = hash(w);
            if !self.grid.maybe(key) {
                continue;
            }
            hits.clear();
            self.grid.lookup(key, |piece, m| hits.push((piece, m)));
            for &(piece, m) in &hits {
                let file = self.keys[self.grid.pieces[piece].file];
                if out.iter().any(|o| o.file == file) {
                    continue;
                }
                if let Some(found) = self.confirm(c, piece, m, pos as u64) {
                    out.push(found);
                }
            }
        }
        out.sort_by_key(|m| m.file);
        out
    }

    /// Whether `c` carried `file`'s bytes `[base, base + c.bytes)` as they are: the copy
    /// right after one matched to the bytes before `base` (a tensor uploaded in chunks,
    /// whose later chunks may hold no grid point). Every byte read must equal the file's,
    /// and the first bytes must hold a window that is no constant run (zeros match zeros).
    pub fn confirm_at(&self, c: &CopyRecord, file: FileKey, base: u64) -> Option<Matched> {
        if c.anchor.len() < WIN || c.strided {
            return None;
        }
        if c.anchor.windows(WIN).all(periodic) {
            return None;
        }
        let fi = self.keys.iter().position(|k| *k == file)?;
        let bytes = &self.grid.files[fi].bytes;
        let end = base.checked_add(c.bytes)?;
        if end > bytes.size {
            return None;
        }
        let mut buf = Vec::new();
        let mut same = |off: u64, want: &[u8]| {
            buf.resize(want.len(), 0);
            bytes.read_exact_at(&mut buf, base + off).is_ok() && buf[..] == *want
        };
        if !same(0, &c.anchor) || !c.samples.iter().all(|(off, w)| same(*off, w)) {
            return None;
        }
        Some(Matched {
            file,
            kind: CopyKind::Identical,
            start: base,
            end,
        })
    }

    /// Confirms that upload byte `pos` is memory offset `m` of `piece`, by every sample.
    fn confirm(&self, c: &CopyRecord, piece: usize, m: u64, pos: u64) -> Option<Matched> {
        let p = &self.grid.pieces[piece];
        let file = &self.grid.files[p.file];
        let key = self.keys[p.file];
        let mut buf = Vec::new();
        if p.kind == CopyKind::Identical {
            // Upload byte 0 is file byte `base`; the copy may run past the tensor.
            let base = (p.file_offset + m).checked_sub(pos)?;
            let end = base.checked_add(c.bytes)?;
            if end > file.bytes.size {
                return None;
            }
            let same = |off: u64, want: &[u8], buf: &mut Vec<u8>| {
                buf.resize(want.len(), 0);
                file.bytes.read_exact_at(buf, base + off).is_ok() && buf[..] == *want
            };
            if !same(0, &c.anchor, &mut buf) {
                return None;
            }
            for (off, w) in &c.samples {
                if !same(*off, w, &mut buf) {
                    return None;
                }
            }
            return Some(Matched {
                file: key,
                kind: p.kind,
                start: base,
                end,
            });
        }
        // Converted: memory offsets of the piece, `me` bytes per element in memory for
        // `fe` in the file; the copy lies within the tensor, whole elements.
        let (fe, me) = p.kind.elements();
        let mbase = m.checked_sub(pos)?;
        if mbase % me != 0 || c.bytes % me != 0 || mbase + c.bytes > p.mem_len {
            return None;
        }
        let mut conv = Vec::new();
        let mut same = |off: u64, want: &[u8]| {
            let a = (mbase + off) / me * me;
            let b = (mbase + off + want.len() as u64).div_ceil(me) * me;
            buf.resize(((b - a) / me * fe) as usize, 0);
            if file
                .bytes
                .read_exact_at(&mut buf, p.file_offset + a / me * fe)
                .is_err()
            {
                return false;
            }
            p.kind.convert(&buf, &mut conv);
            let s = (mbase + off - a) as usize;
            conv.get(s..s + want.len()) == Some(want)
        };
        if !same(0, &c.anchor) {
            return None;
        }
        for (off, w) in &c.samples {
            if !same(*off, w) {
                return None;
            }
        }
        Some(Matched {
            file: key,
            kind: p.kind,
            start: p.file_offset + mbase / me * fe,
            end: p.file_offset + (mbase + c.bytes) / me * fe,
        })
    }
}

/// Adds `[start, end)` to sorted, disjoint `ranges`, merging what touches it.
pub fn add_range(ranges: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    if start >= end {
        return;
    }
    let (mut s, mut e) = (start, end);
    ranges.retain(|&(a, b)| {
        if b < s || a > e {
            true
        } else {
            s = s.min(a);
            e = e.max(b);
            false
        }
    });
    let at = ranges.partition_point(|&(a, _)| a < s);
    ranges.insert(at, (s, e));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut r = Vec::new();
        add_range(&mut r, 10, 20);
        add_range(&mut r, 30, 40);
        add_range(&mut r, 20, 30);
        assert_eq!(r, [(10, 40)]);
        add_range(&mut r, 0, 5);
        add_range(&mut r, 50, 60);
        add_range(&mut r, 35, 55);
        assert_eq!(r, [(0, 5), (10, 60)]);
    }
}
