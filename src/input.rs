//! Files a user names on the command line: opened without blocking, checked to be regular
//! files, read with a size bound; and room checks before twofold writes a file of a size
//! the user chose.
//!
//! `open(2)` of a FIFO for reading blocks until a writer appears, and `/dev/zero` never
//! ends, so every user-named input goes through [`open_regular`] (`O_NONBLOCK` open, then
//! `fstat(2)` of that very fd: no race between the check and the open). Free space comes
//! from `statvfs(3)`, available memory from `MemAvailable` in `/proc/meminfo`
//! (<https://docs.kernel.org/filesystems/proc.html#meminfo>).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context};

use crate::units::iec;

/// Largest JSON document twofold reads (a saved probe report is a few hundred KiB).
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// What a non-regular file is, for messages.
fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a pipe"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// The error for a path that exists but is not a regular file, e.g.
/// `--model '/tmp' is a directory, not a regular file`.
fn not_regular(path: &Path, what: &str, ft: std::fs::FileType) -> anyhow::Error {
    let k = kind(ft);
    if k == "not a regular file" {
        anyhow::anyhow!("{what} '{}' is not a regular file", path.display())
    } else {
        anyhow::anyhow!("{what} '{}' is {k}, not a regular file", path.display())
    }
}

/// Opens `path` read-only without blocking (a FIFO opens at once) and refuses anything but
/// a regular file. `what` names the input in messages (`--model`, `file`).
pub fn open_regular(path: &Path, what: &str) -> anyhow::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("cannot open {what} '{}'", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot access {what} '{}'", path.display()))?;
    if !meta.is_file() {
        return Err(not_regular(path, what, meta.file_type()));
    }
    Ok(file)
}

/// Checks that `path` is a regular file without opening it for long.
pub fn check_regular(path: &Path, what: &str) -> anyhow::Result<u64> {
    Ok(open_regular(path, what)?.metadata()?.len())
}

/// Reads a regular file of at most `max` bytes.
pub fn read_bounded(path: &Path, what: &str, max: u64) -> anyhow::Result<Vec<u8>> {
    let file = open_regular(path, what)?;
    let mut buf = Vec::new();
    // One byte more than allowed tells "exactly max" from "more".
    file.take(max + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read {what} '{}'", path.display()))?;
    if buf.len() as u64 > max {
        bail!(
            "{what} '{}' is larger than the '{}' twofold reads",
            path.display(),
            iec(max)
        );
    }
    Ok(buf)
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir)
        .with_context(|| format!("cannot read the free space of '{}'", dir.display()))?;
    Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Refuses to write `size` bytes (`what`, e.g. `--size`) into `dir` unless the file
/// system has that much free and, as the file will be read into memory, `MemAvailable`
/// (`mem_available`, when known) holds `size × in_memory`.
pub fn check_room(
    what: &str,
    size: u64,
    dir: &Path,
    free: u64,
    mem_available: Option<u64>,
    in_memory: u64,
) -> anyhow::Result<()> {
    if size > free {
        bail!(
            "{what} '{}' is more than the {} free on '{}'",
            iec(size),
            iec(free),
            dir.display()
        );
    }
    if let Some(avail) = mem_available {
        let need = size.saturating_mul(in_memory);
        if need > avail {
            let times = if in_memory > 1 {
                format!(" ({in_memory} times over)")
            } else {
                String::new()
            };
            bail!(
                "{what} '{}' needs {}{times} of memory but MemAvailable is {}",
                iec(size),
                iec(need),
                iec(avail)
            );
        }
    }
    Ok(())
}

/// The host's `MemAvailable` (unknown if `/proc/meminfo` cannot be read).
pub fn mem_available() -> Option<u64> {
    crate::campaign::sandbox::host_memory(Path::new("/proc"))
        .ok()
        .map(|m| m.0)
}

/// [`check_room`] on the live host for a file about to be written at `path`.
pub fn ensure_room(what: &str, size: u64, path: &Path, in_memory: u64) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    check_room(
        what,
        size,
        dir,
        free_bytes(dir)?,
        mem_available(),
        in_memory,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = open_regular(&fifo, "--model").unwrap_err().to_string();
        assert!(err.contains("is a pipe, not a regular file"), "{err}");
        let err = read_bounded(&fifo, "--report", 10).unwrap_err().to_string();
        assert!(err.starts_with("--report '"), "{err}");
    }

    #[test]
    fn directories_devices_and_missing_files_are_named() {
        let err = open_regular(Path::new("/"), "file").unwrap_err();
        assert_eq!(
            err.to_string(),
            "file '/' is a directory, not a regular file"
        );
        let err = read_bounded(Path::new("/dev/zero"), "--report", 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--report '/dev/zero' is a device, not a regular file"
        );
        let err = open_regular(Path::new("/no/such"), "--watch").unwrap_err();
        assert_eq!(err.to_string(), "cannot open --watch '/no/such'");
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_bounded(&p, "--report", 10).unwrap().len(), 10);
        let err = read_bounded(&p, "--report", 9).unwrap_err().to_string();
        assert!(err.contains("is larger than the '9 B'"), "{err}");
    }

    #[test]
    fn room_is_checked_on_disk_and_in_memory() {
        let d = Path::new("/tmp");
        let g = 1u64 << 30;
        assert!(check_room("--size", g, d, 2 * g, Some(4 * g), 2).is_ok());
        let err = check_room("--size", 60 << 40, d, 40 * g, None, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--size '60.0 TiB' is more than the 40.0 GiB free on '/tmp'"
        );
        let err = check_room("--size", 3 * g, d, 40 * g, Some(4 * g), 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--size '3.0 GiB' needs 6.0 GiB (2 times over) of memory but MemAvailable is 4.0 GiB"
        );
        assert!(check_room("--size", u64::MAX, d, u64::MAX, Some(g), 2).is_err());
    }
}
