//! Small parts of the proof's bookkeeping: how much of a file a search looks for, and a
//! fresh (process, file) proof.

use super::grid::Grid;
use super::index::CopyKind;
use crate::sample::{CandidateWhy, FileKey, ProofSample, Sample};

/// Fraction of file `fi`'s bytes the search looks for: the union of the file ranges of its
/// identical pieces with information (tensors, small ones included, and runs of bytes no
/// tensor covers). A file whose bytes are in neither is 0: its copies are unknown.
pub(super) fn searchable_fraction(grid: &Grid, fi: usize) -> f64 {
    let gf = &grid.files[fi];
    let mut spans: Vec<(u64, u64)> = grid
        .pieces
        .iter()
        .enumerate()
        .filter(|(i, p)| p.file == fi && p.kind == CopyKind::Identical && grid.informative[*i])
        .map(|(_, p)| (p.file_offset, p.file_offset + p.mem_len))
        .collect();
    spans.sort_unstable();
    let (mut covered, mut end) = (0u64, 0u64);
    for (a, b) in spans {
        let a = a.max(end);
        if b > a {
            covered += b - a;
            end = b;
        }
    }
    (covered as f64 / gf.bytes.size.max(1) as f64).min(1.0)
}

pub(super) fn grid_index(keys: &[FileKey], key: FileKey) -> usize {
    keys.iter().position(|k| *k == key).unwrap_or(0)
}

pub(super) fn proof_for(pid: i32, key: FileKey, fi: usize, searchable: &[f64]) -> ProofSample {
    ProofSample {
        pid,
        file: key,
        searchable_fraction: searchable[fi],
        ..ProofSample::default()
    }
}

/// The grid files (indices into `keys`) process `pid` came to: it maps or holds them, or
/// its command line names them. A copy of bytes two files share is credited to one of these
/// ([`super::sweep::Sweep::prefer`]).
pub(super) fn came_to(sample: &Sample, pid: i32, keys: &[FileKey]) -> Vec<usize> {
    sample
        .candidates
        .iter()
        .filter(|c| c.pid == pid && matches!(c.why, CandidateWhy::Holder | CandidateWhy::Named))
        .filter_map(|c| keys.iter().position(|k| *k == c.file))
        .collect()
}
