//! Files of interest with the same bytes ("twins"): one checkpoint in two caches, a model
//! copied to an offload folder. Each is its own inode with its own page cache, so bytes
//! cached in both are in memory twice, though no process holds a copy of the other.
//!
//! Two files are twins when they have the same size and the same [`fingerprint`]: the
//! hash of [`BLOCKS`] 4 KiB blocks spread evenly over the file, its first and its last
//! block, read without changing its page cache ([`super::filebytes::FileBytes`]). Only
//! files of a size another file of interest has are read, and a fingerprint is kept per
//! version of a file (device, inode, size, mtime, ctime) in the [`super::pointcache`], so
//! it is read once per version, not once per snapshot. Each file's count stays its own:
//! the link is said beside it, never summed into it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::filebytes::FileBytes;
use super::pointcache::{self, PointCache};
use crate::collect::heldfiles::HeldFiles;
use crate::collect::reopen;
use crate::sample::{FileKey, Sample, PAGE_BYTES as PAGE};

/// Blocks spread over a file besides its last one (the first is block 0).
pub const BLOCKS: u64 = 64;

/// The offsets of the blocks a fingerprint reads: 0, [`BLOCKS`] − 1 more spread evenly
/// over the file, and the last block (page-aligned, ascending, once each).
pub fn block_offsets(size: u64) -> Vec<u64> {
    if size == 0 {
        return Vec::new();
    }
    let last = (size - 1) / PAGE * PAGE;
    let mut v: Vec<u64> = (0..BLOCKS)
        .map(|k| (last / BLOCKS * k) / PAGE * PAGE)
        .chain([last])
        .collect();
    v.dedup();
    v
}

/// The fingerprint of a file's bytes: its size and the blocks of [`block_offsets`]
/// (xxh3, 128 bits); `None` for an empty file or a read that failed.
pub fn fingerprint(b: &FileBytes) -> Option<u128> {
    if b.size == 0 {
        return None;
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&b.size.to_le_bytes());
    let mut buf = Vec::new();
    for off in block_offsets(b.size) {
        buf.resize(PAGE.min(b.size - off) as usize, 0);
        b.read_exact_at(&mut buf, off).ok()?;
        h.update(&off.to_le_bytes());
        h.update(&buf);
    }
    Some(h.digest128())
}

/// Removes from `keys`/`inputs` each file whose bytes are another's (same size, and the
/// same [`fingerprint`]: blocks spread over it, read without touching the
/// page cache); keeps the one not in shared memory (device major 0: tmpfs, shmem).
/// Returns (removed, kept) pairs.
pub(super) fn same_bytes(
    keys: &mut Vec<FileKey>,
    inputs: &mut Vec<(
        FileBytes,
        Vec<crate::container::Tensor>,
        crate::container::Format,
    )>,
) -> Vec<(FileKey, FileKey)> {
    // Each file's fingerprint, read once and only where another file has its size.
    let mut sizes = std::collections::HashMap::<u64, usize>::new();
    for (b, ..) in inputs.iter() {
        *sizes.entry(b.size).or_default() += 1;
    }
    let mut print: Vec<Option<u128>> = inputs
        .iter()
        .map(|(b, ..)| (sizes[&b.size] > 1).then(|| fingerprint(b)).flatten())
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < keys.len() {
        let mut removed = false;
        for j in 0..keys.len() {
            if i == j || print[i].is_none() || print[i] != print[j] {
                continue;
            }
            // Drop i for j: i in shared memory and j not, or both alike and i later.
            let shm = |k: FileKey| k.major == 0;
            let drop_i = shm(keys[i]) && !shm(keys[j]) || (shm(keys[i]) == shm(keys[j]) && i > j);
            if drop_i {
                out.push((keys[i], keys[j]));
                keys.remove(i);
                inputs.remove(i);
                print.remove(i);
                removed = true;
                break;
            }
        }
        if !removed {
            i += 1;
        }
    }
    // A kept file's index moved when an earlier one was removed: resolve by key later.
    out
}

/// The fingerprint of the file `key` of `sample`, from `points` when this version of it
/// was read before; opened through its path or its holders ([`reopen::ways`]).
fn print_of(
    proc_root: &Path,
    sample: &Sample,
    i: usize,
    points: &PointCache,
    held: Option<&HeldFiles>,
) -> Option<u128> {
    let f = &sample.files[i];
    if f.unopened.is_some() {
        return None;
    }
    // The version this snapshot measured (a live engine's): a fingerprint kept of it is
    // this file's, without a `stat` of each file at every snapshot.
    if let Some((len, mtime, ctime)) = held.and_then(|h| h.stamp(f.key)) {
        if let Some(p) = points.fingerprint(&(f.key, len, mtime, ctime)) {
            return Some(p);
        }
    }
    let shown = Path::new(&f.path);
    let place = crate::collect::answer::Place::of_key(f.key);
    let here = crate::collect::answer::metadata(place, shown)
        .ok()
        .and_then(Result::ok);
    // The name shown is the file (as it is on a host of many files, at every snapshot):
    // one `stat`, no look through every process for other ways to it.
    let (way, meta) = match here {
        Some(m) if reopen::identity(&m) == f.key => (shown.to_path_buf(), m),
        here => {
            // A file named through an overlay is shown by that name: its bytes are below it.
            let real = here
                .and_then(|m| crate::collect::overlay::real_here(proc_root, shown, &m))
                .map(|r| r.path);
            let mut ways = reopen::ways(proc_root, &sample.processes, f.key, None);
            ways.extend(real);
            let (w, m) = reopen::first_way(&ways, f.key)?;
            (w.to_path_buf(), m)
        }
    };
    let version = pointcache::version(f.key, &meta);
    if let Some(p) = points.fingerprint(&version) {
        return Some(p);
    }
    let b = FileBytes::open(&way).ok()?;
    if b.version != version {
        return None;
    }
    let p = fingerprint(&b)?;
    points.put_fingerprint(&version, p);
    Some(p)
}

