//! Files seen through an overlayfs mount, resolved to the inode that holds their bytes.
//!
//! A file read through an overlay (`merged/model.bin`) has one page cache: the real
//! inode's, the upper layer's file once it was copied up, else the lower layer's. Yet
//! `stat(2)` of the merged path and `/proc/PID/maps` of a mapping of it both give the
//! overlay's device (an anonymous `0:N`) with its inode number (measured on Linux 6.18:
//! `maps` shows `00:28 10010924` where the lower file is `fe:00 10010924`; before kernel
//! commit 3efdc78fdc21 `maps` showed the real inode instead), and `cachestat` of the
//! overlay file sees an empty page cache (0% for a file 100% resident through its lower
//! path). So one file would be two, and the merged one wrongly cold.
//!
//! The real file is found from the overlay's mount options in `mountinfo` (`upperdir`,
//! `lowerdir`, `lowerdir+`): the path inside the overlay (from the mount that holds the
//! path, in the namespace of the process that names it) under the upper layer, else under
//! each lower layer in order; the first layer that has it is the one the overlay shows.
//! It is taken only when its size, mtime and ctime (to the nanosecond) are those `stat`
//! gives through the overlay (which reports the real inode's); otherwise (metacopy,
//! renamed directories, a layer this namespace cannot reach) the overlay's identity is
//! kept, as before. See <https://docs.kernel.org/filesystems/overlayfs.html>.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sample::FileKey;

/// The file that holds an overlay file's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Real {
    pub key: FileKey,
    pub path: PathBuf,
}

/// One mount from `mountinfo`, with its layers when it is an overlay.
#[derive(Debug, Clone, PartialEq)]
struct Mount {
    majmin: (u32, u32),
    root: PathBuf,
    mount_point: PathBuf,
    /// Upper, then the lower layers top to bottom (`None`: not an overlay).
    layers: Option<Vec<PathBuf>>,
}

/// Resolves overlay files for one procfs root, remembering each overlay inode's answer
/// (shared by the clones of a [`super::process::ProcReader`]).
#[derive(Debug, Default)]
pub struct Overlays {
    proc_root: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `PROC/self/mountinfo`, parsed when first needed.
    ours: Option<Vec<Mount>>,
    /// Each overlay inode's real file (`None`: none found).
    resolved: HashMap<FileKey, Option<Real>>,
}

impl Overlays {
    pub fn new(proc_root: &Path) -> Overlays {
        Overlays {
            proc_root: proc_root.to_path_buf(),
            state: Mutex::default(),
        }
    }

    /// The identity of the file `key` that process `pid` names `path`: the real file's
    /// when `key` is an overlay file's, else `key`. Only anonymous devices (major 0) are
    /// looked at; the answer per inode is remembered.
    pub fn translate(&self, pid: i32, key: FileKey, path: &str) -> FileKey {
        if key.major != 0 || !path.starts_with('/') {
            return key;
        }
        self.real(pid, key, path).map_or(key, |r| r.key)
    }

    /// The real file behind the overlay file `key` that process `pid` names `path`.
    pub fn real(&self, pid: i32, key: FileKey, path: &str) -> Option<Real> {
        if key.major != 0 {
            return None;
        }
        if let Some(r) = self.state.lock().ok()?.resolved.get(&key) {
            return r.clone();
        }
        let r = self.resolve(pid, key, path);
        if let Ok(mut s) = self.state.lock() {
            s.resolved.insert(key, r.clone());
        }
        r
    }

    /// The real file behind `path` as process `pid` names it, when that is an overlay
    /// file.
    pub fn real_at(&self, pid: i32, path: &str) -> Option<Real> {
        // Only a path on an overlay (in the process's mount table: nothing is asked of
        // the file's own filesystem, which may be a mount that does not answer).
        if let Some(t) = super::mounts::table(&self.proc_root, Some(pid)) {
            let plain = Path::new(super::reopen::strip_deleted(path));
            if super::mounts::mount_of(&t, plain).is_some_and(|m| m.fs_type != "overlay") {
                return None;
            }
        }
        let seen = super::reopen::in_root(&self.proc_root, pid, path);
        let key = super::reopen::identity(&stat_within(&seen)?);
        self.real(pid, key, path)
    }

    fn ours(&self) -> Vec<Mount> {
        let Ok(mut s) = self.state.lock() else {
            return Vec::new();
        };
        s.ours
            .get_or_insert_with(|| {
                std::fs::read_to_string(self.proc_root.join("self/mountinfo"))
                    .map(|t| parse(&t))
                    .unwrap_or_default()
            })
            .clone()
    }

