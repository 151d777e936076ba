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
    refuse_pseudo_fd(&file, path, what)?;
    Ok(file)
}

/// `statfs(2)` magic numbers (`include/uapi/linux/magic.h`) of file systems whose files
/// are kernel interfaces, never model bytes: `/proc/self/mem` is "regular" with size 0.
const PSEUDO_FS: &[(i64, &str)] = &[
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x6367_7270, "cgroup2"),
    (0x0027_e0eb, "cgroup"),
    (0x7363_6673, "securityfs"),
    (0xcafe_4a11, "bpf"),
    (0x6265_6570, "configfs"),
    (0x6c6f_6f70, "binderfs"),
    (0xde5e_81e4, "efivarfs"),
    (0x6165_676c, "pstore"),
];

/// `statfs(2)` f_type of tmpfs, which devtmpfs reports too.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether the mount holding device `dev` is devtmpfs (`/dev`), told from tmpfs
/// (`/dev/shm`, a legitimate home for a model) by `/proc/self/mountinfo`.
fn on_devtmpfs(dev: u64) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = format!(
        "{}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    text.lines().any(|l| {
        let mut f = l.split_whitespace();
        let dev_field = f.nth(2);
        let fstype = l
            .split(" - ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next());
        dev_field == Some(want.as_str()) && fstype == Some("devtmpfs")
    })
}

/// The name of the kernel-interface file system `f_type`/`dev` are on, if any.
fn pseudo_name(f_type: i64, dev: u64) -> Option<&'static str> {
    if let Some((_, name)) = PSEUDO_FS.iter().find(|(m, _)| *m == f_type) {
        return Some(name);
    }
    (f_type == TMPFS_MAGIC && on_devtmpfs(dev)).then_some("devtmpfs")
}

fn pseudo_error(path: &Path, what: &str, fs: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} '{}' is on {fs}, a kernel interface, not a model file",
        path.display()
    )
}

/// Refuses an open file on procfs, sysfs, devtmpfs and the like.
fn refuse_pseudo_fd(file: &File, path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(st) = nix::sys::statfs::fstatfs(file.as_fd()) else {
        return Ok(());
    };
    let dev = file.metadata().map(|m| m.dev()).unwrap_or(0);
    match pseudo_name(st.filesystem_type().0, dev) {
        Some(fs) => Err(pseudo_error(path, what, fs)),
        None => Ok(()),
    }
}

/// Refuses a path (a file or a directory to search) on procfs, sysfs, devtmpfs and the like.
/// Devices, FIFOs and sockets pass: the caller's own check names them as what they are.
/// Its `stat` and `statfs` run under the deadline ([`super::answer`]): a path on a mount
/// that does not answer is no kernel interface (those always answer), and is let through.
pub fn refuse_pseudo(path: &Path, what: &str) -> anyhow::Result<()> {
    let place = super::answer::Place::of(path);
    let p = path.to_path_buf();
    match super::answer::within(place.clone(), path, move || std::fs::metadata(&p).ok()) {
        Ok(Some(meta)) => refuse_pseudo_meta(path, what, place, &meta),
        _ => Ok(()),
    }
}

/// [`refuse_pseudo`] of a path whose `stat` the caller has (`meta`, following links, as
/// `statfs` does): its file system's type is its device's, asked once per device and kept
/// for [`PSEUDO_AGE`] (a long-lived engine checks every file named at every snapshot).
pub fn refuse_pseudo_meta(
    path: &Path,
    what: &str,
    place: super::answer::Place,
    meta: &std::fs::Metadata,
) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if !meta.is_file() && !meta.is_dir() {
        return Ok(());
    }
    let dev = meta.dev();
    let now = std::time::Instant::now();
    let seen = |kept: &PseudoKept| {
        kept.get(&dev)
            .filter(|(at, _)| now.duration_since(*at) < PSEUDO_AGE)
            .map(|(_, v)| *v)
    };
    let kept = seen(&PSEUDO_KEPT.lock().unwrap_or_else(|e| e.into_inner()));
    let fs = match kept {
        Some(v) => v,
        None => {
            let p = path.to_path_buf();
            let asked = super::answer::within(place, path, move || {
                nix::sys::statfs::statfs(&p)
                    .ok()
                    .map(|s| s.filesystem_type().0)
            });
            let Some(f_type) = asked.ok().flatten() else {
                return Ok(());
            };
            let v = pseudo_name(f_type, dev);
            let mut kept = PSEUDO_KEPT.lock().unwrap_or_else(|e| e.into_inner());
            kept.retain(|_, (at, _)| now.duration_since(*at) < PSEUDO_AGE);
            kept.insert(dev, (now, v));
            v
        }
    };
    match fs {
        Some(fs) => Err(pseudo_error(path, what, fs)),
        None => Ok(()),
    }
}

/// How long a device's file system type is trusted (a device number freed by an unmount
/// and taken by a new mount is asked again after it).
const PSEUDO_AGE: std::time::Duration = std::time::Duration::from_secs(10);

type PseudoKept = std::collections::HashMap<u64, (std::time::Instant, Option<&'static str>)>;

/// [`pseudo_name`]'s verdicts by device, with when each was taken.
static PSEUDO_KEPT: std::sync::LazyLock<std::sync::Mutex<PseudoKept>> =
    std::sync::LazyLock::new(Default::default);

/// The error for a model path that is neither a regular file nor a directory.
pub fn not_file_or_dir(path: &Path, meta: &std::fs::Metadata) -> anyhow::Error {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    let kind = if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file or directory"
    };
    anyhow::anyhow!(
        "'{}' is {kind}: give a model file or a directory",
        path.display()
    )
}

