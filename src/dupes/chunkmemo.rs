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
//! and `record` across snapshots) and bounded: [`MAX_CHUNKS`] entries, each kept by the
//! xxh3-128 of its chunk's identity (16 bytes, not the 80 of the identity itself), in one
//! table of 2^18 buckets of 33 bytes: 8.3 MiB at most. When it is full it starts again
//! empty, its table freed. (Keyed by the identity, and cleared in place, the table was 2^19
//! buckets of 113 bytes, 56.5 MiB, and stayed: measured in `serve` and `record` soaks,
//! bench/RESULTS-soak.md.) A file rewritten gets a new version (its mtime and ctime move)
//! and so new entries; the old ones go with the next clearing.

use std::collections::HashMap;
use std::sync::Mutex;

use super::index::CopyKind;
use super::pointcache::Version;

/// Chunks kept at most: what a table of 2^18 buckets holds (7/8 of them full), 33 bytes
/// each (a 16-byte key, a 16-byte hash, a control byte).
pub const MAX_CHUNKS: usize = (1 << 18) / 8 * 7;

/// A chunk of one version of a file (offset, length in file bytes, kind of copy), as the
/// xxh3-128 of those: two chunks share a key with probability 2^-128, the odds at which
/// any memory already matches a kept hash.
type Key = u128;

fn key(version: &Version, off: u64, len: usize, kind: CopyKind) -> Key {
    use std::hash::Hash;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    (version, off, len as u64, kind).hash(&mut h);
    h.digest128()
}

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
    let hit = m.chunks.get(&key(version, off, len, kind)).copied();
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
        // A new table: `clear` would keep the full one's memory.
        m.chunks = HashMap::new();
    }
    m.chunks.insert(key(version, off, len, kind), hash);
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

    #[test]
    fn a_full_memo_fits_a_table_of_2_18_buckets() {
        // The table a full memo needs: 2^18 buckets (hashbrown keeps 7/8 of them full).
        let mut m: HashMap<Key, u128> = HashMap::new();
        for i in 0..MAX_CHUNKS as u128 {
            m.insert(i, i);
        }
        assert!(m.capacity() < 1 << 18, "{}", m.capacity());
        assert_eq!(std::mem::size_of::<(Key, u128)>(), 32);
    }
}
