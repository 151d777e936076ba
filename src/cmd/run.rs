//! `twofold run`.

use std::io::Write;
use std::time::Duration;

use crate::campaign::out;
use crate::campaign::run::{run as run_campaign, RunRequest, RunSummary};
use crate::cleanup::Registry;
use crate::cli::RunArgs;
use crate::units::{iec, iec_opt};

use super::common::{check_inputs, check_sandbox};

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

pub fn run(args: &RunArgs, w: &mut dyn Write) -> anyhow::Result<()> {
    check_inputs(args.model.as_deref(), &args.watch)?;
    let memory_max = check_sandbox(&args.sandbox)?;
    if let Some(dir) = &args.sandbox.out {
        out::check(dir)?;
    }
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
    let text = crate::render::safe::terminal(&human(&summary)).into_owned();
    if let Some(dir) = &args.sandbox.out {
        out::write_timeline(
            dir,
            "timeline",
            &points,
            &crate::render::safe::terminal(&format!(
                "twofold run: {}",
                crate::render::safe::shell_words(&summary.command)
            )),
            Some(summary.memory_max_bytes),
        )?;
        out::write(dir, "summary.json", &serde_json::to_vec_pretty(&summary)?)?;
        out::write(dir, "summary.md", out::markdown(&text).as_bytes())?;
    }
    if args.output.json {
        crate::render::json(w, &summary)?;
    } else {
        w.write_all(text.as_bytes())?;
    }
    Ok(())
}
