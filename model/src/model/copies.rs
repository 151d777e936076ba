//! The count and its parts, from the sample's candidates and proofs. Pure.
//!
//! One copy, one count: bytes found inside a process's own private mapping of the file are
//! that mapping's copy-on-write pages (the `cow` part, from smaps `Anonymous:`), never a
//! private copy; copies found in private anonymous memory are private copies. A candidate
//! that was not searched (or only in part) is a *suspected* copy, shown beside the count
//! and never summed into it, and it makes the count a lower bound. A copy whose pages
//! other processes' copies map too (after `fork()`, or in shared memory) is one physical
//! copy: each process counts its share ([`crate::sample::PhysicalSample`]).

use std::collections::BTreeMap;

/// Keyed by pids and file keys, built for every snapshot of a live view (thousands of
/// candidacies): a fixed-seed foldhash, not SipHash (whose hashing was a third of this
/// module's time in `top`'s profile).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

use super::{CopyHow, FileModel, ProvenCopy, Representations, SharedCopy, SuspectedCopy};
use crate::sample::{FileKey, ProcessSample, ProofSample, Sample};

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The cause of a proven copy. A process that maps the file made it from its mapping: a
/// conversion when most of the bytes found are converted, else a copy (its `rchar` counts
/// every file it read, this one's bytes are already in its mapping). One that does not map
/// it and read() as many bytes (this file's in a trace, else any) copied it with read().
fn how(p: Option<&ProcessSample>, mapped: bool, pr: &ProofSample, traced: Option<u64>) -> CopyHow {
    let bytes = pr.identical_file_bytes + pr.converted_file_bytes;
    if mapped {
        return if pr.converted_file_bytes > 0 && pr.converted_file_bytes >= pr.identical_file_bytes
        {
            CopyHow::Converted
        } else {
            CopyHow::CopiedFromMapping
        };
    }
    if traced.is_some_and(|t| t >= bytes) {
        return CopyHow::Read;
    }
    match p.and_then(|p| p.rchar_bytes) {
        Some(r) if r >= bytes => CopyHow::Read,
        _ => CopyHow::Copied,
    }
}

/// At least half of `whole` (and something).
fn most(part: u64, whole: u64) -> bool {
    part > 0 && part.saturating_mul(2) >= whole
}

/// The cause a copy's place tells: most of it in host memory the NVIDIA driver maps, a
/// pinned staging copy; in a shmem file or anonymous shared memory, a shared-memory copy.
fn place_how(pr: &ProofSample) -> Option<CopyHow> {
    let all = pr.copy_memory_bytes;
    if most(pr.places.pinned_bytes, all) {
        Some(CopyHow::Pinned)
    } else if !pr.shmem_files.is_empty() || most(pr.places.shared_anon_bytes, all) {
        Some(CopyHow::SharedMemory)
    } else {
        None
    }
}

