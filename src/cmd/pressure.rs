//! `twofold pressure FILE`: the readers and integrity experiments.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::campaign::competitor::{run_arm, CompetitorRequest, CompetitorRun, SharingArm};
use crate::campaign::integrity::{self, Integrity};
use crate::campaign::out;
use crate::campaign::plot::{line_chart, write_chart, Chart, Limit, Series, XTicks};
use crate::campaign::readers::{run_config, ReadArm, ReadersRow};
use crate::cleanup::Registry;
use crate::cli::{Experiment, PressureArgs};
use crate::units::{iec, iec_opt};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PressureReport {
    pub schema_version: u32,
    pub file: String,
    pub size_bytes: u64,
    pub memory_max_bytes: Option<u64>,
    pub readers: Vec<ReadersRow>,
    pub competitor: Vec<CompetitorRun>,
    pub integrity: Option<Integrity>,
}

pub fn readers_markdown(rows: &[ReadersRow]) -> String {
    let pct = |v: Option<f64>| {
        v.map(|v| format!("{:.0}%", v * 100.0))
            .unwrap_or_else(|| "n/a".into())
    };
    let num = |v: Option<f64>, digits: usize| {
        v.map(|v| format!("{v:.digits$}"))
            .unwrap_or_else(|| "n/a".into())
    };
    let mut s = String::from(
        "| arm | N | resident at start | start spread ms | alive | OOM kills | peak | anon | page cache | file resident | MemAvailable | PSS per reader (median) | load s (median) | load s (max) | load GB/s (file / median) | aggregate GB/s (N × file / max) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut notes = Vec::new();
    for r in rows {
        let mut pss = r.reader_pss_bytes.clone();
        pss.sort_unstable();
        let arm = format!("{:?}", r.arm).to_lowercase();
        let _ = writeln!(
            s,
            "| {arm} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.readers,
            pct(r.start_cache.resident_fraction),
            num(r.release_spread_ms, 1),
            r.alive,
            r.oom_kills
                .map(|v| v.to_string())
                .unwrap_or_else(|| "n/a".into()),
            iec_opt(r.peak_bytes),
            iec_opt(r.anon_bytes),
            iec_opt(r.page_cache_bytes),
            pct(r.file_resident_fraction),
            iec_opt(r.mem_available_bytes),
            iec_opt(pss.get(pss.len() / 2).copied()),
            num(r.load_seconds_median, 3),
            num(r.load_seconds_max, 3),
            num(r.load_gb_per_s, 2),
            num(r.aggregate_load_gb_per_s, 2),
        );
        if let Some(why) = &r.start_cache.eviction_skipped {
            notes.push(format!(
                "- {arm}, N = {}: not a cold start: {why}",
                r.readers
            ));
        }
    }
    if !notes.is_empty() {
        s.push('\n');
        s.push_str(&notes.join("\n"));
        s.push('\n');
    }
    s
}

pub fn integrity_markdown(i: &Integrity) -> String {
    let mut s = format!(
        "{} in {} chunks of {}; xxh3-128 {}; hashing {:.2} GB/s on cached data (memcpy {:.2} GB/s)\n\n| cycle | resident after evict | refault | mismatched chunks | whole file |\n|---:|---:|---:|---|---|\n",
        iec(i.size_bytes),
        i.chunks,
        iec(i.chunk_bytes as u64),
        i.whole_xxh3_128,
        i.hash_gb_per_s,
        i.memcpy_gb_per_s
    );
    for (n, c) in i.cycles.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} s ({:.2} GB/s) | {} | {} |",
            n + 1,
            iec_opt(c.resident_after_evict_bytes),
            c.refault_seconds,
            c.refault_gb_per_s,
            if c.mismatched_chunks.is_empty() {
                "none".to_string()
            } else {
                format!("{:?}", c.mismatched_chunks)
            },
            if c.whole_matches {
                "matches"
            } else {
                "DIFFERS"
            }
        );
    }
    s
}

pub fn competitor_markdown(rows: &[CompetitorRun]) -> String {
    let pct = |v: Option<f64>| {
        v.map(|v| format!("{:.0}%", v * 100.0))
            .unwrap_or_else(|| "n/a".into())
    };
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "n/a".into());
    let mut s = String::from(
        "| arm | competitor | resident at start | min | end | pass ms before | pass ms under pressure | refaults (pages) | OOM kills |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            format!("{:?}", r.arm).to_lowercase(),
            if r.failed.is_some() {
                "failed".to_string()
            } else {
                format!(
                    "{} {}",
                    iec(r.competitor_bytes),
                    if r.active { "active" } else { "idle" }
                )
            },
            pct(r.resident_start_fraction),
            pct(r.resident_min_fraction),
            pct(r.resident_end_fraction),
            ms(r.pass_ms_before),
            ms(r.pass_ms_under_pressure),
            r.refaults_file
                .map(|v| v.to_string())
                .unwrap_or_else(|| "n/a".into()),
            r.oom_kills
                .map(|v| v.to_string())
                .unwrap_or_else(|| "n/a".into()),
        );
    }
    for r in rows {
        if let Some(why) = &r.failed {
            let _ = writeln!(
                s,
                "\n- {} arm failed, not a valid experiment: {why}",
                format!("{:?}", r.arm).to_lowercase()
            );
        }
    }
    s
}

