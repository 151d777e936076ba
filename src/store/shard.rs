//! One day's shard: `YYYY-MM-DD.frames` (concatenated zstd frames) and `YYYY-MM-DD.index`
//! (32-byte entries). Reading single entries and frames with positioned reads, the binary
//! search over an index, and the torn-tail recovery run when a store is opened.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{io, open_regular, regular, Result};
use super::format::{day_name, Entry, ENTRY_BYTES, MAX_FRAME_BYTES};

/// What the store knows about one shard: its day and its valid extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Days since 1970-01-01 (UTC).
    pub day: u32,
    /// Entries in the index up to the end of the valid extent (a damaged entry inside the
    /// extent still counts; it is skipped when read).
    pub entries: u64,
    /// Length of the `.frames` file up to the end of the last valid frame.
    pub frames_len: u64,
}

impl Shard {
    pub fn frames_path(dir: &Path, day: u32) -> PathBuf {
        dir.join(format!("{}.frames", day_name(day)))
    }

    pub fn index_path(dir: &Path, day: u32) -> PathBuf {
        dir.join(format!("{}.index", day_name(day)))
    }

    /// Bytes on disk of the valid extent (frames plus index).
    pub fn bytes(&self) -> u64 {
        self.frames_len + self.entries * ENTRY_BYTES as u64
    }

    pub fn open(&self, dir: &Path) -> Result<ShardFiles> {
        let index_path = Shard::index_path(dir, self.day);
        let frames_path = Shard::frames_path(dir, self.day);
        let index = open_regular(&index_path, OpenOptions::new().read(true))?;
        let frames = open_regular(&frames_path, OpenOptions::new().read(true))?;
        Ok(ShardFiles {
            index,
            index_path,
            frames,
            frames_path,
        })
    }
}

/// Open read handles of one shard.
pub struct ShardFiles {
    pub index: File,
    pub index_path: PathBuf,
    pub frames: File,
    pub frames_path: PathBuf,
}

/// An entry read from an index: valid, or present but failing its own CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Valid(Entry),
    Damaged,
}

impl ShardFiles {
    /// Entry `i`, read with one positioned 32-byte read.
    pub fn entry(&self, i: u64) -> Result<Slot> {
        let mut b = [0u8; ENTRY_BYTES];
        self.index
            .read_exact_at(&mut b, i * ENTRY_BYTES as u64)
            .map_err(io("read", &self.index_path))?;
        Ok(Entry::decode(&b).map_or(Slot::Damaged, Slot::Valid))
    }

    /// The compressed frame of `e`, or `None` when it lies past `frames_len`, is larger than
    /// [`MAX_FRAME_BYTES`] or fails its CRC.
    pub fn raw_frame(&self, e: &Entry, frames_len: u64) -> Result<Option<Vec<u8>>> {
        if e.end() > frames_len || u64::from(e.len) > MAX_FRAME_BYTES {
            return Ok(None);
        }
        let mut buf = vec![0u8; e.len as usize];
        self.frames
            .read_exact_at(&mut buf, e.offset)
            .map_err(io("read", &self.frames_path))?;
        Ok((crc32fast::hash(&buf) == e.frame_crc).then_some(buf))
    }

    /// First position `p` in `lo..hi` such that every valid entry before `p` satisfies
    /// `left` and none from `p` on does (entries are sorted by time). Damaged entries are
    /// stepped over; only O(log n) entries are read when none is damaged.
    pub fn partition_point(
        &self,
        mut lo: u64,
        mut hi: u64,
        left: impl Fn(u64) -> bool,
    ) -> Result<u64> {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let Some((j, e)) = self.valid_near(lo, mid, hi)? else {
                return Ok(lo); // everything in lo..hi is damaged: any point will do
            };
            if left(e.at_ns) {
                lo = j + 1;
            } else {
                hi = j;
            }
        }
        Ok(lo)
    }

    /// A valid entry in `mid..hi`, else in `lo..mid` (nearest to `mid` first).
    fn valid_near(&self, lo: u64, mid: u64, hi: u64) -> Result<Option<(u64, Entry)>> {
        for j in mid..hi {
            if let Slot::Valid(e) = self.entry(j)? {
                return Ok(Some((j, e)));
            }
        }
        for j in (lo..mid).rev() {
            if let Slot::Valid(e) = self.entry(j)? {
                return Ok(Some((j, e)));
            }
        }
        Ok(None)
    }
}

