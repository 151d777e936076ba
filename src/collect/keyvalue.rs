//! A parser for the kernel's flat key/value files.
//!
//! Two shapes exist: `Key:   value kB` (`/proc/PID/status`, `/proc/PID/smaps_rollup`,
//! `/proc/meminfo`) and `key value` (`/proc/vmstat`, cgroup `memory.stat`). Values with a
//! `kB` suffix are converted to bytes here, at the reader boundary. Lines without a number
//! (`Name:  bash`) are skipped; a line that looks like a field but whose value does not
//! parse is an error naming the file and the line.

use std::path::Path;

use super::error::{CollectError, Result};

/// Visits each numeric field of `text`; `kB` values are passed as bytes.
///
/// `numeric_only` lists keys whose value must be numeric (a malformed value for them is
/// an error); other keys with non-numeric values are skipped silently, as the kernel mixes
/// text fields (`Name`, `State`, `Cpus_allowed_list`) with numeric ones.
pub fn for_each_field(
    path: &Path,
    text: &str,
    numeric_only: &[&str],
    mut visit: impl FnMut(&str, u64),
) -> Result<()> {
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let (key, rest) = match line.split_once(':') {
            Some((k, r)) if !k.contains(' ') => (k, r),
            _ => match line.split_once(char::is_whitespace) {
                Some((k, r)) => (k, r),
                None => return Err(CollectError::parse(path, line_no, line)),
            },
        };
        let mut parts = rest.split_whitespace();
        let Some(value) = parts.next() else {
            if numeric_only.contains(&key) {
                return Err(CollectError::parse(path, line_no, line));
            }
            continue;
        };
        let unit = parts.next();
        match value.parse::<u64>() {
            Ok(v) => {
                let bytes = match unit {
                    Some("kB") => v.checked_mul(1024),
                    None => Some(v),
                    Some(_) => None,
                };
                match bytes {
                    Some(b) => visit(key, b),
                    None if numeric_only.contains(&key) => {
                        return Err(CollectError::parse(path, line_no, line))
                    }
                    None => {}
                }
            }
            Err(_) if numeric_only.contains(&key) => {
                return Err(CollectError::parse(path, line_no, line))
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// Reads a flat key/value file into a map (values as [`for_each_field`] gives them).
pub fn read_map(path: &Path) -> Result<std::collections::BTreeMap<String, u64>> {
    let text = read_to_string(path)?;
    let mut map = std::collections::BTreeMap::new();
    for_each_field(path, &text, &[], |k, v| {
        map.insert(k.to_string(), v);
    })?;
    Ok(map)
}

/// Reads a whole small kernel file into a string.
/// Bytes that are not UTF-8 (a file name in `maps`, a `comm`: the kernel prints them as
/// they are) become U+FFFD: one odd name must not make a whole process unreadable.
pub fn read_to_string(path: &Path) -> Result<String> {
    with_text(path, |t| Ok(t.to_string()))
}

/// Reads a whole kernel file into this thread's scratch buffer and hands `parse` its text
/// (lossy UTF-8, as [`read_to_string`]). Nothing is allocated for the bytes: a collection
/// reads thousands of `status`, `maps` and `io` files, and a fresh buffer for each (then
/// its text) was a tenth of `serve`'s steady cost in malloc and free (perf, bench host).
pub fn with_text<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T>) -> Result<T> {
    with_bytes(path, |b| match std::str::from_utf8(b) {
        Ok(t) => parse(t),
        Err(_) => parse(&String::from_utf8_lossy(b)),
    })
    .map_err(|e| match e {
        Reading::Io(e) => CollectError::io(path, e),
        Reading::Parse(e) => e,
    })
}

/// Why [`with_bytes`] failed: the read, or what the caller made of the bytes.
pub enum Reading<E> {
    Io(std::io::Error),
    Parse(E),
}

/// The scratch buffer of [`with_bytes`] is kept up to this size between reads.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`read_kernel_file`] into this thread's scratch buffer, handed to `use_bytes` (a fresh
/// buffer where the scratch is in use: `use_bytes` itself reads another file).
pub fn with_bytes<T, E>(
    path: &Path,
    use_bytes: impl FnOnce(&[u8]) -> std::result::Result<T, E>,
) -> std::result::Result<T, Reading<E>> {
    SCRATCH.with(|cell| {
        let mut fresh = Vec::new();
        let mut kept = cell.try_borrow_mut();
        let buf = match kept.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut fresh,
        };
        let n = read_into(path, buf).map_err(Reading::Io)?;
        let out = use_bytes(&buf[..n]).map_err(Reading::Parse);
        if buf.len() > SCRATCH_KEPT {
            buf.truncate(SCRATCH_KEPT);
            buf.shrink_to_fit();
        }
        out
    })
}

/// Reads a whole file the kernel generates as it is read (procfs, sysfs, cgroupfs) in as
/// few `read`s as it takes: one 4 KiB read first (`status` and most such files whole),
/// where the usual loop starts with a 32-byte probe, and each read of `status` makes the
/// kernel generate the whole file again. It reads on to a read of 0: a file of many
/// records (`maps`, `smaps`) comes in short reads. (`stat` and `io`, one record each, are
/// read in one: `statfiles`.)
pub fn read_kernel_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let n = read_into(path, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// [`read_kernel_file`] into `buf` (grown as needed, never shrunk): the bytes read.
fn read_into(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut n = 0;
    loop {
        let got = f.read(&mut buf[n..])?;
        n += got;
        if got == 0 {
            return Ok(n);
        }
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Reads a file holding one number (cgroup `memory.current`); `max` gives `None`.
pub fn read_limit(path: &Path) -> Result<Option<u64>> {
    let text = read_to_string(path)?;
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| CollectError::parse(path, 1, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_not_utf8_is_read_lossily() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("maps");
        std::fs::write(&p, b"7f00-7f01 r--s 00000000 fd:01 12 /m\xff.gguf\n").unwrap();
        assert_eq!(
            read_to_string(&p).unwrap(),
            "7f00-7f01 r--s 00000000 fd:01 12 /m\u{fffd}.gguf\n"
        );
    }

    /// The scratch reader gives each file's bytes whole (a file larger than the first
    /// read, a shorter one after it: nothing of the longer one left over), a read inside
    /// another's parse gets its own buffer, and a missing file is an error naming it.
    #[test]
    fn scratch_reads_are_whole_nested_and_name_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let (long, short) = (dir.path().join("long"), dir.path().join("short"));
        let big: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&long, &big).unwrap();
        std::fs::write(&short, b"x\n").unwrap();
        assert_eq!(with_text(&long, |t| Ok(t.len())).unwrap(), big.len());
        assert_eq!(with_text(&short, |t| Ok(t.to_string())).unwrap(), "x\n");
        let nested = with_text(&long, |outer| {
            let inner = with_text(&short, |t| Ok(t.to_string()))?;
            Ok((outer.len(), inner))
        })
        .unwrap();
        assert_eq!(nested, (big.len(), "x\n".to_string()));
        // A kernel file, as the engine reads them.
        let status = with_text(Path::new("/proc/self/status"), |t| Ok(t.to_string())).unwrap();
        assert!(status.starts_with("Name:"), "{status}");
        let missing = dir.path().join("gone");
        let err = with_text(&missing, |t| Ok(t.len()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gone"), "{err}");
    }

    fn collect(text: &str, numeric: &[&str]) -> Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for_each_field(Path::new("/fixture"), text, numeric, |k, v| {
            out.push((k.to_string(), v))
        })?;
        Ok(out)
    }

    #[test]
    fn colon_kb_and_space_forms() {
        let got = collect("Name:\tcat\nVmRSS:\t  1024 kB\nRssAnon:  0 kB\n", &[]).unwrap();
        assert_eq!(
            got,
            vec![("VmRSS".into(), 1024 * 1024), ("RssAnon".into(), 0)]
        );
        let got = collect("anon 4096\nfile 8192\n", &[]).unwrap();
        assert_eq!(got, vec![("anon".into(), 4096), ("file".into(), 8192)]);
    }

    #[test]
    fn values_near_u64_limits() {
        let max = u64::MAX;
        let got = collect(&format!("total_rss {max}\n"), &[]).unwrap();
        assert_eq!(got[0].1, u64::MAX);
        // kB that would overflow as bytes is an error for a required field, not a wrap.
        let err = collect(&format!("Rss: {max} kB\n"), &["Rss"]).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn malformed_line_names_file_and_line() {
        let err = collect("Rss: 4 kB\nPss: x kB\n", &["Pss"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed line 2 of '/fixture': 'Pss: x kB'"
        );
        let err = collect("Rss: 4 kB\ngarbage\n", &[]).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn limit_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("memory.max");
        std::fs::write(&p, "max\n").unwrap();
        assert_eq!(read_limit(&p).unwrap(), None);
        std::fs::write(&p, "1073741824\n").unwrap();
        assert_eq!(read_limit(&p).unwrap(), Some(1 << 30));
        std::fs::write(&p, "lots\n").unwrap();
        assert!(read_limit(&p).is_err());
    }
}
