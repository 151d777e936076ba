//! The rows each view shows, picked from a [`Report`]: filtered, then sorted by a field of
//! the registry ([`crate::model::fields`]); and the rows of the open file's table. Pure.

use super::filter::Filter;
use crate::model::fields::{CgroupField, Field, FileField, ProcessField, Unit, Value};
use crate::model::{CgroupModel, Code, FileModel, Finding, ProcessModel, Report};
use crate::sample::FileKey;

/// What picks a view's rows: the filter, the sort field and its direction.
#[derive(Debug, Clone)]
pub struct Query {
    pub filter: Option<Filter>,
    pub sort: Field,
    pub reverse: bool,
}

/// The files view's rows: filtered, then sorted.
/// Whether the filter keeps file row `f`.
fn file_kept(f: &FileModel, filter: Option<&Filter>) -> bool {
    match filter {
        None => true,
        Some(Filter::Substring(s)) => f.path.to_lowercase().contains(s.as_str()),
        Some(Filter::Compare { field, cmp, value }) => Filter::compare(
            *cmp,
            FileField::named(field).and_then(|k| k.ordinal(f)),
            *value,
        ),
    }
}

/// Whether the filter keeps process row `p`.
fn process_kept(report: &Report, p: &ProcessModel, filter: Option<&Filter>) -> bool {
    match filter {
        None => true,
        Some(Filter::Substring(s)) => {
            p.comm.to_lowercase().contains(s.as_str())
                || p.cmdline.to_lowercase().contains(s.as_str())
                || p.pid.to_string() == *s
        }
        Some(Filter::Compare { field, cmp, value }) => Filter::compare(
            *cmp,
            ProcessField::named(field).and_then(|k| k.ordinal(report, p)),
            *value,
        ),
    }
}

/// How many rows of files and of processes the filter keeps (nothing sorted).
pub fn counts(report: &Report, filter: Option<&Filter>) -> (usize, usize) {
    (
        report.files.iter().filter(|f| file_kept(f, filter)).count(),
        report
            .processes
            .iter()
            .filter(|p| process_kept(report, p, filter))
            .count(),
    )
}

pub fn files<'r>(report: &'r Report, q: &Query) -> Vec<&'r FileModel> {
    let mut rows: Vec<&FileModel> = report
        .files
        .iter()
        .filter(|f| file_kept(f, q.filter.as_ref()))
        .collect();
    if let Field::File(col) = q.sort {
        sort_rows(&mut rows, q.reverse, |f| {
            Sortable::of(col.unit(), || col.value(f), || col.ordinal(f))
        });
    }
    rows
}

pub fn processes<'r>(report: &'r Report, q: &Query) -> Vec<&'r ProcessModel> {
    let mut rows: Vec<&ProcessModel> = report
        .processes
        .iter()
        .filter(|p| process_kept(report, p, q.filter.as_ref()))
        .collect();
    if let Field::Process(col) = q.sort {
        sort_rows(&mut rows, q.reverse, |p| {
            Sortable::of(
                col.unit(),
                || col.value(report, p),
                || col.ordinal(report, p),
            )
        });
    }
    rows
}

/// Whether the filter keeps cgroup `c`.
pub fn cgroup_kept(c: &CgroupModel, filter: Option<&Filter>) -> bool {
    match filter {
        None => true,
        Some(Filter::Substring(s)) => c.path.to_lowercase().contains(s.as_str()),
        Some(Filter::Compare { field, cmp, value }) => {
            Filter::compare(*cmp, cgroup_value(c, field), *value)
        }
    }
}

pub fn cgroups<'r>(report: &'r Report, q: &Query) -> Vec<&'r CgroupModel> {
    let mut rows: Vec<&CgroupModel> = report
        .cgroups
        .iter()
        .filter(|c| cgroup_kept(c, q.filter.as_ref()))
        .collect();
    if let Field::Cgroup(col) = q.sort {
        sort_rows(&mut rows, q.reverse, |c| {
            Sortable::of(col.unit(), || col.value(c), || col.ordinal(c))
        });
    }
    rows
}

