//! Copies found before and still in place, kept through a search again of the rest.

use crate::collect::Roots;
use crate::dupes::prove::Proof;
use crate::sample::Sample;

/// The whole copies of `proof` still in place ([`crate::dupes::recheck`]); `None` when one is
/// gone or changed, or the check failed (the process is then searched in full).
pub(super) fn still_there(
    roots: &Roots,
    sample: &Sample,
    proof: &Proof,
    exact: bool,
) -> Option<Proof> {
    use crate::dupes::recheck::{recheck, Rechecked};
    match recheck(roots, sample, proof, exact) {
        Ok(Rechecked::Still(p)) if !p.found.is_empty() => Some(*p),
        _ => None,
    }
}

/// Adds the copies `k` kept (checked in place) to the search `p` of the rest of the
/// process's memory (which passed over them).
pub(super) fn carry(p: &mut Proof, k: Proof) {
    let (s, c) = (&mut p.sample, k.sample);
    s.identical_file_bytes += c.identical_file_bytes;
    s.converted_file_bytes += c.converted_file_bytes;
    for x in &c.conversions {
        crate::sample::converted::add(
            &mut s.conversions,
            x.conversion,
            x.file_bytes,
            x.memory_bytes,
        );
    }
    s.copy_memory_bytes += c.copy_memory_bytes;
    s.copies += c.copies;
    s.cow_file_bytes += c.cow_file_bytes;
    s.compared_bytes += c.compared_bytes;
    s.places.add(&c.places);
    for f in c.shmem_files {
        if !s.shmem_files.contains(&f) {
            s.shmem_files.push(f);
        }
    }
    p.found.extend(k.found);
}
