//! The on-disk store behind `twofold record` / `replay` / `dump`: a directory of per-day
//! shards of zstd-compressed frames with a fixed-size index, generic over the frame bytes.
//!
//! ```text
//! store.json              {"format":"twofold-store","version":1,...}
//! store.lock              flock(2)ed by the one writer
//! 2026-11-30.frames       concatenated zstd frames (`zstdcat` reads them all)
//! 2026-11-30.index        32-byte little-endian entries, one per frame
//! ```
//!
//! docs/store.md gives the format byte by byte. Appends are crash safe: a torn tail left by
//! `kill -9` or a power loss is cut off (and reported once) when the store is next opened
//! for writing; a damaged frame or entry elsewhere makes that frame absent, never the store.
//! Time is UTC nanoseconds since the Unix epoch throughout; the API is synchronous.
//!
//! ```no_run
//! use twofold::store::Store;
//! let (mut store, damage) = Store::open_or_create("/var/lib/twofold/rec".as_ref())?;
//! for line in &damage {
//!     eprintln!("warning: {line}");
//! }
//! store.append(1_764_460_800_000_000_000, br#"{"files":[]}"#)?;
//! store.flush()?;
//! let frame = store.nearest(1_764_460_805_000_000_000)?;
//! # Ok::<(), twofold::store::StoreError>(())
//! ```

mod dirfiles;
mod error;
pub mod format;
mod maintain;
mod query;
mod shard;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_damage;

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

pub use error::{Result, StoreError};
pub use query::Range;

use dirfiles::{lock, read_header, sync_dir, write_header};
use error::{io, open_regular};
use format::{day_of, parse_day_name, Entry, ENTRY_BYTES, ZSTD_LEVEL};
use shard::Shard;

/// One stored snapshot: its time and its (decompressed) bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub at_ns: u64,
    pub payload: Vec<u8>,
}

/// Totals over the store's valid extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Index entries that pass their CRC (a frame damaged inside is still counted).
    pub frames: u64,
    /// Bytes of the `.frames` and `.index` files (up to the end of their valid extent).
    pub bytes: u64,
    /// Day shards.
    pub shards: usize,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
}

/// Damage met while reading: the (day, entry) keys already reported, lines not yet taken.
#[derive(Default)]
struct DamageLog {
    seen: HashSet<(u32, u64)>,
    lines: Vec<String>,
}

/// Append handles of the shard being written.
struct Writer {
    day: u32,
    frames: File,
    index: File,
}

/// A store directory, opened for writing (`open_or_create`) or reading (`open_read_only`).
pub struct Store {
    dir: PathBuf,
    /// Sorted by day.
    shards: Vec<Shard>,
    last_ns: Option<u64>,
    writer: Option<Writer>,
    /// Held while open for writing; `None` when read-only.
    lock: Option<Flock<File>>,
    /// A new shard file was created and the directory not yet synced.
    dir_dirty: bool,
    poisoned: bool,
    damage: Mutex<DamageLog>,
    /// The compression context and frame buffer, kept from one append to the next (a
    /// recorder appends every second: a new context each time was most of its cost).
    packer: Option<(zstd::bulk::Compressor<'static>, Vec<u8>)>,
}

impl Store {
    /// Opens the store in `dir` for writing, creating it (and `dir`) if needed. Torn tails
    /// are cut off; the returned lines report them and any other damage found on the way.
    pub fn open_or_create(dir: &Path) -> Result<(Store, Vec<String>)> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        dirfiles::check_writable(dir)?;
        let header = dir.join("store.json");
        if !header.exists() {
            let mut entries = std::fs::read_dir(dir).map_err(io("read", dir))?;
            if entries.next().is_some() {
                return Err(StoreError::NotAStore {
                    path: dir.to_path_buf(),
                });
            }
            write_header(dir)?;
        }
        let lock =
            lock(dir, FlockArg::LockExclusiveNonblock)?.ok_or_else(|| StoreError::Locked {
                path: dir.to_path_buf(),
            })?;
        Store::load(dir, Some(lock))
    }

    /// Opens an existing store for reading only: nothing is modified, a torn tail is just
    /// ignored. It is reported only when no writer holds the store (a live recorder's
    /// tail is not torn, just being written). Frames appended later are not seen.
    pub fn open_read_only(dir: &Path) -> Result<(Store, Vec<String>)> {
        Store::load(dir, None)
    }