fn plot_competitor(dir: &std::path::Path, report: &PressureReport) -> anyhow::Result<()> {
    let size = report.size_bytes.max(1) as f64;
    let series: Vec<Series> = report
        .competitor
        .iter()
        .map(|r| Series {
            name: format!(
                "{} mapping: file resident %",
                format!("{:?}", r.arm).to_lowercase()
            ),
            points: r
                .timeline
                .iter()
                .filter_map(|p| {
                    let b = p.files_resident_bytes.first().copied().flatten()?;
                    Some((p.t_seconds, (b as f64 / size * 100.0).min(100.0)))
                })
                .collect(),
            markers: false,
        })
        .collect();
    line_chart(
        dir,
        "competitor",
        "mapped file under a growing competitor",
        "seconds",
        "% resident",
        &series,
        None,
    )
}

fn plot_readers(
    dir: &std::path::Path,
    rows: &[ReadersRow],
    memory_max: Option<u64>,
) -> anyhow::Result<()> {
    let series: Vec<Series> = [ReadArm::Copy, ReadArm::Mmap]
        .iter()
        .map(|arm| Series {
            name: format!("{} arm: peak", format!("{arm:?}").to_lowercase()),
            points: rows
                .iter()
                .filter(|r| r.arm == *arm)
                .filter_map(|r| Some((r.readers as f64, r.peak_bytes? as f64 / 1048576.0)))
                .collect(),
            markers: true,
        })
        .collect();
    let limit = memory_max.map(|m| Limit {
        name: format!("memory limit ({})", iec(m)),
        y: m as f64 / 1048576.0,
    });
    write_chart(
        dir,
        "readers",
        &Chart {
            title: "N concurrent readers: peak cgroup usage",
            x_label: "readers",
            y_label: "MiB",
            series: &series,
            limit: limit.as_ref(),
            x_ticks: XTicks::Integer,
        },
    )
}

/// The experiments in the order they ran, as JSON Lines records: a `readers` record per
/// configuration; per competitor arm its `sample`s (with `experiment` and `arm`) then a
/// `competitor` record (without the samples); an `integrity_cycle` record per cycle.
pub fn timeline(report: &PressureReport) -> Vec<(&'static str, serde_json::Value)> {
    fn json<T: Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
    }
    let mut lines = Vec::new();
    for r in &report.readers {
        lines.push(("readers", json(r)));
    }
    for r in &report.competitor {
        let arm = format!("{:?}", r.arm).to_lowercase();
        for p in &r.timeline {
            let extra = serde_json::json!({"experiment": "competitor", "arm": arm});
            lines.push(("sample", out::sample(p, extra)));
        }
        let mut v = json(r);
        if let Some(o) = v.as_object_mut() {
            o.remove("timeline");
        }
        lines.push(("competitor", v));
    }
    if let Some(i) = &report.integrity {
        for (n, c) in i.cycles.iter().enumerate() {
            let mut v = json(c);
            if let Some(o) = v.as_object_mut() {
                o.insert("cycle".into(), (n + 1).into());
            }
            lines.push(("integrity_cycle", v));
        }
    }
    lines
}