/// What recovery found in one shard.
#[derive(Debug, Default)]
pub struct Recovery {
    pub torn_index_bytes: u64,
    pub torn_frames_bytes: u64,
}

impl Recovery {
    /// The one-line report, or `None` when nothing was torn.
    pub fn report(&self, dir: &Path, day: u32, truncated: bool) -> Option<String> {
        let mut parts = Vec::new();
        let name = day_name(day);
        if self.torn_frames_bytes > 0 {
            parts.push(format!("{} bytes in {name}.frames", self.torn_frames_bytes));
        }
        if self.torn_index_bytes > 0 {
            parts.push(format!("{} bytes in {name}.index", self.torn_index_bytes));
        }
        if parts.is_empty() {
            return None;
        }
        let tail = if truncated {
            "; truncated, recording resumes after the last whole frame"
        } else {
            ""
        };
        Some(format!(
            "store '{}': ignored a torn tail of {}{tail}",
            dir.display(),
            parts.join(" and ")
        ))
    }
}

/// Finds the valid extent of the shard of `day`: walks back from the last index entry while
/// the entry fails its CRC, its frame extends past the `.frames` file or its frame fails its
/// CRC. With `truncate`, cuts both files back to that extent and syncs them.
pub fn recover(dir: &Path, day: u32, truncate: bool) -> Result<(Shard, Recovery)> {
    let index_path = Shard::index_path(dir, day);
    let frames_path = Shard::frames_path(dir, day);
    // A FIFO or a device in the store is refused here, before any report of a torn tail
    // (its length reads as 0) and before an open that would wait for a writer.
    let meta = std::fs::metadata(&index_path).map_err(io("stat", &index_path))?;
    regular(&index_path, &meta)?;
    let index_len = meta.len();
    let frames_len = match std::fs::metadata(&frames_path) {
        Ok(m) => {
            regular(&frames_path, &m)?;
            m.len()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && truncate => {
            open_regular(
                &frames_path,
                OpenOptions::new().write(true).create(true).truncate(true),
            )?;
            0
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io("stat", &frames_path)(e)),
    };
    let whole = index_len / ENTRY_BYTES as u64;
    let probe = Shard {
        day,
        entries: whole,
        frames_len,
    };
    let mut keep = 0u64;
    let mut end = 0u64;
    if whole > 0 && frames_len > 0 {
        let files = probe.open(dir)?;
        for i in (0..whole).rev() {
            if let Slot::Valid(e) = files.entry(i)? {
                if files.raw_frame(&e, frames_len)?.is_some() {
                    keep = i + 1;
                    end = e.end();
                    break;
                }
            }
        }
    }
    let rec = Recovery {
        torn_index_bytes: index_len - keep * ENTRY_BYTES as u64,
        torn_frames_bytes: frames_len.saturating_sub(end),
    };
    if truncate && (rec.torn_index_bytes > 0 || rec.torn_frames_bytes > 0) {
        for (path, len) in [
            (&frames_path, end),
            (&index_path, keep * ENTRY_BYTES as u64),
        ] {
            let f = open_regular(path, OpenOptions::new().write(true))?;
            f.set_len(len).map_err(io("truncate", path))?;
            f.sync_all().map_err(io("sync", path))?;
        }
    }
    Ok((
        Shard {
            day,
            entries: keep,
            frames_len: end,
        },
        rec,
    ))
}

/// Decompresses one zstd frame, or says why it is damaged: it does not decode (a damaged
/// frame whose CRC happened to match, or a bug), or it decodes to more than
/// [`MAX_FRAME_BYTES`] (a crafted frame; decoding stops there, nothing larger is
/// allocated).
pub fn decompress(raw: &[u8]) -> std::result::Result<Vec<u8>, &'static str> {
    use std::io::Read;
    const DOES_NOT_DECODE: &str = "it does not decode";
    const TOO_LARGE: &str = "it decodes to more than the 256 MiB frame limit";
    // The content size declared in the frame header, when present, is checked first.
    if let Ok(Some(n)) = zstd::zstd_safe::get_frame_content_size(raw) {
        if n > MAX_FRAME_BYTES {
            return Err(TOO_LARGE);
        }
    }
    let decoder = zstd::stream::read::Decoder::with_buffer(raw).map_err(|_| DOES_NOT_DECODE)?;
    let mut out = Vec::new();
    decoder
        .take(MAX_FRAME_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|_| DOES_NOT_DECODE)?;
    if out.len() as u64 > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    Ok(out)
}
