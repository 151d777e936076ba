//! One file of interest measured: opened by one of its ways (its path, a holder's fd or
//! `map_files` entry) and its page-cache residency read ([`super::residency`]), on a
//! helper thread under [`super::answer`]'s deadline, and never where opening would drop
//! its page cache (FUSE, `statfs(2)`'s `f_type`).

use std::path::PathBuf;

use super::answer::{self, Place};
use super::decisions::Interest;
use super::reopen;
use super::residency::{self, Method};
use crate::sample::{FileKey, FileSample, ProcessSample, ResidencySample};

/// What the helper thread found.
struct Measured {
    /// What the name it is shown by names now (`None` when unknown).
    at_path: Option<FileKey>,
    size: Option<u64>,
    residency: Result<ResidencySample, String>,
    /// On FUSE: nothing was opened.
    fuse: bool,
}

/// The most bytes of `key` that one of `holders` maps (smaps `Rss` of its mappings): the
/// page cache holds at least that much of it.
pub fn mapped_bytes<'a>(
    holders: impl Iterator<Item = &'a ProcessSample>,
    key: FileKey,
) -> Option<u64> {
    holders
        .filter_map(|p| {
            let maps = p.mappings.iter().filter(|m| m.key() == key);
            maps.map(|m| m.rss_bytes).sum::<Option<u64>>()
        })
        .max()
}

/// The file's sample: its size, residency, and why either is unknown. `mapped`: what
/// its holders map of it ([`mapped_bytes`]), said where its residency is not read.
pub fn file_sample(
    key: FileKey,
    i: Interest,
    ways: Vec<PathBuf>,
    method: Method,
    mapped: Option<u64>,
) -> FileSample {
    let mut f = FileSample {
        key,
        deleted: i.shown.ends_with(reopen::DELETED),
        now_at_path: None,
        seen_as: Vec::new(),
        same_bytes: Vec::new(),
        path: i.shown.clone(),
        path_bytes: i.raw.clone(),
        size_bytes: i.size_bytes,
        residency: None,
        residency_error: None,
        unopened: None,
        explicit: i.explicit,
        store: i.store,
    };
    let shown = PathBuf::from(reopen::strip_deleted(&i.shown));
    let open_path = i.open_path;
    let measured = answer::within(Place::of_key(key), &shown, move || {
        measure(key, &open_path, &ways, method)
    });
    let m = match measured {
        Ok(m) => m,
        Err(e) => {
            let why = e.to_string();
            f.residency_error = Some(why.clone());
            f.unopened = Some(why);
            return f;
        }
    };
    f.now_at_path = m.at_path.filter(|k| *k != key);
    f.deleted |= f.now_at_path.is_some();
    if m.fuse {
        let why = answer::fuse_why(&shown);
        f.residency_error = Some(match mapped {
            Some(b) if b > 0 => format!(
                "not read: {why} (its holders map {} of it, so at least that much is cached)",
                crate::units::iec(b)
            ),
            _ => format!("not read: {why}"),
        });
        f.unopened = Some(why);
        return f;
    }
    if m.size.is_some() {
        f.size_bytes = m.size;
    }
    match m.residency {
        Ok(r) => f.residency = Some(r),
        Err(e) => f.residency_error = Some(e),
    }
    f
}

/// Runs on the helper thread: opens the first way that is the inode `key` (none on FUSE)
/// and reads its residency.
fn measure(
    key: FileKey,
    open_path: &std::path::Path,
    ways: &[PathBuf],
    method: Method,
) -> Measured {
    // Each way is opened and its identity taken from the same fstat that gives its size;
    // what the name it is shown by names now comes from that when it was opened.
    let mut at_path: Option<Option<FileKey>> = None;
    let mut fuse = false;
    let opened = reopen::open_inode(ways, key, |p| {
        if nix::sys::statfs::statfs(p)
            .is_ok_and(|s| s.filesystem_type().0 == answer::FUSE_SUPER_MAGIC)
        {
            fuse = true;
            return Err(std::io::Error::other("on FUSE: not opened"));
        }
        let r = residency::open(p);
        if let (true, Ok(o)) = (p == open_path, &r) {
            at_path = Some(Some(o.2));
        }
        let (file, size, k) = r.map_err(|e| match e {
            residency::ResidencyError::Open { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })?;
        Ok(((file, size), k))
    });
    let at_path = at_path.unwrap_or_else(|| {
        std::fs::metadata(open_path)
            .ok()
            .map(|m| reopen::identity(&m))
    });
    let (size, residency) = match opened {
        Ok(((file, size), path)) => (
            Some(size),
            residency::query(&file, &path, size, method)
                .map_err(|e| format!("{:#}", anyhow::Error::from(e))),
        ),
        Err(misses) => (None, Err(misses.describe())),
    };
    Measured {
        at_path,
        size,
        residency,
        fuse,
    }
}