    fn load(dir: &Path, lock_held: Option<Flock<File>>) -> Result<(Store, Vec<String>)> {
        read_header(dir)?;
        let writable = lock_held.is_some();
        let report = writable || lock(dir, FlockArg::LockSharedNonblock)?.is_some();
        let mut reports = Vec::new();
        let mut days = Vec::new();
        for ent in std::fs::read_dir(dir).map_err(io("read", dir))? {
            let ent = ent.map_err(io("read", dir))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(day) = name.strip_suffix(".index").and_then(parse_day_name) {
                days.push(day);
            } else if let Some(day) = name.strip_suffix(".frames").and_then(parse_day_name) {
                if !Shard::index_path(dir, day).exists() && writable {
                    // Shards are created frames-first and removed index-first, so this is
                    // the leftover of an interrupted creation or retention.
                    let path = ent.path();
                    std::fs::remove_file(&path).map_err(io("remove", &path))?;
                    reports.push(format!(
                        "store '{}': removed '{name}', left without its index by an interrupted retention",
                        dir.display()
                    ));
                }
            }
        }
        days.sort_unstable();
        let mut shards = Vec::with_capacity(days.len());
        for day in days {
            let (shard, rec) = shard::recover(dir, day, writable)?;
            if report {
                reports.extend(rec.report(dir, day, writable));
            }
            shards.push(shard);
        }
        let mut store = Store {
            dir: dir.to_path_buf(),
            shards,
            last_ns: None,
            writer: None,
            lock: lock_held,
            dir_dirty: false,
            poisoned: false,
            damage: Mutex::new(DamageLog::default()),
            packer: None,
        };
        store.last_ns = store.last_entry_ns()?;
        Ok((store, reports))
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Compresses `payload` (zstd, [`ZSTD_LEVEL`]) and appends it as the frame at `at_ns`:
    /// the frame to the day's `.frames` file, then its entry to the `.index` file. `at_ns`
    /// must not be before the last frame. Nothing is synced; see [`Store::flush`].
    pub fn append(&mut self, at_ns: u64, payload: &[u8]) -> Result<()> {
        if payload.len() as u64 > format::MAX_FRAME_BYTES {
            return Err(StoreError::TooLarge { len: payload.len() });
        }
        let (cctx, raw) = match self.packer.take() {
            Some(p) => p,
            None => (
                zstd::bulk::Compressor::new(ZSTD_LEVEL)
                    .map_err(io("compress a frame for", &self.dir))?,
                Vec::new(),
            ),
        };
        let (mut cctx, mut raw) = (cctx, raw);
        raw.clear();
        raw.reserve(zstd::zstd_safe::compress_bound(payload.len()));
        let packed = cctx
            .compress_to_buffer(payload, &mut raw)
            .map_err(io("compress a frame for", &self.dir));
        let r = packed.and_then(|_| self.append_raw(at_ns, &raw));
        self.packer = Some((cctx, raw));
        r
    }

    /// Appends an already compressed zstd frame (used by export to copy frames as they are).
    fn append_raw(&mut self, at_ns: u64, raw: &[u8]) -> Result<()> {
        if self.lock.is_none() {
            return Err(StoreError::ReadOnly {
                path: self.dir.clone(),
            });
        }
        if self.poisoned {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        if let Some(last_ns) = self.last_ns.filter(|&l| at_ns < l) {
            return Err(StoreError::OutOfOrder { at_ns, last_ns });
        }
        let len = u32::try_from(raw.len())
            .ok()
            .filter(|l| u64::from(*l) <= format::MAX_FRAME_BYTES)
            .ok_or(StoreError::TooLarge { len: raw.len() })?;
        let day = day_of(at_ns);
        let si = self.writer_for(day)?;
        let shard = &self.shards[si];
        let entry = Entry {
            at_ns,
            offset: shard.frames_len,
            len,
            flags: 0,
            frame_crc: crc32fast::hash(raw),
        };
        let (old_frames, old_entries) = (shard.frames_len, shard.entries);
        let Some(w) = self.writer.as_mut() else {
            unreachable!("writer_for opens the writer")
        };
        let frames_path = Shard::frames_path(&self.dir, day);
        let index_path = Shard::index_path(&self.dir, day);
        let written = w
            .frames
            .write_all(raw)
            .map_err(io("write", &frames_path))
            .and_then(|()| {
                w.index
                    .write_all(&entry.encode())
                    .map_err(io("write", &index_path))
            });
        if let Err(e) = written {
            // Undo a partial write so the next append starts at a whole frame.
            let undone = w.frames.set_len(old_frames).is_ok()
                && w.index.set_len(old_entries * ENTRY_BYTES as u64).is_ok();
            self.poisoned = !undone;
            return Err(e);
        }
        let shard = &mut self.shards[si];
        shard.frames_len = entry.end();
        shard.entries += 1;
        self.last_ns = Some(at_ns);
        Ok(())
    }

    /// Index of the shard of `day` in `shards`, with the writer open on it (created if new).
    fn writer_for(&mut self, day: u32) -> Result<usize> {
        if self.writer.as_ref().map(|w| w.day) != Some(day) {
            if self.writer.is_some() {
                self.flush()?; // the old day is complete: make it durable
            }
            let frames_path = Shard::frames_path(&self.dir, day);
            let index_path = Shard::index_path(&self.dir, day);
            let open = |p: &Path| open_regular(p, OpenOptions::new().create(true).append(true));
            // Frames first: an index never exists without its frames file.
            let frames = open(&frames_path)?;
            let index = open(&index_path)?;
            self.writer = Some(Writer { day, frames, index });
            if let Err(at) = self.shards.binary_search_by_key(&day, |s| s.day) {
                self.shards.insert(
                    at,
                    Shard {
                        day,
                        entries: 0,
                        frames_len: 0,
                    },
                );
                self.dir_dirty = true;
            }
        }
        self.shards
            .binary_search_by_key(&day, |s| s.day)
            .map_err(|_| StoreError::Poisoned {
                path: self.dir.clone(),
            })
    }

    /// Makes every appended frame durable: fsyncs the `.frames` and `.index` files being
    /// written (and the directory after a new shard was created).
    pub fn flush(&mut self) -> Result<()> {
        if let Some(w) = &self.writer {
            let frames_path = Shard::frames_path(&self.dir, w.day);
            let index_path = Shard::index_path(&self.dir, w.day);
            w.frames.sync_data().map_err(io("sync", &frames_path))?;
            w.index.sync_data().map_err(io("sync", &index_path))?;
        }
        if self.dir_dirty {
            sync_dir(&self.dir)?;
            self.dir_dirty = false;
        }
        Ok(())
    }

    /// Frames, bytes on disk and first/last time. Reads every index (32 bytes per frame).
    pub fn stats(&self) -> Result<Stats> {
        let mut st = Stats {
            shards: self.shards.len(),
            last_ns: self.last_ns,
            ..Stats::default()
        };
        for shard in &self.shards {
            st.bytes += shard.bytes();
            let path = Shard::index_path(&self.dir, shard.day);
            let mut bytes = Vec::new();
            open_regular(&path, OpenOptions::new().read(true))?
                .read_to_end(&mut bytes)
                .map_err(io("read", &path))?;
            let valid = bytes
                .chunks_exact(ENTRY_BYTES)
                .take(shard.entries as usize)
                .filter_map(|c| {
                    <&[u8; ENTRY_BYTES]>::try_from(c)
                        .ok()
                        .and_then(Entry::decode)
                });
            for e in valid {
                st.frames += 1;
                st.first_ns = Some(st.first_ns.map_or(e.at_ns, |f: u64| f.min(e.at_ns)));
            }
        }
        Ok(st)
    }

    /// Damage met by reads since the last call, one line each, each reported once.
    pub fn take_damage(&self) -> Vec<String> {
        let mut d = self.damage.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut d.lines)
    }

    fn note_damage(&self, day: u32, entry: u64, line: impl FnOnce() -> String) {
        let mut d = self.damage.lock().unwrap_or_else(|p| p.into_inner());
        if d.seen.insert((day, entry)) {
            let line = line();
            d.lines.push(line);
        }
    }

    /// Time of the last valid entry (recovery leaves each shard ending in one).
    fn last_entry_ns(&self) -> Result<Option<u64>> {
        for shard in self.shards.iter().rev().filter(|s| s.entries > 0) {
            let files = shard.open(&self.dir)?;
            if let shard::Slot::Valid(e) = files.entry(shard.entries - 1)? {
                return Ok(Some(e.at_ns));
            }
        }
        Ok(None)
    }
}
