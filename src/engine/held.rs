//! Device ranges of one process that hold matched model bytes: what each upload put where,
//! and what device-to-device copies of those ranges made (clones). A range is cut where a
//! later copy overwrites it and dropped when its allocation is freed (`cuMemFree*`), so
//! the clones listed are the ones still allocated.
//!
//! A range of converted bytes (F32 narrowed to BF16 on upload) is cut at whole elements:
//! part of a clone counts by the file bytes its elements come from.

use std::collections::BTreeMap;

use crate::collect::bpf::uploads::entry_name;
use crate::dupes::uploads::add_range;
use crate::sample::converted::Conversion;
use crate::sample::uploads::DeviceClone;
use crate::sample::FileKey;

/// A device-to-device copy a range came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CloneOf {
    pub(super) entry: u32,
    pub(super) at_unix_ns: u64,
    /// Which copy (one copy may make several ranges).
    pub(super) id: u64,
}

/// One device range holding model bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Held {
    /// Device bytes.
    pub(super) len: u64,
    /// Each file whose bytes these are, with the file offset of the range's first element
    /// (identical tensors of several files: each of them).
    pub(super) files: Vec<(FileKey, u64)>,
    /// Bytes of one element: (in the file, on the device); (1, 1) as in the file.
    pub(super) elements: (u64, u64),
    pub(super) conversion: Option<Conversion>,
    /// Made by a device-to-device copy (`None`: an upload).
    pub(super) clone: Option<CloneOf>,
}

impl Held {
    /// The part of it from device offset `d0` to `d1` (relative to its start), at whole
    /// elements: (its offset, the part); `None` when no whole element lies there.
    fn part(&self, d0: u64, d1: u64) -> Option<(u64, Held)> {
        let (fe, me) = self.elements;
        let me = me.max(1);
        let a = d0.div_ceil(me) * me;
        let b = d1.min(self.len) / me * me;
        (b > a).then(|| {
            (
                a,
                Held {
                    len: b - a,
                    files: self
                        .files
                        .iter()
                        .map(|(f, o)| (*f, o + a / me * fe))
                        .collect(),
                    ..self.clone()
                },
            )
        })
    }

    /// File bytes its elements come from.
    fn file_bytes(&self) -> u64 {
        let (fe, me) = self.elements;
        self.len / me.max(1) * fe
    }
}

/// A file, in one form (as it is, or converted).
pub(super) type Form = (FileKey, Option<Conversion>);

/// The held ranges of one process, disjoint, by device address.
#[derive(Debug, Default)]
pub(super) struct HeldMap {
    ranges: BTreeMap<u64, Held>,
    copies: u64,
}

impl HeldMap {
    /// The ranges overlapping `[a, b)`, by start.
    fn overlapping(&self, a: u64, b: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .ranges
            .range(..a)
            .next_back()
            .filter(|(s, h)| *s + h.len > a)
            .map(|(s, _)| *s)
            .into_iter()
            .collect();
        out.extend(self.ranges.range(a..b).map(|(s, _)| *s));
        out
    }

    /// Whether any byte of `[start, start + len)` holds model bytes.
    pub(super) fn overlaps(&self, start: u64, len: u64) -> bool {
        !self
            .overlapping(start, start.saturating_add(len))
            .is_empty()
    }

    /// Forgets what `[a, b)` held (overwritten, or freed); the parts outside it stay.
    pub(super) fn cut(&mut self, a: u64, b: u64) {
        if b <= a {
            return;
        }
        for s in self.overlapping(a, b) {
            let Some(h) = self.ranges.remove(&s) else {
                continue;
            };
            if a > s {
                if let Some((off, left)) = h.part(0, a - s) {
                    self.ranges.insert(s + off, left);
                }
            }
            if s + h.len > b {
                if let Some((off, right)) = h.part(b - s, h.len) {
                    self.ranges.insert(s + off, right);
                }
            }
        }
    }

    /// `[start, start + h.len)` holds `h` now.
    pub(super) fn insert(&mut self, start: u64, h: Held) {
        self.cut(start, start.saturating_add(h.len));
        if h.len > 0 {
            self.ranges.insert(start, h);
        }
    }

    /// A device-to-device copy of `bytes` from `src` to `dst`: the parts of the source
    /// that hold model bytes are held at the destination too, as clones.
    pub(super) fn clone_range(&mut self, src: u64, dst: u64, bytes: u64, entry: u32, at: u64) {
        let end = src.saturating_add(bytes);
        let parts: Vec<(u64, Held)> = self
            .overlapping(src, end)
            .into_iter()
            .filter_map(|s| {
                let h = self.ranges.get(&s)?;
                let d0 = src.saturating_sub(s);
                let (off, part) = h.part(d0, end - s)?;
                Some((s + off - src, part))
            })
            .collect();
        self.cut(dst, dst.saturating_add(bytes));
        if parts.is_empty() {
            return;
        }
        self.copies += 1;
        let of = CloneOf {
            entry,
            at_unix_ns: at,
            id: self.copies,
        };
        for (off, mut h) in parts {
            h.clone = Some(of);
            self.ranges.insert(dst + off, h);
        }
    }