    fn resolve(&self, pid: i32, key: FileKey, path: &str) -> Option<Real> {
        let majmin = (key.major, key.minor);
        let ours = self.ours();
        // The mount is a superblock's: known to the host, or only inside the process's
        // namespace (then its mountinfo tells).
        let known = ours.iter().any(|m| m.majmin == majmin);
        if known
            && !ours
                .iter()
                .any(|m| m.majmin == majmin && m.layers.is_some())
        {
            return None;
        }
        let theirs = std::fs::read_to_string(self.proc_root.join(format!("{pid}/mountinfo")))
            .map(|t| parse(&t))
            .unwrap_or_default();
        let overlay = |m: &Mount| m.majmin == majmin && m.layers.is_some();
        if !theirs.iter().chain(ours.iter()).any(overlay) {
            return None;
        }
        let seen = super::reopen::in_root(&self.proc_root, pid, path);
        let meta = stat_within(&seen)?;
        if super::reopen::identity(&meta) != key {
            return None;
        }
        // The path inside the overlay: from the process's own mounts first.
        let all: Vec<&Mount> = theirs.iter().chain(ours.iter()).collect();
        real_in(
            &all,
            majmin,
            Path::new(super::reopen::strip_deleted(path)),
            &meta,
        )
    }
}

/// The real file of `path` (as named in the namespace of `mounts`' first entries), an
/// overlay file on `majmin` whose `stat` is `meta`.
fn real_in(
    mounts: &[&Mount],
    majmin: (u32, u32),
    path: &Path,
    meta: &std::fs::Metadata,
) -> Option<Real> {
    let layers = mounts
        .iter()
        .find(|m| m.majmin == majmin)
        .and_then(|m| m.layers.as_ref())?;
    let holder = mounts
        .iter()
        .filter(|m| m.majmin == majmin && path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())?;
    let rel = path.strip_prefix(&holder.mount_point).ok()?;
    let inside = holder
        .root
        .join(rel)
        .strip_prefix("/")
        .map(Path::to_path_buf)
        .ok()?;
    for layer in layers {
        let candidate = layer.join(&inside);
        let c = candidate.clone();
        let place = super::answer::Place::of(&candidate);
        let Ok(Ok(m)) =
            super::answer::within(place, &candidate, move || std::fs::symlink_metadata(c))
        else {
            continue;
        };
        // The first layer that has it is the one the overlay shows.
        let same = m.is_file()
            && m.len() == meta.len()
            && (m.mtime(), m.mtime_nsec()) == (meta.mtime(), meta.mtime_nsec())
            && (m.ctime(), m.ctime_nsec()) == (meta.ctime(), meta.ctime_nsec());
        return same.then(|| Real {
            key: super::reopen::identity(&m),
            path: candidate,
        });
    }
    None
}

/// The real file behind `path` as named here (a path the user gave), when it is an
/// overlay file; `meta` is its `stat`.
pub fn real_here(proc_root: &Path, path: &Path, meta: &std::fs::Metadata) -> Option<Real> {
    let key = super::reopen::identity(meta);
    if key.major != 0 {
        return None;
    }
    let ours = std::fs::read_to_string(proc_root.join("self/mountinfo"))
        .map(|t| parse(&t))
        .ok()?;
    let p = path.to_path_buf();
    let abs = super::answer::within(super::answer::Place::of(path), path, move || {
        std::fs::canonicalize(p)
    })
    .ok()?
    .ok()?;
    let all: Vec<&Mount> = ours.iter().collect();
    real_in(&all, (key.major, key.minor), &abs, meta)
}

/// `stat(2)` of `path` under the deadline ([`super::answer`]).
fn stat_within(path: &Path) -> Option<std::fs::Metadata> {
    super::answer::metadata(super::answer::Place::of(path), path)
        .ok()?
        .ok()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits a `lowerdir` value into layers: `:` separates them (`\:` is a colon in a
/// name), `::` starts the data-only layers (looked up by the overlay, never by path).
fn lower_layers(v: &str) -> Vec<PathBuf> {
    let v = v.split("::").next().unwrap_or("");
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            ':' => out.push(PathBuf::from(std::mem::take(&mut cur))),
            c => cur.push(c),
        }
    }
    out.push(PathBuf::from(cur));
    out.retain(|p| !p.as_os_str().is_empty());
    out
}

