//! The integrity experiment: xxh3 of every 2 MiB chunk and of the whole file; evict the
//! file completely (whole-file `POSIX_FADV_DONTNEED`, confirmed 0% resident by
//! cachestat); refault it through `pread` while hashing again; compare. The file is only
//! ever opened read-only and never mapped: a file that changes size under the experiment
//! stops it with an error naming the file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

use super::readers::evict;
use crate::collect::residency;

pub const CHUNK: usize = 2 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hashes {
    pub chunks: Vec<u64>,
    pub whole: u128,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cycle {
    /// Bytes still resident after the eviction (0 when it worked).
    pub resident_after_evict_bytes: Option<u64>,
    pub refault_seconds: f64,
    pub refault_gb_per_s: f64,
    pub mismatched_chunks: Vec<usize>,
    pub whole_matches: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Integrity {
    pub size_bytes: u64,
    pub chunk_bytes: usize,
    pub chunks: usize,
    /// xxh3-128 over the per-chunk xxh3-64 digests.
    pub whole_xxh3_128: String,
    /// Hashing rate on cached data (one core), GB/s.
    pub hash_gb_per_s: f64,
    /// In-process memcpy rate of 256 MiB (four passes over 64 MiB) measured in the same
    /// run (one core), GB/s: the memory bandwidth the hashing rate compares with.
    pub memcpy_gb_per_s: f64,
    pub cycles: Vec<Cycle>,
}

/// The whole-file digest: xxh3-128 over the chunk digests (any changed byte changes its
/// chunk's digest, hence this one), so the data is hashed once.
fn whole(chunks: &[u64]) -> u128 {
    let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.to_le_bytes()).collect();
    xxh3_128(&bytes)
}

/// The file's size now, through the open descriptor.
fn size_of(f: &File, path: &Path) -> anyhow::Result<u64> {
    Ok(f.metadata()
        .with_context(|| format!("cannot access '{}'", path.display()))?
        .len())
}

/// The error for a file whose size is no longer the one it had when the experiment began.
fn changed_size(path: &Path, was: u64, now: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "'{}' changed size while it was hashed ({was} bytes, now {now}): it was replaced or truncated, run again on a file that stays put",
        path.display()
    )
}

/// Hashes a file through `pread` (the page cache, faulting in what is not cached, without
/// mapping it: a file truncated under a mapping would kill twofold with SIGBUS). With
/// `expect`, the file must keep exactly that size from start to end, or this fails naming
/// it.
pub fn hash_file(path: &Path, expect: Option<u64>) -> anyhow::Result<Hashes> {
    let f = File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
    let size = size_of(&f, path)?;
    let size = match expect {
        Some(was) if was != size => return Err(changed_size(path, was, size)),
        Some(was) => was,
        None => size,
    };
    let mut buf = vec![0u8; CHUNK.min(size as usize)];
    let mut chunks = Vec::new();
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(CHUNK as u64) as usize;
        if let Err(e) = f.read_exact_at(&mut buf[..n], off) {
            let now = size_of(&f, path)?;
            if now != size {
                return Err(changed_size(path, size, now));
            }
            return Err(e).with_context(|| format!("cannot read '{}'", path.display()));
        }
        chunks.push(xxh3_64(&buf[..n]));
        off += n as u64;
    }
    let now = size_of(&f, path)?;
    if expect.is_some() && now != size {
        return Err(changed_size(path, size, now));
    }
    Ok(Hashes {
        whole: whole(&chunks),
        chunks,
    })
}

/// Best of three copies of 256 MiB, each four passes between two warm 64 MiB buffers:
/// past any cache but the largest, and 128 MiB of memory, not the 512 MiB that two
/// 256 MiB buffers made the peak of every run, whatever the file (531 MB for an empty one).
fn memcpy_rate() -> f64 {
    const BUF: usize = 64 << 20;
    const PASSES: usize = 4;
    let src = vec![1u8; BUF];
    let mut dst = vec![0u8; BUF];
    dst.copy_from_slice(&src);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..PASSES {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (BUF * PASSES) as f64 / best / 1e9
}

fn resident(path: &Path) -> Option<u64> {
    let (f, size, _) = residency::open(path).ok()?;
    residency::query(&f, path, size, residency::Method::Auto)
        .ok()
        .map(|r| r.cached_bytes)
}

/// Refuses, before any work, a file the experiment cannot be honest about: it hashes the
/// whole file from the page cache, evicts it and refaults it, so the file must fit in the
/// memory the host has available (`None`: unknown, not refused). A 15 TiB sparse file
/// would otherwise be read for hours, caching zero pages and evicting everything else.
pub fn check_fits(path: &Path, size: u64, available: Option<u64>) -> anyhow::Result<()> {
    match available {
        Some(avail) if size > avail => anyhow::bail!(
            "'{}' ({}) is larger than MemAvailable ({}): the integrity experiment reads the whole file into the page cache and refaults it, so it needs a file that fits in memory",
            path.display(),
            crate::units::iec(size),
            crate::units::iec(avail)
        ),
        _ => Ok(()),
    }
}

/// Runs `cycles` evict/refault cycles; `reference` (test only) supplies the expected
/// checksums instead of the file's own.
pub fn run(
    path: &Path,
    cycles: usize,
    reference: Option<&Path>,
    step: &dyn Fn(),
) -> anyhow::Result<Integrity> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot access '{}'", path.display()))?
        .len();
    let base = match reference {
        Some(r) => hash_file(r, None)?,
        None => hash_file(path, Some(size))?,
    };
    // Hash rate on cached data: hash again, now warm.
    let t = Instant::now();
    let warm = hash_file(path, Some(size))?;
    let hash_gb_per_s = size as f64 / t.elapsed().as_secs_f64() / 1e9;
    std::hint::black_box(&warm);
    step();
    let memcpy_gb_per_s = memcpy_rate();
    let mut out = Vec::new();
    for _ in 0..cycles {
        evict(path);
        let left = resident(path);
        let t = Instant::now();
        let again = hash_file(path, Some(size))?;
        let secs = t.elapsed().as_secs_f64();
        let mismatched: Vec<usize> = (0..base.chunks.len().max(again.chunks.len()))
            .filter(|i| base.chunks.get(*i) != again.chunks.get(*i))
            .collect();
        out.push(Cycle {
            resident_after_evict_bytes: left,
            refault_seconds: secs,
            refault_gb_per_s: size as f64 / secs / 1e9,
            mismatched_chunks: mismatched,
            whole_matches: base.whole == again.whole,
        });
        step();
    }
    Ok(Integrity {
        size_bytes: size,
        chunk_bytes: CHUNK,
        chunks: base.chunks.len(),
        whole_xxh3_128: format!("{:032x}", base.whole),
        hash_gb_per_s,
        memcpy_gb_per_s,
        cycles: out,
    })
}
