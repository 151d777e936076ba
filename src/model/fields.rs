//! The field registry: the fields of a report's file, process and cgroup rows that views
//! list, each defined once with its title and width in `top`, its unit, its names (the
//! short one `top` sorts and filters by, the column of `twofold dump`), the metric family
//! it is exported as, and how its value is read from the model. `top`'s columns, sort keys
//! and filters, `dump`'s JSON Lines, CSV and OpenMetrics, and the exporter's families all
//! read from here. Pure.
//!
//! Where two views show numbers that look alike but are not the same (the CoW bytes of
//! the mappers' smaps against the CoW part of the count; processes holding the file with
//! or without its copy holders), each is a field of its own, so the difference is written
//! down once instead of hiding in two views.

use std::borrow::Cow;

use serde::{Serialize, Serializer};

use super::{CgroupModel, FileModel, ProcessModel, Report};

/// What a field's number is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    BytesPerSecond,
    /// A count of things, or the representation count.
    Count,
    /// A fraction, 0–1 (`top` compares it in percent).
    Ratio,
    /// A percentage as the kernel gives it (PSI).
    Percent,
    /// Yes or no.
    Flag,
    /// Words: a path, a name, an identity.
    Text,
}

/// A field's value, as its type is (`None`: unknown, never 0).
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Uint(Option<u64>),
    Int(i64),
    Real(Option<f64>),
    Flag(bool),
    Text(Cow<'a, str>),
}

impl Value<'_> {
    /// The value as a number (`None` for text and unknown values).
    pub fn number(&self) -> Option<f64> {
        match self {
            Value::Uint(v) => v.map(|v| v as f64),
            Value::Int(v) => Some(*v as f64),
            Value::Real(v) => *v,
            Value::Flag(b) => Some(if *b { 1.0 } else { 0.0 }),
            Value::Text(_) => None,
        }
    }

    /// The text of a text value.
    pub fn text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// As the model's own types serialize: numbers, `null` for unknown, strings.
impl Serialize for Value<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Uint(v) => v.serialize(s),
            Value::Int(v) => v.serialize(s),
            Value::Real(v) => v.serialize(s),
            Value::Flag(v) => v.serialize(s),
            Value::Text(v) => v.serialize(s),
        }
    }
}

/// A metric family a field is exported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    /// The exporter's help (no final period: the encoder adds one).
    pub help: &'static str,
    /// A cumulative count (the exporter appends `_total`).
    pub counter: bool,
}

const fn gauge(name: &'static str, help: &'static str) -> Option<Metric> {
    Some(Metric {
        name,
        help,
        counter: false,
    })
}

/// `twofold_file_held_bytes`: the file's bytes in memory by `kind` (the fields with a
/// [`FileField::held_kind`]).
pub const FILE_HELD_BYTES: &str = "twofold_file_held_bytes";

/// The fields of a file row ([`FileModel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileField {
    Path,
    /// `major:minor:inode`: stable for a file, the `file_id` label of the exporter too.
    FileId,
    Size,
    /// The representation count (proven parts only).
    Count,
    /// The count is a lower bound.
    LowerBound,
    /// Page-cache bytes of the file.
    Cache,
    /// Page-cache resident fraction.
    Resident,
    /// CoW bytes of the mappers' smaps ([`FileModel::cow_bytes`]).
    Cow,
    /// The CoW part of the count in bytes ([`FileModel::counted_cow_bytes`]).
    CountedCow,
    /// The device part of the count in bytes ([`FileModel::counted_device_bytes`]).
    CountedDevice,
    /// Memory of the proven private copies ([`FileModel::private_copy_memory_bytes`]).
    Private,
    /// File bytes of the proven private copies, whole bytes
    /// ([`FileModel::proven_copy_whole_bytes`]).
    ProvenCopy,
    /// Private memory attributed to suspected copies.
    Suspected,
    /// Processes that map, hold open or hold a copy of it ([`FileModel::holder_count`]).
    Holders,
    /// Processes that map it or hold it open ([`FileModel::mapper_or_opener_count`]).
    MappersOrOpeners,
    /// Bytes held beyond one copy.
    Excess,
}

impl FileField {
    pub const ALL: [FileField; 16] = [
        FileField::Path,
        FileField::FileId,
        FileField::Size,
        FileField::Count,
        FileField::LowerBound,
        FileField::Cache,
        FileField::Resident,
        FileField::Cow,
        FileField::CountedCow,
        FileField::CountedDevice,
        FileField::Private,
        FileField::ProvenCopy,
        FileField::Suspected,
        FileField::Holders,
        FileField::MappersOrOpeners,
        FileField::Excess,
    ];