/// Fills each file's proven and suspected copies and candidate counts; `reads` is the
/// read() ledger (bytes each process read of each file while traced).
pub fn attribute(sample: &Sample, reads: &BTreeMap<(i32, FileKey), u64>, files: &mut [FileModel]) {
    // Looked up by key rather than searched for each file (a host has hundreds of files
    // and thousands of candidacies); the first of each key, in the sample's order.
    let mut procs: HashMap<i32, &ProcessSample> = HashMap::default();
    for p in &sample.processes {
        procs.entry(p.pid).or_insert(p);
    }
    let proc_of = |pid: i32| procs.get(&pid).copied();
    let (under, said) = twin_choices(sample, reads);
    let counted = |p: &ProofSample| under.get(&(p.pid, p.file)).copied().unwrap_or(p.file);
    let mut proofs_of: HashMap<FileKey, Vec<&ProofSample>> = HashMap::default();
    let mut proof_at: HashMap<(i32, FileKey), &ProofSample> = HashMap::default();
    for p in &sample.proofs {
        proofs_of.entry(counted(p)).or_default().push(p);
        proof_at.entry((p.pid, counted(p))).or_insert(p);
    }
    let mut candidates_of: HashMap<FileKey, Vec<&crate::sample::CandidateSample>> =
        HashMap::default();
    for c in &sample.candidates {
        candidates_of.entry(c.file).or_default().push(c);
    }
    // Private memory left for suspicion per process, largest file first.
    let mut left: BTreeMap<i32, u64> = BTreeMap::new();
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|a, b| files[*b].size_bytes.cmp(&files[*a].size_bytes));
    for i in order {
        let f = &mut files[i];
        let key = f.key;
        let size = f.size_bytes.unwrap_or(0);
        for &pr in proofs_of.get(&key).into_iter().flatten() {
            let bytes = pr.identical_file_bytes + pr.converted_file_bytes;
            if bytes == 0 {
                continue;
            }
            let p = proc_of(pr.pid);
            let mapped = f.mappers.iter().any(|m| m.pid == pr.pid);
            let traced = reads.get(&(pr.pid, key)).copied();
            let share = pr.physical.as_ref().map_or(1.0, |w| w.ratio());
            let shared = pr
                .physical
                .as_ref()
                .filter(|w| w.shared_by > 1)
                .map(|w| SharedCopy {
                    by: w.shared_by,
                    with: w.shared_with.clone(),
                    shmem: w.shmem,
                    ksm: w.ksm,
                    estimated: w.estimated,
                });
            f.proven_copies.push(ProvenCopy {
                pid: pr.pid,
                comm: p.map(|p| p.comm.clone()).unwrap_or_default(),
                identical_bytes: pr.identical_file_bytes,
                converted_bytes: pr.converted_file_bytes,
                memory_bytes: pr.copy_memory_bytes,
                conversions: pr.conversions.clone(),
                copies: pr.copies,
                // By the memory the copy occupies: a converted copy counts its own bytes.
                fraction: fraction(pr.copy_memory_bytes, size) * share,
                share,
                shared,
                how: place_how(pr).unwrap_or_else(|| how(p, mapped, pr, traced)),
                traced_read_bytes: traced,
                mapped,
                huge_pages: most(pr.places.hugetlb_bytes, pr.copy_memory_bytes),
                attribution: said.get(&(pr.pid, key)).cloned(),
            });
        }
        for &c in candidates_of.get(&key).into_iter().flatten() {
            f.candidates.could_hold += 1;
            let proof = proof_at.get(&(c.pid, key)).copied();
            let unsearched = match proof {
                Some(p) => p.unsearched.clone(),
                None => Some(crate::sample::unsearched::Unsearched::no_prove()),
            };
            if let Some(p) = proof {
                f.candidates.sampled_bytes += p.sampled_bytes;
                f.candidates.compared_bytes += p.compared_bytes;
            }
            let Some(why_not) = unsearched else {
                f.candidates.searched += 1;
                continue;
            };
            f.candidates.not_searched += 1;
            f.candidates.unsearched.push(super::UnsearchedCandidate {
                pid: c.pid,
                why: why_not.clone(),
            });
            // Memory already proven to be a copy is not suspected again.
            let proven: u64 = proof.map_or(0, |p| p.copy_memory_bytes);
            let avail = left
                .entry(c.pid)
                .or_insert(c.private_anon_bytes.saturating_sub(proven));
            if size == 0 || (*avail as f64) < super::SUSPECT_FRACTION * size as f64 {
                continue;
            }
            let attributed = (*avail).min(size);
            *avail -= attributed;
            f.suspected_copies.push(SuspectedCopy {
                pid: c.pid,
                comm: proc_of(c.pid).map(|p| p.comm.clone()).unwrap_or_default(),
                anon_bytes: c.private_anon_bytes,
                attributed_bytes: attributed,
                fraction: fraction(attributed, size),
                mapped: f.mappers.iter().any(|m| m.pid == c.pid),
                why: c.why,
                unsearched: why_not,
            });
        }
        f.proven_copies.sort_by_key(|c| c.pid);
        f.suspected_copies.sort_by_key(|c| c.pid);
    }
}

