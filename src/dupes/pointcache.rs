//! The index's points of each model file, kept per version of the file: read once, then
//! shared by every proof group of a run (the small files of a host are in several) and,
//! on disk, by every later `scan`, `top`, `serve` and `record`.
//!
//! A file's points are the fingerprints [`super::grid`] reads at its pieces (tensor ×
//! copy kind). They depend only on the file's bytes, its pieces and the pair spacing `M`;
//! points at spacing `M` include those at every coarser spacing (`k mod 2M ∈ {0, 1}` is
//! nested for powers of two), so an entry serves any grid whose `M` is at least its own.
//! An entry is used only for the same version of the file (device, inode, size, mtime,
//! ctime: rewritten in place or replaced, it is read again) and the same pieces.
//!
//! On disk: one file per (file, pieces) in `TWOFOLD_INDEX_CACHE` (`off`: none), by default
//! `/var/cache/twofold/index` as root, else `$XDG_CACHE_HOME/twofold/index`. The directory
//! is used only when it is the user's and no one else may write to it; an entry is
//! checked whole (xxh3) before use, written to a temporary name and renamed, and the
//! directory is kept under [`DISK_MAX`] bytes, oldest entries first. Nothing here ever
//! writes to a model file.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::index::{is_point, CopyKind, Piece, Slot};
use crate::sample::FileKey;

/// One file's version: key, size, mtime and ctime (ns).
pub type Version = (FileKey, u64, i128, i128);

/// The version of an open file.
pub fn version(key: FileKey, m: &std::fs::Metadata) -> Version {
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    (
        key,
        m.len(),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    )
}

/// One point of a file: the piece (within the file), the point's number in it, its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct FilePoint {
    pub piece: u32,
    pub k: u32,
    pub key: u64,
}

/// A file's points at spacing `every`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilePoints {
    pub every: u64,
    pub points: Vec<FilePoint>,
}

/// The "pieces" key a file's fingerprint is kept under (no pieces key of tensors is
/// this: theirs are hashes of their offsets).
pub const FINGERPRINT: u64 = u64::from_le_bytes(*b"twinprnt");
/// Changes whenever the points of the same bytes would differ (the hash, the windows).
const SCHEME: u32 = 1;
const MAGIC: &[u8; 8] = b"TWOFOLDX";
/// Header: magic, scheme, 0, size, mtime (i128), ctime (i128), pieces, every, count.
const HEADER: usize = 8 + 4 + 4 + 8 + 16 + 16 + 8 + 8 + 8;
/// The directory is kept under this many bytes.
pub const DISK_MAX: u64 = 256 << 20;

/// What a run's grids share: the points read or loaded so far, and the directory.
#[derive(Default)]
pub struct PointCache {
    dir: Option<PathBuf>,
    mem: Mutex<HashMap<(Version, u64), Arc<FilePoints>>>,
    /// Files whose points were taken from here / read from the file, since it was made.
    pub stats: Mutex<(u64, u64)>,
    wrote: std::sync::atomic::AtomicBool,
}

/// The directory entries go to, if one may be used.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("TWOFOLD_INDEX_CACHE") {
        Some(v) if v.is_empty() || v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None if nix::unistd::geteuid().is_root() => Some(PathBuf::from("/var/cache/twofold/index")),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("twofold/index")),
    }
}

/// `dir`, created (mode 0700) if missing, when it is a directory of the user's that no
/// one else may write to.
fn usable(dir: &Path) -> Option<PathBuf> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .ok()?;
    }
    let m = fs::metadata(dir).ok()?;
    let mine = m.uid() == nix::unistd::geteuid().as_raw();
    (m.is_dir() && mine && m.mode() & 0o022 == 0).then(|| dir.to_path_buf())
}

impl PointCache {
    /// A cache with the default directory (see the module docs).
    pub fn new() -> PointCache {
        PointCache::with_dir(default_dir().as_deref())
    }

    /// A cache on `dir` (`None`: in memory only).
    pub fn with_dir(dir: Option<&Path>) -> PointCache {
        PointCache {
            dir: dir.and_then(usable),
            mem: Mutex::default(),
            stats: Mutex::default(),
            wrote: Default::default(),
        }
    }

