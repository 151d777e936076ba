//! Reads: `nearest`, `before` and `range`. A query finds the shard of the day it asks
//! about, binary-searches that shard's index with positioned 32-byte reads and reads only
//! the frames it returns. Damaged entries and frames are skipped (noted once in the
//! store's damage lines) and the search moves on to the next candidate.

use super::error::Result;
use super::format::{day_name, day_of, Entry};
use super::shard::{decompress, ShardFiles, Slot};
use super::{Frame, Store};

/// A place between entries: shard `shard` (index into `Store::shards`), before entry `entry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    shard: usize,
    entry: u64,
}

/// Read handles of the last shard visited by one query.
struct Reader<'a> {
    store: &'a Store,
    open: Option<(usize, ShardFiles)>,
}

impl<'a> Reader<'a> {
    fn new(store: &'a Store) -> Self {
        Reader { store, open: None }
    }

    fn files(&mut self, shard: usize) -> Result<&ShardFiles> {
        if self.open.as_ref().map(|(s, _)| *s) != Some(shard) {
            let files = self.store.shards[shard].open(&self.store.dir)?;
            self.open = Some((shard, files));
        }
        match &self.open {
            Some((_, f)) => Ok(f),
            None => unreachable!("opened above"),
        }
    }

    /// Entry `i` of `shard`, `None` (and noted) when it fails its CRC.
    fn entry(&mut self, shard: usize, i: u64) -> Result<Option<Entry>> {
        match self.files(shard)?.entry(i)? {
            Slot::Valid(e) => Ok(Some(e)),
            Slot::Damaged => {
                let day = self.store.shards[shard].day;
                self.store.note_damage(day, i, || {
                    format!(
                        "store '{}': entry {i} of {}.index is damaged (its CRC fails); its frame is skipped",
                        self.store.dir.display(),
                        day_name(day)
                    )
                });
                Ok(None)
            }
        }
    }

    /// The position such that valid entries before it have `at_ns <= t` (`strict`: `< t`)
    /// and those from it on do not.
    fn locate(&mut self, t: u64, strict: bool) -> Result<Pos> {
        let day = day_of(t);
        let shards = &self.store.shards;
        let s = shards.partition_point(|sh| sh.day < day);
        if s == shards.len() || shards[s].day != day {
            return Ok(Pos { shard: s, entry: 0 });
        }
        let n = shards[s].entries;
        if n == 0 {
            return Ok(Pos { shard: s, entry: 0 });
        }
        let left = |at: u64| if strict { at < t } else { at <= t };
        let entry = self.files(s)?.partition_point(0, n, left)?;
        Ok(Pos { shard: s, entry })
    }

    /// The last valid entry before `p`, with its position.
    fn prev(&mut self, mut p: Pos) -> Result<Option<(Pos, Entry)>> {
        loop {
            if p.entry == 0 {
                if p.shard == 0 {
                    return Ok(None);
                }
                p.shard -= 1;
                p.entry = self.store.shards[p.shard].entries;
                continue;
            }
            p.entry -= 1;
            if let Some(e) = self.entry(p.shard, p.entry)? {
                return Ok(Some((p, e)));
            }
        }
    }

    /// The first valid entry at or after `p`, with its position.
    fn next(&mut self, mut p: Pos) -> Result<Option<(Pos, Entry)>> {
        loop {
            if p.shard >= self.store.shards.len() {
                return Ok(None);
            }
            if p.entry >= self.store.shards[p.shard].entries {
                p = Pos {
                    shard: p.shard + 1,
                    entry: 0,
                };
                continue;
            }
            if let Some(e) = self.entry(p.shard, p.entry)? {
                return Ok(Some((p, e)));
            }
            p.entry += 1;
        }
    }

    /// The compressed frame of the entry at `p`, `None` (and noted) when it is damaged.
    fn raw_frame(&mut self, p: Pos, e: &Entry) -> Result<Option<Vec<u8>>> {
        let frames_len = self.store.shards[p.shard].frames_len;
        let raw = self.files(p.shard)?.raw_frame(e, frames_len)?;
        if raw.is_none() {
            self.note_bad_frame(p, e, "its CRC fails");
        }
        Ok(raw)
    }

    /// The frame of the entry at `p`, `None` (and noted) when it is damaged.
    fn frame(&mut self, p: Pos, e: &Entry) -> Result<Option<Frame>> {
        let Some(raw) = self.raw_frame(p, e)? else {
            return Ok(None);
        };
        match decompress(&raw) {
            Ok(payload) => Ok(Some(Frame {
                at_ns: e.at_ns,
                payload,
            })),
            Err(why) => {
                self.note_bad_frame(p, e, why);
                Ok(None)
            }
        }
    }

