//! Byte-level proof that a process holds a private (or converted) copy of a model file.
//!
//! [`index`] fingerprints the file's tensors; [`sweep`] samples the target's anonymous
//! memory once per page, looks the samples up, and confirms each candidate by comparing
//! the whole tensor with the file. Only a confirmed match is reported as a copy.
//! [`prove`] runs it for the candidates of a snapshot, [`search`] for `twofold dupes`;
//! both report how far they came through one [`Progress`].

pub mod blocks;
pub mod cachedcopy;
pub mod chunkmemo;
pub mod compare;
pub mod family;
pub mod filebytes;
pub mod found;
pub mod grid;
pub mod index;
pub mod indexcache;
pub mod likeness;
pub mod moved;
pub mod opening;
pub mod pagemap;
pub mod physical;
pub mod pointcache;
mod prefer;
pub mod prove;
mod prove_parts;
pub mod recheck;
pub mod runs;
pub mod search;
pub mod sweep;
pub mod sweep_parts;
pub mod transform;
pub mod twins;
pub mod uploads;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How far a proof has come, and a flag that stops it: shared with the thread that shows
/// it (`top`'s `p`). Only atomics: nothing waits on it.
#[derive(Debug, Default)]
pub struct Progress {
    cancel: AtomicBool,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
}

impl Progress {
    /// Asks the proof to stop at its next check (between windows of memory).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub(crate) fn add_total(&self, bytes: u64) {
        self.total_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_done(&self, bytes: u64) {
        self.done_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `(bytes of mapped memory searched, bytes to search)`; the total grows as each
    /// process's memory map is read.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.done_bytes.load(Ordering::Relaxed),
            self.total_bytes.load(Ordering::Relaxed),
        )
    }
}

/// An F32 tensor of `len` bytes at `offset` (the tests of the index and the search).
#[cfg(test)]
pub(crate) fn test_tensor(offset: u64, len: u64) -> crate::container::Tensor {
    crate::container::Tensor {
        name: format!("t{offset}"),
        dtype: crate::container::Dtype::F32,
        shape: vec![len / 4],
        offset,
        len,
    }
}

/// Pseudo-random bytes (xorshift) from `seed` (the tests of the index and the search).
#[cfg(test)]
pub(crate) fn test_random(n: usize, mut s: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}
