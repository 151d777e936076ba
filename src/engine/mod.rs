//! The engine: one place that collects a timestamped [`Snapshot`] (the sample of
//! `/proc`, cgroups and residency, with the byte-level proofs and the read() ledger as
//! inputs), and the one pure way to turn a snapshot, and optionally the one before it, into
//! the [`Report`] every view shows: `scan`, `replay`, `record`, `dump` and campaigns.
//!
//! Collection keeps nothing a report needs outside the snapshot, so a recorded snapshot
//! renders exactly as it did live.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::collect::gather::{self, Request};
use crate::collect::Roots;
use crate::dupes::prove::ProveOptions;
use crate::model::{self, Report};
use crate::sample::{ReadSample, Sample};

/// Version of the snapshot document (recordings); bumped on any incompatible change.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Everything one collection read, stamped with when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// Wall clock, nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// `CLOCK_MONOTONIC`, nanoseconds: rates between snapshots use this.
    pub at_mono_ns: u64,
    pub sample: Sample,
}

/// The clocks, read once.
pub fn now() -> (u64, u64) {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    (wall, mono)
}

/// Collects snapshots of what `req` names, with the proof when `prove` is set.
pub struct Engine {
    pub roots: Roots,
    pub req: Request,
    pub prove: Option<ProveOptions>,
}

impl Engine {
    pub fn new(req: Request, prove: Option<ProveOptions>) -> Engine {
        Engine {
            roots: Roots::live(),
            req,
            prove,
        }
    }

    /// One snapshot; `reads` is the read() ledger of a traced window, when there is one.
    /// Warnings (a process that could not be read, a file that vanished) are appended.
    pub fn snapshot(
        &mut self,
        reads: Vec<ReadSample>,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<Snapshot> {
        let (at_unix_ns, at_mono_ns) = now();
        let mut sample = gather::gather(&self.roots, &self.req, warnings)?;
        sample.reads = reads;
        if let Some(opts) = self.prove {
            sample.proofs = crate::dupes::prove::prove(&self.roots, &sample, opts, warnings);
        }
        Ok(Snapshot {
            version: SNAPSHOT_VERSION,
            at_unix_ns,
            at_mono_ns,
            sample,
        })
    }
}

/// The report of a snapshot: the one pure entry every view uses. With the snapshot
/// before it, the report also carries rates over the interval between the two.
pub fn report(snap: &Snapshot, prev: Option<&Snapshot>) -> Report {
    let mut r = model::build(&snap.sample);
    r.at_unix_ns = Some(snap.at_unix_ns);
    if let Some(p) = prev {
        let secs = Duration::from_nanos(snap.at_mono_ns.saturating_sub(p.at_mono_ns)).as_secs_f64();
        // A previous snapshot from another boot (monotonic clock went back): wall clock.
        let secs = if secs > 0.0 {
            secs
        } else {
            Duration::from_nanos(snap.at_unix_ns.saturating_sub(p.at_unix_ns)).as_secs_f64()
        };
        r.rates = model::rates::between(&p.sample, &snap.sample, secs);
    }
    r
}
