//! `twofold run`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::campaign::plot::{line_chart, Series};
use crate::campaign::run::{run as run_campaign, RunRequest, RunSummary};
use crate::campaign::sampler::TimelinePoint;
use crate::cleanup::Registry;
use crate::cli::RunArgs;
use crate::units::{iec, iec_opt};

use super::common::{check_inputs, check_sandbox};

const MIB: f64 = 1048576.0;

/// Writes `timeline.jsonl` and `memory.{svg,png}` for samples.
pub fn write_timeline(
    dir: &Path,
    stem: &str,
    points: &[TimelinePoint],
    title: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
    let path = dir.join(format!("{stem}.jsonl"));
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&path)
            .with_context(|| format!("cannot create '{}'", path.display()))?,
    );
    for p in points {
        serde_json::to_writer(&mut f, &serde_json::json!({"type": "sample", "data": p}))?;
        writeln!(f)?;
    }
    f.flush()?;
    let series = |name: &str, get: &dyn Fn(&TimelinePoint) -> Option<u64>| Series {
        name: name.to_string(),
        points: points
            .iter()
            .filter_map(|p| get(p).map(|v| (p.t_seconds, v as f64 / MIB)))
            .collect(),
    };
    let mut lines = vec![
        series("cgroup usage", &|p| p.usage_bytes),
        series("anon", &|p| p.anon_bytes),
        series("file (page cache)", &|p| p.file_bytes),
    ];
    if points
        .iter()
        .any(|p| p.files_resident_bytes.first().copied().flatten().is_some())
    {
        lines.push(series("model resident", &|p| {
            p.files_resident_bytes.first().copied().flatten()
        }));
    }
    line_chart(dir, stem, title, "seconds", "MiB", &lines)
}

fn human(s: &RunSummary) -> String {
    let mut out = format!(
        "twofold run: '{}' in a {} cgroup limited to {}\n",
        s.command.join(" "),
        s.cgroup_version,
        iec(s.memory_max_bytes)
    );
    let status = match (s.exit_code, s.exit_signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(9)) => "killed by SIGKILL (OOM killer or timeout)".to_string(),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown".to_string(),
    };
    out.push_str(&format!(
        "  {status} after {:.2} s{}\n",
        s.wall_seconds,
        if s.timed_out { " (timed out)" } else { "" }
    ));
    out.push_str(&format!(
        "  peak {}  (anon {}, file {})   at the end: anon {}, file {}\n",
        iec_opt(s.peak_bytes),
        iec_opt(s.peak_anon_bytes),
        iec_opt(s.peak_file_bytes),
        iec_opt(s.end_anon_bytes),
        iec_opt(s.end_file_bytes)
    ));
    out.push_str(&format!(
        "  settled after {}   OOM kills {}   samples {}\n",
        s.settle_seconds
            .map(|v| format!("{v:.2} s"))
            .unwrap_or_else(|| "n/a".into()),
        s.oom_kills
            .map(|v| v.to_string())
            .unwrap_or_else(|| "n/a".into()),
        s.samples
    ));
    if let Some(c) = &s.start_cache {
        out.push_str(&format!("  page cache: {}\n", c.describe()));
    }
    if let Some(c) = &s.copies {
        if c.proven.is_empty() && c.suspected.is_empty() {
            out.push_str("  copies of the model at the timeout: none (every candidate searched)\n");
        }
        for p in &c.proven {
            out.push_str(&format!(
                "  copy of the model at the timeout: pid {} ({}): proven private copy ({:.0}% of the file, {} in memory)\n",
                p.pid,
                p.comm,
                p.fraction * 100.0,
                iec(p.memory_bytes)
            ));
        }
        for x in &c.suspected {
            out.push_str(&format!(
                "  copy of the model at the timeout: pid {} ({}), private anon {}: suspected, not proven ({})\n",
                x.pid,
                x.comm,
                iec(x.anon_bytes),
                x.unsearched
            ));
        }
    }
    if let Some(m) = &s.model {
        let r = |v: Option<f64>| {
            v.map(|v| format!("{v:.2}×"))
                .unwrap_or_else(|| "n/a".into())
        };
        out.push_str(&format!(
            "  model '{}' ({}): peak = {} the file (copies + page cache charged here); {} without the model's page-cache growth (UMLoad's metric)\n",
            m.path,
            iec(m.size_bytes),
            r(m.peak_ratio),
            r(m.peak_ratio_excluding_cache)
        ));
    }
    out
}

pub fn run(args: &RunArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    check_inputs(args.model.as_deref(), &args.watch)?;
    let memory_max = check_sandbox(&args.sandbox)?;
    let registry = Registry::install()?;
    let req = RunRequest {
        command: args.command.clone(),
        stdout_to_stderr: args.output.json,
        quiet: args.output.json,
        memory_max,
        model: args.model.clone(),
        watch: args.watch.clone(),
        interval: Duration::from_millis(args.sandbox.interval_ms.max(1)),
        timeout: args.timeout,
        warm: args.warm,
    };
    let (summary, points) = run_campaign(&req, &registry)?;
    crate::cleanup::check_interrupted()?;
    if let Some(dir) = &args.sandbox.out {
        write_timeline(
            dir,
            "timeline",
            &points,
            &format!("twofold run: {}", summary.command.join(" ")),
        )?;
        std::fs::write(
            dir.join("summary.json"),
            serde_json::to_vec_pretty(&summary)?,
        )?;
    }
    if args.output.json {
        crate::render::json(out, &summary)?;
    } else {
        out.write_all(crate::render::safe::terminal(&human(&summary)).as_bytes())?;
    }
    Ok(())
}