/// A model path named on the command line (`scan`, `top`, `record`, `trace`, `serve`):
/// it exists, is a regular file or a directory, and is not on a kernel-interface file
/// system. Checked before any work or output.
///
/// Under the deadline ([`super::answer`]): a path whose filesystem does not answer is
/// refused with that sentence. A file on FUSE is not opened (opening it there drops its
/// page cache): its `stat` says it is regular.
pub fn check_target(path: &Path) -> anyhow::Result<()> {
    use super::answer::{self, Place};
    let place = Place::of(path);
    let meta = answer::metadata(place.clone(), path)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("cannot access '{}'", path.display()))?;
    if meta.is_file() {
        if answer::is_fuse(place.clone(), path).map_err(|e| anyhow::anyhow!("{e}"))? {
            return Ok(());
        }
        // Opens without blocking, as a FIFO renamed under us must not hang.
        let p = path.to_path_buf();
        answer::within(place, path, move || open_regular(&p, "file").map(drop))
            .map_err(|e| anyhow::anyhow!("{e}"))??;
        return Ok(());
    }
    if !meta.is_dir() {
        return Err(not_file_or_dir(path, &meta));
    }
    refuse_pseudo(path, "directory")
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;

/// A pid named on the command line: it runs and is not a kernel thread (which maps no
/// file and holds no copy). `proc` is the procfs root.
pub fn check_pid(proc: &Path, pid: i32) -> anyhow::Result<()> {
    let stat = match std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) {
        Ok(s) => s,
        Err(_) if pid <= 0 || !proc.join(pid.to_string()).is_dir() => {
            bail!("no process with pid '{pid}'")
        }
        // Readable or not, it exists: what it holds is decided later.
        Err(_) => return Ok(()),
    };
    let Some(close) = stat.rfind(')') else {
        return Ok(());
    };
    let comm = stat
        .find('(')
        .map(|o| &stat[o + 1..close])
        .unwrap_or_default();
    let flags: u64 = stat[close + 1..]
        .split_whitespace()
        .nth(6)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    let state = stat[close + 1..].split_whitespace().next();
    if state == Some("Z") || state == Some("X") {
        bail!(
            "pid '{pid}' ('{}') has exited (a zombie maps nothing)",
            comm
        );
    }
    if flags & PF_KTHREAD != 0 {
        bail!(
            "pid '{pid}' is the kernel thread '{}': it maps no files",
            comm
        );
    }
    Ok(())
}

/// [`check_target`] of every path and [`check_pid`] of every pid, on the live host.
pub fn check_targets(paths: &[std::path::PathBuf], pids: &[i32]) -> anyhow::Result<()> {
    for p in paths {
        check_target(p)?;
    }
    for &pid in pids {
        check_pid(Path::new("/proc"), pid)?;
    }
    Ok(())
}

/// Checks that `path` is a regular file without opening it for long.
///
/// Under the deadline ([`super::answer`]): a filesystem that does not answer is said.
pub fn check_regular(path: &Path, what: &str) -> anyhow::Result<u64> {
    let (p, w) = (path.to_path_buf(), what.to_string());
    let place = super::answer::Place::of(path);
    super::answer::within(place, path, move || {
        Ok(open_regular(&p, &w)?.metadata()?.len())
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?
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
    super::system::host_memory(Path::new("/proc"))
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
    fn kernel_interface_files_are_refused() {
        let err = open_regular(Path::new("/proc/self/mem"), "file").unwrap_err();
        assert_eq!(
            err.to_string(),
            "file '/proc/self/mem' is on procfs, a kernel interface, not a model file"
        );
        let err = check_target(Path::new("/sys/kernel")).unwrap_err();
        assert!(err.to_string().contains("is on sysfs"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        std::fs::write(&p, b"x").unwrap();
        assert!(check_target(&p).is_ok());
        assert!(check_target(dir.path()).is_ok());
        // Asked again, each device's verdict kept: the same answers.
        for _ in 0..2 {
            let err = refuse_pseudo(Path::new("/proc/self/status"), "file").unwrap_err();
            assert!(err.to_string().contains("is on procfs"), "{err}");
            assert!(refuse_pseudo(&p, "file").is_ok());
            assert!(refuse_pseudo(Path::new("/sys/kernel"), "directory").is_err());
        }
    }

    #[test]
    fn kernel_threads_and_missing_pids_are_named() {
        // kthreadd is pid 2 on every Linux since 2.6 (not so in a pid namespace).
        let comm = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
        if comm.trim() != "kthreadd" {
            println!("SKIPPED: pid 2 is not kthreadd here (a pid namespace)");
            return;
        }
        let err = check_pid(Path::new("/proc"), 2).unwrap_err().to_string();
        assert_eq!(
            err,
            "pid '2' is the kernel thread 'kthreadd': it maps no files"
        );
        let err = check_pid(Path::new("/proc"), 99_999_999).unwrap_err();
        assert_eq!(err.to_string(), "no process with pid '99999999'");
        assert!(check_pid(Path::new("/proc"), std::process::id() as i32).is_ok());
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
