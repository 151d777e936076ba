//! The fields of a process row.

use std::borrow::Cow;

use super::{Unit, Value};
use crate::model::{ProcessModel, Report};

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
