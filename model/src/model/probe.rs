//! The placement verdict of `twofold probe` (pure: from measured passes, residency and
//! capacity, no I/O).
//!
//! This is the seed paper's Algorithm 2 (§8.1): with working set `W` and endpoint rate
//! `B`, an endpoint's path time is `W/B`. The mapped set must be resident in the page
//! cache (otherwise storage bounds every path: stop); the resident endpoint is excluded
//! when its copy does not fit next to the mapping (device memory on a discrete device,
//! MemAvailable on a unified one) or did not coexist with it after running; the fastest
//! remaining endpoint wins, except that one within the tie band of map resolves to map,
//! the one evictable, file-backed representation.

use serde::{Deserialize, Serialize};
use twofold_probe_types::{Arm, ArmsReport, ImportStatus, Topology};

/// Fraction of the working set that must be in the page cache.
pub const RESIDENT_THRESHOLD: f64 = 0.95;
/// The seed paper's tie band.
pub const TIE_BAND: f64 = 0.05;
/// How close a kernel must come to its copy ceiling.
pub const LIMIT_TARGET: f64 = 0.85;

/// One endpoint over all probe processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub arm: Arm,
    /// Median over processes of each process's median pass rate (GB/s).
    pub gbps: Option<f64>,
    /// Slowest and fastest single pass (GB/s): the spread.
    pub min_gbps: Option<f64>,
    pub max_gbps: Option<f64>,
    /// Each process's median rate.
    pub process_gbps: Vec<f64>,
    /// `W / B`, seconds.
    pub path_seconds: Option<f64>,
    /// Every pass of every process ran and matched the CPU's checksum.
    pub valid: bool,
    pub invalid_reason: Option<String>,
}

fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Endpoints over `bytes` from the reports of all processes.
pub fn endpoints(bytes: u64, reports: &[ArmsReport]) -> Vec<Endpoint> {
    Arm::ALL
        .iter()
        .map(|&arm| {
            let runs: Vec<_> = reports
                .iter()
                .filter_map(|r| r.runs.iter().find(|a| a.arm == arm))
                .collect();
            let mut reason = None;
            if runs.is_empty() {
                reason = Some("not run".to_string());
            }
            for r in &runs {
                if reason.is_none() && (!r.checksums_ok || r.error.is_some()) {
                    reason = Some(
                        r.error
                            .clone()
                            .unwrap_or_else(|| "checksum mismatch".into()),
                    );
                }
                if reason.is_none() && r.pass_seconds.is_empty() {
                    reason = Some("no timed pass".into());
                }
            }
            let rate = |s: f64| bytes as f64 / s.max(1e-12) / 1e9;
            let all: Vec<f64> = runs
                .iter()
                .flat_map(|r| r.pass_seconds.iter().map(|&s| rate(s)))
                .collect();
            let mut per: Vec<f64> = runs
                .iter()
                .filter_map(|r| median(&mut r.pass_seconds.clone()).map(rate))
                .collect();
            let valid = reason.is_none();
            let gbps = if valid { median(&mut per) } else { None };
            Endpoint {
                arm,
                gbps,
                min_gbps: all.iter().copied().reduce(f64::min),
                max_gbps: all.iter().copied().reduce(f64::max),
                process_gbps: per,
                path_seconds: gbps.map(|b| bytes as f64 / (b * 1e9)),
                valid,
                invalid_reason: reason,
            }
        })
        .collect()
}

/// Whether a resident copy fits next to the mapping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Bytes the resident copy needs (the working set).
    pub needed_bytes: u64,
    /// Bytes it may use: free device memory (discrete) or MemAvailable less the cached
    /// working set (unified and coherent), `None` if unknown.
    pub available_bytes: Option<u64>,
    /// `device memory` or `MemAvailable`.
    pub source: String,
    /// Processes in which the mapping stayed resident with the resident copy alive.
    pub coexisted: u32,
    pub processes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    Map,
    Resident,
    PerUseCopy,
    /// The working set is not resident in the page cache: storage bounds every path.
    StorageBound,
    /// No endpoint is valid.
    Undecided,
}

