//! The competitor experiment: readers keep touching a mapped file (MAP_SHARED or
//! MAP_PRIVATE arm) while an incompressible anonymous region grows stepwise to a fraction
//! of the limit, idle or touching its pages continuously. Over time: the file's residency
//! (cachestat), the readers' pass times, refaults (cgroup `workingset_refault_file`).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::readers::evict;
use super::sampler::{Sampler, TimelinePoint};
use super::sandbox::Sandbox;
use crate::cleanup::Registry;
use crate::collect::Roots;
use crate::spawn::Reader;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharingArm {
    Shared,
    Private,
}

#[derive(Debug, Clone)]
pub struct CompetitorRequest {
    pub readers: usize,
    pub fraction: f64,
    pub steps: usize,
    pub step_seconds: f64,
    pub active: bool,
    pub limit: u64,
    pub interval: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompetitorRun {
    pub arm: SharingArm,
    /// Anonymous bytes of the competitor steps that started (or were OOM-killed).
    pub competitor_bytes: u64,
    pub active: bool,
    /// File residency at the start (readers warm) and its minimum under the competitor.
    pub resident_start_fraction: Option<f64>,
    pub resident_min_fraction: Option<f64>,
    pub resident_end_fraction: Option<f64>,
    /// Median reader pass time before the competitor and at its full size (ms).
    pub pass_ms_before: Option<f64>,
    pub pass_ms_under_pressure: Option<f64>,
    pub refaults_file: Option<u64>,
    pub oom_kills: Option<u64>,
    /// Why the arm is not a valid experiment: a competitor step that died of something
    /// other than the OOM killer (a crash, a refused allocation); `None` if it is valid.
    #[serde(default)]
    pub failed: Option<String>,
    pub timeline: Vec<TimelinePoint>,
}

fn pass_times(dir: &Path, readers: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for i in 0..readers {
        let text =
            std::fs::read_to_string(dir.join(format!("reader-{i}.stats"))).unwrap_or_default();
        for line in text.lines() {
            let mut it = line.split_whitespace().map(|v| v.parse::<f64>().ok());
            if let (Some(Some(t)), Some(Some(ms))) = (it.next(), it.next()) {
                out.push((t, ms));
            }
        }
    }
    out
}

/// One arm in a fresh sandbox.
pub fn run_arm(
    exe: &Path,
    file: &Path,
    arm: SharingArm,
    req: &CompetitorRequest,
    registry: &Registry,
) -> anyhow::Result<CompetitorRun> {
    let roots = Roots::live();
    let size = std::fs::metadata(file)?.len().max(1);
    let scratch = registry.temp_dir("competitor", None)?;
    evict(file);
    let sandbox = Sandbox::create(&roots, req.limit, registry)?;
    let files = [file.to_path_buf()];
    let sampler = Sampler::start(
        &roots.proc,
        &sandbox.dir,
        sandbox.version,
        &files,
        req.interval,
        req.interval,
    );
    let t0 = std::time::Instant::now();
    let mut procs = Vec::new();
    for i in 0..req.readers {
        let stats = scratch.path().join(format!("reader-{i}.stats"));
        let stats = stats.to_string_lossy().into_owned();
        let mut extra = vec!["--stats", stats.as_str()];
        if arm == SharingArm::Private {
            extra.push("--private");
        }
        let r = Reader::start_in(
            exe,
            "map-loop",
            Some(file),
            &extra,
            Duration::from_secs(120),
            Some(&sandbox.procs_file()),
        )?;
        procs.push(r);
    }
    let warm = Duration::from_secs_f64(req.step_seconds);
    std::thread::sleep(warm);
    let t_before = t0.elapsed().as_secs_f64();
    // Saturating: an absurd fraction asks for u64::MAX, which the step refuses (a failure).
    let step = (req.fraction * req.limit as f64 / req.steps.max(1) as f64) as u64;
    let step_arg = step.to_string();
    let mut t_full = t_before;
    let mut failed = None;
    let mut steps_taken = 0u64;
    for k in 0..req.steps {
        crate::cleanup::check_interrupted()?;
        let mut extra = vec!["--bytes", step_arg.as_str(), "--random"];
        if req.active {
            extra.push("--touch-loop");
        }
        let oom_before = sandbox.oom_kills();
        match Reader::start_in(
            exe,
            "anon",
            None,
            &extra,
            Duration::from_secs(120),
            Some(&sandbox.procs_file()),
        ) {
            Ok(r) => procs.push(r),
            Err(e) => {
                crate::cleanup::check_interrupted()?;
                // A step the OOM killer takes is part of the result, not an error; any
                // other death (a panic, a refused allocation) spoils the arm.
                let oom_after = sandbox.oom_kills();
                let oom = oom_before.zip(oom_after).is_some_and(|(a, b)| b > a);
                if !oom {
                    failed = Some(format!(
                        "competitor step {} of {} ('{}' of anonymous memory) died, not by the OOM killer: {e:#}",
                        k + 1,
                        req.steps,
                        crate::units::iec(step)
                    ));
                    break;
                }
            }
        }
        steps_taken += 1;
        t_full = t0.elapsed().as_secs_f64();
        std::thread::sleep(warm);
    }
    // Hold at full size so that the readers complete passes under pressure.
    if failed.is_none() {
        std::thread::sleep(warm * 2);
    }
    let (timeline, _) = sampler.finish();
    let passes = pass_times(scratch.path(), req.readers);
    let median_between = |a: f64, b: f64| {
        let v: Vec<f64> = passes
            .iter()
            .filter(|(t, _)| *t >= a && *t < b)
            .map(|p| p.1)
            .collect();
        super::stats::median(&v)
    };
    // Reader stats are relative to each reader's own start; readers start within the
    // first moments of t0, so the windows are approximate by that much.
    let page = crate::collect::system::page_size();
    let residency: Vec<(f64, f64)> = timeline
        .iter()
        .filter_map(|p| {
            let cached = p.files_resident_bytes.first().copied().flatten()?;
            Some((
                p.t_seconds,
                crate::model::page_cache_fraction(cached, size, page),
            ))
        })
        .collect();
    let at_or_after = |t: f64| {
        residency
            .iter()
            .find(|(x, _)| *x >= t)
            .map(|r| r.1.min(1.0))
    };
    let first_refaults = timeline.iter().find_map(|p| p.refaults_file);
    let last_refaults = timeline.iter().rev().find_map(|p| p.refaults_file);
    let oom = sandbox.oom_kills();
    drop(procs);
    drop(sandbox);
    Ok(CompetitorRun {
        arm,
        competitor_bytes: step.saturating_mul(steps_taken),
        active: req.active,
        resident_start_fraction: at_or_after(t_before.min(warm.as_secs_f64() * 0.9)),
        resident_min_fraction: residency
            .iter()
            .filter(|r| r.0 >= t_before)
            .map(|r| r.1.min(1.0))
            .reduce(f64::min),
        resident_end_fraction: residency.last().map(|r| r.1.min(1.0)),
        pass_ms_before: median_between(0.0, t_before),
        pass_ms_under_pressure: median_between(t_full, f64::MAX),
        refaults_file: first_refaults
            .zip(last_refaults)
            .map(|(a, b)| b.saturating_sub(a)),
        oom_kills: oom,
        failed,
        timeline,
    })
}
