//! Output of `twofold trace`: a block of tables per interval for people, JSON Lines
//! (one `{"schema_version", "type", "data"}` object per line) for programs; and the
//! traced section of `scan --trace`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::table::{Align, Table};
use crate::model::trace::uploads::{FileUploadTrace, ProcessUploadTrace};
use crate::model::trace::{FileTrace, ProcessTrace, TraceModel};
use crate::sample::trace::Counter;
use crate::units::iec;

/// Version of the JSON Lines records; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// What was attached, printed once before the first interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attached {
    /// Milliseconds it took to load and attach the programs.
    pub attach_ms: f64,
    /// Counters that are unknown in this session, with the reason.
    pub unavailable: std::collections::BTreeMap<Counter, String>,
    /// Files of interest: their counters are kept in non-evicting maps.
    pub files: Vec<String>,
    pub pids: Vec<i32>,
}

/// One JSON Lines record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Record {
    Attached(Attached),
    /// Rates over one interval.
    Interval(TraceModel),
    /// Rates and totals over the whole session, when it ends.
    Summary(TraceModel),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub schema_version: u32,
    #[serde(flatten)]
    pub record: Record,
}

/// Writes one record as one line of JSON.
pub fn json_line(out: &mut dyn std::io::Write, record: Record) -> std::io::Result<()> {
    let line = Line {
        schema_version: SCHEMA_VERSION,
        record,
    };
    serde_json::to_writer(&mut *out, &line)?;
    writeln!(out)?;
    out.flush()
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(0.0) => "0".into(),
        Some(v) if v < 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

fn bytes_rate(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) => format!("{}/s", iec(v.max(0.0) as u64)),
    }
}

fn file_name(f: &FileTrace) -> String {
    f.path
        .clone()
        .unwrap_or_else(|| format!("[{} inode {}]", f.device, f.inode))
}

fn files_table(files: &[FileTrace]) -> String {
    let mut t = Table::new(&[
        ("faults/s", Align::Right),
        ("around pg/s", Align::Right),
        ("added pg/s", Align::Right),
        ("evicted pg/s", Align::Right),
        ("refault pg/s", Align::Right),
        ("read()", Align::Right),
        ("file", Align::Left),
    ]);
    for f in files {
        t.row(vec![
            num(f.file_faults_per_sec),
            num(f.fault_around_pages_per_sec),
            num(f.added_pages_per_sec),
            num(f.evicted_pages_per_sec),
            num(f.refault_pages_per_sec),
            bytes_rate(f.read_bytes_per_sec),
            format!("{}{}", file_name(f), if f.of_interest { "" } else { " *" }),
        ]);
    }
    t.render(2)
}

fn processes_table(procs: &[ProcessTrace]) -> String {
    let mut t = Table::new(&[
        ("pid", Align::Right),
        ("comm", Align::Left),
        ("faults/s", Align::Right),
        ("writes/s", Align::Right),
        ("file faults/s", Align::Right),
        ("read()", Align::Right),
        ("reclaim ms/s", Align::Right),
        ("top file read", Align::Left),
    ]);
    for p in procs {
        let top = p
            .files
            .iter()
            .find(|f| f.read_bytes > 0)
            .map(|f| {
                let name = f
                    .path
                    .clone()
                    .unwrap_or_else(|| format!("[{} inode {}]", f.device, f.inode));
                format!("{name} ({})", iec(f.read_bytes))
            })
            .unwrap_or_default();
        t.row(vec![
            p.pid.to_string(),
            p.comm.clone().unwrap_or_else(|| "?".into()),
            num(p.faults_per_sec),
            num(p.write_faults_per_sec),
            num(p.file_faults_per_sec),
            bytes_rate(p.read_bytes_per_sec),
            num(p.reclaim_ms_per_sec),
            top,
        ]);
    }
    t.render(2)
}

/// Decimal gigabytes per second, as links and copies are quoted.
fn gb_per_sec(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{:.2}", v / 1e9))
}