/// Which file of the same bytes each proof's copy is counted under: the proof found it in
/// one file's index (the search indexes one of a set of twins), but it is the copy of the
/// file the process came to ([`super::relation`]), whatever order the files were named in.
/// Returns (pid, file searched) → file counted (a proof moved to a twin trades places with
/// that twin's empty proof), and (pid, file counted) → why, in words.
#[allow(clippy::type_complexity)]
fn twin_choices(
    sample: &Sample,
    reads: &BTreeMap<(i32, FileKey), u64>,
) -> (
    HashMap<(i32, FileKey), FileKey>,
    HashMap<(i32, FileKey), String>,
) {
    let mut under = HashMap::default();
    let mut said = HashMap::default();
    if sample.files.iter().all(|f| f.same_bytes.is_empty()) {
        return (under, said);
    }
    let relations = super::relation::Relations::new(sample, reads, &[]);
    let twins: HashMap<FileKey, &Vec<FileKey>> = sample
        .files
        .iter()
        .filter(|f| !f.same_bytes.is_empty())
        .map(|f| (f.key, &f.same_bytes))
        .collect();
    // A twin in shared memory (a /dev/shm copy of the model) is no place a copy moves to:
    // a copy found in its pages is that file itself, counted under the original.
    let shm = |k: &FileKey| k.major == 0;
    for p in &sample.proofs {
        let Some(others) = twins.get(&p.file) else {
            continue;
        };
        if p.identical_file_bytes + p.converted_file_bytes == 0
            || shm(&p.file)
            || !p.shmem_files.is_empty()
        {
            continue;
        }
        // A twin in shared memory (tmpfs, memfd: device major 0) is itself a copy of the
        // file, folded under it ([`shmem_copies`]): never the file a copy counts under.
        let others: Vec<FileKey> = others.iter().copied().filter(|k| k.major != 0).collect();
        if others.is_empty() {
            continue;
        }
        let mut options = vec![(p.file, false)];
        options.extend(others.iter().filter(|k| !shm(k)).map(|k| (*k, false)));
        if options.len() < 2 {
            continue;
        }
        let choice = relations.choose(p.pid, &options);
        if let Some(w) = relations.words(&choice) {
            said.insert((p.pid, choice.file), w);
        }
        if choice.file != p.file {
            under.insert((p.pid, p.file), choice.file);
            under.insert((p.pid, choice.file), p.file);
        }
    }
    (under, said)
}

/// Marks each file in shared memory in which a proof found a copy of another file as a
/// copy of that file (`/dev/shm/m.safetensors`, a memfd mapped by a loader).
pub fn shmem_copies(sample: &Sample, files: &mut [FileModel]) {
    for pr in &sample.proofs {
        let Some(original) = files.iter().find(|f| f.key == pr.file) else {
            continue;
        };
        let of = super::CopyOf {
            key: original.key,
            path: original.path.clone(),
        };
        for k in &pr.shmem_files {
            if let Some(f) = files.iter_mut().find(|f| f.key == *k && f.key != of.key) {
                f.shmem_copy_of = Some(of.clone());
            }
        }
    }
}

/// Moves each file proven to be a shared-memory copy of another file of the report under
/// that file ([`super::FileModel::shmem_places`]): one set of bytes has one place in the
/// output, the original, whatever else was named.
pub fn fold_shmem_copies(files: &mut Vec<FileModel>) {
    let mut places: Vec<(FileKey, super::ShmemPlace)> = Vec::new();
    files.retain(|f| {
        let Some(of) = &f.shmem_copy_of else {
            return true;
        };
        let mut pids: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
        pids.extend(f.holders.iter().map(|h| h.pid));
        pids.sort_unstable();
        pids.dedup();
        places.push((
            of.key,
            super::ShmemPlace {
                key: f.key,
                path: f.path.clone(),
                size_bytes: f.size_bytes,
                resident_bytes: f.resident_bytes,
                pids,
            },
        ));
        false
    });
    // A folded copy is no twin of anything shown: its bytes are counted (and named) under
    // the original already.
    for f in files.iter_mut() {
        f.same_bytes
            .retain(|t| !places.iter().any(|(_, p)| p.key == t.key));
    }
    for (of, place) in places {
        if let Some(original) = files.iter_mut().find(|f| f.key == of) {
            original.shmem_places.push(place);
        }
    }
}

/// A count rounded to 9 decimals (what bytes over sizes measure; no float noise).
pub fn round_count(x: f64) -> f64 {
    (x * 1e9).round() / 1e9
}

