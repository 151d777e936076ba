//! Reads of files other processes named, under a deadline: a filesystem that does not
//! answer (a hung NFS server, a stopped FUSE daemon, a gcsfuse mount that lost its
//! network) costs one file's count, never the scan.
//!
//! A system call stuck in a filesystem (`D` state, `request_wait_answer` for FUSE) cannot
//! be cancelled, so each such read runs on a helper thread ([`within`]) and the caller
//! waits at most [`deadline`] (reads on a local disk or memory filesystem, [`LOCAL`], run
//! in place). A helper that misses it is abandoned: it finishes on its
//! own whenever the filesystem answers. Until then its filesystem (the device, or the
//! path where the device is not known yet) counts as not answering: a later read there
//! returns [`NotAnswering`] at once, without a thread, so a `serve` that collects every
//! 15 s holds at most one helper per hung filesystem, however long it stays hung.
//!
//! FUSE: opening a file on most FUSE filesystems drops its page cache (the kernel
//! invalidates it unless the daemon answers the open with `FOPEN_KEEP_CACHE`), so a file
//! on one ([`is_fuse`], `statfs(2)`'s `f_type`) is never opened to measure it.
//! Kernel documentation: <https://www.kernel.org/doc/html/latest/filesystems/fuse.html>.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a read of a file may take before its filesystem counts as not answering.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// `statfs(2)`'s `f_type` of FUSE (and virtiofs, `fuseblk`): `FUSE_SUPER_MAGIC`.
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// [`DEADLINE`], or `TWOFOLD_FS_DEADLINE` (seconds) where set.
pub fn deadline() -> Duration {
    std::env::var("TWOFOLD_FS_DEADLINE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(DEADLINE, Duration::from_secs_f64)
}

/// Where a read goes: a device (`major:minor` as `st_dev` encodes it), or a path whose
/// device is not known yet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Place {
    Device(u64),
    Path(PathBuf),
}

impl Place {
    pub fn of_key(key: crate::sample::FileKey) -> Place {
        Place::Device(libc::makedev(key.major, key.minor))
    }

    /// Where `path` is, found without asking its filesystem anything: a descriptor or
    /// mapping of a process (`/proc/PID/fd/N`, `/proc/PID/map_files/A-B`) by a `statx` of
    /// the link with `AT_STATX_DONT_SYNC` ([`stat_cached`]); a path in a process's root
    /// (`/proc/PID/root/P`) by the mount of `P` in that process's mount table; any other
    /// path by the mount that holds it here ([`super::mounts::mount_of`]). The path
    /// itself where none of these tells.
    pub fn of(path: &Path) -> Place {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let dev = match proc_parts(&abs) {
            Some((_, "fd" | "map_files", _)) => stat_cached(&abs).ok().map(|s| s.st_dev),
            Some((pid, "root", rest)) => {
                let t = super::mounts::table(Path::new("/proc"), Some(pid));
                let inside = Path::new("/").join(rest);
                t.and_then(|t| super::mounts::mount_of(&t, &inside).map(|m| m.dev))
            }
            Some(_) => None,
            None => super::mounts::table(Path::new("/proc"), None)
                .and_then(|t| super::mounts::mount_of(&t, &abs).map(|m| m.dev)),
        };
        dev.map_or(Place::Path(abs), Place::Device)
    }
}

/// `/proc/PID/WHAT/REST` of the live procfs: (pid, what, rest).
fn proc_parts(path: &Path) -> Option<(i32, &str, &Path)> {
    let rest = path.strip_prefix("/proc").ok()?;
    let mut c = rest.components();
    let pid = match c.next()?.as_os_str().to_str()? {
        "self" | "thread-self" => std::process::id() as i32,
        n => n.parse().ok()?,
    };
    let what = c.next()?.as_os_str().to_str()?;
    Some((pid, what, c.as_path()))
}

/// `statx(2)` of `path` with `AT_STATX_DONT_SYNC`, as a `stat`: a network or FUSE
/// filesystem answers from the attributes it has cached rather than asking its server or
/// daemon (FUSE: `fuse_update_get_attr`; NFS: `nfs_getattr`). Through a procfs link
/// (`/proc/PID/fd/N`, `map_files`) no name is looked up on the file's filesystem either,
/// so it answers while that filesystem hangs; a path elsewhere is still looked up.
pub fn stat_cached(path: &Path) -> nix::Result<libc::stat> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| nix::errno::Errno::EINVAL)?;
    stat_cached_at(libc::AT_FDCWD, &c)
}