    fn note_bad_frame(&self, p: Pos, e: &Entry, why: &str) {
        let day = self.store.shards[p.shard].day;
        self.store.note_damage(day, p.entry, || {
            format!(
                "store '{}': frame {} of {}.frames (at {} ns) is damaged ({why}); it is skipped",
                self.store.dir.display(),
                p.entry,
                day_name(day),
                e.at_ns
            )
        });
    }
}

impl Store {
    /// The frame nearest in time to `at_ns` (on a tie, the earlier one); `None` when the
    /// store is empty. Reads about log2(frames per day) index entries and one frame.
    pub fn nearest(&self, at_ns: u64) -> Result<Option<Frame>> {
        let mut r = Reader::new(self);
        let start = r.locate(at_ns, false)?;
        let (mut lo, mut hi) = (start, start);
        loop {
            let below = r.prev(lo)?;
            let above = r.next(hi)?;
            let take_below = match (&below, &above) {
                (None, None) => return Ok(None),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((_, b)), Some((_, a))) => at_ns - b.at_ns <= a.at_ns - at_ns,
            };
            if take_below {
                let Some((p, e)) = below else { return Ok(None) };
                match r.frame(p, &e)? {
                    Some(f) => return Ok(Some(f)),
                    None => lo = p,
                }
            } else {
                let Some((p, e)) = above else { return Ok(None) };
                match r.frame(p, &e)? {
                    Some(f) => return Ok(Some(f)),
                    None => {
                        hi = Pos {
                            shard: p.shard,
                            entry: p.entry + 1,
                        }
                    }
                }
            }
        }
    }

    /// The last frame strictly before `at_ns` (the previous sample, for rates).
    pub fn before(&self, at_ns: u64) -> Result<Option<Frame>> {
        let mut r = Reader::new(self);
        let mut p = r.locate(at_ns, true)?;
        while let Some((q, e)) = r.prev(p)? {
            if let Some(f) = r.frame(q, &e)? {
                return Ok(Some(f));
            }
            p = q;
        }
        Ok(None)
    }

    /// The frames with `from_ns <= at_ns <= to_ns` (both ends included), oldest first, read
    /// lazily. An I/O error is yielded once and ends the iteration.
    pub fn range(&self, from_ns: u64, to_ns: u64) -> Range<'_> {
        Range {
            reader: Reader::new(self),
            from_ns,
            to_ns,
            pos: None,
            done: from_ns > to_ns,
        }
    }
}

/// Iterator returned by [`Store::range`].
pub struct Range<'a> {
    reader: Reader<'a>,
    from_ns: u64,
    to_ns: u64,
    pos: Option<Pos>,
    done: bool,
}

impl Range<'_> {
    /// The next entry in range with its compressed frame (damaged frames skipped).
    fn step_raw(&mut self) -> Result<Option<(Pos, Entry, Vec<u8>)>> {
        let mut p = match self.pos {
            Some(p) => p,
            None => self.reader.locate(self.from_ns, true)?,
        };
        while let Some((q, e)) = self.reader.next(p)? {
            p = Pos {
                shard: q.shard,
                entry: q.entry + 1,
            };
            self.pos = Some(p);
            if e.at_ns > self.to_ns {
                return Ok(None);
            }
            if let Some(raw) = self.reader.raw_frame(q, &e)? {
                return Ok(Some((q, e, raw)));
            }
        }
        Ok(None)
    }

    fn step(&mut self) -> Result<Option<Frame>> {
        while let Some((q, e, raw)) = self.step_raw()? {
            match decompress(&raw) {
                Ok(payload) => {
                    return Ok(Some(Frame {
                        at_ns: e.at_ns,
                        payload,
                    }))
                }
                Err(why) => self.reader.note_bad_frame(q, &e, why),
            }
        }
        Ok(None)
    }

    /// Like `next`, but the frame as stored (compressed, CRC checked): `(at_ns, zstd frame)`.
    pub(super) fn next_raw(&mut self) -> Result<Option<(u64, Vec<u8>)>> {
        if self.done {
            return Ok(None);
        }
        let item = self.step_raw();
        if !matches!(item, Ok(Some(_))) {
            self.done = true;
        }
        item.map(|o| o.map(|(_, e, raw)| (e.at_ns, raw)))
    }
}

impl Iterator for Range<'_> {
    type Item = Result<Frame>;

    fn next(&mut self) -> Option<Result<Frame>> {
        if self.done {
            return None;
        }
        let item = self.step().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}
