//! `twofold run`: one command in a sandbox, sampled until it exits.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::cache::{self, CacheMode, StartCache};
use super::sampler::{Sampler, TimelinePoint};
use super::sandbox::Sandbox;
use crate::cleanup::Registry;
use crate::collect::Roots;

/// What `run` measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub command: Vec<String>,
    pub memory_max_bytes: u64,
    pub cgroup_version: String,
    pub exit_code: Option<i32>,
    /// Signal that ended the command (9 = SIGKILL, e.g. the OOM killer).
    pub exit_signal: Option<i32>,
    pub timed_out: bool,
    pub wall_seconds: f64,
    /// Peak cgroup usage (`memory.peak` / `memory.max_usage_in_bytes`, or the samples').
    pub peak_bytes: Option<u64>,
    pub peak_anon_bytes: Option<u64>,
    pub peak_file_bytes: Option<u64>,
    pub end_anon_bytes: Option<u64>,
    pub end_file_bytes: Option<u64>,
    /// Seconds until usage stays within 5% of its final value.
    pub settle_seconds: Option<f64>,
    pub oom_kills: Option<u64>,
    /// With `--model` and `--timeout`: the suspected copies of the model in the sandbox's
    /// processes when the timeout struck, each proven or disproven byte by byte.
    pub copies: Option<CopiesAtTimeout>,
    /// With `--model`: the model's page cache at the start (evicted unless `--warm` or
    /// mapped by another process) and its resident fraction then.
    pub start_cache: Option<StartCache>,
    pub model: Option<ModelRatios>,
    pub samples: usize,
    /// CPU seconds the sampler thread used (getrusage), and as a share of one core.
    pub sampler_cpu_seconds: f64,
    pub sampler_cpu_fraction: f64,
}

/// The footprint relative to the model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRatios {
    pub path: String,
    pub size_bytes: u64,
    /// Page cache of the model at the start (bytes).
    pub cached_at_start_bytes: Option<u64>,
    /// Peak cgroup usage / model size: copies plus page cache charged here.
    pub peak_ratio: Option<f64>,
    /// UMLoad's metric: (peak usage − page-cache growth of the model) / model size.
    pub peak_ratio_excluding_cache: Option<f64>,
}

/// Seconds until usage settles within `band` of its final value.
pub fn settle_time(points: &[TimelinePoint], band: f64) -> Option<f64> {
    let usage: Vec<(f64, u64)> = points
        .iter()
        .filter_map(|p| p.usage_bytes.map(|u| (p.t_seconds, u)))
        .collect();
    let &(_, last) = usage.last()?;
    let lo = last as f64 * (1.0 - band);
    let hi = last as f64 * (1.0 + band);
    let mut settle = usage.first()?.0;
    for (t, u) in &usage {
        if (*u as f64) < lo || (*u as f64) > hi {
            settle = *t;
        }
    }
    Some(settle)
}

fn max_of(points: &[TimelinePoint], f: impl Fn(&TimelinePoint) -> Option<u64>) -> Option<u64> {
    points.iter().filter_map(f).max()
}

/// Pure summary of the samples.
pub fn summarize(
    points: &[TimelinePoint],
    cgroup_peak: Option<u64>,
    model: Option<(String, u64)>,
) -> (Option<u64>, Option<ModelRatios>) {
    let peak = cgroup_peak.or_else(|| max_of(points, |p| p.usage_bytes));
    let ratios = model.map(|(path, size)| {
        let start = points
            .first()
            .and_then(|p| p.files_resident_bytes.first().copied().flatten());
        let growth_peak = points
            .iter()
            .filter_map(|p| {
                let u = p.usage_bytes?;
                let cached = p.files_resident_bytes.first().copied().flatten()?;
                Some(u.saturating_sub(cached.saturating_sub(start.unwrap_or(0))))
            })
            .max();
        let r = |v: Option<u64>| v.filter(|_| size > 0).map(|v| v as f64 / size as f64);
        ModelRatios {
            path,
            size_bytes: size,
            cached_at_start_bytes: start,
            peak_ratio: r(peak),
            peak_ratio_excluding_cache: r(growth_peak),
        }
    });
    (peak, ratios)
}

pub struct RunRequest {
    pub command: Vec<String>,
    /// Send the command's stdout to our stderr (keeps `--json` output clean).
    pub stdout_to_stderr: bool,
    /// No progress display.
    pub quiet: bool,
    pub memory_max: u64,
    pub model: Option<PathBuf>,
    /// More files whose residency to sample.
    pub watch: Vec<PathBuf>,
    pub interval: Duration,
    pub timeout: Option<Duration>,
    /// Keep the model's page cache (`--warm`) instead of evicting it first.
    pub warm: bool,
}

/// The model's copies in the sandbox at the timeout: proven ones, suspected ones (not
/// searched), and the count of the whole machine for the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CopiesAtTimeout {
    pub proven: Vec<crate::model::ProvenCopy>,
    pub suspected: Vec<crate::model::SuspectedCopy>,
    pub representations: crate::model::Representations,
}

/// Scans the sandbox's processes for the model and proves their copies.
fn copies_in(sandbox: &Sandbox, model: &std::path::Path) -> Option<CopiesAtTimeout> {
    let req = crate::collect::gather::Request {
        paths: vec![model.to_path_buf()],
        cgroup: Some(sandbox.dir.clone()),
        ..Default::default()
    };
    let mut warnings = Vec::new();
    let snap = crate::engine::Engine::new(req, Some(Default::default()))
        .snapshot(&mut warnings)
        .ok()?;
    let report = crate::engine::report(&snap, None);
    let shown = std::path::absolute(model).ok()?.display().to_string();
    let file = report.files.into_iter().find(|f| f.path == shown)?;
    Some(CopiesAtTimeout {
        proven: file.proven_copies,
        suspected: file.suspected_copies,
        representations: file.representations,
    })
}