/// Parses `mountinfo` text; malformed lines are skipped.
fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let f: Vec<&str> = left.split(' ').collect();
    let (maj, min) = f.get(2)?.split_once(':')?;
    let mut r = right.splitn(3, ' ');
    let fs_type = r.next()?;
    let _source = r.next()?;
    let options = r.next().unwrap_or("");
    let layers = (fs_type == "overlay").then(|| {
        let (mut upper, mut lower) = (Vec::new(), Vec::new());
        for o in options.split(',') {
            let o = unescape(o);
            match o.split_once('=') {
                Some(("upperdir", v)) => upper.push(PathBuf::from(v)),
                Some(("lowerdir", v)) => lower.extend(lower_layers(v)),
                Some(("lowerdir+", v)) => lower.push(PathBuf::from(v)),
                _ => {}
            }
        }
        upper.extend(lower);
        upper
    });
    Some(Mount {
        majmin: (maj.parse().ok()?, min.parse().ok()?),
        root: PathBuf::from(unescape(f.get(3)?)),
        mount_point: PathBuf::from(unescape(f.get(4)?)),
        layers,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn overlay_layers_are_read_from_mountinfo() {
        let text = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
47 27 0:40 / /tmp/o/merged rw,relatime - overlay overlay rw,lowerdir=/tmp/o/l1:/tmp/a\\:b::/tmp/data,upperdir=/tmp/o/up,workdir=/tmp/o/w,uuid=on
48 27 0:41 /sub /tmp/o\\040x rw - overlay overlay rw,lowerdir+=/l/one,lowerdir+=/l/two
49 27 0:42 / /dev/shm rw - tmpfs tmpfs rw
";
        let m = parse(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].layers, None);
        assert_eq!(m[1].majmin, (0, 40));
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/o/merged"));
        assert_eq!(
            m[1].layers.as_deref().unwrap(),
            [
                PathBuf::from("/tmp/o/up"),
                PathBuf::from("/tmp/o/l1"),
                PathBuf::from("/tmp/a:b")
            ]
        );
        assert_eq!(m[2].root, PathBuf::from("/sub"));
        assert_eq!(m[2].mount_point, PathBuf::from("/tmp/o x"));
        assert_eq!(
            m[2].layers.as_deref().unwrap(),
            [PathBuf::from("/l/one"), PathBuf::from("/l/two")]
        );
        assert_eq!(m[3].layers, None);
    }

    /// The first layer that has the path is taken, and only when `stat` through the
    /// overlay agrees with it (here a stand-in: the lower file's own metadata).
    #[test]
    fn the_first_layer_that_has_it_and_agrees_is_the_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let (up, low) = (dir.path().join("up"), dir.path().join("low"));
        std::fs::create_dir_all(up.join("m")).unwrap();
        std::fs::create_dir_all(low.join("m")).unwrap();
        std::fs::write(low.join("m/a.bin"), b"lower").unwrap();
        std::fs::write(low.join("m/b.bin"), b"lower b").unwrap();
        std::fs::write(up.join("m/b.bin"), b"upper b, copied up").unwrap();
        let mount = Mount {
            majmin: (0, 40),
            root: PathBuf::from("/"),
            mount_point: PathBuf::from("/merged"),
            layers: Some(vec![up.clone(), low.clone()]),
        };
        let all = [&mount];
        let a = std::fs::metadata(low.join("m/a.bin")).unwrap();
        let r = real_in(&all, (0, 40), Path::new("/merged/m/a.bin"), &a).unwrap();
        assert_eq!(r.path, low.join("m/a.bin"));
        assert_eq!(r.key, crate::collect::reopen::identity(&a));
        // b is in the upper layer: its lower file is hidden, and does not agree.
        let b_low = std::fs::metadata(low.join("m/b.bin")).unwrap();
        assert_eq!(
            real_in(&all, (0, 40), Path::new("/merged/m/b.bin"), &b_low),
            None
        );
        let b_up = std::fs::metadata(up.join("m/b.bin")).unwrap();
        let r = real_in(&all, (0, 40), Path::new("/merged/m/b.bin"), &b_up).unwrap();
        assert_eq!(r.path, up.join("m/b.bin"));
        // Another device, or a path outside the mount: nothing.
        assert_eq!(
            real_in(&all, (0, 41), Path::new("/merged/m/a.bin"), &a),
            None
        );
        assert_eq!(
            real_in(&all, (0, 40), Path::new("/other/m/a.bin"), &a),
            None
        );
    }
}
