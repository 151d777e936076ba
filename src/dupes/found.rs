//! What a search found: each copy ([`Found`]) and each (process, file) proof ([`Proof`]),
//! and how a copy is credited to a proof.

use std::collections::BTreeMap;
use std::time::Duration;

use super::index::CopyKind;
use crate::collect::memory::{Region, RegionKind};
use crate::sample::{converted, FileKey, ProofSample};

/// A copy a search found: where it is, and which bytes of which file it holds. Kept by
/// the engine so that a later snapshot can check it again in place ([`super::recheck`]).
#[derive(Debug, Clone)]
pub struct Found {
    pub file: FileKey,
    pub kind: CopyKind,
    pub file_offset: u64,
    pub mem_len: u64,
    /// Where the copy of the whole piece would start (it may begin outside `region`).
    pub addr: u64,
    /// The region it was found in, as the search saw it.
    pub region: Region,
    /// The whole piece matched (else only some of its pages: a partial copy).
    pub whole: bool,
}

impl Found {
    /// The memory it occupies within the region it was found in.
    pub fn part(&self) -> (u64, u64) {
        (
            self.addr.max(self.region.start),
            (self.addr + self.mem_len).min(self.region.end),
        )
    }
}

/// One (process, file) search: what it found, where, and how long the process's search
/// took (shared by its files).
#[derive(Debug, Clone)]
pub struct Proof {
    pub sample: ProofSample,
    pub found: Vec<Found>,
    pub took: Duration,
}

impl Proof {
    /// The memory its copies occupy, each range within the region it was found in.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.found.iter().map(Found::part)
    }
}

/// Memory ranges per pid that hold copies already known (an earlier search's, checked in
/// place): a search passes over them ([`super::sweep::Sweep::known`]).
pub type KnownCopies = BTreeMap<i32, Vec<(u64, u64)>>;

/// Credits `mem_bytes` of a copy of `key` found in region `r` to `p`: inside the
/// process's own private mapping of the file, its copy-on-write pages; elsewhere a copy,
/// whose place (shared memory, huge pages, driver memory) the proof notes.
pub fn credit(p: &mut ProofSample, key: FileKey, kind: CopyKind, r: &Region, mem_bytes: u64) {
    let file_bytes = kind.file_bytes(mem_bytes);
    if r.kind == RegionKind::PrivateFile && r.key == Some(key) {
        p.cow_file_bytes += file_bytes;
        return;
    }
    if r.kind == RegionKind::SharedAnon {
        match r.key {
            // A file in shared memory mapped by its own process: its page cache.
            Some(k) if k == key => return,
            // A copy in a shmem, tmpfs or memfd file: that file is a copy of this one.
            Some(k) if !p.shmem_files.contains(&k) => p.shmem_files.push(k),
            _ => {}
        }
    }
    match r.kind {
        RegionKind::SharedAnon if r.key.is_none() => p.places.shared_anon_bytes += mem_bytes,
        RegionKind::Hugetlb => p.places.hugetlb_bytes += mem_bytes,
        RegionKind::Pinned => p.places.pinned_bytes += mem_bytes,
        _ => {}
    }
    match kind.conversion() {
        None => p.identical_file_bytes += file_bytes,
        Some(c) => {
            p.converted_file_bytes += file_bytes;
            converted::add(&mut p.conversions, c, file_bytes, mem_bytes);
        }
    }
    p.copy_memory_bytes += mem_bytes;
    p.copies += 1;
}