/// The findings the filter keeps: text that their subject or sentence contains; a
/// comparison that a file, process or cgroup they name passes (`count>=2` keeps the
/// findings about files held twice). Findings name nothing a comparison could pass
/// are hidden by it.
pub fn findings<'r>(report: &'r Report, filter: Option<&Filter>) -> Vec<&'r Finding> {
    report
        .findings
        .iter()
        .filter(|f| match filter {
            None => true,
            Some(Filter::Substring(s)) => {
                let t = f.text();
                t.subject.to_lowercase().contains(s.as_str())
                    || t.message.to_lowercase().contains(s.as_str())
            }
            Some(Filter::Compare { field, cmp, value }) => {
                let (file, pids, cgroup) = named(report, f);
                let file = FileField::named(field).zip(file).map(|(k, key)| {
                    report
                        .files
                        .iter()
                        .filter(|f| f.key == key)
                        .any(|f| Filter::compare(*cmp, k.ordinal(f), *value))
                });
                let process = ProcessField::named(field).map(|k| {
                    report
                        .processes
                        .iter()
                        .filter(|p| pids.contains(&p.pid))
                        .any(|p| Filter::compare(*cmp, k.ordinal(report, p), *value))
                });
                let cg = cgroup.map(|path| {
                    report
                        .cgroups
                        .iter()
                        .filter(|c| c.path == path)
                        .any(|c| Filter::compare(*cmp, cgroup_value(c, field), *value))
                });
                [file, process, cg].into_iter().flatten().any(|b| b)
            }
        })
        .collect()
}

/// The file, the processes and the cgroup a finding is about (a finding read back as
/// text: the file at its subject).
fn named<'r>(report: &'r Report, f: &'r Finding) -> (Option<FileKey>, Vec<i32>, Option<&'r str>) {
    match &f.code {
        Code::ProvenPrivateCopy { file, pid, .. }
        | Code::SuspectedPrivateCopy { file, pid, .. }
        | Code::UnexplainedMemory { file, pid, .. }
        | Code::CowInPrivateMapping { file, pid, .. }
        | Code::MappingBeyondEof { file, pid, .. }
        | Code::FileThp { file, pid, .. }
        | Code::ReadCopy { file, pid, .. }
        | Code::DeviceCopy { file, pid, .. } => (Some(*file), vec![*pid], None),
        Code::SharedPrivateCopy { file, pids, .. } => (Some(*file), pids.clone(), None),
        Code::ReplacedFileHeld { file, holders, .. } => {
            (Some(*file), holders.iter().map(|h| h.0).collect(), None)
        }
        Code::SharedMapping { file, .. }
        | Code::LowResidency { file, .. }
        | Code::ResidencyUnknown { file, .. }
        | Code::MultipleRepresentations { file, .. }
        | Code::CountIsLowerBound { file, .. }
        | Code::Refaults { file, .. } => (Some(*file), Vec::new(), None),
        Code::SameBytesCached { files, .. } => (files.first().map(|f| f.0), Vec::new(), None),
        Code::DirectReclaim { pid, .. } | Code::OomKill { pid, .. } => (None, vec![*pid], None),
        Code::CgroupOomKills { cgroup, .. } | Code::CgroupNearLimit { cgroup, .. } => {
            (None, Vec::new(), Some(cgroup.as_str()))
        }
        Code::Text { subject, .. } => (
            report
                .files
                .iter()
                .find(|f| f.path == *subject)
                .map(|f| f.key),
            Vec::new(),
            report
                .cgroups
                .iter()
                .find(|c| c.path == *subject)
                .map(|c| c.path.as_str()),
        ),
    }
}

/// The value of the cgroup field named `field`, as `top` compares it.
pub fn cgroup_value(c: &CgroupModel, field: &str) -> Option<f64> {
    CgroupField::named(field).and_then(|k| k.ordinal(c))
}

