//! Small parts of the proof's bookkeeping: which processes are searched together for
//! which files, how much of a file a search looks for, and a fresh (process, file) proof.

use std::collections::BTreeSet;

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

/// Files of one group differ in size at most this many times: a grid of 1 MiB files and
/// 1 GiB ones samples memory as densely as the small ones' short tensors need, over the
/// large files' copies too (stride 15 where each alone takes 127: `bench/host.sh`'s
/// daemons, candidates of 4 models and 200 small files, took 1.1 s a search).
pub(super) const CLASS_RATIO: u64 = 64;

/// The search groups: the processes (in `order`) that could hold copies of the same set of
/// files, each set cut by size ([`CLASS_RATIO`]) into groups searched with grids of their
/// own. One process may be searched in several groups, each for its own files.
pub(super) fn groups(sample: &Sample, order: Vec<i32>) -> Vec<(BTreeSet<FileKey>, Vec<i32>)> {
    let mut sets: Vec<(BTreeSet<FileKey>, Vec<i32>)> = Vec::new();
    for pid in order {
        let files: BTreeSet<FileKey> = sample
            .candidates
            .iter()
            .filter(|c| c.pid == pid)
            .map(|c| c.file)
            .collect();
        match sets.iter_mut().find(|g| g.0 == files) {
            Some(g) => g.1.push(pid),
            None => sets.push((files, vec![pid])),
        }
    }
    let sizes: std::collections::BTreeMap<FileKey, u64> = sample
        .files
        .iter()
        .map(|f| (f.key, f.size_bytes.unwrap_or(0)))
        .collect();
    let size = |k: &FileKey| sizes.get(k).copied().unwrap_or(0);
    let mut out = Vec::new();
    for (files, pids) in sets {
        let mut by_size: Vec<(u64, FileKey)> = files.iter().map(|k| (size(k), *k)).collect();
        by_size.sort_unstable();
        let mut class: BTreeSet<FileKey> = BTreeSet::new();
        let mut smallest = 0u64;
        for (n, k) in by_size {
            if !class.is_empty() && n > smallest.max(1).saturating_mul(CLASS_RATIO) {
                out.push((std::mem::take(&mut class), pids.clone()));
            }
            if class.is_empty() {
                smallest = n;
            }
            class.insert(k);
        }
        if !class.is_empty() {
            out.push((class, pids));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{CandidateSample, CandidateWhy};

    /// Processes with the same files are searched together; files more than
    /// [`CLASS_RATIO`] times apart in size are searched in groups of their own.
    #[test]
    fn groups_are_cut_by_file_size() {
        let key = |i| FileKey::from_dev(1, i);
        let sizes = [(1, 1 << 20), (2, 3 << 20), (3, 1 << 30), (4, 2 << 30)];
        let mut sample = Sample::default();
        for (i, n) in sizes {
            sample
                .files
                .push(crate::collect::test_file_sample(key(i), "/m", n, None));
        }
        let cand = |pid, i| CandidateSample {
            pid,
            file: key(i),
            why: CandidateWhy::Read,
            private_anon_bytes: 4 << 30,
        };
        for i in 1..=4 {
            sample.candidates.push(cand(10, i));
            sample.candidates.push(cand(11, i));
        }
        sample.candidates.push(cand(12, 1));
        let set = |v: &[u64]| v.iter().map(|i| key(*i)).collect::<BTreeSet<_>>();
        assert_eq!(
            groups(&sample, vec![10, 12, 11]),
            [
                (set(&[1, 2]), vec![10, 11]),
                (set(&[3, 4]), vec![10, 11]),
                (set(&[1]), vec![12]),
            ]
        );
    }
}
