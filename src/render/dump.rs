//! `twofold dump`: rows of reports over time as JSON Lines (a `type`/`data` envelope),
//! CSV, or OpenMetrics text that `promtool tsdb create-blocks-from openmetrics` loads
//! (metric families grouped, samples in time order, timestamps in whole seconds, `# EOF`).

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use crate::model::fields::{CgroupField, FileField, ProcessField, Value, FILE_HELD_BYTES};
use crate::model::trace::TraceModel;
use crate::model::{CgroupModel, FileModel, ProcessModel, Report};
use crate::sample::FileKey;

/// The rows of a dump: one per file, process, cgroup, or traced file and process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpWhat {
    Files,
    Processes,
    Cgroups,
    Trace,
}

/// How the rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpFormat {
    /// JSON Lines, a `type`/`data` envelope per row.
    Json,
    Csv,
    Openmetrics,
}

/// The columns of `dump --what files`, `processes` and `cgroups`, from the registry
/// (besides `at`, when the report was taken); JSON keys and CSV columns come out in name
/// order.
const FILE_COLUMNS: [FileField; 11] = {
    use FileField as F;
    [
        F::FileId,
        F::Path,
        F::Size,
        F::Resident,
        F::Count,
        F::LowerBound,
        F::Cache,
        F::CountedCow,
        F::ProvenCopy,
        F::Suspected,
        F::Holders,
    ]
};

const PROCESS_COLUMNS: [ProcessField; 7] = {
    use ProcessField as P;
    [P::Pid, P::Comm, P::Rss, P::Anon, P::File, P::Pss, P::Growth]
};

const CGROUP_COLUMNS: [CgroupField; 6] = {
    use CgroupField as C;
    [C::Path, C::Usage, C::Limit, C::Anon, C::File, C::OomKills]
};

/// The file gauges of `dump --format openmetrics` (beside the info and the held bytes).
const FILE_GAUGES: [FileField; 3] = [FileField::Count, FileField::Size, FileField::Resident];

/// The kinds of `twofold_file_held_bytes` in dump's OpenMetrics, in their order.
const FILE_HELD: [FileField; 4] = [
    FileField::Cache,
    FileField::CountedCow,
    FileField::ProvenCopy,
    FileField::Suspected,
];

/// One row: `at` and the named values.
type Row = serde_json::Map<String, serde_json::Value>;

fn row<'v>(
    at: &str,
    cells: impl Iterator<Item = (Option<&'static str>, Value<'v>)>,
) -> anyhow::Result<Row> {
    let mut row = Row::new();
    row.insert("at".into(), at.into());
    for (name, v) in cells {
        if let Some(name) = name {
            row.insert(name.into(), serde_json::to_value(v)?);
        }
    }
    Ok(row)
}

/// One row of eBPF counters: a file, a process, or the page cache as a whole
/// (`scope`). Totals are since the tracer attached; rates are over the interval since the
/// snapshot before (or since attach for the first snapshot of an attachment). Empty
/// (`null`) where a counter does not apply to the scope or was unavailable.
#[derive(Debug, Serialize)]
struct TraceRow<'a> {
    at: String,
    scope: &'static str,
    file_id: Option<String>,
    path: Option<&'a str>,
    pid: Option<i32>,
    comm: Option<&'a str>,
    interval_secs: f64,
    faults_total: Option<u64>,
    file_faults_total: Option<u64>,
    added_pages_total: Option<u64>,
    evicted_pages_total: Option<u64>,
    refault_pages_total: Option<u64>,
    read_bytes_total: Option<u64>,
    reclaim_ns_total: Option<u64>,
    faults_per_sec: Option<f64>,
    file_faults_per_sec: Option<f64>,
    added_pages_per_sec: Option<f64>,
    evicted_pages_per_sec: Option<f64>,
    refault_pages_per_sec: Option<f64>,
    read_bytes_per_sec: Option<f64>,
    reclaim_ms_per_sec: Option<f64>,
}