impl Decision {
    pub fn from_arm(a: Arm) -> Decision {
        match a {
            Arm::Map => Decision::Map,
            Arm::Resident => Decision::Resident,
            Arm::PerUseCopy => Decision::PerUseCopy,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictInput {
    pub working_set_bytes: u64,
    /// Fraction of the working set in the page cache (lowest seen), `None` if unknown.
    pub resident_fraction: Option<f64>,
    pub topology: Topology,
    pub capacity: Capacity,
    pub endpoints: Vec<Endpoint>,
    pub tie_band: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    /// The decision is map because another endpoint led it by no more than the band.
    pub tie: bool,
    /// Endpoints left out, with why.
    pub excluded: Vec<(Arm, Exclusion)>,
    /// Why, step by step, in the order Algorithm 2 takes them.
    pub reasons: Vec<Reason>,
}

/// One step of Algorithm 2, with its numbers; `render::probe` writes the sentence (and
/// the JSON, where each step is that sentence).
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// Less than `threshold` of the working set is in the page cache: stop.
    StorageBound {
        resident_fraction: f64,
        threshold: f64,
    },
    Resident {
        resident_fraction: f64,
    },
    ResidencyUnknown,
    /// The capacity gate left the resident endpoint out.
    CapacityExcluded(CapacityShort),
    /// The capacity gate let the resident endpoint in.
    CapacityFits {
        source: String,
        coexisted: u32,
        processes: u32,
    },
    NoValidEndpoint,
    MapFastest {
        map_gbps: f64,
    },
    /// `best` leads map by `gap`, within `band`: map.
    Tie {
        best: Arm,
        gap: f64,
        band: f64,
    },
    /// `best` leads map by `gap`, outside `band`.
    Leads {
        best: Arm,
        best_gbps: f64,
        map_gbps: f64,
        gap: f64,
        band: f64,
    },
    /// No map endpoint: the fastest valid one.
    Fastest {
        best: Arm,
        best_gbps: f64,
    },
    /// A step read back from a report's JSON: its sentence.
    Text(String),
}

/// Why the resident copy cannot be had.
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityShort {
    /// The copy does not fit in what `source` leaves.
    DoesNotFit {
        needed_bytes: u64,
        available_bytes: u64,
        source: String,
    },
    /// The mapping stayed resident next to the copy in only some processes.
    NotCoexisted { coexisted: u32, processes: u32 },
}

/// Why an endpoint was left out.
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    /// It did not run validly (`None`: it has no rate).
    Invalid(Option<String>),
    Capacity(CapacityShort),
    /// Read back from a report's JSON.
    Text(String),
}

/// Algorithm 2.
pub fn decide(input: &VerdictInput) -> Verdict {
    let mut reasons = Vec::new();
    let mut excluded = Vec::new();
    let done = |decision, tie, excluded, reasons| Verdict {
        decision,
        tie,
        excluded,
        reasons,
    };
    match input.resident_fraction {
        Some(f) if f < RESIDENT_THRESHOLD => {
            reasons.push(Reason::StorageBound {
                resident_fraction: f,
                threshold: RESIDENT_THRESHOLD,
            });
            return done(Decision::StorageBound, false, excluded, reasons);
        }
        Some(f) => reasons.push(Reason::Resident {
            resident_fraction: f,
        }),
        None => reasons.push(Reason::ResidencyUnknown),
    }
    let mut candidates: Vec<(Arm, f64)> = Vec::new();
    for e in &input.endpoints {
        match (e.valid, e.gbps) {
            (true, Some(b)) if b > 0.0 => candidates.push((e.arm, b)),
            _ => excluded.push((e.arm, Exclusion::Invalid(e.invalid_reason.clone()))),
        }
    }
    let c = &input.capacity;
    if candidates.iter().any(|(a, _)| *a == Arm::Resident) {
        let why = match c.available_bytes {
            Some(avail) if c.needed_bytes > avail => Some(CapacityShort::DoesNotFit {
                needed_bytes: c.needed_bytes,
                available_bytes: avail,
                source: c.source.clone(),
            }),
            _ if c.coexisted < c.processes => Some(CapacityShort::NotCoexisted {
                coexisted: c.coexisted,
                processes: c.processes,
            }),
            _ => None,
        };
        if let Some(why) = why {
            reasons.push(Reason::CapacityExcluded(why.clone()));
            excluded.push((Arm::Resident, Exclusion::Capacity(why)));
            candidates.retain(|(a, _)| *a != Arm::Resident);
        } else {
            reasons.push(Reason::CapacityFits {
                source: c.source.clone(),
                coexisted: c.coexisted,
                processes: c.processes,
            });
        }
    }
    let Some(&(best, best_b)) = candidates.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        reasons.push(Reason::NoValidEndpoint);
        return done(Decision::Undecided, false, excluded, reasons);
    };
    if let Some(&(_, map_b)) = candidates.iter().find(|(a, _)| *a == Arm::Map) {
        // Path times are W/B, so map's extra time over the best is best_b/map_b - 1.
        let gap = best_b / map_b - 1.0;
        if best == Arm::Map {
            reasons.push(Reason::MapFastest { map_gbps: map_b });
            return done(Decision::Map, false, excluded, reasons);
        }
        if gap <= input.tie_band {
            reasons.push(Reason::Tie {
                best,
                gap,
                band: input.tie_band,
            });
            return done(Decision::Map, true, excluded, reasons);
        }
        reasons.push(Reason::Leads {
            best,
            best_gbps: best_b,
            map_gbps: map_b,
            gap,
            band: input.tie_band,
        });
    } else {
        reasons.push(Reason::Fastest {
            best,
            best_gbps: best_b,
        });
    }
    done(Decision::from_arm(best), false, excluded, reasons)
}

