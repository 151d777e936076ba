//! A minimal zip reader: the end of central directory (and its zip64 record), the central
//! directory entries, and each entry's local header to find where its data starts. It
//! never decompresses; `.npz` and `torch.save` archives store their arrays uncompressed.
//!
//! Every count and offset is checked against the file before it is used.
//! Format: PKWARE APPNOTE.TXT, sections 4.3 (records) and 4.5.3 (zip64 extra field).

use super::source::{check_range, Seq, Source};
use super::ContainerError;

const FORMAT: &str = "zip";
const LOCAL: u32 = 0x0403_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const EOCD: u32 = 0x0605_4b50;
const ZIP64_EOCD: u32 = 0x0606_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const EOCD_LEN: u64 = 22;
const CENTRAL_LEN: u64 = 46;
const LOCAL_LEN: u64 = 30;

/// `true` if the file starts with a local file header or is an empty archive.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06")
}

/// One central directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// 0 stored, 8 deflated, ...
    pub method: u16,
    pub flags: u16,
    pub compressed_size: u64,
    pub size: u64,
    pub local_header_offset: u64,
}

impl Entry {
    /// Stored without compression or encryption: its bytes in the file are its content.
    pub fn is_stored(&self) -> bool {
        self.method == 0 && self.flags & 1 == 0
    }
}

/// The entries of an archive, in central directory order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    pub entries: Vec<Entry>,
    /// Where the central directory starts: entry data must end before it.
    pub cd_offset: u64,
}

fn le16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Offset of the end of central directory record: the last signature whose comment
/// ends within the file.
fn find_eocd(src: &dyn Source) -> Result<u64, ContainerError> {
    let size = src.size();
    if size < EOCD_LEN {
        return Err(ContainerError::Truncated {
            what: "zip end of central directory",
            offset: 0,
            needed: EOCD_LEN,
            size,
        });
    }
    let tail_len = size.min(EOCD_LEN + u64::from(u16::MAX));
    let tail_at = size - tail_len;
    let tail = src.read_at(tail_at, tail_len, "zip end of central directory")?;
    let last = tail.len() - EOCD_LEN as usize;
    (0..=last)
        .rev()
        .find(|&i| {
            le32(&tail, i) == EOCD
                && i + EOCD_LEN as usize + le16(&tail, i + 20) as usize <= tail.len()
        })
        .map(|i| tail_at + i as u64)
        .ok_or_else(|| ContainerError::invalid(FORMAT, "no end of central directory record"))
}

struct Directory {
    entries: u64,
    size: u64,
    offset: u64,
    /// The directory must end here (the zip64 record or the end record).
    limit: u64,
}

fn directory(src: &dyn Source) -> Result<Directory, ContainerError> {
    let eocd = find_eocd(src)?;
    let mut r = Seq::new(src, eocd + 4).with_chunk(EOCD_LEN);
    let disk = r.u16("zip disk number")?;
    let cd_disk = r.u16("zip disk number")?;
    r.skip(2, "zip entry count")?;
    let mut d = Directory {
        entries: r.u16("zip entry count")?.into(),
        size: r.u32("zip directory size")?.into(),
        offset: r.u32("zip directory offset")?.into(),
        limit: eocd,
    };
    if disk != 0 || cd_disk != 0 {
        return Err(ContainerError::invalid(
            FORMAT,
            "multi-disk archives are not supported",
        ));
    }
    let locator = eocd.checked_sub(20);
    if let Some(at) = locator.filter(|&at| {
        src.read_at(at, 4, "zip64 locator")
            .is_ok_and(|b| le32(&b, 0) == ZIP64_LOCATOR)
    }) {
        let mut r = Seq::new(src, at + 8).with_chunk(8);
        let rec_at = r.u64("zip64 end of central directory offset")?;
        let mut r = Seq::new(src, rec_at).with_chunk(56);
        if r.u32("zip64 end of central directory")? != ZIP64_EOCD {
            return Err(ContainerError::invalid(
                FORMAT,
                "bad zip64 end of central directory record",
            ));
        }
        r.skip(8 + 2 + 2 + 4 + 4 + 8, "zip64 end of central directory")?;
        d.entries = r.u64("zip64 entry count")?;
        d.size = r.u64("zip64 directory size")?;
        d.offset = r.u64("zip64 directory offset")?;
        d.limit = rec_at;
    }
    Ok(d)
}

/// Applies a zip64 extended information extra field to the fields saturated at
/// `0xFFFFFFFF`, in the order the format lists them.
fn zip64_extra(extra: &[u8], e: &mut Entry) {
    let mut at = 0;
    while at + 4 <= extra.len() {
        let (id, len) = (le16(extra, at), le16(extra, at + 2) as usize);
        let Some(data) = extra.get(at + 4..at + 4 + len) else {
            return;
        };
        if id == 1 {
            let mut vals = data.chunks_exact(8).map(|c| {
                let mut a = [0u8; 8];
                a.iter_mut().zip(c).for_each(|(d, s)| *d = *s);
                u64::from_le_bytes(a)
            });
            for field in [
                &mut e.size,
                &mut e.compressed_size,
                &mut e.local_header_offset,
            ] {
                if *field == u64::from(u32::MAX) {
                    match vals.next() {
                        Some(v) => *field = v,
                        None => return,
                    }
                }
            }
            return;
        }
        at += 4 + len;
    }
}

