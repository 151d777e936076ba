//! The bytes of a store: the `store.json` header, the 32-byte index entry and the names of
//! the per-day shard files. docs/store.md describes the same layout byte by byte.

use serde::{Deserialize, Serialize};

/// `format` in `store.json`.
pub const FORMAT_NAME: &str = "twofold-store";
/// The only version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Size of one index entry in bytes.
pub const ENTRY_BYTES: usize = 32;
/// zstd level frames are compressed with: 1, the fastest of the standard levels (a
/// recorder compresses a frame of about 1 MiB of JSON every second; any level decodes).
pub const ZSTD_LEVEL: i32 = 1;
/// Largest frame, compressed or decompressed (256 MiB): the writer refuses a larger
/// payload, and the reader treats a frame that declares or decodes to more as damaged
/// without allocating it (a crafted frame of valid CRCs can declare 4 GiB).
pub const MAX_FRAME_BYTES: u64 = 256 << 20;
/// Nanoseconds in one UTC day (the shard span; UTC has no leap seconds in epoch time).
pub const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;

/// The header file, `store.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Always `"twofold-store"`.
    pub format: String,
    /// Layout version; this code handles 1.
    pub version: u32,
    /// When the store was created, in ns since the Unix epoch.
    pub created_ns: u64,
    /// How segments are split: `"utc-day"`.
    pub shard: String,
    /// How each frame is compressed: `"zstd"`.
    pub compression: String,
    /// Bytes per index entry: 32.
    pub index_entry_bytes: u32,
}

impl Header {
    pub fn new(created_ns: u64) -> Self {
        Header {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            created_ns,
            shard: "utc-day".to_string(),
            compression: "zstd".to_string(),
            index_entry_bytes: ENTRY_BYTES as u32,
        }
    }
}

/// One index entry as stored, little-endian:
///
/// | bytes  | field       |
/// |--------|-------------|
/// | 0..8   | `at_ns` u64 |
/// | 8..16  | `offset` u64 (of the frame in the `.frames` file) |
/// | 16..20 | `len` u32 (compressed frame length) |
/// | 20..24 | `flags` u32 (0 in version 1) |
/// | 24..28 | `frame_crc` u32 (CRC-32 of the compressed frame) |
/// | 28..32 | CRC-32 of bytes 0..28 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub at_ns: u64,
    pub offset: u64,
    pub len: u32,
    pub flags: u32,
    pub frame_crc: u32,
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.at_ns.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        b[24..28].copy_from_slice(&self.frame_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[0..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The entry in `b`, or `None` when its own CRC fails (the entry is absent).
    pub fn decode(b: &[u8; ENTRY_BYTES]) -> Option<Entry> {
        let crc = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
        if crc32fast::hash(&b[0..28]) != crc {
            return None;
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Entry {
            at_ns: u64_at(0),
            offset: u64_at(8),
            len: u32_at(16),
            flags: u32_at(20),
            frame_crc: u32_at(24),
        })
    }

    /// Offset just past the frame.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// The UTC day (days since 1970-01-01) holding `at_ns`.
pub fn day_of(at_ns: u64) -> u32 {
    (at_ns / NS_PER_DAY) as u32
}

/// First nanosecond of `day`.
pub fn day_start_ns(day: u32) -> u64 {
    u64::from(day) * NS_PER_DAY
}

/// `YYYY-MM-DD` of a day number (proleptic Gregorian, Howard Hinnant's `civil_from_days`).
pub fn day_name(day: u32) -> String {
    let z = i64::from(day) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day number of a `YYYY-MM-DD` name; `None` for anything else.
pub fn parse_day_name(name: &str) -> Option<u32> {
    let b = name.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |s: &str| -> Option<i64> {
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let (y, m, d) = (num(&name[0..4])?, num(&name[5..7])?, num(&name[8..10])?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // days_from_civil
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let day = u32::try_from(days).ok()?;
    // Reject 2026-02-31 and the like: the name must round-trip.
    (day_name(day) == name).then_some(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_names_round_trip() {
        assert_eq!(day_name(0), "1970-01-01");
        assert_eq!(day_name(20_422), "2025-11-30");
        assert_eq!(parse_day_name("2025-11-30"), Some(20_422));
        assert_eq!(parse_day_name("2024-02-29"), Some(19_782));
        assert_eq!(parse_day_name("2025-02-29"), None);
        assert_eq!(parse_day_name("2025-1-30x"), None);
        for day in (0..80_000).step_by(37) {
            assert_eq!(parse_day_name(&day_name(day)), Some(day));
        }
    }

    #[test]
    fn entry_round_trip_and_crc() {
        let e = Entry {
            at_ns: 1,
            offset: 2,
            len: 3,
            flags: 0,
            frame_crc: 5,
        };
        let mut b = e.encode();
        assert_eq!(Entry::decode(&b), Some(e));
        b[3] ^= 0x10;
        assert_eq!(Entry::decode(&b), None);
    }
}