    fn path(&self, v: &Version, pieces: u64) -> Option<PathBuf> {
        let k = v.0;
        let name = format!(
            "{:x}-{:x}-{:x}-{pieces:016x}.tfx",
            k.major, k.minor, k.inode
        );
        self.dir.as_ref().map(|d| d.join(name))
    }

    /// The points of this version of a file with these pieces, at spacing `every` or
    /// finer.
    pub fn get(&self, v: &Version, pieces: u64, every: u64) -> Option<Arc<FilePoints>> {
        let hit = {
            let mem = self.mem.lock().ok()?;
            mem.get(&(*v, pieces)).cloned()
        };
        let found = match hit {
            Some(p) => Some(p),
            None => {
                let p = Arc::new(self.load(v, pieces)?);
                self.mem.lock().ok()?.insert((*v, pieces), p.clone());
                Some(p)
            }
        };
        let found = found.filter(|p| p.every <= every)?;
        if let Ok(mut s) = self.stats.lock() {
            s.0 += 1;
        }
        Some(found)
    }

    /// Keeps points just read (on disk too, unless a finer entry is there).
    pub fn put(&self, v: &Version, pieces: u64, points: FilePoints) {
        if let Ok(mut s) = self.stats.lock() {
            s.1 += 1;
        }
        let finer = self
            .mem
            .lock()
            .ok()
            .and_then(|m| m.get(&(*v, pieces)).map(|p| p.every < points.every))
            .unwrap_or(false);
        if finer {
            return;
        }
        self.store(v, pieces, &points);
        if let Ok(mut m) = self.mem.lock() {
            m.insert((*v, pieces), Arc::new(points));
        }
    }

    /// The fingerprint of this version of a file's bytes ([`super::twins::fingerprint`]),
    /// if kept: an entry of its own "pieces" ([`FINGERPRINT`]) holding its two halves.
    pub fn fingerprint(&self, v: &Version) -> Option<u128> {
        let p = self.get(v, FINGERPRINT, u64::MAX)?;
        match p.points.as_slice() {
            [lo, hi] => Some(u128::from(lo.key) | u128::from(hi.key) << 64),
            _ => None,
        }
    }

    /// Keeps the fingerprint of this version of a file's bytes.
    pub fn put_fingerprint(&self, v: &Version, print: u128) {
        let half = |k: u32, key: u64| FilePoint { piece: 0, k, key };
        let points = vec![half(0, print as u64), half(1, (print >> 64) as u64)];
        self.put(v, FINGERPRINT, FilePoints { every: 1, points });
    }

    fn load(&self, v: &Version, pieces: u64) -> Option<FilePoints> {
        let bytes = fs::read(self.path(v, pieces)?).ok()?;
        decode(&bytes, v, pieces)
    }

    fn store(&self, v: &Version, pieces: u64, points: &FilePoints) {
        let Some(path) = self.path(v, pieces) else {
            return;
        };
        let bytes = encode(v, pieces, points);
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let written = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|_| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        self.wrote.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for PointCache {
    /// The directory is pruned once, after the run's writes.
    fn drop(&mut self) {
        if let (Some(dir), true) = (&self.dir, *self.wrote.get_mut()) {
            prune(dir, DISK_MAX);
        }
    }
}

fn encode(v: &Version, pieces: u64, p: &FilePoints) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + p.points.len() * 16 + 8);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&SCHEME.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&v.1.to_le_bytes());
    b.extend_from_slice(&v.2.to_le_bytes());
    b.extend_from_slice(&v.3.to_le_bytes());
    b.extend_from_slice(&pieces.to_le_bytes());
    b.extend_from_slice(&p.every.to_le_bytes());
    b.extend_from_slice(&(p.points.len() as u64).to_le_bytes());
    b.extend_from_slice(bytemuck::cast_slice(&p.points));
    let sum = xxhash_rust::xxh3::xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// An entry's points, if it is whole and of this version and pieces.
