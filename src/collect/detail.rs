//! What phase 3 of a long-lived engine keeps of a process ([`super::cache`]): its
//! mappings' `smaps` values, its `smaps_rollup`, and the state of its pages that says
//! whether those values stand.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::sample::{CgroupRef, FileKey, MappingSample, RollupSample};

/// What phase 3 read of a process, for one set of wanted files.
#[derive(Debug, Clone)]
pub struct Detail {
    pub wanted: HashSet<FileKey>,
    /// The state of the pages of its mappings of the wanted files, read just before
    /// `smaps` ([`super::phases::page_state`]); `None` where it could not be read.
    pub pages: Option<PageState>,
    /// How long its read took (phase 3 as a whole): a rollup that takes long is read less
    /// often ([`super::cache::rollup_every`]).
    pub took: Duration,
    /// When `rollup` was read: a process whose mappings of the wanted files stand
    /// ([`PageState`]) keeps it, as one that maps none of them does, for
    /// [`super::cache::rollup_every`] of `took`.
    pub rollup_at: Instant,
    pub mappings: Vec<MappingSample>,
    pub rollup: Option<RollupSample>,
    pub cmdline: std::sync::Arc<[String]>,
    pub cgroup: Option<CgroupRef>,
    pub denied: bool,
    /// Read while another twofold could have mapped a file's pages
    /// ([`super::quiet::Quiet`]): its mappings' PSS and sharing are not kept.
    pub tainted: bool,
}

impl Detail {
    /// Whether its mappings include one of `wanted`: values that other mappers move.
    pub(super) fn maps_any(&self, wanted: &HashSet<FileKey>) -> bool {
        self.mappings.iter().any(|m| wanted.contains(&m.key()))
    }
}

/// What a process's mappings of the wanted files hold, page by page, as far as their
/// `smaps` values go: `RssFile` and `RssShmem` (the mappings of phase 1 are kept while
/// they stand), each mapping's range, and its present pages and, of those, the private
/// (copy-on-write) ones, from `PAGEMAP_SCAN`. While it stands, those mappings' `smaps`
/// values stand (but PSS, which other mappers move: their changes read them again), and
/// a process whose other memory moves (a CUDA runtime's host buffers: its `smaps` lists
/// thousands of mappings, 25 ms a read) reads `smaps_rollup` only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageState {
    pub mapped: (Option<u64>, Option<u64>),
    pub ranges: Vec<(u64, u64)>,
    pub present: Vec<Vec<(u64, u64)>>,
}