    /// `cuMemFree*` of the allocation at `start` (ending at `end` when it was traced; else
    /// only the ranges that start there are known to go).
    pub(super) fn free(&mut self, start: u64, end: Option<u64>) {
        match end {
            Some(end) => self.cut(start, end),
            None => {
                self.ranges.remove(&start);
            }
        }
    }

    /// The file ranges each upload (not a clone) still holds, per (file, form), merged.
    pub(super) fn uploaded(&self) -> BTreeMap<Form, Vec<(u64, u64)>> {
        let mut out: BTreeMap<Form, Vec<(u64, u64)>> = BTreeMap::new();
        for h in self.ranges.values().filter(|h| h.clone.is_none()) {
            let n = h.file_bytes();
            for (file, start) in &h.files {
                add_range(
                    out.entry((*file, h.conversion)).or_default(),
                    *start,
                    start + n,
                );
            }
        }
        out
    }

    /// The live clones, per (file, form).
    pub(super) fn clones(&self, pid: i32) -> Vec<DeviceClone> {
        let mut out: BTreeMap<(FileKey, Option<Conversion>), (DeviceClone, Vec<u64>)> =
            BTreeMap::new();
        for h in self.ranges.values() {
            let Some(of) = h.clone else { continue };
            for (file, start) in &h.files {
                let (c, ids) = out.entry((*file, h.conversion)).or_insert_with(|| {
                    (
                        DeviceClone {
                            pid,
                            file: *file,
                            conversion: h.conversion,
                            first_unix_ns: of.at_unix_ns,
                            ..DeviceClone::default()
                        },
                        Vec::new(),
                    )
                });
                let n = h.file_bytes();
                add_range(&mut c.ranges, *start, start + n);
                c.file_bytes += n;
                c.device_bytes += h.len;
                c.first_unix_ns = c.first_unix_ns.min(of.at_unix_ns);
                if of.at_unix_ns >= c.last_unix_ns {
                    c.last_unix_ns = of.at_unix_ns;
                    c.entry = entry_name(of.entry).into();
                }
                if !ids.contains(&of.id) {
                    ids.push(of.id);
                }
                for (other, _) in &h.files {
                    if other != file && !c.also.contains(other) {
                        c.also.push(*other);
                        c.also.sort();
                    }
                }
            }
        }
        out.into_values()
            .map(|(mut c, ids)| {
                c.copies = ids.len() as u64;
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(len: u64, file: FileKey, start: u64, elements: (u64, u64)) -> Held {
        Held {
            len,
            files: vec![(file, start)],
            elements,
            conversion: None,
            clone: None,
        }
    }

    /// A clone of part of an upload, a clone of the clone, a partial overwrite and a free:
    /// what stays held is what the copies left.
    #[test]
    fn clones_follow_copies_overwrites_and_frees() {
        let f = FileKey::from_dev(1, 7);
        let mut m = HeldMap::default();
        m.insert(0x1000, up(4096, f, 100, (1, 1)));
        // Bytes 512..3072 of the upload cloned to 0x9000.
        m.clone_range(0x1000 + 512, 0x9000, 2560, 1, 5);
        let c = m.clones(3);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].file_bytes, c[0].device_bytes, c[0].copies),
            (2560, 2560, 1)
        );
        assert_eq!(c[0].ranges, [(612, 612 + 2560)]);
        // The clone cloned again: two clones.
        m.clone_range(0x9000, 0x20000, 2560, 1, 6);
        assert_eq!(m.clones(3)[0].file_bytes, 5120);
        // Half of the first clone overwritten (an upload of other bytes).
        m.cut(0x9000, 0x9000 + 1280);
        assert_eq!(m.clones(3)[0].file_bytes, 2560 + 1280);
        // The second clone's allocation freed.
        m.free(0x20000, Some(0x20000 + 4096));
        let c = m.clones(3);
        assert_eq!((c[0].file_bytes, c[0].copies), (1280, 1));
        assert_eq!(c[0].ranges, [(612 + 1280, 612 + 2560)]);
        // A copy from memory that holds no model bytes clones nothing.
        m.clone_range(0x50000, 0x60000, 4096, 1, 7);
        assert_eq!(m.clones(3)[0].file_bytes, 1280);
    }

    /// A narrowed range (F32 → BF16: 4 file bytes per 2 device bytes) cloned in part
    /// counts whole elements, by the file bytes they come from.
    #[test]
    fn part_of_a_converted_range_counts_whole_elements() {
        let f = FileKey::from_dev(1, 8);
        let mut m = HeldMap::default();
        let mut h = up(1000, f, 40, (4, 2));
        h.conversion = Some(Conversion::F32ToBf16);
        m.insert(0, h);
        // Device bytes 3..503: whole elements 4..502 (249 elements).
        m.clone_range(3, 0x10000, 500, 1, 1);
        let c = m.clones(1);
        assert_eq!((c[0].device_bytes, c[0].file_bytes), (498, 996));
        assert_eq!(c[0].ranges, [(40 + 8, 40 + 8 + 996)]);
        assert_eq!(c[0].conversion, Some(Conversion::F32ToBf16));
    }
}
