//! One file of interest measured: opened by one of its ways (its path, a holder's fd or
//! `map_files` entry) and its page-cache residency read ([`super::residency`]), on a
//! helper thread under [`super::answer`]'s deadline, and never where opening would drop
//! its page cache (FUSE, `statfs(2)`'s `f_type`).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use super::answer::{self, Place};
use super::decisions::Interest;
use super::heldfiles::{stamp, Opened, PagesNow, Since, Stamp};
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
    /// The `fstat` of what was measured, and the descriptor it was measured through while
    /// the file has a link left (to keep: [`super::heldfiles`]).
    opened: Option<(Stamp, Option<Arc<File>>)>,
    /// The residency with the page count it stands on (a kept file's).
    since: Option<Since>,
    /// How long the residency read took, where one was made.
    took: Option<std::time::Duration>,
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
/// `held`: the descriptor an earlier snapshot kept of it (then `ways` is not needed), and
/// its page count now. Returns what was measured, and the descriptor to keep.
pub fn file_sample(
    key: FileKey,
    i: Interest,
    ways: Vec<PathBuf>,
    method: Method,
    mapped: Option<u64>,
    (held, pages): (Option<Arc<File>>, Option<PagesNow>),
) -> (FileSample, Opened) {
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
    let place = Place::of_key(key);
    // What its name names now, where this gather saw it (else a `stat` of it).
    let named = i.named.then_some(key);
    let measured = answer::within(place.clone(), &shown, move || match held {
        Some(file) => measure_held(file, &open_path, named, pages, method),
        None => measure(key, &open_path, &ways, method),
    });
    let m = match measured {
        Ok(m) => m,
        Err(e) => {
            let why = e.to_string();
            f.residency_error = Some(why.clone());
            f.unopened = Some(why);
            return (f, Opened::default());
        }
    };
    let opened = match m.opened {
        Some((s, file)) => Opened {
            stamp: Some(s),
            file: file.filter(|_| answer::is_local(&place)),
            since: m.since,
            took: m.took,
        },
        None => Opened::default(),
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
        return (f, Opened::default());
    }
    if m.size.is_some() {
        f.size_bytes = m.size;
    }
    match m.residency {
        Ok(r) => f.residency = Some(r),
        Err(e) => f.residency_error = Some(e),
    }
    (f, opened)
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
        let (file, st) = residency::open_stat(p).map_err(|e| match e {
            residency::ResidencyError::Open { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })?;
        let k = FileKey::from_dev(st.st_dev, st.st_ino);
        if p == open_path {
            at_path = Some(Some(k));
        }
        Ok(((file, st), k))
    });
    let at_path = at_path.unwrap_or_else(|| path_names(open_path));
    match opened {
        Ok(((file, st), path)) => Measured {
            fuse,
            ..measured(file, st, &path, at_path, method)
        },
        Err(misses) => Measured {
            at_path,
            size: None,
            residency: Err(misses.describe()),
            fuse,
            opened: None,
            since: None,
            took: None,
        },
    }
}

/// The inode `path` names now (`None`: none, or unknown).
fn path_names(path: &std::path::Path) -> Option<FileKey> {
    std::fs::metadata(path).ok().map(|m| reopen::identity(&m))
}

/// Runs on the helper thread: the residency of a file kept open ([`super::heldfiles`])
/// through its descriptor; what its name, `open_path`, names by a `stat` unless `named`
/// (this gather saw it).
/// Its residency stands where its page count and stamp do ([`Since`]).
fn measure_held(
    file: Arc<File>,
    open_path: &std::path::Path,
    named: Option<FileKey>,
    pages: Option<PagesNow>,
    method: Method,
) -> Measured {
    use std::os::fd::AsRawFd;
    let at_path = named.or_else(|| path_names(open_path));
    match nix::sys::stat::fstat(file.as_raw_fd()) {
        Ok(st) => {
            let now = stamp(&st);
            if let Some(PagesNow {
                nrpages,
                since: Some(s),
            }) = &pages
            {
                if s.stands(now, *nrpages) {
                    return Measured {
                        at_path,
                        size: Some(st.st_size as u64),
                        residency: Ok(s.sample.clone()),
                        fuse: false,
                        opened: Some((now, (st.st_nlink > 0).then_some(file))),
                        since: Some(s.clone()),
                        took: None,
                    };
                }
            }
            let mut m = measured(file, st, open_path, at_path, method);
            // Kept for the next snapshot where `cachestat` counted the pages the iterator
            // did just before (nothing moved between the two).
            let ps = super::system::page_size();
            m.since = match (&m.residency, pages) {
                (Ok(r), Some(p)) if r.cached_bytes == p.nrpages * ps => Some(Since {
                    stamp: now,
                    nrpages: p.nrpages,
                    sample: r.clone(),
                    at: std::time::Instant::now(),
                }),
                _ => None,
            };
            m
        }
        Err(e) => Measured {
            at_path,
            size: None,
            residency: Err(format!(
                "fstat failed on '{}': {}",
                open_path.display(),
                std::io::Error::from(e)
            )),
            fuse: false,
            opened: None,
            since: None,
            took: None,
        },
    }
}

/// The residency of an open file whose `fstat` is `st`; the descriptor given back to keep
/// while the file has a link.
fn measured(
    file: impl Into<Arc<File>>,
    st: nix::sys::stat::FileStat,
    path: &std::path::Path,
    at_path: Option<FileKey>,
    method: Method,
) -> Measured {
    let file = file.into();
    let size = st.st_size as u64;
    let t = std::time::Instant::now();
    let residency = residency::query(&file, path, size, method)
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)));
    Measured {
        at_path,
        size: Some(size),
        residency,
        fuse: false,
        opened: Some((stamp(&st), (st.st_nlink > 0).then_some(file))),
        since: None,
        took: Some(t.elapsed()),
    }
}
