//! `/proc/PID/maps` and `/proc/PID/smaps`.
//!
//! Header lines: `start-end perms offset major:minor inode   path` (addresses, offset and
//! device in hex). `smaps` follows each header with `Key: value kB` lines (bytes here).
//! See <https://www.kernel.org/doc/html/latest/filesystems/proc.html> (§1.1, "smaps").

use std::collections::HashSet;
use std::path::Path;

use super::error::{CollectError, Result};
use crate::sample::{FileKey, MappingSample, Perms};

/// Parses one header line; `None` if it is not a header.
pub fn parse_header(line: &str) -> Option<MappingSample> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let dev = it.next()?;
    let inode = it.next()?;
    let path = it.next().map(str::trim_start).unwrap_or("");
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let p = perms.as_bytes();
    if p.len() != 4 {
        return None;
    }
    Some(MappingSample {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: Perms {
            read: p[0] == b'r',
            write: p[1] == b'w',
            exec: p[2] == b'x',
            shared: p[3] == b's',
        },
        offset_bytes: u64::from_str_radix(offset, 16).ok()?,
        major: u32::from_str_radix(major, 16).ok()?,
        minor: u32::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        path: path.to_string(),
        ..MappingSample::default()
    })
}

/// Parses `maps` text into file-backed mappings (inode ≠ 0), without smaps fields.
pub fn parse_maps(path: &Path, text: &str) -> Result<Vec<MappingSample>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let m = parse_header(line).ok_or_else(|| CollectError::parse(path, i + 1, line))?;
        if m.inode != 0 {
            out.push(m);
        }
    }
    Ok(out)
}

fn is_header(line: &str) -> bool {
    line.split_once('-')
        .is_some_and(|(a, _)| !a.is_empty() && a.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Parses `smaps` text, keeping only the VMAs whose file is in `wanted`.
pub fn parse_smaps(
    path: &Path,
    text: &str,
    wanted: &HashSet<FileKey>,
) -> Result<Vec<MappingSample>> {
    let mut out = Vec::new();
    let mut current: Option<MappingSample> = None;
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        if !is_header(line) {
            let Some(m) = current.as_mut() else {
                return Err(CollectError::parse(path, i + 1, line));
            };
            if line.starts_with("VmFlags") || line.starts_with("THPeligible") {
                continue;
            }
            let (key, rest) = line
                .split_once(':')
                .ok_or_else(|| CollectError::parse(path, i + 1, line))?;
            let mut parts = rest.split_whitespace();
            let value: u64 = parts
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| CollectError::parse(path, i + 1, line))?;
            let bytes = match parts.next() {
                Some("kB") => value.checked_mul(1024),
                _ => Some(value),
            }
            .ok_or_else(|| CollectError::parse(path, i + 1, line))?;
            let slot = match key {
                "Rss" => &mut m.rss_bytes,
                "Pss" => &mut m.pss_bytes,
                "Shared_Clean" => &mut m.shared_clean_bytes,
                "Shared_Dirty" => &mut m.shared_dirty_bytes,
                "Private_Clean" => &mut m.private_clean_bytes,
                "Private_Dirty" => &mut m.private_dirty_bytes,
                "Anonymous" => &mut m.anonymous_bytes,
                "FilePmdMapped" => &mut m.file_pmd_mapped_bytes,
                "Swap" => &mut m.swap_bytes,
                _ => continue,
            };
            *slot = Some(bytes);
        } else {
            let m = parse_header(line).ok_or_else(|| CollectError::parse(path, i + 1, line))?;
            if let Some(done) = current.take() {
                if wanted.contains(&done.key()) {
                    out.push(done);
                }
            }
            current = Some(m);
        }
    }
    if let Some(done) = current.take() {
        if wanted.contains(&done.key()) {
            out.push(done);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0010000000 r--s 00000000 fd:01 1234                       /models/m.gguf
Size:             262144 kB
KernelPageSize:        4 kB
Rss:              262144 kB
Pss:              131072 kB
Shared_Clean:     262144 kB
Shared_Dirty:          0 kB
Private_Clean:         0 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
FilePmdMapped:      2048 kB
Swap:                  0 kB
THPeligible:    0
VmFlags: rd sh mr mw me ms sd
7f0010000000-7f0010001000 rw-p 00000000 00:00 0 
Size:                  4 kB
Rss:                   4 kB
Anonymous:             4 kB
VmFlags: rd wr mr mw me ac sd
7f0020000000-7f0020400000 rw-p 00100000 fd:01 1234                       /models/m (deleted)
Rss:                4096 kB
Private_Dirty:      1024 kB
Anonymous:          1024 kB
";

    #[test]
    fn smaps_keeps_only_wanted_files() {
        let wanted: HashSet<_> = [FileKey {
            major: 0xfd,
            minor: 1,
            inode: 1234,
        }]
        .into();
        let maps = parse_smaps(Path::new("/proc/1/smaps"), SMAPS, &wanted).unwrap();
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].rss_bytes, Some(256 << 20));
        assert_eq!(maps[0].pss_bytes, Some(128 << 20));
        assert_eq!(maps[0].file_pmd_mapped_bytes, Some(2 << 20));
        assert!(maps[0].perms.shared && !maps[0].perms.write);
        assert_eq!(maps[0].path, "/models/m.gguf");
        assert_eq!(maps[1].anonymous_bytes, Some(1 << 20));
        assert_eq!(maps[1].offset_bytes, 0x100000);
        assert_eq!(maps[1].path, "/models/m (deleted)");
        assert!(!maps[1].perms.shared && maps[1].perms.write);
        // Fields a kernel does not print stay unknown.
        assert_eq!(maps[1].file_pmd_mapped_bytes, None);
    }

    #[test]
    fn maps_skips_anonymous_and_reports_bad_lines() {
        let text = "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n\
                    7ffd000-7ffe000 rw-p 00000000 00:00 0                  [stack]\n";
        let maps = parse_maps(Path::new("maps"), text).unwrap();
        assert_eq!(maps.len(), 1);
        assert_eq!(maps[0].major, 8);
        assert_eq!(maps[0].minor, 2);
        let err = parse_maps(Path::new("/proc/9/maps"), "zz-yy r--p\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed line 1 of '/proc/9/maps': 'zz-yy r--p'"
        );
    }

    #[test]
    fn smaps_field_before_header_is_an_error() {
        let err = parse_smaps(Path::new("s"), "Rss: 4 kB\n", &HashSet::new()).unwrap_err();
        assert!(err.to_string().contains("line 1"));
    }
}
