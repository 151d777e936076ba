//! The files a process maps, worked out once per version of its phase-1 parts: a live
//! view keeps an unchanged process's parts, so it does not go over its mappings again.

use std::collections::HashSet;

use crate::sample::{FileKey, MappingSample};

/// The files a process maps, each once: the index of its first mapping, in the order of
/// `maps`, and the files it maps executable (code), sorted.
#[derive(Debug, Default)]
pub struct MappedFiles {
    pub first: Vec<u32>,
    pub code: Vec<FileKey>,
}

impl MappedFiles {
    /// The files `maps` map.
    pub fn of(maps: &[MappingSample]) -> MappedFiles {
        let mut code: Vec<FileKey> = maps
            .iter()
            .filter(|m| m.perms.exec)
            .map(|m| m.key())
            .collect();
        code.sort_unstable();
        code.dedup();
        let mut seen = HashSet::with_capacity(maps.len());
        let first = (0..maps.len())
            .filter(|&i| seen.insert(maps[i].key()))
            .map(|i| i as u32)
            .collect();
        MappedFiles { first, code }
    }
}
