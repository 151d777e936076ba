//! The fields of a file row.

use std::borrow::Cow;

use super::{gauge, Metric, Unit, Value};
use crate::model::FileModel;

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
    /// Holders: distinct processes that map it, hold it open or hold a copy of it
    /// ([`FileModel::holder_count`]); one meaning in `top`, `dump` and the docs.
    Holders,
    /// Bytes held beyond one copy.
    Excess,
    /// Device bytes living processes uploaded from the file (upload tracing; unknown when
    /// none was traced, [`FileModel::uploaded_bytes`]).
    Uploaded,
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
        FileField::Excess,
        FileField::Uploaded,
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
            FileField::Uploaded => "uploaded",
            FileField::FileId
            | FileField::LowerBound
            | FileField::CountedCow
            | FileField::CountedDevice
            | FileField::ProvenCopy => return None,
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
            FileField::Holders => "holders",
            FileField::Cow
            | FileField::CountedDevice
            | FileField::Private
            | FileField::Excess
            | FileField::Uploaded => return None,
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
            FileField::Count | FileField::Holders => Unit::Count,
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

    /// The `kind` label of the field in [`super::FILE_HELD_BYTES`], if it is one.
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
            FileField::Excess => Value::Uint(f.excess_bytes()),
            FileField::Uploaded => Value::Uint(f.uploaded_bytes()),
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
