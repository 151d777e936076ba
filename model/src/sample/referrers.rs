//! Which processes map or hold each file.

use super::{FileKey, ProcessSample};

/// Indexes of processes by file (a fixed-seed foldhash: every mapping of every process
/// is hashed at every snapshot of a live view).
pub type Referrers = std::collections::HashMap<FileKey, Vec<usize>, foldhash::fast::FixedState>;

/// For each file, the indexes in `processes` of those that map it or hold it open, in
/// their order: one pass over every mapping, for lookups by file (a host has hundreds of
/// files and processes; searching every process's mappings for each file is their product).
pub fn referrers(processes: &[ProcessSample]) -> Referrers {
    let mut refs = Referrers::default();
    for (i, p) in processes.iter().enumerate() {
        let keys = p.mappings.iter().map(|m| m.key());
        for k in keys.chain(p.open_files.iter().map(|o| o.key)) {
            let v = refs.entry(k).or_default();
            if v.last() != Some(&i) {
                v.push(i);
            }
        }
    }
    refs
}
