//! One collection, stamped with when: what recordings hold and what the model is built from.

use serde::{Deserialize, Serialize};

use super::trace::TraceSample;
use super::Sample;

/// Version of the snapshot document (recordings); bumped on any incompatible change.
/// 2: `trace` (the eBPF counters). Version-1 snapshots read back with no trace.
pub const SNAPSHOT_VERSION: u32 = 2;

/// Everything one collection read, stamped with when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// Wall clock, nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// `CLOCK_MONOTONIC`, nanoseconds: rates between snapshots use this.
    pub at_mono_ns: u64,
    pub sample: Sample,
    /// The eBPF counters, cumulative since the tracer attached, when tracing was on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSample>,
}
