//! Private memory that is no known form of a model: suspected, shown beside the count and
//! never summed into it. Pure.
//!
//! The search estimates, per process and file, the private memory that is distributed like
//! the file's bytes (as they are, reordered, or each byte relabelled by one XOR constant)
//! and that no proven copy covers ([`crate::sample::ProofSample::unexplained_bytes`]: the
//! sampled pages like the file times the pages each stands for). A runtime that keeps a
//! transformed copy twofold cannot recompute (a repacked or prepacked layout it does not
//! know) shows here rather than as a bare count. It is shown for a process tied to the
//! file (it maps it, holds it open or names it, or it read() as many bytes and holds bytes
//! of it proven) when it is at least [`UNEXPLAINED_FRACTION`] of the file. Call it after
//! the proven copies are attributed.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::FileModel;
use crate::sample::{CandidateWhy, FileKey, ProofSample, Sample};

/// Memory like the file of at least this fraction of its size is shown.
pub const UNEXPLAINED_FRACTION: f64 = 0.25;

/// A process's private memory that is no known form of the file but is distributed like
/// it: a suspicion, never counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnexplainedMemory {
    pub pid: i32,
    pub comm: String,
    /// Estimated bytes (sampled pages like the file, times the pages each stands for).
    pub estimated_bytes: u64,
    /// `estimated_bytes / size`.
    pub fraction_of_file: f64,
    /// Sampled pages behind the estimate.
    pub sampled_pages: u64,
    /// Pages between samples of the search (1: every page).
    pub stride_pages: u64,
    /// Why the process is related to the file.
    pub why: CandidateWhy,
}

/// Fills each file's [`FileModel::unexplained`] from the proofs of its candidates.
pub fn attribute(sample: &Sample, files: &mut [FileModel]) {
    // Only the proofs with memory like a file are looked at (most find none): by file, so
    // a host of many files and proofs is not searched once per file.
    let mut like: HashMap<FileKey, Vec<&ProofSample>> = HashMap::new();
    for p in sample.proofs.iter().filter(|p| p.unexplained_bytes > 0) {
        like.entry(p.file).or_default().push(p);
    }
    if like.is_empty() {
        return;
    }
    for f in files.iter_mut() {
        let size = f.size_bytes.unwrap_or(0);
        let Some(proofs) = like.get(&f.key).filter(|_| size > 0) else {
            continue;
        };
        for pr in proofs {
            let bytes = pr.unexplained_bytes;
            if (bytes as f64) < UNEXPLAINED_FRACTION * size as f64 {
                continue;
            }
            let Some(c) = sample
                .candidates
                .iter()
                .find(|c| c.pid == pr.pid && c.file == f.key)
            else {
                continue;
            };
            // Tied to this file: it maps it, holds it open or names it, or it read() as
            // much and holds bytes of it proven (a runtime that read the model, closed it
            // and transformed it keeps some of it: onnxruntime's unpacked initializers).
            // A process that read() much of anything, holding another model distributed
            // like this one, is not.
            let proven = f.proven_copies.iter().any(|p| p.pid == pr.pid);
            let tied = match c.why {
                CandidateWhy::Holder | CandidateWhy::Named => true,
                CandidateWhy::Read => proven,
                CandidateWhy::Unknown | CandidateWhy::SharedMemory => false,
            };
            if !tied || f.unexplained.iter().any(|u| u.pid == pr.pid) {
                continue;
            }
            let comm = sample
                .processes
                .iter()
                .find(|p| p.pid == pr.pid)
                .map(|p| p.comm.clone())
                .unwrap_or_default();
            f.unexplained.push(UnexplainedMemory {
                pid: pr.pid,
                comm,
                estimated_bytes: bytes,
                fraction_of_file: bytes as f64 / size as f64,
                sampled_pages: pr.unexplained_samples,
                stride_pages: pr.stride_pages,
                why: c.why,
            });
        }
        f.unexplained.sort_by_key(|u| u.pid);
    }
}

/// The line shown beside the count: "pid N holds X of private memory that is no known
/// form of this model (not counted)".
pub fn beside_line(u: &UnexplainedMemory) -> String {
    format!(
        "pid {} ({}) holds {} of private memory that is no known form of this model (not counted; estimated, {:.2} of the file)",
        u.pid,
        u.comm,
        crate::units::iec(u.estimated_bytes),
        u.fraction_of_file
    )
}