    /// The short name `top` sorts (`--sort`, `s`) and filters (`size>1G`) by.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self {
            FileField::Path => "path",
            FileField::Size => "size",
            FileField::Count => "count",
            FileField::Cache => "cache",
            FileField::Resident => "resident",
            FileField::Cow => "cow",
            FileField::Private => "private",
            FileField::Suspected => "suspected",
            FileField::Holders => "holders",
            FileField::Excess => "excess",
            FileField::FileId
            | FileField::LowerBound
            | FileField::CountedCow
            | FileField::CountedDevice
            | FileField::ProvenCopy
            | FileField::MappersOrOpeners => return None,
        })
    }

    /// The field named `name` in `top` (`resident_bytes` is the page cache too).
    pub fn named(name: &str) -> Option<FileField> {
        if name == "resident_bytes" {
            return Some(FileField::Cache);
        }
        FileField::ALL.into_iter().find(|f| f.name() == Some(name))
    }

    /// The column of `twofold dump` (CSV header, JSON key).
    pub const fn column(self) -> Option<&'static str> {
        Some(match self {
            FileField::Path => "path",
            FileField::FileId => "file_id",
            FileField::Size => "size_bytes",
            FileField::Count => "copies",
            FileField::LowerBound => "lower_bound",
            FileField::Cache => "page_cache_bytes",
            FileField::Resident => "resident_fraction",
            FileField::CountedCow => "cow_bytes",
            FileField::ProvenCopy => "private_copy_proven_bytes",
            FileField::Suspected => "private_copy_suspected_bytes",
            FileField::MappersOrOpeners => "holders",
            FileField::Cow
            | FileField::CountedDevice
            | FileField::Private
            | FileField::Holders
            | FileField::Excess => return None,
        })
    }

    /// The column title in `top`.
    pub const fn title(self) -> &'static str {
        match self {
            FileField::Resident => "res%",
            FileField::Path => "file",
            f => match f.name() {
                Some(n) => n,
                None => match f.column() {
                    Some(c) => c,
                    None => "",
                },
            },
        }
    }

    /// The column width in `top` (a wider value widens it).
    pub const fn width(self) -> u16 {
        match self {
            FileField::Count | FileField::Holders => 7,
            FileField::Resident => 6,
            FileField::Path => 22,
            _ => 9,
        }
    }

    pub const fn unit(self) -> Unit {
        match self {
            FileField::Path | FileField::FileId => Unit::Text,
            FileField::Count | FileField::Holders | FileField::MappersOrOpeners => Unit::Count,
            FileField::LowerBound => Unit::Flag,
            FileField::Resident => Unit::Ratio,
            _ => Unit::Bytes,
        }
    }

    /// The metric family of the field (labelled by `file_id`), if it is one.
    pub const fn metric(self) -> Option<Metric> {
        match self {
            FileField::Size => gauge("twofold_file_size_bytes", "Size of the file"),
            FileField::Count => gauge(
                "twofold_file_copies",
                "How many times the file's bytes are in memory, proven parts only",
            ),
            FileField::LowerBound => gauge(
                "twofold_file_copies_lower_bound",
                "1 when twofold_file_copies is a lower bound (something that could hold a copy was not searched)",
            ),
            FileField::Resident => gauge(
                "twofold_file_resident_ratio",
                "Page-cache resident fraction of the file (0-1)",
            ),
            FileField::Excess => gauge(
                "twofold_file_excess_bytes",
                "Bytes of the file held beyond one copy: max(0, copies - 1) x size",
            ),
            _ => None,
        }
    }

    /// The help `twofold dump --format openmetrics` writes for the field's family (its
    /// own, shorter wording, as recordings were always dumped).
    pub const fn dump_help(self) -> Option<&'static str> {
        match self {
            FileField::Size => Some("Size of the file."),
            FileField::Count => {
                Some("How many times the file's bytes are in memory, proven parts only.")
            }
            FileField::Resident => Some("Page-cache resident fraction of the file."),
            _ => None,
        }
    }

    /// The `kind` label of the field in [`FILE_HELD_BYTES`], if it is one.
    pub const fn held_kind(self) -> Option<&'static str> {
        match self {
            FileField::Cache => Some("page_cache"),
            FileField::CountedCow => Some("cow"),
            FileField::ProvenCopy => Some("private_copy_proven"),
            FileField::Suspected => Some("private_copy_suspected"),
            FileField::CountedDevice => Some("device"),
            _ => None,
        }
    }

    pub fn value(self, f: &FileModel) -> Value<'_> {
        let r = &f.representations;
        match self {
            FileField::Path => Value::Text(Cow::Borrowed(&f.path)),
            FileField::FileId => Value::Text(Cow::Owned(file_id(f))),
            FileField::Size => Value::Uint(f.size_bytes),
            FileField::Count => Value::Real(r.proven),
            FileField::LowerBound => Value::Flag(r.lower_bound),
            FileField::Cache => Value::Uint(f.resident_bytes),
            FileField::Resident => Value::Real(f.resident_fraction),
            FileField::Cow => Value::Uint(f.cow_bytes()),
            FileField::CountedCow => Value::Uint(f.counted_cow_bytes()),
            FileField::CountedDevice => Value::Uint(f.counted_device_bytes()),
            FileField::Private => Value::Uint(Some(f.private_copy_memory_bytes())),
            FileField::ProvenCopy => Value::Uint(Some(f.proven_copy_whole_bytes())),
            FileField::Suspected => Value::Uint(Some(f.suspected_copy_bytes())),
            FileField::Holders => Value::Uint(Some(f.holder_count() as u64)),
            FileField::MappersOrOpeners => Value::Uint(Some(f.mapper_or_opener_count() as u64)),
            FileField::Excess => Value::Uint(f.excess_bytes()),
        }
    }

    /// The value as `top` sorts and compares it: ratios in percent (`resident<50`).
    pub fn ordinal(self, f: &FileModel) -> Option<f64> {
        let v = self.value(f).number();
        match self.unit() {
            Unit::Ratio => v.map(|v| v * 100.0),
            _ => v,
        }
    }
}