impl TraceRow<'_> {
    fn empty(at: String, scope: &'static str, interval_secs: f64) -> Self {
        TraceRow {
            at,
            scope,
            file_id: None,
            path: None,
            pid: None,
            comm: None,
            interval_secs,
            faults_total: None,
            file_faults_total: None,
            added_pages_total: None,
            evicted_pages_total: None,
            refault_pages_total: None,
            read_bytes_total: None,
            reclaim_ns_total: None,
            faults_per_sec: None,
            file_faults_per_sec: None,
            added_pages_per_sec: None,
            evicted_pages_per_sec: None,
            refault_pages_per_sec: None,
            read_bytes_per_sec: None,
            reclaim_ms_per_sec: None,
        }
    }
}

/// The trace rows of a report: the page cache, then its files and processes as the
/// report lists them (files of interest first, then by activity), at most `top` of each.
fn trace_rows<'a>(t: &'a TraceModel, at: &str, top: usize) -> Vec<TraceRow<'a>> {
    let secs = t.interval_secs;
    let mut rows = vec![TraceRow {
        added_pages_total: t.cache_added_pages,
        evicted_pages_total: t.cache_evicted_pages,
        added_pages_per_sec: t.cache_added_pages_per_sec,
        evicted_pages_per_sec: t.cache_evicted_pages_per_sec,
        ..TraceRow::empty(at.to_string(), "page_cache", secs)
    }];
    rows.extend(t.files.iter().take(top).map(|f| TraceRow {
        file_id: Some(key_id(f.key)),
        path: f.path.as_deref(),
        file_faults_total: f.total.file_faults,
        added_pages_total: f.total.added_pages,
        evicted_pages_total: f.total.evicted_pages,
        refault_pages_total: f.total.refault_pages,
        read_bytes_total: f.total.read_bytes,
        file_faults_per_sec: f.file_faults_per_sec,
        added_pages_per_sec: f.added_pages_per_sec,
        evicted_pages_per_sec: f.evicted_pages_per_sec,
        refault_pages_per_sec: f.refault_pages_per_sec,
        read_bytes_per_sec: f.read_bytes_per_sec,
        ..TraceRow::empty(at.to_string(), "file", secs)
    }));
    rows.extend(t.processes.iter().take(top).map(|p| TraceRow {
        pid: Some(p.pid),
        comm: p.comm.as_deref(),
        faults_total: p.total.faults,
        file_faults_total: p.total.file_faults,
        read_bytes_total: p.total.read_bytes,
        reclaim_ns_total: p.total.reclaim_ns,
        faults_per_sec: p.faults_per_sec,
        file_faults_per_sec: p.file_faults_per_sec,
        read_bytes_per_sec: p.read_bytes_per_sec,
        reclaim_ms_per_sec: p.reclaim_ms_per_sec,
        ..TraceRow::empty(at.to_string(), "process", secs)
    }));
    rows
}

/// `major:minor:inode` of a key.
fn key_id(k: FileKey) -> String {
    format!("{}:{}:{}", k.major, k.minor, k.inode)
}

pub use crate::model::fields::file_id;

/// Escapes an OpenMetrics label value.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Decimal places of the fractions, counts and rates `dump` writes (1 ppm: a page of a
/// 4 GiB file), the same in JSON Lines and CSV; integers (bytes, pages) stay exact.
pub const DECIMALS: i32 = 6;

/// `v` with every non-integer number rounded to [`DECIMALS`] places (no float noise such
/// as `4.999998092652277`).
pub fn rounded(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if !(n.is_u64() || n.is_i64()) => {
            let scale = 10f64.powi(DECIMALS);
            match n.as_f64().map(|f| (f * scale).round() / scale) {
                Some(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
                None => Value::Number(n),
            }
        }
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, rounded(v))).collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(rounded).collect()),
        other => other,
    }
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// Accumulates rows; JSON and CSV stream, OpenMetrics groups by family until `finish`.
pub struct Rows {
    what: DumpWhat,
    format: DumpFormat,
    top: Option<usize>,
    header_done: bool,
    /// Rows (JSON, CSV) or samples (OpenMetrics) written or kept so far.
    rows: usize,
    /// family → (type, help, sample lines).
    families: BTreeMap<&'static str, (&'static str, &'static str, Vec<String>)>,
}

impl Rows {
    pub fn new(what: DumpWhat, format: DumpFormat, top: Option<usize>) -> Rows {
        Rows {
            what,
            format,
            top,
            header_done: false,
            rows: 0,
            families: BTreeMap::new(),
        }
    }

