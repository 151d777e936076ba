//! Whole-store maintenance: retention by age and size, the self-contained export bundle,
//! and a full verification pass.

use std::path::{Path, PathBuf};

use super::error::{io, Result, StoreError};
use super::format::{day_name, day_start_ns, NS_PER_DAY};
use super::shard::{decompress, Shard, Slot};
use super::Store;

impl Store {
    /// Deletes whole day shards: first every shard whose day ends at or before
    /// `keep_after_ns`, then the oldest shards while the shards' total bytes exceed
    /// `max_bytes`. The newest shard is never deleted. Returns the removed files.
    pub fn retain(&mut self, keep_after_ns: u64, max_bytes: Option<u64>) -> Result<Vec<PathBuf>> {
        if self.lock.is_none() {
            return Err(StoreError::ReadOnly {
                path: self.dir.clone(),
            });
        }
        let mut removed = Vec::new();
        let mut total: u64 = self.shards.iter().map(Shard::bytes).sum();
        while self.shards.len() > 1 {
            let oldest = &self.shards[0];
            let expired = day_start_ns(oldest.day) + NS_PER_DAY <= keep_after_ns;
            let over = max_bytes.is_some_and(|max| total > max);
            if !expired && !over {
                break;
            }
            let shard = self.shards.remove(0);
            total -= shard.bytes();
            if self.writer.as_ref().is_some_and(|w| w.day == shard.day) {
                self.writer = None;
            }
            // Index first: a frames file without its index is recognised as a leftover.
            for path in [
                Shard::index_path(&self.dir, shard.day),
                Shard::frames_path(&self.dir, shard.day),
            ] {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed.push(path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("remove", &path)(e)),
                }
            }
            self.dir_dirty = true;
        }
        if !removed.is_empty() {
            super::dirfiles::sync_dir(&self.dir)?;
            self.dir_dirty = false;
        }
        Ok(removed)
    }

    /// Writes a new store in `dest_dir` (which must be absent or empty) holding the frames
    /// with `from_ns <= at_ns <= to_ns`, copied without recompression, and syncs it. Returns
    /// the number of frames written. Damaged frames are left out (and noted).
    pub fn export(&self, from_ns: u64, to_ns: u64, dest_dir: &Path) -> Result<u64> {
        if std::fs::read_dir(dest_dir).is_ok_and(|mut d| d.next().is_some()) {
            return Err(StoreError::DestNotEmpty {
                path: dest_dir.to_path_buf(),
            });
        }
        let (mut dest, _) = Store::open_or_create(dest_dir)?;
        let mut n = 0;
        let mut frames = self.range(from_ns, to_ns);
        while let Some((at_ns, raw)) = frames.next_raw()? {
            dest.append_raw(at_ns, &raw)?;
            n += 1;
        }
        dest.flush()?;
        Ok(n)
    }

    /// Reads every entry and frame, checking both CRCs and that each frame decodes;
    /// returns one line per damaged entry or frame (also noted for [`Store::take_damage`]).
    pub fn verify(&self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        for shard in &self.shards {
            let files = shard.open(&self.dir)?;
            let name = day_name(shard.day);
            for i in 0..shard.entries {
                let line = match files.entry(i)? {
                    Slot::Damaged => Some(format!(
                        "entry {i} of {name}.index is damaged (its CRC fails)"
                    )),
                    Slot::Valid(e) => match files.raw_frame(&e, shard.frames_len)? {
                        None => Some(format!(
                            "frame {i} of {name}.frames (at {} ns) is damaged (its CRC fails)",
                            e.at_ns
                        )),
                        Some(raw) => decompress(&raw).err().map(|why| {
                            format!(
                                "frame {i} of {name}.frames (at {} ns) is damaged ({why})",
                                e.at_ns
                            )
                        }),
                    },
                };
                if let Some(line) = line {
                    let line = format!("store '{}': {line}", self.dir.display());
                    self.note_damage(shard.day, i, || line.clone());
                    lines.push(line);
                }
            }
        }
        Ok(lines)
    }
}