/// The count of one file from its parts.
pub fn representations(f: &FileModel) -> Representations {
    let size = f.size_bytes.unwrap_or(0);
    let cow = f.cow_bytes().map(|b| fraction(b, size));
    let private_copies = f.proven_copies.iter().fold(0.0, |a, c| a + c.fraction);
    let suspected = f.suspected_copies.iter().fold(0.0, |a, s| a + s.fraction);
    // Each part is a ratio of byte counts; their float sum is rounded to 1e-9 (well below
    // a byte of any model) so that one copy of a file reads 2, not 2.0000000000015357.
    let private_copies = round_count(private_copies);
    let proven = f
        .resident_fraction
        .map(|pc| round_count(pc + cow.unwrap_or(0.0) + private_copies));
    let unsearched = f.candidates.not_searched;
    Representations {
        page_cache: f.resident_fraction,
        cow,
        private_copies,
        device: None,
        proven,
        suspected,
        suspected_device: 0.0,
        unsearched,
        lower_bound: unsearched > 0 || cow.is_none() || f.resident_fraction.is_none(),
    }
}

#[cfg(test)]
mod place_tests {
    use super::*;
    use crate::sample::places::Places;

    fn proof(places: Places, shmem_file: bool) -> ProofSample {
        ProofSample {
            identical_file_bytes: 64 << 20,
            copy_memory_bytes: 64 << 20,
            places,
            shmem_files: if shmem_file {
                vec![FileKey::default()]
            } else {
                Vec::new()
            },
            ..ProofSample::default()
        }
    }

    /// A copy's place names its cause where the place tells it: pinned driver memory, shared
    /// memory (a file or anonymous); huge pages and private memory leave it to the process.
    #[test]
    fn the_place_of_a_copy_names_its_cause() {
        let all = 64u64 << 20;
        let pinned = Places {
            pinned_bytes: all,
            ..Places::default()
        };
        assert_eq!(place_how(&proof(pinned, false)), Some(CopyHow::Pinned));
        let anon = Places {
            shared_anon_bytes: all / 2,
            ..Places::default()
        };
        assert_eq!(place_how(&proof(anon, false)), Some(CopyHow::SharedMemory));
        assert_eq!(
            place_how(&proof(Places::default(), true)),
            Some(CopyHow::SharedMemory)
        );
        let little = Places {
            pinned_bytes: all / 4,
            hugetlb_bytes: all,
            ..Places::default()
        };
        assert_eq!(place_how(&proof(little, false)), None);
        assert_eq!(place_how(&proof(Places::default(), false)), None);
        assert!(most(all, all) && most(all / 2, all) && !most(all / 2 - 1, all));
        assert!(!most(0, 0));
    }

    /// Old recordings (no `places`, no `ksm`) still read, as private memory and fork.
    #[test]
    fn recordings_without_places_read_back() {
        let p: ProofSample = serde_json::from_str(
            r#"{"pid":1,"file":{"major":8,"minor":1,"inode":2},"searchable_fraction":1.0,"stride_pages":1,"sampled_bytes":0,"physical":{"pages":4,"share_pages":2.0,"shared_by":2}}"#,
        )
        .unwrap();
        assert!(p.places.is_empty());
        assert!(!p.physical.unwrap().ksm);
    }

    /// A converted copy is the cause when it holds most of the bytes found; old
    /// recordings' `widened_file_bytes` read as converted bytes.
    #[test]
    fn converted_copies_are_conversions_and_old_widened_bytes_read_back() {
        use crate::sample::converted::{Conversion, Converted};
        let narrowed = ProofSample {
            converted_file_bytes: 64 << 20,
            copy_memory_bytes: 32 << 20,
            conversions: vec![Converted {
                conversion: Conversion::F32ToF16,
                file_bytes: 64 << 20,
                memory_bytes: 32 << 20,
            }],
            ..ProofSample::default()
        };
        assert_eq!(how(None, true, &narrowed, None), CopyHow::Converted);
        let p: ProofSample = serde_json::from_str(
            r#"{"pid":1,"file":{"major":8,"minor":1,"inode":2},"widened_file_bytes":4096,"copy_memory_bytes":8192,"searchable_fraction":1.0,"stride_pages":1,"sampled_bytes":0}"#,
        )
        .unwrap();
        assert_eq!((p.converted_file_bytes, p.conversions.len()), (4096, 0));
    }
}
