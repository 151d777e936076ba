//! What comparisons already read of a model file, kept as hashes: the proof compares a
//! process's memory with the file page by page ([`super::compare`]), and the same pages
//! of one file are compared again and again: in each of the seven forked workers that
//! share one copy, in every search again of a process whose memory moved, in every check
//! in place. Each of those reads came from the disk (`O_DIRECT`, so that the proof does not
//! change the page cache it reports): 76,000 reads of 4 KiB for one search again of the
//! moving host's pool and daemons (`bench/host.sh`).
//!
//! So the bytes a comparison reads from the file, after conversion (widened copies), are
//! kept as their xxh3-128 hash, per file version (device, inode, size, mtime, ctime, as
//! the point cache keys them) and chunk (file offset, length, copy kind). A comparison
//! whose chunk is kept reads only the memory and compares its hash. Memory that is not the
//! file's bytes matches a kept hash with probability 2^-128 per chunk: the bytes were read
//! from the file once, byte by byte, and every later comparison is against them.
//!
//! The memo is shared by every proof of the process (one-shot `scan`, and `top`, `serve`
//! and `record` across snapshots) and bounded: [`MAX_CHUNKS`] entries (about 12 MiB);
//! when it is full it starts again empty. A file rewritten gets a new version (its mtime
//! and ctime move) and so new entries; the old ones go with the next clearing.

use std::collections::HashMap;
use std::sync::Mutex;

use super::index::CopyKind;
use super::pointcache::Version;

/// Chunks kept at most: a page each, about 48 bytes each with the map's overhead.
pub const MAX_CHUNKS: usize = 256 * 1024;

/// A chunk of one version of a file: offset, length (file bytes), kind of copy.
type Key = (Version, u64, u32, CopyKind);

/// The process-wide memo.
static MEMO: Mutex<Option<Memo>> = Mutex::new(None);

#[derive(Default)]
struct Memo {
    chunks: HashMap<Key, u128>,
    hits: u64,
    misses: u64,
}

/// The kept hash of `len` file bytes at `off` of `version`, converted as `kind`.
pub fn get(version: &Version, off: u64, len: usize, kind: CopyKind) -> Option<u128> {
    let mut memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let m = memo.get_or_insert_with(Memo::default);
    let hit = m.chunks.get(&(*version, off, len as u32, kind)).copied();
    match hit {
        Some(_) => m.hits += 1,
        None => m.misses += 1,
    }
    hit
}

/// Keeps the hash of a chunk just read from the file.
pub fn put(version: &Version, off: u64, len: usize, kind: CopyKind, hash: u128) {
    let mut memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let m = memo.get_or_insert_with(Memo::default);
    if m.chunks.len() >= MAX_CHUNKS {
        m.chunks.clear();
    }
    m.chunks.insert((*version, off, len as u32, kind), hash);
}

/// The hash a chunk is kept and compared as.
pub fn hash(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// (chunks kept, hits, misses) since the process started: for `TWOFOLD_PROFILE` and tests.
pub fn stats() -> (usize, u64, u64) {
    let memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    memo.as_ref()
        .map_or((0, 0, 0), |m| (m.chunks.len(), m.hits, m.misses))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::FileKey;

    #[test]
    fn a_chunk_is_kept_per_version_offset_length_and_kind() {
        let v1: Version = (FileKey::from_dev(7, 424242), 4096, 1, 2);
        let v2: Version = (FileKey::from_dev(7, 424242), 4096, 1, 3);
        let h = hash(b"weights");
        put(&v1, 8192, 4096, CopyKind::Identical, h);
        assert_eq!(get(&v1, 8192, 4096, CopyKind::Identical), Some(h));
        // Another ctime (the file was rewritten), offset, length or kind: not kept.
        assert_eq!(get(&v2, 8192, 4096, CopyKind::Identical), None);
        assert_eq!(get(&v1, 4096, 4096, CopyKind::Identical), None);
        assert_eq!(get(&v1, 8192, 2048, CopyKind::Identical), None);
        assert_eq!(get(&v1, 8192, 4096, CopyKind::WidenedF16), None);
        assert_ne!(hash(b"weights"), hash(b"weightz"));
    }
}