/// [`stat_cached`] of `name` relative to the directory `dir`.
pub fn stat_cached_at(dir: std::os::fd::RawFd, name: &std::ffi::CStr) -> nix::Result<libc::stat> {
    let mut sx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_INO | libc::STATX_SIZE;
    // SAFETY: `name` is a valid C string, `sx` a valid buffer of the size statx writes.
    let rc = unsafe {
        libc::statx(
            dir,
            name.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            mask,
            sx.as_mut_ptr(),
        )
    };
    nix::errno::Errno::result(rc)?;
    // SAFETY: statx succeeded and filled the buffer.
    let sx = unsafe { sx.assume_init() };
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_mode = u32::from(sx.stx_mode);
    st.st_dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    st.st_ino = sx.stx_ino;
    st.st_size = sx.stx_size as i64;
    Ok(st)
}

/// A filesystem that did not answer a read of `path` in `waited` (or, `crowded`, a read
/// not tried: [`MAX_STUCK`] reads of filesystems that did not answer are still out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnswering {
    pub path: PathBuf,
    pub waited: Duration,
    pub crowded: bool,
}

/// What every sentence of a filesystem that did not answer says (how a reason is typed).
pub use crate::sample::unsearched::DID_NOT_ANSWER;

/// Whether `e` is a read that did not answer in time ([`NotAnswering`] as an I/O error).
pub fn is_not_answering(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut && e.get_ref().is_some_and(|i| i.is::<NotAnswering>())
}

impl std::fmt::Display for NotAnswering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.crowded {
            return write!(
                f,
                "'{}': not read: {MAX_STUCK} reads where {DID_NOT_ANSWER} are still waiting",
                self.path.display()
            );
        }
        write!(
            f,
            "'{}': {DID_NOT_ANSWER} in {}",
            self.path.display(),
            seconds(self.waited)
        )
    }
}

impl NotAnswering {
    /// The sentence without the path, for a line that names it already.
    pub fn unnamed(&self) -> String {
        let named = self.to_string();
        let head = format!("'{}': ", self.path.display());
        named.strip_prefix(&head).unwrap_or(&named).to_string()
    }
}

impl From<NotAnswering> for std::io::Error {
    fn from(e: NotAnswering) -> Self {
        std::io::Error::new(std::io::ErrorKind::TimedOut, e)
    }
}

impl std::error::Error for NotAnswering {}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if (s - s.round()).abs() < 0.05 {
        format!("{:.0} s", s.round())
    } else {
        format!("{s:.1} s")
    }
}

