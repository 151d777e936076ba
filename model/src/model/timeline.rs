//! A campaign's timeline: one [`TimelinePoint`] per [`CampaignTick`], a view the model
//! computes from the raw tick (bytes unless named otherwise).

use serde::{Deserialize, Serialize};

use crate::sample::campaign::CampaignTick;

/// One point of a campaign's timeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub t_seconds: f64,
    pub usage_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub file_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub file_mapped_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    /// Cumulative `workingset_refault_file` of the cgroup (pages).
    pub refaults_file: Option<u64>,
    pub processes: usize,
    /// Summed over the processes, from `/proc/PID/statm`: `resident − shared` (= RssAnon)
    /// and `shared` (= RssFile + RssShmem).
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Resident bytes of each file of interest, in the order given (at most the file's
    /// size rounded up to a page: a page past the end is not the file's).
    pub files_resident_bytes: Vec<Option<u64>>,
}

/// The point of one tick.
pub fn point(t: &CampaignTick) -> TimelinePoint {
    let page = t.page_bytes.max(1);
    let mut p = TimelinePoint {
        t_seconds: t.t_seconds,
        processes: t.processes,
        ..TimelinePoint::default()
    };
    if let Some(s) = &t.cgroup {
        let m = super::cgroup::build(s);
        p.usage_bytes = m.usage_bytes;
        p.anon_bytes = m.anon_bytes;
        p.file_bytes = m.file_bytes;
        p.shmem_bytes = m.shmem_bytes;
        p.file_mapped_bytes = m.file_mapped_bytes;
        p.oom_kills = m.oom_kills;
        p.refaults_file = m.refaults_file;
    }
    for s in &t.statm {
        p.rss_anon_bytes += s.resident_pages.saturating_sub(s.shared_pages) * page;
        p.rss_file_bytes += s.shared_pages * page;
    }
    p.files_resident_bytes = t
        .files
        .iter()
        .map(|f| f.map(|f| f.cached_bytes.min(f.size_bytes.next_multiple_of(page))))
        .collect();
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::campaign::{FileTick, Statm};

    #[test]
    fn a_point_sums_statm_and_caps_residency_at_the_file() {
        let t = CampaignTick {
            t_seconds: 1.5,
            page_bytes: 4096,
            cgroup: None,
            processes: 3,
            statm: vec![
                Statm {
                    resident_pages: 10,
                    shared_pages: 4,
                },
                Statm {
                    resident_pages: 5,
                    shared_pages: 5,
                },
            ],
            files: vec![
                Some(FileTick {
                    cached_bytes: 8192,
                    size_bytes: 5000,
                }),
                None,
                Some(FileTick {
                    cached_bytes: 4096,
                    size_bytes: 1 << 20,
                }),
            ],
        };
        let p = point(&t);
        assert_eq!(p.t_seconds, 1.5);
        assert_eq!(p.processes, 3, "the exited third is counted, not summed");
        assert_eq!(p.rss_anon_bytes, 6 * 4096);
        assert_eq!(p.rss_file_bytes, 9 * 4096);
        assert_eq!(p.files_resident_bytes, vec![Some(8192), None, Some(4096)]);
        assert_eq!(p.usage_bytes, None, "no cgroup counters: unknown, not 0");
    }
}
