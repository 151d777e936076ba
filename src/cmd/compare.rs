//! `twofold compare`: paired, order-rotated rounds of two commands.

use std::io::Write;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use crate::campaign::out;
use crate::campaign::plot::{write_chart, Chart, Limit, Series, XTicks};
use crate::campaign::run::{run as run_campaign, RunRequest, RunSummary};
use crate::campaign::stats::{bootstrap_ci, median, quartiles};
use crate::cleanup::Registry;
use crate::cli::CompareArgs;
use crate::units::iec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandArm {
    pub command: Vec<String>,
    pub peak_bytes: Vec<Option<u64>>,
    pub wall_seconds: Vec<f64>,
    pub median_peak_bytes: Option<f64>,
    pub median_wall_seconds: Option<f64>,
    /// With `--model`: the model's resident fraction at the start of each round.
    pub start_resident_fraction: Vec<Option<f64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// B / A per round.
    pub per_round: Vec<f64>,
    pub median: Option<f64>,
    pub iqr: Option<(f64, f64)>,
    pub ci95: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub schema_version: u32,
    pub rounds: usize,
    pub a: CommandArm,
    pub b: CommandArm,
    pub peak_ratio_b_over_a: Ratio,
    pub wall_ratio_b_over_a: Ratio,
    pub runs: Vec<RunSummary>,
}

fn ratio(per_round: Vec<f64>) -> Ratio {
    Ratio {
        median: median(&per_round),
        iqr: quartiles(&per_round),
        ci95: bootstrap_ci(&per_round, 2000, 0.95),
        per_round,
    }
}

fn arm(command: &[String], runs: &[&RunSummary]) -> CommandArm {
    let peaks: Vec<Option<u64>> = runs.iter().map(|r| r.peak_bytes).collect();
    let walls: Vec<f64> = runs.iter().map(|r| r.wall_seconds).collect();
    let pk: Vec<f64> = peaks.iter().flatten().map(|v| *v as f64).collect();
    CommandArm {
        command: command.to_vec(),
        median_peak_bytes: median(&pk),
        median_wall_seconds: median(&walls),
        peak_bytes: peaks,
        wall_seconds: walls,
        start_resident_fraction: runs
            .iter()
            .map(|r| r.start_cache.as_ref().and_then(|c| c.resident_fraction))
            .collect(),
    }
}

/// Splits `CMD_A... ::: CMD_B...` into exactly two non-empty commands.
fn arms(commands: &[String]) -> anyhow::Result<(&[String], &[String])> {
    let seps = commands.iter().filter(|a| *a == ":::").count();
    let Some(split) = commands.iter().position(|a| a == ":::") else {
        bail!("give two commands separated by ':::' (twofold compare -- CMD_A ::: CMD_B)");
    };
    if seps > 1 {
        bail!(
            "give exactly two commands: found '{}' separators ':::'",
            seps
        );
    }
    let (a, b) = (&commands[..split], &commands[split + 1..]);
    if a.is_empty() || b.is_empty() {
        bail!("give two non-empty commands separated by ':::'");
    }
    Ok((a, b))
}