/// `major:minor:inode` of a file.
pub fn file_id(f: &FileModel) -> String {
    format!("{}:{}:{}", f.key.major, f.key.minor, f.key.inode)
}

/// The fields of a process row ([`ProcessModel`]; some need the report around it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessField {
    Pid,
    Comm,
    Rss,
    Anon,
    File,
    Shmem,
    Swap,
    Pss,
    Uss,
    /// `Private_Dirty`.
    Dirty,
    /// Growth of `RssAnon` per second, from the report's rates.
    Growth,
    /// Model files it maps, holds open or holds a proven copy of.
    Files,
    /// CoW bytes inside its private mappings of model files.
    Cow,
    /// Device memory on all GPUs.
    Gpu,
}

impl ProcessField {
    pub const ALL: [ProcessField; 14] = [
        ProcessField::Pid,
        ProcessField::Comm,
        ProcessField::Rss,
        ProcessField::Anon,
        ProcessField::File,
        ProcessField::Shmem,
        ProcessField::Swap,
        ProcessField::Pss,
        ProcessField::Uss,
        ProcessField::Dirty,
        ProcessField::Growth,
        ProcessField::Files,
        ProcessField::Cow,
        ProcessField::Gpu,
    ];

    /// The short name `top` sorts and filters by.
    pub const fn name(self) -> &'static str {
        match self {
            ProcessField::Pid => "pid",
            ProcessField::Comm => "comm",
            ProcessField::Rss => "rss",
            ProcessField::Anon => "anon",
            ProcessField::File => "file",
            ProcessField::Shmem => "shmem",
            ProcessField::Swap => "swap",
            ProcessField::Pss => "pss",
            ProcessField::Uss => "uss",
            ProcessField::Dirty => "dirty",
            ProcessField::Growth => "growth",
            ProcessField::Files => "files",
            ProcessField::Cow => "cow",
            ProcessField::Gpu => "gpu",
        }
    }

    pub fn named(name: &str) -> Option<ProcessField> {
        ProcessField::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The column of `twofold dump`.
    pub const fn column(self) -> Option<&'static str> {
        Some(match self {
            ProcessField::Pid => "pid",
            ProcessField::Comm => "comm",
            ProcessField::Rss => "rss_bytes",
            ProcessField::Anon => "anon_bytes",
            ProcessField::File => "file_bytes",
            ProcessField::Pss => "pss_bytes",
            ProcessField::Growth => "anon_bytes_per_sec",
            _ => return None,
        })
    }

    /// The column title in `top`.
    pub const fn title(self) -> &'static str {
        match self {
            ProcessField::Dirty => "priv dirty",
            ProcessField::Growth => "anon/s",
            f => f.name(),
        }
    }

    pub const fn width(self) -> u16 {
        match self {
            ProcessField::Pid => 7,
            ProcessField::Comm => 15,
            ProcessField::Dirty => 10,
            ProcessField::Growth => 12,
            ProcessField::Files => 5,
            _ => 9,
        }
    }

    pub const fn unit(self) -> Unit {
        match self {
            ProcessField::Comm => Unit::Text,
            ProcessField::Pid | ProcessField::Files => Unit::Count,
            ProcessField::Growth => Unit::BytesPerSecond,
            _ => Unit::Bytes,
        }
    }

    /// The metric family `twofold dump --format openmetrics` writes (labelled by `pid`
    /// and `comm`), with its help.
    pub const fn dump_metric(self) -> Option<(&'static str, &'static str)> {
        match self {
            ProcessField::Anon => Some(("twofold_process_anon_bytes", "RssAnon of a process.")),
            ProcessField::File => Some(("twofold_process_file_bytes", "RssFile of a process.")),
            _ => None,
        }
    }

    pub fn value<'r>(self, r: &Report, p: &'r ProcessModel) -> Value<'r> {
        match self {
            ProcessField::Pid => Value::Int(i64::from(p.pid)),
            ProcessField::Comm => Value::Text(Cow::Borrowed(&p.comm)),
            ProcessField::Rss => Value::Uint(p.rss_bytes),
            ProcessField::Anon => Value::Uint(p.anon_bytes),
            ProcessField::File => Value::Uint(p.file_bytes),
            ProcessField::Shmem => Value::Uint(p.shmem_bytes),
            ProcessField::Swap => Value::Uint(p.swap_bytes),
            ProcessField::Pss => Value::Uint(p.pss_bytes),
            ProcessField::Uss => Value::Uint(p.uss_bytes),
            ProcessField::Dirty => Value::Uint(p.private_dirty_bytes),
            ProcessField::Growth => Value::Real(r.anon_growth(p.pid)),
            ProcessField::Files => Value::Uint(p.holds_files.map(|n| n as u64)),
            ProcessField::Cow => Value::Uint(r.process_cow_bytes(p.pid)),
            ProcessField::Gpu => Value::Uint(p.gpu_memory_bytes),
        }
    }

    /// The value as `top` sorts and compares it.
    pub fn ordinal(self, r: &Report, p: &ProcessModel) -> Option<f64> {
        self.value(r, p).number()
    }
}

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

