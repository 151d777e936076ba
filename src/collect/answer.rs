//! Reads of files other processes named, under a deadline: a filesystem that does not
//! answer (a hung NFS server, a stopped FUSE daemon, a gcsfuse mount that lost its
//! network) costs one file's count, never the scan.
//!
//! A system call stuck in a filesystem (`D` state, `request_wait_answer` for FUSE) cannot
//! be cancelled, so each such read runs on a helper thread ([`within`]) and the caller
//! waits at most [`deadline`]. A helper that misses it is abandoned: it finishes on its
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
}

/// A filesystem that did not answer a read of `path` in `waited`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnswering {
    pub path: PathBuf,
    pub waited: Duration,
}

impl std::fmt::Display for NotAnswering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "'{}': the filesystem did not answer in {}",
            self.path.display(),
            seconds(self.waited)
        )
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

/// Runs `f` (a read of `path`, at `place`) on a helper thread and waits for it at most
/// [`deadline`]. `Err` when it did not answer in time, or at once when an earlier helper
/// at `place` is still stuck.
pub fn within<T: Send + 'static>(
    place: Place,
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NotAnswering> {
    let limit = deadline();
    let not = |waited| NotAnswering {
        path: path.to_path_buf(),
        waited,
    };
    if stuck(&place) {
        return Err(not(limit));
    }
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Ok(mut o) = OUT.lock() {
        o.push((id, place, Instant::now()));
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("twofold-fs".into())
        .spawn(move || {
            let r = f();
            if let Ok(mut o) = OUT.lock() {
                o.retain(|e| e.0 != id);
            }
            let _ = tx.send(r);
        });
    if spawned.is_err() {
        // No thread to spare: said as not answering rather than blocking here.
        if let Ok(mut o) = OUT.lock() {
            o.retain(|e| e.0 != id);
        }
        return Err(not(Duration::ZERO));
    }
    rx.recv_timeout(limit).map_err(|_| not(limit))
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
    fn seconds_are_said_plainly() {
        assert_eq!(seconds(Duration::from_secs(2)), "2 s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
    }
}