fn decode(b: &[u8], v: &Version, pieces: u64) -> Option<FilePoints> {
    if b.len() < HEADER + 8 {
        return None;
    }
    let (body, sum) = b.split_at(b.len() - 8);
    if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != sum {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap_or_default());
    let i128_at = |o: usize| i128::from_le_bytes(body[o..o + 16].try_into().unwrap_or_default());
    let scheme = u32::from_le_bytes(body[8..12].try_into().ok()?);
    let same = &body[..8] == MAGIC
        && scheme == SCHEME
        && u64_at(16) == v.1
        && i128_at(24) == v.2
        && i128_at(40) == v.3
        && u64_at(56) == pieces;
    let (every, n) = (u64_at(64), u64_at(72) as usize);
    let data = &body[HEADER..];
    if !same || every == 0 || data.len() != n.checked_mul(16)? {
        return None;
    }
    let points = data
        .chunks_exact(16)
        .map(bytemuck::pod_read_unaligned::<FilePoint>)
        .collect();
    Some(FilePoints { every, points })
}

/// Removes temporaries a killed run left (a minute old), then the oldest entries until
/// `dir` holds at most `max` bytes.
fn prune(dir: &Path, max: u64) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut entries: Vec<(i64, u64, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            let tmp = e.file_name().to_string_lossy().contains(".tmp.");
            if tmp && now - m.mtime() > 60 {
                let _ = fs::remove_file(e.path());
                return None;
            }
            (m.is_file() && !tmp).then(|| (m.mtime(), m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, len, path) in entries {
        if total <= max {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// A file's pieces, as the points depend on them: (file offset, bytes in memory, kind).
pub fn pieces_key(pieces: impl Iterator<Item = (u64, u64, CopyKind)>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (off, len, kind) in pieces {
        h.update(&off.to_le_bytes());
        h.update(&len.to_le_bytes());
        // One byte per dtype kind, as ever (entries kept before repacks stay valid); a
        // repack adds its layout's name and row length.
        match kind {
            CopyKind::Repacked { layout, row_bytes } => {
                h.update(&[0xff]);
                h.update(layout.spec().name.as_bytes());
                h.update(&row_bytes.to_le_bytes());
            }
            CopyKind::AmxPacked { layout, row_bytes } => {
                h.update(&[0xfe]);
                h.update(layout.spec().name.as_bytes());
                h.update(&row_bytes.to_le_bytes());
            }
            other => h.update(&[dtype_code(other)]),
        }
    }
    h.digest()
}

/// The byte a kind of copy other than a repack added to the key (its declaration order).
fn dtype_code(kind: CopyKind) -> u8 {
    match kind {
        CopyKind::Identical => 0,
        CopyKind::WidenedF16 => 1,
        CopyKind::WidenedBf16 => 2,
        CopyKind::F32ToF16 => 3,
        CopyKind::F32ToBf16 => 4,
        CopyKind::Bf16ToF16 => 5,
        CopyKind::F16ToBf16 => 6,
        CopyKind::Repacked { .. } => 0xff,
        CopyKind::AmxPacked { .. } => 0xfe,
    }
}

/// What [`super::grid::Grid::build_cached`] takes from a cache, per file of the grid: the
/// index of its first piece (pieces are in file order), its version and pieces key (when
/// known), and its points when kept.
pub(super) struct Kept {
    first: Vec<usize>,
    ids: Vec<Option<(Version, u64)>>,
    pub got: Vec<Option<Arc<FilePoints>>>,
}

pub(super) fn kept_points(
    files: &[&fs::File],
    pieces: &[Piece],
    every: u64,
    cache: Option<&PointCache>,
) -> Kept {
    let mut first = vec![0; files.len()];
    let mut keys = vec![None; files.len()];
    let mut at = 0;
    for run in pieces.chunk_by(|a, b| a.file == b.file) {
        let fi = run[0].file;
        first[fi] = at;
        at += run.len();
        if cache.is_some() {
            let of = run.iter().map(|p| (p.file_offset, p.mem_len, p.kind));
            keys[fi] = Some(pieces_key(of));
        }
    }
    let ids: Vec<Option<(Version, u64)>> = match cache {
        None => vec![None; files.len()],
        Some(_) => files
            .iter()
            .zip(&keys)
            .map(|(f, k)| {
                let m = f.metadata().ok()?;
                let key = FileKey::from_dev(m.dev(), m.ino());
                Some((version(key, &m), (*k)?))
            })
            .collect(),
    };
    let got = ids
        .iter()
        .map(|id| {
            let (v, k) = id.as_ref()?;
            cache?.get(v, *k, every)
        })
        .collect();
    Kept { first, ids, got }
}

/// The grid's points in one pass's order: those kept, at spacing `every`, and those read
/// (`read`, per file), which are kept in `cache`. A kept piece none of whose points at
/// this spacing carries information is marked in `low_entropy`, as a read one is.
pub(super) fn merge_points(
    failed: &[bool],
    kept: &Kept,
    read: Vec<Vec<Slot>>,
    every: u64,
    cache: Option<&PointCache>,
    low_entropy: &mut [bool],
) -> Vec<Slot> {
    let mut keys = Vec::new();
    for (fi, (failed, read)) in failed.iter().zip(read).enumerate() {
        if *failed {
            continue;
        }
        let first = kept.first[fi];
        match &kept.got[fi] {
            Some(p) => {
                for fp in p
                    .points
                    .iter()
                    .filter(|fp| is_point(u64::from(fp.k), every))
                {
                    let piece = first + fp.piece as usize;
                    low_entropy[piece] = false;
                    keys.push(Slot {
                        key: fp.key,
                        piece: piece as u32,
                        k: fp.k,
                    });
                }
            }
            None => {
                if let (Some(c), Some((v, k))) = (cache, &kept.ids[fi]) {
                    let points = read
                        .iter()
                        .map(|s| FilePoint {
                            piece: s.piece - first as u32,
                            k: s.k,
                            key: s.key,
                        })
                        .collect();
                    c.put(v, *k, FilePoints { every, points });
                }
                keys.extend(read);
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(mtime: i128) -> Version {
        (FileKey::from_dev(0x801, 42), 4096, mtime, 7)
    }

    fn version_of(inode: u64) -> Version {
        (FileKey::from_dev(0x801, inode), 4096, 1, 7)
    }

    fn points(every: u64) -> FilePoints {
        FilePoints {
            every,
            points: (0..100)
                .map(|i| FilePoint {
                    piece: i % 3,
                    k: i,
                    key: (u64::from(i) * 0x9E37) | 1,
                })
                .collect(),
        }
    }

    #[test]
    fn an_entry_reads_back_only_for_its_version_pieces_and_a_coarser_spacing() {
        let dir = tempfile::tempdir().unwrap();
        let c = PointCache::with_dir(Some(dir.path()));
        c.put(&version(1), 9, points(2));
        // A new run: only the disk.
        let c = PointCache::with_dir(Some(dir.path()));
        assert_eq!(c.get(&version(1), 9, 4).as_deref(), Some(&points(2)));
        assert_eq!(c.get(&version(1), 9, 2).as_deref(), Some(&points(2)));
        assert!(c.get(&version(1), 9, 1).is_none(), "finer than kept");
        let c = PointCache::with_dir(Some(dir.path()));
        assert!(c.get(&version(2), 9, 4).is_none(), "the file changed");
        assert!(c.get(&version(1), 8, 4).is_none(), "other pieces");
    }

    #[test]
    fn a_damaged_entry_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let c = PointCache::with_dir(Some(dir.path()));
        c.put(&version(1), 9, points(2));
        let path = c.path(&version(1), 9).unwrap();
        let mut b = fs::read(&path).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 1;
        fs::write(&path, &b).unwrap();
        let c = PointCache::with_dir(Some(dir.path()));
        assert!(c.get(&version(1), 9, 4).is_none());
        fs::write(&path, &b[..HEADER]).unwrap();
        assert!(PointCache::with_dir(Some(dir.path()))
            .get(&version(1), 9, 4)
            .is_none());
    }

    #[test]
    fn the_directory_is_kept_under_its_bound_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let c = PointCache::with_dir(Some(dir.path()));
        for i in 0..4 {
            c.put(&version_of(i), 9, points(2));
        }
        let one = fs::metadata(c.path(&version_of(0), 9).unwrap())
            .unwrap()
            .len();
        prune(dir.path(), one * 2);
        let left = fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 2);
    }

    #[test]
    fn a_directory_others_may_write_to_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let c = PointCache::with_dir(Some(dir.path()));
        c.put(&version(1), 9, points(2));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        // In memory it still serves the run.
        assert!(c.get(&version(1), 9, 2).is_some());
    }
}