    fn metric(&mut self, name: &'static str, help: &'static str, labels: &str, v: f64, at: f64) {
        self.sample("gauge", name, help, labels, v, at);
    }

    /// A counter: `name` ends in `_total`, and the family is named so too (what both
    /// `promtool check metrics` and the OpenMetrics backfill accept).
    fn counter(&mut self, name: &'static str, help: &'static str, labels: &str, v: f64, at: f64) {
        self.sample("counter", name, help, labels, v, at);
    }

    fn sample(
        &mut self,
        kind: &'static str,
        name: &'static str,
        help: &'static str,
        labels: &str,
        v: f64,
        at: f64,
    ) {
        if !v.is_finite() {
            return;
        }
        self.rows += 1;
        self.families
            .entry(name)
            .or_insert((kind, help, Vec::new()))
            .2
            .push(format!("{name}{{{labels}}} {v} {}", at.floor() as u64));
    }

    /// OpenMetrics of trace rows: the counters, as counters.
    fn trace_metrics(&mut self, rows: &[TraceRow], secs: f64) {
        for r in rows {
            let labels = match r.scope {
                "file" => {
                    let id = format!("file_id=\"{}\"", label(r.file_id.as_deref().unwrap_or("")));
                    if let Some(p) = r.path {
                        self.metric(
                            "twofold_trace_file_info",
                            "A traced file: its path (1 while it is listed).",
                            &format!("{id},path=\"{}\"", label(p)),
                            1.0,
                            secs,
                        );
                    }
                    id
                }
                "process" => format!(
                    "pid=\"{}\",comm=\"{}\"",
                    r.pid.unwrap_or(0),
                    label(r.comm.unwrap_or(""))
                ),
                _ => String::new(),
            };
            let (file, process) = (r.scope == "file", r.scope == "process");
            let n = |v: Option<u64>| v.map(|v| v as f64);
            #[rustfmt::skip]
            let counters: [(bool, &'static str, &'static str, Option<f64>); 11] = [
                (r.scope == "page_cache", "twofold_trace_page_cache_added_pages_total",
                 "Pages added to the page cache since the tracer attached, all files (4 KiB pages).",
                 n(r.added_pages_total)),
                (r.scope == "page_cache", "twofold_trace_page_cache_evicted_pages_total",
                 "Pages evicted from the page cache since the tracer attached, all files (4 KiB pages).",
                 n(r.evicted_pages_total)),
                (file, "twofold_trace_file_faults_total",
                 "Page faults on the file's pages (filemap faults) since the tracer attached.",
                 n(r.file_faults_total)),
                (file, "twofold_trace_file_added_pages_total",
                 "Pages of the file added to the page cache since the tracer attached (4 KiB pages).",
                 n(r.added_pages_total)),
                (file, "twofold_trace_file_evicted_pages_total",
                 "Pages of the file evicted from the page cache since the tracer attached (4 KiB pages).",
                 n(r.evicted_pages_total)),
                (file, "twofold_trace_file_refault_pages_total",
                 "Pages of the file read back soon after their eviction, since the tracer attached (4 KiB pages).",
                 n(r.refault_pages_total)),
                (file, "twofold_trace_file_read_bytes_total",
                 "Bytes read from the file with read(), pread64(), readv() and preadv(), all processes, since the tracer attached.",
                 n(r.read_bytes_total)),
                (process, "twofold_trace_process_faults_total",
                 "Page faults of the process since the tracer attached.",
                 n(r.faults_total)),
                (process, "twofold_trace_process_file_faults_total",
                 "File page faults of the process since the tracer attached.",
                 n(r.file_faults_total)),
                (process, "twofold_trace_process_read_bytes_total",
                 "Bytes the process read from files with read() and the like since the tracer attached.",
                 n(r.read_bytes_total)),
                (process, "twofold_trace_process_reclaim_seconds_total",
                 "Seconds the process stalled in direct reclaim since the tracer attached.",
                 r.reclaim_ns_total.map(|ns| ns as f64 / 1e9)),
            ];
            for (applies, name, help, v) in counters {
                if let (true, Some(v)) = (applies, v) {
                    self.counter(name, help, &labels, v, secs);
                }
            }
        }
    }