pub fn run(args: &CompareArgs, w: &mut dyn Write) -> anyhow::Result<()> {
    let (a, b) = arms(&args.commands)?;
    super::common::check_inputs(args.model.as_deref(), &[])?;
    let memory_max = super::common::check_sandbox(&args.sandbox)?;
    if let Some(dir) = &args.sandbox.out {
        out::check(dir)?;
    }
    let registry = Registry::install()?;
    let mut runs: Vec<(usize, RunSummary)> = Vec::new();
    let mut samples: Vec<(&'static str, serde_json::Value)> = Vec::new();
    for round in 0..args.rounds {
        // Alternate which arm goes first, so order effects (a warm page cache) cancel.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let req = RunRequest {
                command: if which == 0 { a.to_vec() } else { b.to_vec() },
                stdout_to_stderr: true,
                quiet: args.output.json,
                memory_max,
                model: args.model.clone(),
                watch: Vec::new(),
                interval: Duration::from_millis(args.sandbox.interval_ms.max(1)),
                timeout: args.timeout,
                warm: args.warm,
            };
            let (summary, points) = run_campaign(&req, &registry)?;
            let name = if which == 0 { "A" } else { "B" };
            for p in &points {
                let extra = serde_json::json!({"round": round + 1, "arm": name});
                samples.push(("sample", out::sample(p, extra)));
            }
            runs.push((which, summary));
        }
    }
    let of =
        |w: usize| -> Vec<&RunSummary> { runs.iter().filter(|r| r.0 == w).map(|r| &r.1).collect() };
    crate::cleanup::check_interrupted()?;
    let (ra, rb) = (of(0), of(1));
    let peak_ratios: Vec<f64> = ra
        .iter()
        .zip(&rb)
        .filter_map(|(x, y)| Some(y.peak_bytes? as f64 / x.peak_bytes?.max(1) as f64))
        .collect();
    let wall_ratios: Vec<f64> = ra
        .iter()
        .zip(&rb)
        .map(|(x, y)| y.wall_seconds / x.wall_seconds.max(1e-9))
        .collect();
    let c = Comparison {
        schema_version: crate::model::SCHEMA_VERSION,
        rounds: args.rounds,
        a: arm(a, &ra),
        b: arm(b, &rb),
        peak_ratio_b_over_a: ratio(peak_ratios),
        wall_ratio_b_over_a: ratio(wall_ratios),
        runs: runs.into_iter().map(|r| r.1).collect(),
    };
    let text = human(&c)?;
    if let Some(dir) = &args.sandbox.out {
        out::write(dir, "comparison.json", &serde_json::to_vec_pretty(&c)?)?;
        out::write(dir, "comparison.md", out::markdown(&text).as_bytes())?;
        out::write_jsonl(dir, "timeline.jsonl", samples)?;
        plot_peaks(dir, &c, memory_max)?;
    }
    if args.output.json {
        crate::render::json(w, &c)?;
    } else {
        w.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// `peaks.{svg,png}`: each arm's peak per round, with the sandbox's limit.
fn plot_peaks(dir: &std::path::Path, c: &Comparison, memory_max: u64) -> anyhow::Result<()> {
    let mib = |b: u64| b as f64 / 1048576.0;
    let series: Vec<Series> = [("A", &c.a), ("B", &c.b)]
        .iter()
        .map(|(name, arm)| Series {
            name: format!("{name}: peak"),
            points: arm
                .peak_bytes
                .iter()
                .enumerate()
                .filter_map(|(i, p)| Some(((i + 1) as f64, mib((*p)?))))
                .collect(),
            markers: true,
        })
        .collect();
    let limit = Limit {
        name: format!("memory limit ({})", iec(memory_max)),
        y: mib(memory_max),
    };
    write_chart(
        dir,
        "peaks",
        &Chart {
            title: "twofold compare: peak cgroup usage per round",
            x_label: "round",
            y_label: "MiB",
            series: &series,
            limit: Some(&limit),
            x_ticks: XTicks::Integer,
        },
    )
}

/// The text report (commands and file names from the outside escaped for a terminal).
fn human(c: &Comparison) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    let out = &mut crate::render::safe::Terminal(&mut buf);
    let f = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "n/a".into());
    let pair = |v: Option<(f64, f64)>| {
        v.map(|(l, h)| format!("[{l:.3}, {h:.3}]"))
            .unwrap_or_else(|| "n/a".into())
    };
    writeln!(
        out,
        "twofold compare: {}, order alternating",
        crate::units::count(c.rounds as u64, "round", "rounds")
    )?;
    for (name, arm) in [("A", &c.a), ("B", &c.b)] {
        writeln!(
            out,
            "  {name}: '{}'  median peak {}  median wall {} s",
            arm.command.join(" "),
            arm.median_peak_bytes
                .map(|v| iec(v as u64))
                .unwrap_or_else(|| "n/a".into()),
            f(arm.median_wall_seconds)
        )?;
    }
    for (i, pair) in c.runs.chunks(2).enumerate() {
        for (j, r) in pair.iter().enumerate() {
            let Some(cache) = &r.start_cache else {
                continue;
            };
            // A goes first in odd rounds (counting from 1).
            let name = if (i % 2 == 0) == (j == 0) { "A" } else { "B" };
            writeln!(out, "  round {} {name}: {}", i + 1, cache.describe())?;
        }
    }
    for (name, r) in [
        ("peak B/A", &c.peak_ratio_b_over_a),
        ("wall B/A", &c.wall_ratio_b_over_a),
    ] {
        writeln!(
            out,
            "  {name}: median {}  IQR {}  bootstrap 95% CI {}",
            f(r.median),
            pair(r.iqr),
            pair(r.ci95)
        )?;
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