/// A row of the open file's table: a mapper, a holder of an open fd that does not map
/// it, or a copy holder that neither maps nor holds it.
#[derive(Debug, Clone, Copy)]
pub enum HolderRow<'r> {
    Mapper(&'r crate::model::Mapper),
    OpenFd(i32, &'r str),
    NotOpen(i32, &'r str),
}

impl HolderRow<'_> {
    pub fn pid(&self) -> i32 {
        match self {
            HolderRow::Mapper(m) => m.pid,
            HolderRow::OpenFd(p, _) | HolderRow::NotOpen(p, _) => *p,
        }
    }
}

/// The open file's table, in the order it is drawn.
pub fn holder_rows(f: &FileModel) -> Vec<HolderRow<'_>> {
    let mut rows: Vec<HolderRow> = f.mappers.iter().map(HolderRow::Mapper).collect();
    rows.extend(
        f.holders
            .iter()
            .filter(|h| !h.mapped)
            .map(|h| HolderRow::OpenFd(h.pid, &h.comm)),
    );
    rows.extend(
        crate::render::scan::unlisted_copy_holders(f)
            .into_iter()
            .map(|(pid, comm)| HolderRow::NotOpen(pid, comm)),
    );
    rows
}

enum Sortable {
    Num(Option<f64>),
    Text(String),
}

impl Sortable {
    /// Text sorts as text; anything else by its number as `top` compares it.
    fn of<'a>(
        unit: Unit,
        value: impl FnOnce() -> Value<'a>,
        ordinal: impl FnOnce() -> Option<f64>,
    ) -> Sortable {
        match unit {
            Unit::Text => Sortable::Text(value().text().unwrap_or_default().to_string()),
            _ => Sortable::Num(ordinal()),
        }
    }
}

/// Numbers largest first, text A→Z; unknown values last either way; stable, so equal
/// rows keep the report's order. Each row's key is computed once (a key may scan the
/// report: the growth rate, the CoW bytes).
fn sort_rows<T: Copy>(rows: &mut Vec<T>, reverse: bool, key: impl Fn(&T) -> Sortable) {
    use std::cmp::Ordering;
    let mut keyed: Vec<(Sortable, T)> = rows.drain(..).map(|r| (key(&r), r)).collect();
    keyed.sort_by(|(a, _), (b, _)| match (a, b) {
        (Sortable::Num(x), Sortable::Num(y)) => match (x, y) {
            (Some(x), Some(y)) => {
                let o = y.total_cmp(x);
                if reverse {
                    o.reverse()
                } else {
                    o
                }
            }
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        },
        (Sortable::Text(x), Sortable::Text(y)) => {
            let o = x.cmp(y);
            if reverse {
                o.reverse()
            } else {
                o
            }
        }
        _ => Ordering::Equal,
    });
    rows.extend(keyed.into_iter().map(|(_, r)| r));
}

/// How the process holds each model file: `map` (MAP_SHARED), `priv` (MAP_PRIVATE),
/// `fd` (open, not mapped), `copy` (a proven private copy), `copy?` (suspected), with the
/// file's name: `map llama.gguf, copy qwen.safetensors`.
pub fn process_holds(report: &Report, pid: i32) -> String {
    let mut out: Vec<String> = Vec::new();
    for f in &report.files {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        let mut how: Vec<&str> = Vec::new();
        if let Some(m) = f.mappers.iter().find(|m| m.pid == pid) {
            how.push(match m.kind {
                crate::model::MapKind::Shared => "map",
                crate::model::MapKind::Private => "priv",
                _ => "map+priv",
            });
        } else if f.holders.iter().any(|h| h.pid == pid) {
            how.push("fd");
        }
        if f.proven_copies.iter().any(|c| c.pid == pid) {
            how.push("copy");
        } else if f.suspected_copies.iter().any(|c| c.pid == pid) {
            how.push("copy?");
        }
        if !how.is_empty() {
            out.push(format!("{} {name}", how.join("+")));
        }
    }
    out.join(", ")
}
