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

mod cgroup;
mod file;
mod process;
pub mod sort;

pub use cgroup::CgroupField;
pub use file::{file_id, FileField};
pub use process::ProcessField;

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

pub(super) const fn gauge(name: &'static str, help: &'static str) -> Option<Metric> {
    Some(Metric {
        name,
        help,
        counter: false,
    })
}

/// `twofold_file_held_bytes`: the file's bytes in memory by `kind` (the fields with a
/// [`FileField::held_kind`]).
pub const FILE_HELD_BYTES: &str = "twofold_file_held_bytes";

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
