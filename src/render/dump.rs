//! `twofold dump`: rows of reports over time as JSON Lines (a `type`/`data` envelope),
//! CSV, or OpenMetrics text that `promtool tsdb create-blocks-from openmetrics` loads
//! (metric families grouped, samples in time order, timestamps in whole seconds, `# EOF`).

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use crate::cli::{DumpFormat, DumpWhat};
use crate::model::Report;

/// One row per file of a report.
#[derive(Debug, Serialize)]
struct FileRow<'a> {
    at: String,
    file_id: String,
    path: &'a str,
    size_bytes: Option<u64>,
    resident_fraction: Option<f64>,
    copies: Option<f64>,
    lower_bound: bool,
    page_cache_bytes: Option<u64>,
    cow_bytes: Option<u64>,
    private_copy_proven_bytes: u64,
    private_copy_suspected_bytes: u64,
    holders: usize,
}

#[derive(Debug, Serialize)]
struct ProcessRow<'a> {
    at: String,
    pid: i32,
    comm: &'a str,
    rss_bytes: Option<u64>,
    anon_bytes: Option<u64>,
    file_bytes: Option<u64>,
    pss_bytes: Option<u64>,
    anon_bytes_per_sec: Option<f64>,
}

#[derive(Debug, Serialize)]
struct CgroupRow<'a> {
    at: String,
    cgroup: &'a str,
    usage_bytes: Option<u64>,
    limit_bytes: Option<u64>,
    anon_bytes: Option<u64>,
    file_bytes: Option<u64>,
    oom_kills: Option<u64>,
}

/// `major:minor:inode`: stable for a file, the `file_id` label of the exporter too.
pub fn file_id(f: &crate::model::FileModel) -> String {
    format!("{}:{}:{}", f.key.major, f.key.minor, f.key.inode)
}

fn frac_bytes(frac: Option<f64>, size: Option<u64>) -> Option<u64> {
    Some((frac? * size? as f64).round() as u64)
}