fn central_entry(r: &mut Seq) -> Result<Entry, ContainerError> {
    let at = r.pos();
    if r.u32("zip central directory entry")? != CENTRAL {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("no central directory entry at offset '{at}'"),
        ));
    }
    r.skip(4, "zip central directory entry")?;
    let flags = r.u16("zip entry flags")?;
    let method = r.u16("zip entry method")?;
    r.skip(8, "zip central directory entry")?;
    let compressed_size = r.u32("zip entry size")?.into();
    let size = r.u32("zip entry size")?.into();
    let name_len = r.u16("zip entry name length")?;
    let extra_len = r.u16("zip entry extra length")?;
    let comment_len = r.u16("zip entry comment length")?;
    r.skip(8, "zip central directory entry")?;
    let local_header_offset = r.u32("zip local header offset")?.into();
    let name_at = r.pos();
    let name = std::str::from_utf8(r.take(name_len.into(), "zip entry name")?)
        .map_err(|_| ContainerError::Utf8 {
            what: "zip entry name",
            offset: name_at,
        })?
        .to_string();
    let mut e = Entry {
        name,
        method,
        flags,
        compressed_size,
        size,
        local_header_offset,
    };
    zip64_extra(r.take(extra_len.into(), "zip entry extra field")?, &mut e);
    r.skip(comment_len.into(), "zip entry comment")?;
    Ok(e)
}

/// Reads the central directory.
pub fn read(src: &dyn Source) -> Result<Archive, ContainerError> {
    let d = directory(src)?;
    let end = check_range(d.offset, d.size, src.size(), "zip central directory")?;
    if end > d.limit {
        return Err(ContainerError::invalid(
            FORMAT,
            format!(
                "central directory '{}..{end}' overlaps its end record at '{}'",
                d.offset, d.limit
            ),
        ));
    }
    if d.entries > d.size / CENTRAL_LEN {
        return Err(ContainerError::AbsurdCount {
            what: "zip entry count",
            count: d.entries,
            size: src.size(),
        });
    }
    let mut r = Seq::new(src, d.offset).with_chunk(d.size.clamp(1, 1 << 20));
    let mut entries = Vec::with_capacity(d.entries as usize);
    for _ in 0..d.entries {
        entries.push(central_entry(&mut r)?);
        if r.pos() > end {
            return Err(ContainerError::invalid(
                FORMAT,
                "entry runs past the central directory",
            ));
        }
    }
    Ok(Archive {
        entries,
        cd_offset: d.offset,
    })
}

/// Absolute offset of an entry's data, from its local header; checks that its
/// `compressed_size` bytes lie before the central directory.
pub fn data_offset(src: &dyn Source, archive: &Archive, e: &Entry) -> Result<u64, ContainerError> {
    let at = e.local_header_offset;
    let h = src.read_at(at, LOCAL_LEN, "zip local header")?;
    if le32(&h, 0) != LOCAL {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("entry '{}': no local header at offset '{at}'", e.name),
        ));
    }
    let skip = LOCAL_LEN + u64::from(le16(&h, 26)) + u64::from(le16(&h, 28));
    let data = at + skip;
    match data.checked_add(e.compressed_size) {
        Some(end) if end <= archive.cd_offset => Ok(data),
        _ => Err(ContainerError::OutOfBounds {
            tensor: e.name.clone(),
            start: data,
            end: data.saturating_add(e.compressed_size),
            data_start: 0,
            data_end: archive.cd_offset,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored archive with the given entries (no zip64, no data descriptors).
    pub(crate) fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in files {
            let off = out.len() as u32;
            let fixed = |v: &mut Vec<u8>, sig: u32| {
                v.extend_from_slice(&sig.to_le_bytes());
                if sig == CENTRAL {
                    v.extend_from_slice(&20u16.to_le_bytes());
                }
                v.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
                v.extend_from_slice(&(data.len() as u32).to_le_bytes());
                v.extend_from_slice(&(data.len() as u32).to_le_bytes());
                v.extend_from_slice(&(name.len() as u16).to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes());
            };
            fixed(&mut out, LOCAL);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
            fixed(&mut central, CENTRAL);
            central.extend_from_slice(&[0; 10]);
            central.extend_from_slice(&off.to_le_bytes());
            central.extend_from_slice(name.as_bytes());
        }
        let cd_off = out.len() as u32;
        out.extend_from_slice(&central);
        out.extend_from_slice(&EOCD.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        let n = files.len() as u16;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&(central.len() as u32).to_le_bytes());
        out.extend_from_slice(&cd_off.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    #[test]
    fn reads_entries_and_data_offsets() {
        let z = archive(&[("a.npy", b"hello"), ("dir/b", b"xy")]);
        let a = read(&z).unwrap();
        assert_eq!(a.entries.len(), 2);
        assert_eq!(a.entries[1].name, "dir/b");
        assert!(a.entries[0].is_stored());
        let off = data_offset(&z, &a, &a.entries[1]).unwrap() as usize;
        assert_eq!(&z[off..off + 2], b"xy");
    }

    #[test]
    fn rejects_broken_archives() {
        let z = archive(&[("a", b"1")]);
        let mut bad = z.clone();
        let n = bad.len();
        bad[n - 12..n - 10].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(read(&bad)
            .unwrap_err()
            .to_string()
            .contains("zip entry count '65535'"));
        for cut in 0..z.len() {
            assert!(read(&&z[..cut]).is_err(), "prefix {cut}");
        }
    }

    #[test]
    fn zip64_extra_replaces_saturated_fields() {
        let mut e = Entry {
            name: "x".into(),
            method: 0,
            flags: 0,
            compressed_size: u32::MAX.into(),
            size: u32::MAX.into(),
            local_header_offset: 7,
        };
        let mut extra = vec![1, 0, 16, 0];
        extra.extend_from_slice(&5u64.to_le_bytes());
        extra.extend_from_slice(&6u64.to_le_bytes());
        zip64_extra(&extra, &mut e);
        assert_eq!(
            (e.size, e.compressed_size, e.local_header_offset),
            (5, 6, 7)
        );
    }
}