/// GPU indices (NVML), or `n/a` when none is known.
fn gpus(g: &[u32]) -> String {
    if g.is_empty() {
        return "n/a".into();
    }
    g.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Model-file bytes uploaded per file and process, then every copy per process.
fn uploads_tables(files: &[FileUploadTrace], procs: &[ProcessUploadTrace]) -> String {
    let mut t = Table::new(&[
        ("pid", Align::Right),
        ("comm", Align::Left),
        ("uploaded", Align::Right),
        ("calls", Align::Right),
        ("GB/s", Align::Right),
        ("gpu", Align::Right),
        ("file (bytes of it on the device)", Align::Left),
    ]);
    for f in files {
        let name = f
            .path
            .clone()
            .unwrap_or_else(|| format!("[{}:{} inode {}]", f.key.major, f.key.minor, f.key.inode));
        t.row(vec![
            f.pid.to_string(),
            f.comm.clone(),
            iec(f.device_bytes),
            f.calls.to_string(),
            gb_per_sec(f.bytes_per_sec),
            gpus(&f.gpus),
            format!(
                "{name} ({}{})",
                iec(f.file_bytes),
                match f.conversion {
                    Some(c) => format!(", {}", crate::sample::converted::words(c)),
                    None if f.widened => ", widened to F32".into(),
                    None => String::new(),
                }
            ),
        ]);
    }
    let mut out = t.render(2);
    let mut t = Table::new(&[
        ("pid", Align::Right),
        ("comm", Align::Left),
        ("copies", Align::Right),
        ("bytes", Align::Right),
        ("model bytes", Align::Right),
        ("GB/s", Align::Right),
        ("gpu", Align::Right),
    ]);
    for p in procs {
        t.row(vec![
            p.pid.to_string(),
            p.comm.clone(),
            p.calls.to_string(),
            iec(p.bytes),
            iec(p.model_bytes),
            gb_per_sec(p.bytes_per_sec),
            gpus(&p.gpus),
        ]);
    }
    out.push_str("  host-to-device copies per process\n");
    out.push_str(&t.render(2));
    out
}

/// The tables of one interval (or of a whole session).
pub fn human(m: &TraceModel, title: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title} at {:.1} s (rates over {:.2} s); page cache, all files: added {} pg/s, evicted {} pg/s",
        m.at_secs,
        m.interval_secs,
        num(m.cache_added_pages_per_sec),
        num(m.cache_evicted_pages_per_sec)
    );
    if m.files.is_empty() {
        out.push_str("  FILES: no activity\n");
    } else {
        out.push_str("  FILES (* = not a file of interest)\n");
        out.push_str(&files_table(&m.files));
    }
    if m.processes.is_empty() {
        out.push_str("  PROCESSES: no activity\n");
    } else {
        out.push_str("  PROCESSES\n");
        out.push_str(&processes_table(&m.processes));
    }
    if !m.uploads.is_empty() || !m.upload_processes.is_empty() {
        out.push_str("  UPLOADS to GPUs (model bytes matched by content)\n");
        out.push_str(&uploads_tables(&m.uploads, &m.upload_processes));
    }
    for k in &m.oom_kills {
        let _ = writeln!(
            out,
            "  OOM KILL  pid {} ({}) anon {} file {}",
            k.pid,
            k.comm,
            iec(k.anon_rss_bytes),
            iec(k.file_rss_bytes)
        );
    }
    if m.lost_updates > 0 {
        let _ = writeln!(
            out,
            "  {} updates lost to full maps: some counters are low",
            m.lost_updates
        );
    }
    out
}

/// The first lines for people: what is traced and what is not.
pub fn human_attached(a: &Attached) -> String {
    let mut out = format!(
        "attached in {:.0} ms; {} file(s) of interest{}\n",
        a.attach_ms,
        a.files.len(),
        if a.pids.is_empty() {
            String::new()
        } else {
            format!(
                ", pid(s) {}",
                a.pids
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
    );
    for (c, why) in &a.unavailable {
        let _ = writeln!(out, "  unavailable: {c:?}: {why}");
    }
    out
}

/// The section `scan --trace` adds before its findings.
pub fn scan_section(m: &TraceModel) -> String {
    let mut out = format!("\nTRACED FOR {:.1} s (eBPF)\n", m.interval_secs);
    let body = human(m, "  totals");
    out.push_str(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_round_trip_through_the_typed_record() {
        let m = TraceModel {
            at_secs: 1.0,
            interval_secs: 1.0,
            files: Vec::new(),
            processes: Vec::new(),
            oom_kills: Vec::new(),
            unavailable: [(Counter::OomKills, "no tracepoint".to_string())].into(),
            lost_updates: 0,
            cache_added_pages_per_sec: None,
            cache_evicted_pages_per_sec: Some(2.0),
            cache_added_pages: None,
            cache_evicted_pages: Some(10),
            uploads: Vec::new(),
            upload_processes: Vec::new(),
        };
        let mut buf = Vec::new();
        json_line(&mut buf, Record::Interval(m.clone())).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with(r#"{"schema_version":1,"type":"interval","data":{"#));
        let back: Line = serde_json::from_str(&text).unwrap();
        assert_eq!(back.record, Record::Interval(m.clone()));
        let human = human(&m, "interval");
        assert!(human.contains("FILES: no activity"), "{human}");
    }

    #[test]
    fn unknown_rates_show_as_na() {
        assert_eq!(num(None), "n/a");
        assert_eq!(num(Some(0.0)), "0");
        assert_eq!(num(Some(2.25)), "2.2");
        assert_eq!(num(Some(1234.4)), "1234");
        assert_eq!(bytes_rate(Some(2048.0)), "2.0 KiB/s");
    }
}