/// Escapes an OpenMetrics label value.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
            families: BTreeMap::new(),
        }
    }

    fn metric(&mut self, name: &'static str, help: &'static str, labels: &str, v: f64, at: f64) {
        if !v.is_finite() {
            return;
        }
        self.families
            .entry(name)
            .or_insert(("gauge", help, Vec::new()))
            .2
            .push(format!("{name}{{{labels}}} {v} {}", at.floor() as u64));
    }

    fn emit<T: Serialize>(
        &mut self,
        kind: &str,
        rows: &[T],
        out: &mut dyn Write,
    ) -> anyhow::Result<()> {
        match self.format {
            DumpFormat::Json => {
                for r in rows {
                    serde_json::to_writer(
                        &mut *out,
                        &serde_json::json!({"type": kind, "data": r}),
                    )?;
                    writeln!(out)?;
                }
            }
            DumpFormat::Csv => {
                for r in rows {
                    let v = serde_json::to_value(r)?;
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
                let mut files: Vec<&crate::model::FileModel> = r.files.iter().collect();
                files.sort_by_key(|f| std::cmp::Reverse(f.size_bytes.unwrap_or(0)));
                let rows: Vec<FileRow> = files
                    .iter()
                    .take(top)
                    .map(|f| {
                        let reps = &f.representations;
                        FileRow {
                            at: at.clone(),
                            file_id: file_id(f),
                            path: &f.path,
                            size_bytes: f.size_bytes,
                            resident_fraction: f.resident_fraction,
                            copies: reps.proven,
                            lower_bound: reps.lower_bound,
                            page_cache_bytes: f.resident_bytes,
                            cow_bytes: frac_bytes(reps.cow, f.size_bytes),
                            private_copy_proven_bytes: f
                                .proven_copies
                                .iter()
                                .map(|c| c.identical_bytes + c.widened_bytes)
                                .sum(),
                            private_copy_suspected_bytes: f
                                .suspected_copies
                                .iter()
                                .map(|s| s.attributed_bytes)
                                .sum(),
                            holders: f.mappers.len()
                                + f.holders.iter().filter(|h| !h.mapped).count(),
                        }
                    })
                    .collect();
                if self.format == DumpFormat::Openmetrics {
                    for f in &rows {
                        let id = format!("file_id=\"{}\"", label(&f.file_id));
                        self.metric(
                            "twofold_file_info",
                            "A model file: its path (1 while it is seen).",
                            &format!("{id},path=\"{}\"", label(f.path)),
                            1.0,
                            secs,
                        );
                        if let Some(c) = f.copies {
                            self.metric(
                                "twofold_file_copies",
                                "How many times the file's bytes are in memory, proven parts only.",
                                &id,
                                c,
                                secs,
                            );
                        }
                        if let Some(s) = f.size_bytes {
                            self.metric(
                                "twofold_file_size_bytes",
                                "Size of the file.",
                                &id,
                                s as f64,
                                secs,
                            );
                        }
                        if let Some(r) = f.resident_fraction {
                            self.metric(
                                "twofold_file_resident_ratio",
                                "Page-cache resident fraction of the file.",
                                &id,
                                r,
                                secs,
                            );
                        }
                        for (kind, v) in [
                            ("page_cache", f.page_cache_bytes),
                            ("cow", f.cow_bytes),
                            ("private_copy_proven", Some(f.private_copy_proven_bytes)),
                            (
                                "private_copy_suspected",
                                Some(f.private_copy_suspected_bytes),
                            ),
                        ] {
                            if let Some(v) = v {
                                self.metric(
                                    "twofold_file_held_bytes",
                                    "Bytes of the file held in memory, by kind.",
                                    &format!("{id},kind=\"{kind}\""),
                                    v as f64,
                                    secs,
                                );
                            }
                        }
                    }
                }
                self.emit("file", &rows, out)
            }
            DumpWhat::Processes => {
                let mut procs: Vec<&crate::model::ProcessModel> = r.processes.iter().collect();
                procs.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes.unwrap_or(0)));
                let rate = |pid: i32| {
                    r.rates.as_ref().and_then(|x| {
                        x.processes
                            .iter()
                            .find(|p| p.pid == pid)
                            .and_then(|p| p.anon_bytes_per_sec)
                    })
                };
                let rows: Vec<ProcessRow> = procs
                    .iter()
                    .take(top)
                    .map(|p| ProcessRow {
                        at: at.clone(),
                        pid: p.pid,
                        comm: &p.comm,
                        rss_bytes: p.rss_bytes,
                        anon_bytes: p.anon_bytes,
                        file_bytes: p.file_bytes,
                        pss_bytes: p.pss_bytes,
                        anon_bytes_per_sec: rate(p.pid),
                    })
                    .collect();
                if self.format == DumpFormat::Openmetrics {
                    for p in &rows {
                        let l = format!("pid=\"{}\",comm=\"{}\"", p.pid, label(p.comm));
                        if let Some(v) = p.anon_bytes {
                            self.metric(
                                "twofold_process_anon_bytes",
                                "RssAnon of a process.",
                                &l,
                                v as f64,
                                secs,
                            );
                        }
                        if let Some(v) = p.file_bytes {
                            self.metric(
                                "twofold_process_file_bytes",
                                "RssFile of a process.",
                                &l,
                                v as f64,
                                secs,
                            );
                        }
                    }
                }
                self.emit("process", &rows, out)
            }
            DumpWhat::Cgroups => {
                let rows: Vec<CgroupRow> = r
                    .cgroups
                    .iter()
                    .take(top)
                    .map(|c| CgroupRow {
                        at: at.clone(),
                        cgroup: &c.path,
                        usage_bytes: c.usage_bytes,
                        limit_bytes: c.limit_bytes,
                        anon_bytes: c.anon_bytes,
                        file_bytes: c.file_bytes,
                        oom_kills: c.oom_kills,
                    })
                    .collect();
                if self.format == DumpFormat::Openmetrics {
                    for c in &rows {
                        let l = format!("cgroup=\"{}\"", label(c.cgroup));
                        if let Some(v) = c.usage_bytes {
                            self.metric(
                                "twofold_cgroup_memory_usage_bytes",
                                "Memory usage of a cgroup.",
                                &l,
                                v as f64,
                                secs,
                            );
                        }
                    }
                }
                self.emit("cgroup", &rows, out)
            }
        }
    }

    /// Writes what was held back (OpenMetrics) and the terminator.
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