    /// OpenMetrics of one file: its info (the path), its gauges and its held bytes.
    fn file_metrics(&mut self, f: &FileModel, secs: f64) {
        let id = format!("file_id=\"{}\"", label(&file_id(f)));
        self.metric(
            "twofold_file_info",
            "A model file: its path (1 while it is seen).",
            &format!("{id},path=\"{}\"", label(&f.path)),
            1.0,
            secs,
        );
        for k in FILE_GAUGES {
            if let (Some(m), Some(help), Some(v)) = (k.metric(), k.dump_help(), k.value(f).number())
            {
                self.metric(m.name, help, &id, v, secs);
            }
        }
        for k in FILE_HELD {
            if let (Some(kind), Some(v)) = (k.held_kind(), k.value(f).number()) {
                self.metric(
                    FILE_HELD_BYTES,
                    "Bytes of the file held in memory, by kind.",
                    &format!("{id},kind=\"{kind}\""),
                    v,
                    secs,
                );
            }
        }
    }

    fn emit<T: Serialize>(
        &mut self,
        kind: &str,
        rows: &[T],
        out: &mut dyn Write,
    ) -> anyhow::Result<()> {
        if self.format != DumpFormat::Openmetrics {
            self.rows += rows.len();
        }
        match self.format {
            DumpFormat::Json => {
                for r in rows {
                    let data = rounded(serde_json::to_value(r)?);
                    serde_json::to_writer(
                        &mut *out,
                        &serde_json::json!({"type": kind, "data": data}),
                    )?;
                    writeln!(out)?;
                }
            }
            DumpFormat::Csv => {
                for r in rows {
                    let v = rounded(serde_json::to_value(r)?);
                    let obj = v
                        .as_object()
                        .map(|o| o.iter().collect::<Vec<_>>())
                        .unwrap_or_default();
                    if !self.header_done {
                        let names: Vec<String> = obj.iter().map(|(k, _)| csv_field(k)).collect();
                        writeln!(out, "{}", names.join(","))?;
                        self.header_done = true;
                    }
                    let cells: Vec<String> = obj
                        .iter()
                        .map(|(_, v)| match v {
                            serde_json::Value::Null => String::new(),
                            serde_json::Value::String(s) => csv_field(s),
                            other => other.to_string(),
                        })
                        .collect();
                    writeln!(out, "{}", cells.join(","))?;
                }
            }
            DumpFormat::Openmetrics => {}
        }
        Ok(())
    }

