//! What a campaign's sampler reads every interval: a [`CampaignTick`], the raw counters of
//! the sandbox cgroup, its processes' `statm` and the residency of the files of interest.
//! The timeline a campaign plots and summarises is a view of these ticks
//! ([`crate::model::timeline`]), computed by the model like every other report.

use serde::{Deserialize, Serialize};

use super::CgroupSample;

/// `/proc/PID/statm`'s resident and shared sizes (pages) of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statm {
    pub resident_pages: u64,
    pub shared_pages: u64,
}

/// The page-cache residency of one file of interest, as read (cachestat or mincore).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTick {
    pub cached_bytes: u64,
    pub size_bytes: u64,
}

/// One sample of a campaign's sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CampaignTick {
    /// Seconds since the sampler started.
    pub t_seconds: f64,
    pub page_bytes: u64,
    /// The cgroup's counters (`None` when they could not be read).
    pub cgroup: Option<CgroupSample>,
    /// How many processes `cgroup.procs` listed, and the `statm` of those that could be
    /// read (a process that exited between the two is counted, not summed).
    pub processes: usize,
    pub statm: Vec<Statm>,
    /// Per file of interest, in the order given: `None` when not read this tick (the
    /// residency is read at most once a second) or unreadable.
    pub files: Vec<Option<FileTick>>,
}
