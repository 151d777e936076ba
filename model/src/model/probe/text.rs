//! The words of a verdict: each step and exclusion as the report says it. The JSON carries
//! these sentences, so they live with the model.

use super::{CapacityShort, Exclusion, Reason};
use crate::units::{count, iec};

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

impl std::fmt::Display for CapacityShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacityShort::DoesNotFit {
                needed_bytes,
                available_bytes,
                source,
            } => write!(
                f,
                "a copy of {} does not fit in {} of {source}",
                iec(*needed_bytes),
                iec(*available_bytes)
            ),
            CapacityShort::NotCoexisted {
                coexisted,
                processes,
            } => write!(
                f,
                "the mapping stayed resident next to the copy in only {coexisted} of {}",
                count(*processes, "process", "processes")
            ),
        }
    }
}

/// A step of the verdict, as the report says it.
impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::StorageBound {
                resident_fraction,
                threshold,
            } => write!(
                f,
                "only {} of the working set is in the page cache (needs {}): every path reads storage",
                pct(*resident_fraction),
                pct(*threshold)
            ),
            Reason::Resident { resident_fraction } => write!(
                f,
                "{} of the working set is in the page cache",
                pct(*resident_fraction)
            ),
            Reason::ResidencyUnknown => {
                f.write_str("page-cache residency unknown: assumed resident")
            }
            Reason::CapacityExcluded(why) => {
                write!(f, "capacity gate: resident excluded ({why})")
            }
            Reason::CapacityFits {
                source,
                coexisted,
                processes,
            } => write!(
                f,
                "capacity gate: the resident copy fits ({source}) and coexisted in {coexisted} of {}",
                count(*processes, "process", "processes")
            ),
            Reason::NoValidEndpoint => f.write_str("no valid endpoint"),
            Reason::MapFastest { map_gbps } => {
                write!(f, "map is the fastest endpoint ({map_gbps:.1} GB/s)")
            }
            Reason::Tie { best, gap, band } => write!(
                f,
                "{} leads map by {} (≤ {} band): tie resolved to map, the one evictable representation",
                best.name(),
                pct(*gap),
                pct(*band)
            ),
            Reason::Leads {
                best,
                best_gbps,
                map_gbps,
                gap,
                band,
            } => write!(
                f,
                "{} ({best_gbps:.1} GB/s) leads map ({map_gbps:.1} GB/s) by {}, outside the {} band",
                best.name(),
                pct(*gap),
                pct(*band)
            ),
            Reason::Fastest { best, best_gbps } => write!(
                f,
                "{} is the fastest valid endpoint ({best_gbps:.1} GB/s)",
                best.name()
            ),
            Reason::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exclusion::Invalid(why) => {
                write!(f, "invalid: {}", why.as_deref().unwrap_or("no rate"))
            }
            Exclusion::Capacity(why) => write!(f, "capacity: {why}"),
            Exclusion::Text(t) => f.write_str(t),
        }
    }
}

/// In the JSON each step is its sentence.
impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A step read back from JSON keeps its sentence.
impl<'de> serde::Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Reason::Text)
    }
}

impl serde::Serialize for Exclusion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Exclusion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Exclusion::Text)
    }
}