/// Helpers not finished: id → (where, since when).
static OUT: Mutex<Vec<(u64, Place, Instant)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a helper at `place` is still out after its deadline (that filesystem is not
/// answering).
pub fn stuck(place: &Place) -> bool {
    let limit = deadline();
    OUT.lock()
        .map(|o| {
            o.iter()
                .any(|(_, p, since)| p == place && since.elapsed() >= limit)
        })
        .unwrap_or(false)
}

/// How many helpers are out now (finished ones are gone).
pub fn outstanding() -> usize {
    OUT.lock().map(|o| o.len()).unwrap_or(0)
}

/// Helpers out past their deadline (stuck in a filesystem) at most: past it, a read of
/// any other filesystem is refused at once rather than risk one more stuck thread.
pub const MAX_STUCK: usize = 16;

/// How many helpers are out past their deadline now.
pub fn stuck_count() -> usize {
    let limit = deadline();
    OUT.lock()
        .map(|o| o.iter().filter(|e| e.2.elapsed() >= limit).count())
        .unwrap_or(0)
}

/// Runs `f` (a read of `path`, at `place`) on a helper thread and waits for it at most
/// [`deadline`]. `Err` when it did not answer in time, or at once when an earlier helper
/// at `place` is still stuck.
pub fn within<T: Send + 'static>(
    place: Place,
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NotAnswering> {
    if is_local(&place) {
        return Ok(f());
    }
    let limit = deadline();
    let not = |waited, crowded| NotAnswering {
        path: path.to_path_buf(),
        waited,
        crowded,
    };
    if stuck(&place) {
        return Err(not(limit, false));
    }
    if stuck_count() >= MAX_STUCK {
        return Err(not(Duration::ZERO, true));
    }
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Ok(mut o) = OUT.lock() {
        o.push((id, place, Instant::now()));
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let submitted = helpers::submit(Box::new(move || {
        let r = f();
        if let Ok(mut o) = OUT.lock() {
            o.retain(|e| e.0 != id);
        }
        let _ = tx.send(r);
    }));
    if submitted.is_err() {
        // No thread to spare: said as not answering rather than blocking here.
        if let Ok(mut o) = OUT.lock() {
            o.retain(|e| e.0 != id);
        }
        return Err(not(Duration::ZERO, true));
    }
    rx.recv_timeout(limit).map_err(|_| not(limit, false))
}

/// Filesystems on this machine's own disks or memory, which answer or fail but do not wait
/// on a server or a daemon: their reads run on the caller's thread. On `bench/host.sh`
/// (205 model files on ext4) handing each read to a helper cost more than the reads:
/// 4,000 handovers a second in `record --interval 1s`, 92% of its system time in `futex`.
const LOCAL: &[&str] = &[
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "f2fs",
    "vfat",
    "exfat",
    "tmpfs",
    "ramfs",
    "hugetlbfs",
];

/// Whether `place` is a device of a [`LOCAL`] filesystem mounted in this process's
/// namespace (procfs's mount table): a place not found there (a path whose device is
/// unknown, a device only a container mounts) is not. The local devices are kept for
/// [`LOCAL_AGE`]: asking the mount table itself (a `readlink` of the namespace, a lookup)
/// for each of a snapshot's thousands of reads was 6% of `top` on `bench/host.sh`.
pub fn is_local(place: &Place) -> bool {
    static KEPT: Mutex<Option<(Instant, Vec<u64>)>> = Mutex::new(None);
    let Place::Device(dev) = place else {
        return false;
    };
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if kept
        .as_ref()
        .is_none_or(|(at, _)| at.elapsed() >= LOCAL_AGE)
    {
        let devs = super::mounts::table(Path::new("/proc"), None).map_or_else(Vec::new, |t| {
            t.iter()
                .filter(|m| LOCAL.contains(&m.fs_type.as_str()))
                .map(|m| m.dev)
                .collect()
        });
        *kept = Some((Instant::now(), devs));
    }
    kept.as_ref().is_some_and(|(_, devs)| devs.contains(dev))
}

/// How long [`local`] keeps this process's local devices (as the mount table is kept).
const LOCAL_AGE: Duration = Duration::from_secs(2);

/// The helper threads of [`within`], kept between reads: a snapshot of a host with 200
/// model files makes thousands of such reads, and a thread started for each (its stack
/// mapped, advised and unmapped) cost more than the reads (621 threads a second in
/// `record --interval 1s` on `bench/host.sh`). A helper waits for the next read up to
/// [`helpers::IDLE`], then ends; one stuck in a filesystem is simply not idle, and the
/// next read starts another (at most [`MAX_STUCK`] are stuck, as before).
mod helpers {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Mutex, OnceLock};
    use std::time::Duration;

    pub type Job = Box<dyn FnOnce() + Send>;

    /// How long an idle helper waits for a read before it ends.
    pub const IDLE: Duration = Duration::from_secs(30);

    struct Pool {
        tx: Mutex<mpsc::Sender<Job>>,
        rx: Mutex<mpsc::Receiver<Job>>,
        /// Helpers waiting for a job and not yet claimed by a submitter.
        idle: AtomicUsize,
    }

    fn pool() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            Pool {
                tx: Mutex::new(tx),
                rx: Mutex::new(rx),
                idle: AtomicUsize::new(0),
            }
        })
    }

    fn claim(idle: &AtomicUsize) -> bool {
        idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Hands `job` to an idle helper, or to a new one when none is idle.
    pub fn submit(job: Job) -> std::io::Result<()> {
        let p = pool();
        if !claim(&p.idle) {
            std::thread::Builder::new()
                .name("twofold-fs".into())
                .spawn(|| work(pool()))?;
        }
        p.tx.lock()
            .map_err(|_| std::io::Error::other("helper queue poisoned"))?
            .send(job)
            .map_err(|_| std::io::Error::other("helper queue closed"))
    }

    fn work(p: &Pool) {
        loop {
            let next = match p.rx.lock() {
                Ok(rx) => rx.recv_timeout(IDLE),
                Err(_) => return,
            };
            match next {
                Ok(job) => {
                    job();
                    p.idle.fetch_add(1, Ordering::AcqRel);
                }
                // Idle too long: end, unless a submitter has just counted on this helper.
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if claim(&p.idle) {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// Whether the file at `path` is on a FUSE filesystem (`statfs(2)`, under the deadline).
pub fn is_fuse(place: Place, path: &Path) -> Result<bool, NotAnswering> {
    let p = path.to_path_buf();
    within(place, path, move || {
        nix::sys::statfs::statfs(&p)
            .map(|s| s.filesystem_type().0 == FUSE_SUPER_MAGIC)
            .unwrap_or(false)
    })
}

/// Why a file on FUSE is not opened to read its residency.
pub fn fuse_why(path: &Path) -> String {
    format!(
        "'{}' is on a FUSE filesystem, where opening a file drops its page cache",
        path.display()
    )
}

/// `std::fs::metadata(path)` under the deadline.
pub fn metadata(
    place: Place,
    path: &Path,
) -> Result<std::io::Result<std::fs::Metadata>, NotAnswering> {
    let p = path.to_path_buf();
    within(place, path, move || std::fs::metadata(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_that_hangs_is_abandoned_and_its_place_answers_at_once_after() {
        let place = Place::Path("/nowhere/hung".into());
        let (release, wait) = mpsc::channel::<()>();
        let t = Instant::now();
        let r = within(
            place.clone(),
            Path::new("/nowhere/hung/m.gguf"),
            move || {
                let _ = wait.recv();
            },
        );
        let e = r.unwrap_err();
        assert!(t.elapsed() >= deadline());
        assert_eq!(
            e.to_string(),
            "'/nowhere/hung/m.gguf': the filesystem did not answer in 2 s"
        );
        // Still stuck: refused at once, no second helper.
        let t = Instant::now();
        assert!(within(place.clone(), Path::new("/nowhere/hung/n"), || ()).is_err());
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(stuck(&place));
        // Once it answers, the place is tried again.
        release.send(()).unwrap();
        let t = Instant::now();
        while stuck(&place) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(within(place, Path::new("/nowhere/hung/n"), || 7), Ok(7));
    }

    #[test]
    fn a_place_is_found_from_procfs_without_asking_the_filesystem() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let dev = f.metadata().unwrap().dev();
        // Through a descriptor's link: the file's own device (from cached attributes).
        let fd = format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd());
        assert_eq!(Place::of(Path::new(&fd)), Place::Device(dev));
        let st = stat_cached(Path::new(&fd)).unwrap();
        assert_eq!((st.st_size, st.st_dev), (1, dev));
        // A path, and the same path through a process's root: its mount's device.
        let t = super::super::mounts::table(Path::new("/proc"), None).unwrap();
        let mount = super::super::mounts::mount_of(&t, &p).unwrap().dev;
        assert_eq!(Place::of(&p), Place::Device(mount));
        let rooted = Path::new("/proc/self/root").join(p.strip_prefix("/").unwrap());
        assert_eq!(Place::of(&rooted), Place::Device(mount));
    }

    #[test]
    fn reads_on_a_local_disk_run_in_place_and_helpers_are_kept() {
        use std::thread::{current, ThreadId};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        std::fs::write(&p, b"x").unwrap();
        let t = super::super::mounts::table(Path::new("/proc"), None).unwrap();
        let fs = super::super::mounts::mount_of(&t, &p)
            .unwrap()
            .fs_type
            .clone();
        let here = current().id();
        let on = |place: Place| within(place, &p, || current().id()).unwrap();
        if LOCAL.contains(&fs.as_str()) {
            assert_eq!(on(Place::of(&p)), here, "{fs}");
        } else {
            assert_ne!(on(Place::of(&p)), here, "{fs}");
        }
        // A place whose filesystem is not known: a helper, the same few for many reads.
        let away: Vec<ThreadId> = (0..100)
            .map(|_| on(Place::Path("/nowhere/answers".into())))
            .collect();
        assert!(away.iter().all(|t| *t != here));
        let mut distinct = away.clone();
        distinct.sort_by_key(|t| format!("{t:?}"));
        distinct.dedup();
        assert!(
            distinct.len() <= 4,
            "{} helper threads for 100 reads",
            distinct.len()
        );
    }

    #[test]
    fn seconds_are_said_plainly() {
        assert_eq!(seconds(Duration::from_secs(2)), "2 s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
    }
}