/// Runs the command in a fresh sandbox; returns the summary and the samples.
pub fn run(
    req: &RunRequest,
    registry: &Registry,
) -> anyhow::Result<(RunSummary, Vec<TimelinePoint>)> {
    let roots = Roots::live();
    let (prog, args) = req
        .command
        .split_first()
        .context("no command given after '--'")?;
    let mode = if req.warm {
        CacheMode::Warm
    } else {
        CacheMode::Cold
    };
    let start_cache = match &req.model {
        Some(m) => Some(cache::prepare(&roots.proc, m, mode)?),
        None => None,
    };
    let sandbox = Sandbox::create(&roots, req.memory_max, registry)?;
    let files: Vec<PathBuf> = req.model.iter().chain(&req.watch).cloned().collect();
    let sampler = Sampler::start(
        &roots.proc,
        &sandbox.dir,
        sandbox.version,
        &files,
        req.interval,
        Duration::from_secs(1),
    );
    let mut cmd = Command::new(prog);
    cmd.args(args).stdin(std::process::Stdio::null());
    if req.stdout_to_stderr {
        cmd.stdout(std::io::stderr());
    }
    sandbox.enter(&mut cmd)?;
    let start = Instant::now();
    let mut child =
        crate::cleanup::spawn(&mut cmd).with_context(|| format!("cannot start '{prog}'"))?;
    let mut timed_out = false;
    let mut copies = None;
    let bar = super::progress(0, req.quiet);
    bar.set_message(format!(
        "running {} in the sandbox",
        crate::render::safe::shell_words(&req.command)
    ));
    let status = loop {
        // Interrupted: the signal thread kills the command; this is no result to report.
        crate::cleanup::check_interrupted()?;
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if req.timeout.is_some_and(|t| start.elapsed() >= t) {
            timed_out = true;
            // A long-running command (a server) is still holding what it loaded: look
            // for copies of the model, byte by byte, before stopping it.
            copies = req.model.as_ref().and_then(|m| copies_in(&sandbox, m));
            sandbox.kill_all();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    crate::cleanup::forget(child.id() as i32);
    bar.finish_and_clear();
    // A command killed by the signal thread is not a result either.
    crate::cleanup::check_interrupted()?;
    let wall = start.elapsed().as_secs_f64();
    // Whatever the command left behind in the sandbox goes with it.
    sandbox.kill_all();
    let (points, sampler_cpu) = sampler.finish();
    let cg = sandbox.read().ok();
    let cgroup_peak = cg.as_ref().and_then(|c| c.peak_bytes);
    let model = match &req.model {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::metadata(p)
                .with_context(|| format!("cannot access '{}'", p.display()))?
                .len(),
        )),
        None => None,
    };
    let (peak, ratios) = summarize(&points, cgroup_peak, model);
    use std::os::unix::process::ExitStatusExt;
    let running: Vec<&TimelinePoint> = points.iter().filter(|p| p.processes > 0).collect();
    let end = running.last().copied();
    let summary = RunSummary {
        command: req.command.clone(),
        memory_max_bytes: req.memory_max,
        cgroup_version: format!("{:?}", sandbox.version).to_lowercase(),
        exit_code: status.code(),
        exit_signal: status.signal(),
        timed_out,
        wall_seconds: wall,
        peak_bytes: peak,
        peak_anon_bytes: max_of(&points, |p| p.anon_bytes),
        peak_file_bytes: max_of(&points, |p| p.file_bytes),
        end_anon_bytes: end.and_then(|p| p.anon_bytes),
        end_file_bytes: end.and_then(|p| p.file_bytes),
        settle_seconds: settle_time(&points, 0.05),
        oom_kills: cg.as_ref().and_then(|c| c.events.get("oom_kill").copied()),
        copies,
        start_cache,
        model: ratios,
        samples: points.len(),
        sampler_cpu_seconds: sampler_cpu,
        sampler_cpu_fraction: sampler_cpu / wall.max(1e-9),
    };
    Ok((summary, points))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(t: f64, usage: u64, cached: u64) -> TimelinePoint {
        TimelinePoint {
            t_seconds: t,
            usage_bytes: Some(usage),
            files_resident_bytes: vec![Some(cached)],
            ..TimelinePoint::default()
        }
    }

    #[test]
    fn settles_when_usage_stops_moving() {
        let p = [
            pt(0.0, 0, 0),
            pt(0.1, 50, 0),
            pt(0.2, 99, 0),
            pt(0.3, 100, 0),
            pt(0.4, 101, 0),
        ];
        assert_eq!(settle_time(&p, 0.05), Some(0.1));
    }

    #[test]
    fn ratios_subtract_cache_growth() {
        // A copying loader of a 100-byte file: cache grows to 100, anon to 100.
        let p = [pt(0.0, 0, 0), pt(0.1, 100, 100), pt(0.2, 200, 100)];
        let (peak, r) = summarize(&p, Some(205), Some(("m".into(), 100)));
        let r = r.unwrap();
        assert_eq!(peak, Some(205));
        assert_eq!(r.peak_ratio, Some(2.05));
        assert_eq!(r.peak_ratio_excluding_cache, Some(1.0));
    }
}
