//! The fields of a cgroup row.

use std::borrow::Cow;

use super::{gauge, Metric, Unit, Value};
use crate::model::CgroupModel;

/// The fields of a cgroup row ([`CgroupModel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupField {
    Path,
    Usage,
    /// `memory.max` (`None`: unlimited, or not read).
    Limit,
    High,
    Min,
    Low,
    Peak,
    Anon,
    File,
    /// `workingset_refault_file`.
    Refaults,
    OomKills,
    /// `memory.pressure` `some` avg10.
    Psi,
}

impl CgroupField {
    pub const ALL: [CgroupField; 12] = [
        CgroupField::Path,
        CgroupField::Usage,
        CgroupField::Limit,
        CgroupField::High,
        CgroupField::Min,
        CgroupField::Low,
        CgroupField::Peak,
        CgroupField::Anon,
        CgroupField::File,
        CgroupField::Refaults,
        CgroupField::OomKills,
        CgroupField::Psi,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            CgroupField::Path => "path",
            CgroupField::Usage => "usage",
            CgroupField::Limit => "limit",
            CgroupField::High => "high",
            CgroupField::Min => "min",
            CgroupField::Low => "low",
            CgroupField::Peak => "peak",
            CgroupField::Anon => "anon",
            CgroupField::File => "file",
            CgroupField::Refaults => "refaults",
            CgroupField::OomKills => "oom",
            CgroupField::Psi => "psi",
        }
    }

    pub fn named(name: &str) -> Option<CgroupField> {
        CgroupField::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The column of `twofold dump`.
    pub const fn column(self) -> Option<&'static str> {
        Some(match self {
            CgroupField::Path => "cgroup",
            CgroupField::Usage => "usage_bytes",
            CgroupField::Limit => "limit_bytes",
            CgroupField::Anon => "anon_bytes",
            CgroupField::File => "file_bytes",
            CgroupField::OomKills => "oom_kills",
            _ => return None,
        })
    }

    /// The column title in `top` (usage is shown against the limit, min beside low).
    pub const fn title(self) -> &'static str {
        match self {
            CgroupField::Usage => "usage / max",
            CgroupField::Min => "min / low",
            CgroupField::OomKills => "oom kills",
            CgroupField::Psi => "psi some/full",
            f => f.name(),
        }
    }

    pub const fn width(self) -> u16 {
        match self {
            CgroupField::Usage => 21,
            CgroupField::Min => 19,
            CgroupField::Psi => 13,
            CgroupField::Path => 20,
            _ => 9,
        }
    }

    pub const fn unit(self) -> Unit {
        match self {
            CgroupField::Path => Unit::Text,
            CgroupField::Refaults | CgroupField::OomKills => Unit::Count,
            CgroupField::Psi => Unit::Percent,
            _ => Unit::Bytes,
        }
    }

    /// The metric family of the field (labelled by `cgroup`), if it is one.
    pub const fn metric(self) -> Option<Metric> {
        match self {
            CgroupField::Usage => gauge(
                "twofold_cgroup_memory_usage_bytes",
                "Memory charged to the cgroup (memory.current / memory.usage_in_bytes)",
            ),
            CgroupField::Limit => gauge(
                "twofold_cgroup_memory_limit_bytes",
                "Memory limit of the cgroup (memory.max / memory.limit_in_bytes); absent when unlimited",
            ),
            CgroupField::Peak => gauge(
                "twofold_cgroup_memory_peak_bytes",
                "Peak memory of the cgroup (memory.peak / memory.max_usage_in_bytes)",
            ),
            CgroupField::OomKills => Some(Metric {
                name: "twofold_cgroup_oom_kills",
                help: "Processes of the cgroup killed by the OOM killer (memory.events oom_kill)",
                counter: true,
            }),
            _ => None,
        }
    }

    /// The help `twofold dump --format openmetrics` writes for the field's family.
    pub const fn dump_help(self) -> Option<&'static str> {
        match self {
            CgroupField::Usage => Some("Memory usage of a cgroup."),
            _ => None,
        }
    }

    pub fn value(self, c: &CgroupModel) -> Value<'_> {
        match self {
            CgroupField::Path => Value::Text(Cow::Borrowed(&c.path)),
            CgroupField::Usage => Value::Uint(c.usage_bytes),
            CgroupField::Limit => Value::Uint(c.limit_bytes),
            CgroupField::High => Value::Uint(c.high_bytes),
            CgroupField::Min => Value::Uint(c.min_bytes),
            CgroupField::Low => Value::Uint(c.low_bytes),
            CgroupField::Peak => Value::Uint(c.peak_bytes),
            CgroupField::Anon => Value::Uint(c.anon_bytes),
            CgroupField::File => Value::Uint(c.file_bytes),
            CgroupField::Refaults => Value::Uint(c.refaults_file),
            CgroupField::OomKills => Value::Uint(c.oom_kills),
            CgroupField::Psi => Value::Real(c.pressure.map(|p| p.some_avg10)),
        }
    }

    /// The value as `top` sorts and compares it: no limit is +∞.
    pub fn ordinal(self, c: &CgroupModel) -> Option<f64> {
        match self {
            CgroupField::Limit if c.unlimited => Some(f64::INFINITY),
            CgroupField::High if c.high_unlimited => Some(f64::INFINITY),
            _ => self.value(c).number(),
        }
    }
}