/// How close a kernel came to the copy rate it is judged against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitCheck {
    pub arm: Arm,
    /// The reference (`device-to-device copy ...`).
    pub reference: String,
    pub arm_gbps: f64,
    /// Reference rate in the unit compared: bytes moved through memory per second for a
    /// device-to-device copy (read + write), bytes copied per second otherwise.
    pub reference_gbps: f64,
    pub fraction: f64,
    pub met: bool,
}

/// Resident against the device-to-device copy (read + write traffic), map against the
/// pinned host-to-device copy, where both were measured.
pub fn limits(endpoints: &[Endpoint], reports: &[ArmsReport]) -> Vec<LimitCheck> {
    let reference = |prefix: &str| {
        let mut v: Vec<_> = reports
            .iter()
            .flat_map(|r| &r.references)
            .filter(|r| r.what.starts_with(prefix) && r.gbps > 0.0)
            .map(|r| (r.what.clone(), r.gbps))
            .collect();
        v.sort_by(|a, b| a.1.total_cmp(&b.1));
        v.get(v.len() / 2).cloned()
    };
    let mut out = Vec::new();
    for (arm, prefix, factor) in [
        (Arm::Resident, "device-to-device", 2.0),
        (Arm::Map, "pinned host-to-device", 1.0),
    ] {
        let Some(e) = endpoints.iter().find(|e| e.arm == arm) else {
            continue;
        };
        let (Some(b), Some((what, r))) = (e.gbps, reference(prefix)) else {
            continue;
        };
        let reference_gbps = r * factor;
        let fraction = b / reference_gbps;
        out.push(LimitCheck {
            arm,
            reference: if factor > 1.0 {
                format!("{what}, read + write")
            } else {
                what
            },
            arm_gbps: b,
            reference_gbps,
            fraction,
            met: fraction >= LIMIT_TARGET,
        });
    }
    out
}

/// The largest single import found by bisection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    /// Sizes tried, in order, with their outcome.
    pub tried: Vec<(u64, ImportStatus)>,
    /// Largest size that imported.
    pub largest_ok: Option<u64>,
    /// Smallest size that did not.
    pub smallest_failed: Option<u64>,
}

/// Bisects the largest importable size in `(0, max]`, in multiples of `align`, with at
/// most `steps` attempts after the first (at `max`); a hang ends the search.
pub fn bisect(
    max: u64,
    align: u64,
    steps: u32,
    mut attempt: impl FnMut(u64) -> ImportStatus,
) -> Ceiling {
    let align = align.max(1);
    let mut c = Ceiling {
        tried: Vec::new(),
        largest_ok: None,
        smallest_failed: None,
    };
    let mut size = max / align * align;
    for _ in 0..=steps {
        if size == 0 {
            break;
        }
        let s = attempt(size);
        c.tried.push((size, s));
        match s {
            ImportStatus::Ok => c.largest_ok = Some(size),
            ImportStatus::Hang => {
                c.smallest_failed = Some(size);
                break;
            }
            _ => c.smallest_failed = Some(size),
        }
        let lo = c.largest_ok.unwrap_or(0);
        let Some(hi) = c.smallest_failed else { break };
        let mid = (lo + (hi - lo) / 2) / align * align;
        if mid <= lo || mid >= hi {
            break;
        }
        size = mid;
    }
    c
}