    /// Adds the rows of one report.
    pub fn add(&mut self, r: &Report, out: &mut dyn Write) -> anyhow::Result<()> {
        let at_ns = r.at_unix_ns.unwrap_or(0);
        let at = crate::timespec::format(at_ns);
        let secs = at_ns as f64 / 1e9;
        let top = self.top.unwrap_or(usize::MAX);
        match self.what {
            DumpWhat::Files => {
                let mut files: Vec<&FileModel> = r.files.iter().collect();
                files.sort_by_key(|f| std::cmp::Reverse(f.size_bytes.unwrap_or(0)));
                files.truncate(top);
                let rows = files
                    .iter()
                    .map(|f| row(&at, FILE_COLUMNS.iter().map(|k| (k.column(), k.value(f)))))
                    .collect::<anyhow::Result<Vec<Row>>>()?;
                if self.format == DumpFormat::Openmetrics {
                    for f in &files {
                        self.file_metrics(f, secs);
                    }
                }
                self.emit("file", &rows, out)
            }
            DumpWhat::Processes => {
                let mut procs: Vec<&ProcessModel> = r.processes.iter().collect();
                procs.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes.unwrap_or(0)));
                procs.truncate(top);
                let rows = procs
                    .iter()
                    .map(|p| {
                        let cells = PROCESS_COLUMNS.iter().map(|k| (k.column(), k.value(r, p)));
                        row(&at, cells)
                    })
                    .collect::<anyhow::Result<Vec<Row>>>()?;
                if self.format == DumpFormat::Openmetrics {
                    for p in &procs {
                        let l = format!("pid=\"{}\",comm=\"{}\"", p.pid, label(&p.comm));
                        for k in ProcessField::ALL {
                            if let (Some((name, help)), Some(v)) =
                                (k.dump_metric(), k.value(r, p).number())
                            {
                                self.metric(name, help, &l, v, secs);
                            }
                        }
                    }
                }
                self.emit("process", &rows, out)
            }
            DumpWhat::Cgroups => {
                let cgroups: Vec<&CgroupModel> = r.cgroups.iter().take(top).collect();
                let rows = cgroups
                    .iter()
                    .map(|c| row(&at, CGROUP_COLUMNS.iter().map(|k| (k.column(), k.value(c)))))
                    .collect::<anyhow::Result<Vec<Row>>>()?;
                if self.format == DumpFormat::Openmetrics {
                    for c in &cgroups {
                        let l = format!("cgroup=\"{}\"", label(&c.path));
                        for k in CgroupField::ALL {
                            if let (Some(m), Some(help), Some(v)) =
                                (k.metric(), k.dump_help(), k.value(c).number())
                            {
                                self.metric(m.name, help, &l, v, secs);
                            }
                        }
                    }
                }
                self.emit("cgroup", &rows, out)
            }
            DumpWhat::Trace => {
                // Snapshots recorded without --trace have no rows.
                let Some(t) = &r.trace else { return Ok(()) };
                let rows = trace_rows(t, &at, top);
                if self.format == DumpFormat::Openmetrics {
                    self.trace_metrics(&rows, secs);
                }
                self.emit("trace", &rows, out)
            }
        }
    }

    /// Writes what was held back (OpenMetrics) and the terminator.
    /// Rows (or OpenMetrics samples) the reports gave so far.
    pub fn count(&self) -> usize {
        self.rows
    }

    pub fn finish(self, out: &mut dyn Write) -> anyhow::Result<()> {
        if self.format != DumpFormat::Openmetrics {
            return Ok(());
        }
        for (name, (kind, help, lines)) in &self.families {
            writeln!(out, "# HELP {name} {help}")?;
            writeln!(out, "# TYPE {name} {kind}")?;
            // Timestamps are whole seconds (what both promtool's linter and the
            // OpenMetrics backfill read): of two samples of a series in one second, the
            // later one is kept.
            for (i, l) in lines.iter().enumerate() {
                let series = l.rsplitn(3, ' ').nth(2).unwrap_or(l);
                let ts = l.rsplit(' ').next().unwrap_or("");
                let superseded = lines[i + 1..].iter().any(|m| {
                    m.rsplitn(3, ' ').nth(2) == Some(series) && m.rsplit(' ').next() == Some(ts)
                });
                if !superseded {
                    writeln!(out, "{l}")?;
                }
            }
        }
        writeln!(out, "# EOF")?;
        Ok(())
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;

    #[test]
    fn fractions_are_rounded_and_integers_kept() {
        let v = serde_json::json!({"copies": 4.999998092652277, "bytes": 33554432u64,
            "neg": -1i64, "whole": 1.0, "none": null});
        let r = rounded(v);
        assert_eq!(r["copies"].to_string(), "4.999998");
        assert_eq!(r["bytes"].to_string(), "33554432");
        assert_eq!(r["neg"].to_string(), "-1");
        assert_eq!(r["whole"].to_string(), "1.0");
        assert!(r["none"].is_null());
    }

    #[test]
    fn csv_and_json_rows_carry_the_same_rounded_numbers() {
        let mut row = Row::new();
        row.insert("copies".into(), serde_json::json!(4.999998092652277));
        let mut rows = Rows::new(DumpWhat::Files, DumpFormat::Csv, None);
        let mut csv = Vec::new();
        rows.emit("file", std::slice::from_ref(&row), &mut csv)
            .unwrap();
        assert_eq!(String::from_utf8(csv).unwrap(), "copies\n4.999998\n");
        let mut rows = Rows::new(DumpWhat::Files, DumpFormat::Json, None);
        let mut json = Vec::new();
        rows.emit("file", &[row], &mut json).unwrap();
        let json = String::from_utf8(json).unwrap();
        assert!(json.contains("\"copies\":4.999998}"), "{json}");
    }
}