pub fn run(args: &PressureArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let meta = crate::input::open_regular(&args.file, "file")?
        .metadata()
        .with_context(|| format!("cannot access '{}'", args.file.display()))?;
    if let Some(r) = &args.reference {
        crate::input::check_regular(r, "--reference")?;
    }
    // One rule for every --memory-max, whichever experiments run.
    super::common::check_sandbox(&args.sandbox)?;
    // --out is checked before the experiments (minutes of work), not after them.
    if let Some(dir) = &args.sandbox.out {
        out::check(dir)?;
    }
    let all = args.experiments.is_empty();
    let want = |e: Experiment| all || args.experiments.contains(&e);
    let f = args.competitor_fraction;
    if want(Experiment::Competitor) && (!f.is_finite() || f <= 0.0) {
        bail!("'--competitor-fraction {f}' must be a finite number above 0");
    }
    if want(Experiment::Integrity) {
        integrity::check_fits(&args.file, meta.len(), crate::input::mem_available())?;
    }
    let registry = Registry::install()?;
    let mut report = PressureReport {
        schema_version: crate::model::SCHEMA_VERSION,
        file: args.file.display().to_string(),
        size_bytes: meta.len(),
        memory_max_bytes: None,
        readers: Vec::new(),
        competitor: Vec::new(),
        integrity: None,
    };
    if want(Experiment::Readers) {
        let limit = super::common::memory_max(&args.sandbox)?;
        // Refuse up front, before any reader starts.
        let proc_root = std::path::Path::new("/proc");
        let (avail, total) = crate::campaign::sandbox::host_memory(proc_root)?;
        crate::campaign::sandbox::check_limit(limit, avail, total)?;
        let free = crate::campaign::readers::free_tasks(proc_root);
        for &n in &args.readers {
            crate::campaign::readers::check_readers(n, meta.len(), limit, free)?;
        }
        report.memory_max_bytes = Some(limit);
        let exe = std::env::current_exe().context("cannot find the twofold executable")?;
        let bar = crate::campaign::progress(2 * args.readers.len() as u64, args.output.json);
        for arm in [ReadArm::Copy, ReadArm::Mmap] {
            for &n in &args.readers {
                bar.set_message(format!("readers: {arm:?} arm, N = {n}").to_lowercase());
                report
                    .readers
                    .push(run_config(&exe, &args.file, arm, n, limit, &registry)?);
                bar.inc(1);
            }
        }
        bar.finish_and_clear();
    }
    if want(Experiment::Competitor) {
        let limit = super::common::memory_max(&args.sandbox)?;
        let exe = std::env::current_exe().context("cannot find the twofold executable")?;
        let req = CompetitorRequest {
            readers: args.map_readers,
            fraction: args.competitor_fraction,
            steps: args.competitor_steps,
            step_seconds: args.competitor_step_seconds,
            active: args.competitor_active,
            limit,
            interval: std::time::Duration::from_millis(args.sandbox.interval_ms.max(1)),
        };
        report.memory_max_bytes = Some(limit);
        let bar = crate::campaign::progress(2, args.output.json);
        for arm in [SharingArm::Shared, SharingArm::Private] {
            bar.set_message(format!("competitor: {arm:?} arm").to_lowercase());
            report
                .competitor
                .push(run_arm(&exe, &args.file, arm, &req, &registry)?);
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    if want(Experiment::Integrity) {
        let bar = crate::campaign::progress(args.cycles as u64 + 1, args.output.json);
        bar.set_message("integrity: evict, refault, re-hash");
        report.integrity = Some(integrity::run(
            &args.file,
            args.cycles,
            args.reference.as_deref(),
            &|| bar.inc(1),
        )?);
        bar.finish_and_clear();
    }
    let mut md = String::new();
    if !report.readers.is_empty() {
        let _ = writeln!(
            md,
            "## readers: '{}' ({}) under {}\n\n{}",
            report.file,
            iec(report.size_bytes),
            iec_opt(report.memory_max_bytes),
            readers_markdown(&report.readers)
        );
    }
    if !report.competitor.is_empty() {
        let _ = writeln!(
            md,
            "## competitor: '{}' ({}) under {}\n\n{}",
            report.file,
            iec(report.size_bytes),
            iec_opt(report.memory_max_bytes),
            competitor_markdown(&report.competitor)
        );
    }
    if let Some(i) = &report.integrity {
        let _ = writeln!(
            md,
            "## integrity: '{}'\n\n{}",
            report.file,
            integrity_markdown(i)
        );
    }
    if let Some(dir) = &args.sandbox.out {
        out::write(dir, "pressure.json", &serde_json::to_vec_pretty(&report)?)?;
        out::write(dir, "pressure.md", md.as_bytes())?;
        out::write_jsonl(dir, "pressure.jsonl", timeline(&report))?;
        if !report.readers.is_empty() {
            plot_readers(dir, &report.readers, report.memory_max_bytes)?;
        }
        if !report.competitor.is_empty() {
            plot_competitor(dir, &report)?;
        }
    }
    crate::cleanup::check_interrupted()?;
    if args.output.json {
        crate::render::json(out, &report)?;
    } else {
        out.write_all(crate::render::safe::terminal(&md).as_bytes())?;
    }
    let failed: Vec<String> = report
        .competitor
        .iter()
        .filter_map(|r| {
            let why = r.failed.as_ref()?;
            Some(format!(
                "{} arm: {why}",
                format!("{:?}", r.arm).to_lowercase()
            ))
        })
        .collect();
    if !failed.is_empty() {
        out.flush()?;
        bail!("the competitor experiment failed ({})", failed.join("; "));
    }
    Ok(())
}
