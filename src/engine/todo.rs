//! What a snapshot's searches are given: the sample they need, and their budget.

use std::collections::HashSet;

use crate::dupes::prove::ProveOptions;
use crate::sample::unsearched::Unsearched;
use crate::sample::{CandidateSample, FileKey, ProcessSample, ProofSample, Sample};

/// A search the budget cut is searched again at the next snapshot with twice the budget,
/// at most this many times in a row: a collection never takes more than twice its budget
/// (`serve`'s 2 s budget at a 5 s interval: 4 s, well inside the 3 intervals after which
/// `/healthz` says it is stale; `top`'s 2 s: 4 s).
pub const MAX_BOOST: u32 = 1;

/// Whether the proof budget cut a search, or left no time to begin it.
pub(super) fn by_budget(p: &ProofSample) -> bool {
    matches!(p.unsearched, Some(Unsearched::OverBudget(_)))
}

/// The proof options of a snapshot: the budget doubled for each cut in a row of the
/// searches it is to make again (`cuts`), up to [`MAX_BOOST`] times.
pub(super) fn boosted(opts: ProveOptions, cuts: impl Iterator<Item = u32>) -> ProveOptions {
    let n = cuts.max().unwrap_or(0).min(MAX_BOOST);
    ProveOptions {
        budget: opts.budget.map(|b| b * (1 << n)),
        ..opts
    }
}

/// The sample a search of `todo` needs: `sample` with those candidates, and of its
/// processes only theirs and the holders of their files (the other ways to open a file).
/// A clone of the whole sample (hundreds of processes with their mappings) was most of a
/// steady snapshot's proof cost when a few new processes were searched.
pub(super) fn pending(sample: &Sample, todo: Vec<CandidateSample>) -> Sample {
    let pids: HashSet<i32> = todo.iter().map(|c| c.pid).collect();
    let files: HashSet<FileKey> = todo.iter().map(|c| c.file).collect();
    let needed = |p: &&ProcessSample| {
        pids.contains(&p.pid)
            || p.open_files.iter().any(|o| files.contains(&o.key))
            || p.mappings.iter().any(|m| files.contains(&m.key()))
    };
    let Sample {
        system,
        processes: _,
        files: file_samples,
        cgroups,
        skipped,
        candidates: _,
        proofs,
        reads,
        gpu,
        named,
        observers,
        privilege,
        host_files,
    } = sample;
    Sample {
        system: system.clone(),
        processes: sample.processes.iter().filter(needed).cloned().collect(),
        files: file_samples.clone(),
        cgroups: cgroups.clone(),
        skipped: skipped.clone(),
        candidates: todo,
        proofs: proofs.clone(),
        reads: reads.clone(),
        gpu: gpu.clone(),
        named: named.clone(),
        observers: observers.clone(),
        privilege: *privilege,
        host_files: host_files.clone(),
    }
}