/// A field of any of the three kinds of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    File(FileField),
    Process(ProcessField),
    Cgroup(CgroupField),
}

impl Field {
    /// The name `top` sorts and filters by (empty for a file field without one).
    pub const fn name(self) -> &'static str {
        match self {
            Field::File(f) => match f.name() {
                Some(n) => n,
                None => "",
            },
            Field::Process(f) => f.name(),
            Field::Cgroup(f) => f.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_columns_are_unique() {
        let mut names: Vec<&str> = FileField::ALL.iter().filter_map(|f| f.name()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        let mut cols: Vec<&str> = FileField::ALL.iter().filter_map(|f| f.column()).collect();
        let n = cols.len();
        cols.sort_unstable();
        cols.dedup();
        assert_eq!(cols.len(), n);
        for f in ProcessField::ALL {
            assert_eq!(ProcessField::named(f.name()), Some(f));
        }
        for f in CgroupField::ALL {
            assert_eq!(CgroupField::named(f.name()), Some(f));
        }
        assert_eq!(FileField::named("resident_bytes"), Some(FileField::Cache));
        assert_eq!(FileField::named("lower_bound"), None);
    }

    #[test]
    fn values_serialize_as_the_model_does() {
        let j = |v: Value| serde_json::to_string(&v).unwrap();
        assert_eq!(j(Value::Uint(Some(2))), "2");
        assert_eq!(j(Value::Uint(None)), "null");
        assert_eq!(j(Value::Real(Some(2.0))), "2.0");
        assert_eq!(j(Value::Int(-1)), "-1");
        assert_eq!(j(Value::Flag(true)), "true");
        assert_eq!(j(Value::Text("a".into())), "\"a\"");
    }
}