/// The file a probe read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeFile {
    pub path: String,
    pub size_bytes: u64,
    /// Bytes every pass reads from the start of the file.
    pub working_set_bytes: u64,
    /// Written by the probe and removed afterwards.
    pub generated: bool,
    /// Fraction of the working set in the page cache when the probe started, before its
    /// own checksum pass read it: the state the verdict is about.
    #[serde(alias = "resident_fraction")]
    pub resident_fraction_at_start: Option<f64>,
    /// Fraction of the working set in the page cache after the checksum pass, as the
    /// arms found it.
    #[serde(default)]
    pub resident_fraction_after: Option<f64>,
    /// The CPU's checksum of the working set (`sum:weighted`, hex).
    pub cpu_checksum: String,
    pub mem_available_bytes: Option<u64>,
}

/// One import attempt at the working set, and the ceiling search that followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportReport {
    pub outcome: twofold_probe_types::ImportOutcome,
    pub ceiling: Option<Ceiling>,
}

/// Everything measured and decided for one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendReport {
    pub backend: twofold_probe_types::BackendKind,
    pub device: String,
    pub topology: Topology,
    pub imports: Vec<ImportReport>,
    pub processes: Vec<ArmsReport>,
    /// Probe processes that returned no report (hang, crash, error).
    pub process_errors: Vec<String>,
    pub endpoints: Vec<Endpoint>,
    pub limits: Vec<LimitCheck>,
    pub capacity: Capacity,
    /// Lowest fraction of the working set seen in the page cache.
    pub resident_fraction: Option<f64>,
    pub verdict: Verdict,
}

/// The whole `twofold probe` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub schema_version: u32,
    pub caps: twofold_probe_types::Caps,
    pub file: Option<ProbeFile>,
    pub backends: Vec<BackendReport>,
}

/// What [`assess`] derives from the processes' reports.
pub struct Assessment {
    pub endpoints: Vec<Endpoint>,
    pub limits: Vec<LimitCheck>,
    pub capacity: Capacity,
    pub resident_fraction: Option<f64>,
    pub verdict: Verdict,
}

/// Endpoints, capacity and verdict for one backend. Capacity is free device memory on
/// discrete and coherent-link devices (the copy goes to device memory) and MemAvailable
/// less the cached working set on unified ones (the copy competes with the mapping).
pub fn assess(
    file: &ProbeFile,
    topology: Topology,
    reports: &[ArmsReport],
    tie_band: f64,
) -> Assessment {
    let bytes = file.working_set_bytes;
    let endpoints = endpoints(bytes, reports);
    let limits = limits(&endpoints, reports);
    let after = |arm: Arm| {
        reports
            .iter()
            .filter_map(move |r| r.runs.iter().find(|a| a.arm == arm))
            .filter(|a| a.error.is_none())
            .map(|a| a.resident_fraction_after)
    };
    let resident_fraction = file
        .resident_fraction_at_start
        .into_iter()
        .chain(after(Arm::Map).flatten())
        .chain(after(Arm::PerUseCopy).flatten())
        .reduce(f64::min);
    let coexist: Vec<Option<f64>> = after(Arm::Resident).collect();
    let (available_bytes, source) = match topology {
        Topology::Unified => (
            file.mem_available_bytes.map(|m| {
                let now = file
                    .resident_fraction_after
                    .or(file.resident_fraction_at_start);
                let cached = (now.unwrap_or(0.0) * bytes as f64) as u64;
                m.saturating_sub(cached)
            }),
            "MemAvailable less the cached working set",
        ),
        _ => (
            reports.iter().filter_map(|r| r.device_free_bytes).min(),
            "free device memory",
        ),
    };
    let capacity = Capacity {
        needed_bytes: bytes,
        available_bytes,
        source: source.into(),
        coexisted: coexist
            .iter()
            .filter(|f| f.is_none_or(|f| f >= RESIDENT_THRESHOLD))
            .count() as u32,
        processes: coexist.len() as u32,
    };
    let verdict = decide(&VerdictInput {
        working_set_bytes: bytes,
        resident_fraction,
        topology,
        capacity: capacity.clone(),
        endpoints: endpoints.clone(),
        tie_band,
    });
    Assessment {
        endpoints,
        limits,
        capacity,
        resident_fraction,
        verdict,
    }
}

mod text;

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