/// Links the files of interest with the same bytes: each one's `same_bytes` names the
/// others (sorted). `points` is made only when two files have one size.
/// `held`: what a live engine measured of each file this snapshot
/// ([`crate::collect::heldfiles`]).
pub fn link(
    proc_root: &Path,
    sample: &mut Sample,
    points: &mut Option<PointCache>,
    held: Option<&HeldFiles>,
) {
    let mut by_size: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, f) in sample.files.iter_mut().enumerate() {
        f.same_bytes.clear();
        if let Some(s) = f.size_bytes.filter(|s| *s > 0) {
            by_size.entry(s).or_default().push(i);
        }
    }
    let mut groups: HashMap<(u64, u128), Vec<usize>> = HashMap::new();
    for (size, files) in by_size.into_iter().filter(|(_, v)| v.len() > 1) {
        let points = points.get_or_insert_with(PointCache::new);
        for i in files {
            if let Some(p) = print_of(proc_root, sample, i, points, held) {
                groups.entry((size, p)).or_default().push(i);
            }
        }
    }
    for members in groups.into_values().filter(|v| v.len() > 1) {
        let keys: Vec<FileKey> = members.iter().map(|&i| sample.files[i].key).collect();
        for &i in &members {
            let me = sample.files[i].key;
            let mut others: Vec<FileKey> = keys.iter().copied().filter(|k| *k != me).collect();
            others.sort();
            sample.files[i].same_bytes = others;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn blocks_cover_first_spread_and_last() {
        assert!(block_offsets(0).is_empty());
        assert_eq!(block_offsets(100), [0]);
        // A file of a few blocks is read whole.
        assert_eq!(block_offsets(3 * PAGE + 1), [0, PAGE, 2 * PAGE, 3 * PAGE]);
        let big = block_offsets(1 << 30);
        assert_eq!(big.len() as u64, BLOCKS + 1);
        assert_eq!(big[0], 0);
        assert_eq!(*big.last().unwrap(), (1 << 30) - PAGE);
        assert!(big.windows(2).all(|w| w[0] < w[1] && w[0] % PAGE == 0));
    }

    /// Files of one size are twins only with the same bytes in every block read; a
    /// fingerprint is read once per version (the second is from the cache).
    #[test]
    fn same_bytes_same_fingerprint_one_changed_block_not() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(70 * PAGE + 9) as u32)
            .map(|b| (b.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        std::fs::write(&a, &data).unwrap();
        std::fs::write(&b, &data).unwrap();
        let mut other = data.clone();
        *other.last_mut().unwrap() ^= 1;
        std::fs::write(&c, &other).unwrap();
        let [fa, fb, fc] = [&a, &b, &c].map(|p| fingerprint(&FileBytes::open(p).unwrap()));
        assert!(fa.is_some());
        assert_eq!(fa, fb);
        assert_ne!(fa, fc);
        let points = PointCache::with_dir(Some(&dir.path().join("cache")));
        let v = FileBytes::open(&a).unwrap().version;
        assert_eq!(points.fingerprint(&v), None);
        points.put_fingerprint(&v, fa.unwrap());
        let again = PointCache::with_dir(Some(&dir.path().join("cache")));
        assert_eq!(again.fingerprint(&v), fa, "kept on disk by version");
    }

    /// Of 40 files of one size, those with the same bytes are paired (the later goes) and
    /// one that differs from them only in its last block is not.
    #[test]
    fn only_files_of_the_same_bytes_are_paired() {
        let dir = tempfile::tempdir().unwrap();
        let mut keys = Vec::new();
        let mut inputs = Vec::new();
        for i in 0..40u32 {
            let mut data: Vec<u8> = (0..3 * PAGE as u32 + 100)
                .map(|b| (b.wrapping_mul(31) ^ i.min(7).wrapping_mul(97)) as u8)
                .collect();
            if i == 9 {
                // The bytes of file 7 (i.min(7) == 7) but its last block.
                *data.last_mut().unwrap() ^= 1;
            }
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, &data).unwrap();
            keys.push(FileKey::from_dev(1, u64::from(i) + 1));
            inputs.push((
                FileBytes::open(&path).unwrap(),
                Vec::new(),
                crate::container::Format::Safetensors,
            ));
        }
        let pairs = same_bytes(&mut keys, &mut inputs);
        // Files 7, 8 and 10 to 39 (inodes 8, 9, 11 to 40) have the same bytes: each later
        // one is paired with the first and dropped; file 9 (inode 10) differs in its last
        // block and stays, as do files 0 to 6.
        assert_eq!(pairs.len(), 31, "{pairs:?}");
        assert!(pairs
            .iter()
            .all(|(a, b)| b.inode == 8 && a.inode > 8 && a.inode != 10));
        assert!(keys.iter().any(|k| k.inode == 10), "file 9 is kept");
        assert_eq!(keys.len(), 40 - 31);
    }
}
