//! Campaigns for real (as root): cgroups, the OOM killer, eviction and refault, cleanup.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use twofold::campaign::run::RunSummary;
use twofold::cmd::pressure::PressureReport;

mod interrupted;

/// The tests here and in `interrupted` run as one group (beside each other, never beside
/// another module's).
const GROUP: &str = module_path!();

/// Cgroups this test binary's twofold processes may have made (named `twofold-PID-N`).
fn leftover_cgroups() -> Vec<String> {
    let mut out = Vec::new();
    for root in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/unified",
    ] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // twofold-PID-N: a leftover only once its creator PID is gone (other
                // tests' campaigns run concurrently).
                let creator = name
                    .strip_prefix("twofold-")
                    .and_then(|r| r.split('-').next())
                    .and_then(|p| p.parse::<i32>().ok());
                if let Some(pid) = creator {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        out.push(format!("{root}/{name}"));
                    }
                }
            }
        }
    }
    out
}

/// Processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

fn wait_gone(marker: &str) {
    let start = Instant::now();
    while !processes_with(marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "processes left behind: {marker}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn root() -> bool {
    require(is_root(), "root (campaigns create memory cgroups)")
}

#[test]
fn readers_copy_arm_ooms_and_mmap_arm_does_not() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 64 * MIB);
    let f = file.to_str().unwrap();
    let r: PressureReport = twofold_json(&[
        "pressure".as_ref(),
        f.as_ref(),
        "--experiment".as_ref(),
        "readers".as_ref(),
        "--readers".as_ref(),
        "1,4".as_ref(),
        "--memory-max".as_ref(),
        "200M".as_ref(),
        "--json".as_ref(),
    ]);
    let row = |arm: &str, n: usize| {
        r.readers
            .iter()
            .find(|x| format!("{:?}", x.arm).to_lowercase() == arm && x.readers == n)
            .unwrap()
            .clone()
    };
    // 4 copies of 64 MiB plus the page cache cannot fit in 200 MiB: the OOM killer acts.
    let c4 = row("copy", 4);
    assert!(c4.oom_kills.unwrap() >= 1, "{c4:?}");
    assert!(c4.alive < 4, "{c4:?}");
    // One mapped copy serves four readers.
    let m4 = row("mmap", 4);
    assert_eq!(m4.oom_kills, Some(0), "{m4:?}");
    assert_eq!(m4.alive, 4);
    assert_eq!(m4.file_resident_fraction, Some(1.0));
    // Four mappers split the file's PSS: each about a quarter of 64 MiB plus its own.
    for pss in &m4.reader_pss_bytes {
        assert!(*pss < 32 * MIB, "{pss}");
    }
    assert_eq!(row("copy", 1).oom_kills, Some(0));
    for x in &r.readers {
        // Every configuration starts from a cold cache...
        assert!(x.start_cache.evicted, "{x:?}");
        assert!(x.start_cache.resident_fraction.unwrap() < 0.02, "{x:?}");
        // ...with its readers released together, from the timestamps twofold recorded.
        let offsets: Vec<f64> = x.release_offsets_ms.iter().map(|o| o.unwrap()).collect();
        assert_eq!(offsets.len(), x.readers);
        let spread = offsets.iter().copied().fold(0.0, f64::max);
        assert!(spread < 50.0, "releases spread over {spread} ms: {x:?}");
        assert_eq!(x.release_spread_ms, Some(spread));
        assert_eq!(x.load_seconds.len(), x.readers);
    }
    // Every mapping reader loaded: times and rates for all of them.
    let loaded: Vec<f64> = m4.load_seconds.iter().map(|s| s.unwrap()).collect();
    let max = loaded.iter().copied().fold(0.0, f64::max);
    assert_eq!(m4.load_seconds_max, Some(max));
    let (median, gbs) = (m4.load_seconds_median.unwrap(), m4.load_gb_per_s.unwrap());
    assert!((gbs - (64 * MIB) as f64 / median / 1e9).abs() < 1e-9);
    let agg = m4.aggregate_load_gb_per_s.unwrap();
    assert!((agg - (4 * 64 * MIB) as f64 / max / 1e9).abs() < 1e-9);
    // Killed copying readers have no load time.
    let killed = c4.load_seconds.iter().filter(|s| s.is_none()).count();
    assert!(killed >= 4 - c4.alive, "{c4:?}");
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
    wait_gone(f);
}

#[test]
fn integrity_cycle_and_an_altered_copy() {
    let _group = crate::common::group(GROUP);
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 16 * MIB);
    let before = std::fs::read(&file).unwrap();
    let out = dir.path().join("out");
    let r: PressureReport = twofold_json(&[
        "pressure".as_ref(),
        file.as_os_str(),
        "--experiment".as_ref(),
        "integrity".as_ref(),
        "--cycles".as_ref(),
        "2".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
        "--json".as_ref(),
    ]);
    // `--out` writes the report, its Markdown and the JSON Lines timeline: one record
    // per cycle, as the report has them.
    let written: PressureReport =
        serde_json::from_slice(&std::fs::read(out.join("pressure.json")).unwrap()).unwrap();
    assert_eq!(written, r);
    assert!(std::fs::read_to_string(out.join("pressure.md"))
        .unwrap()
        .starts_with("## integrity: '"));
    let lines = std::fs::read_to_string(out.join("pressure.jsonl")).unwrap();
    let cycles = &r.integrity.as_ref().unwrap().cycles;
    assert_eq!(lines.lines().count(), cycles.len());
    for (n, l) in lines.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["type"], "integrity_cycle");
        assert_eq!(v["data"]["cycle"], n + 1);
        assert_eq!(v["data"]["whole_matches"], cycles[n].whole_matches);
    }
    let i = r.integrity.unwrap();
    assert_eq!(i.chunks, 8);
    for c in &i.cycles {
        assert_eq!(c.resident_after_evict_bytes, Some(0), "evicted completely");
        assert!(c.mismatched_chunks.is_empty());
        assert!(c.whole_matches);
    }
    // A reference that differs in one byte of chunk 5 (bytes 10 MiB..12 MiB).
    let reference = dir.path().join("altered");
    let mut altered = before.clone();
    altered[(10 * MIB + 12345) as usize] ^= 0xff;
    std::fs::write(&reference, altered).unwrap();
    let r: PressureReport = twofold_json(&[
        "pressure".as_ref(),
        file.as_os_str(),
        "--experiment".as_ref(),
        "integrity".as_ref(),
        "--cycles".as_ref(),
        "1".as_ref(),
        "--reference".as_ref(),
        reference.as_os_str(),
        "--json".as_ref(),
    ]);
    let c = &r.integrity.unwrap().cycles[0];
    assert_eq!(c.mismatched_chunks, [5]);
    assert!(!c.whole_matches);
    assert!(
        std::fs::read(&file).unwrap() == before,
        "the model file was changed"
    );
}

fn run_json(args: &[&str]) -> RunSummary {
    let a: Vec<&std::ffi::OsStr> = args.iter().map(|s| std::ffi::OsStr::new(*s)).collect();
    twofold_json(&a)
}

#[test]
fn run_peak_ratio_copy_twice_map_once() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 256 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let f = file.to_str().unwrap();
    let bin = exe();
    let bin = bin.to_str().unwrap();
    for (mode, want) in [("copy", 2.0), ("map", 1.0)] {
        evict(&file);
        let s = run_json(&[
            "run",
            "--json",
            "--memory-max",
            "1G",
            "--model",
            f,
            "--",
            bin,
            "__child",
            mode,
            f,
            "--exit-after-ms",
            "300",
        ]);
        assert_eq!(s.exit_code, Some(0), "{s:?}");
        assert_eq!(s.oom_kills, Some(0));
        let ratio = s.model.as_ref().unwrap().peak_ratio.unwrap();
        assert!(
            (ratio - want).abs() / want <= 0.05,
            "{mode}: peak ratio {ratio}, want {want}"
        );
        assert!(s.samples >= 3, "{s:?}");
    }
    assert!(leftover_cgroups().is_empty());
}

#[test]
fn memory_max_above_available_is_refused() {
    let _group = crate::common::group(GROUP);
    let out = Command::new(exe())
        .args(["run", "--memory-max", "100T", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must never push the host into OOM"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn competitor_pushes_the_mapped_file_out() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", 64 * MIB);
    let out = dir.path().join("out");
    let r: PressureReport = twofold_json(&[
        "pressure".as_ref(),
        file.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--experiment".as_ref(),
        "competitor".as_ref(),
        "--memory-max".as_ref(),
        "160M".as_ref(),
        "--competitor-fraction".as_ref(),
        "0.9".as_ref(),
        "--competitor-steps".as_ref(),
        "3".as_ref(),
        "--competitor-step-seconds".as_ref(),
        "0.5".as_ref(),
        "--json".as_ref(),
    ]);
    assert_eq!(r.competitor.len(), 2);
    // pressure.jsonl: each arm's samples, then its record without them.
    let lines = std::fs::read_to_string(out.join("pressure.jsonl")).unwrap();
    let v: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut at = 0;
    for c in &r.competitor {
        let arm = format!("{:?}", c.arm).to_lowercase();
        for p in &c.timeline {
            assert_eq!(v[at]["type"], "sample");
            assert_eq!(v[at]["data"]["arm"], arm.as_str());
            assert_eq!(v[at]["data"]["t_seconds"], p.t_seconds);
            at += 1;
        }
        assert_eq!(v[at]["type"], "competitor");
        assert_eq!(v[at]["data"]["arm"], serde_json::to_value(c.arm).unwrap());
        assert!(v[at]["data"].get("timeline").is_none());
        at += 1;
    }
    assert_eq!(at, v.len());
    for c in &r.competitor {
        // Warm: the readers had the whole file resident; the competitor took most of it
        // (the limit leaves 16 MiB for 64 MiB of file), and reading it back refaulted.
        assert_eq!(c.resident_start_fraction, Some(1.0), "{:?}", c.arm);
        assert!(
            c.resident_min_fraction.unwrap() < 0.5,
            "{:?}",
            c.resident_min_fraction
        );
        assert!(c.refaults_file.unwrap() > 0);
        // Passes slow down under pressure (when one completed at full size at all).
        if let Some(under) = c.pass_ms_under_pressure {
            assert!(under > c.pass_ms_before.unwrap(), "{under}");
        }
    }
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
}

#[test]
fn compare_rotates_rounds_and_reports_intervals() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.npy", 32 * MIB);
    let f = file.to_str().unwrap();
    let bin = exe();
    let bin = bin.to_str().unwrap();
    let out = dir.path().join("out");
    let out_c = dir.path().join("out-compare");
    let c: twofold::cmd::compare::Comparison = twofold_json(&[
        "compare".as_ref(),
        "--out".as_ref(),
        out_c.as_os_str(),
        "--rounds".as_ref(),
        "3".as_ref(),
        "--model".as_ref(),
        f.as_ref(),
        "--memory-max".as_ref(),
        "512M".as_ref(),
        "--json".as_ref(),
        "--".as_ref(),
        bin.as_ref(),
        "__child".as_ref(),
        "copy".as_ref(),
        f.as_ref(),
        "--exit-after-ms".as_ref(),
        "200".as_ref(),
        ":::".as_ref(),
        bin.as_ref(),
        "__child".as_ref(),
        "map".as_ref(),
        f.as_ref(),
        "--exit-after-ms".as_ref(),
        "200".as_ref(),
    ]);
    assert_eq!(c.runs.len(), 6);
    // Order alternates: A first in rounds 1 and 3, B first in round 2.
    let firsts: Vec<&str> = c
        .runs
        .iter()
        .step_by(2)
        .map(|r| r.command[2].as_str())
        .collect();
    assert_eq!(firsts, ["copy", "map", "copy"]);
    // Each round starts from a cold cache (the other arm's load evicted first).
    for run in &c.runs {
        let sc = run.start_cache.as_ref().unwrap();
        assert!(sc.evicted, "{sc:?}");
        assert!(sc.resident_fraction.unwrap() < 0.02, "{sc:?}");
    }
    assert_eq!(c.a.start_resident_fraction.len(), 3);
    let r = &c.peak_ratio_b_over_a;
    assert_eq!(r.per_round.len(), 3);
    // Mapping needs no private copy: well under the copying arm's peak.
    assert!(r.median.unwrap() < 0.8, "{r:?}");
    let (lo, hi) = r.ci95.unwrap();
    assert!(lo <= r.median.unwrap() && r.median.unwrap() <= hi);
    // `compare --out` writes what its help lists: the comparison as printed, every
    // round's samples with their round and arm, and the plot of the peaks.
    let written: twofold::cmd::compare::Comparison =
        serde_json::from_slice(&std::fs::read(out_c.join("comparison.json")).unwrap()).unwrap();
    assert_eq!(written, c);
    let md = std::fs::read_to_string(out_c.join("comparison.md")).unwrap();
    assert!(md.starts_with("# twofold compare: 3 rounds"), "{md}");
    assert!(md.contains("- peak B/A: median"), "{md}");
    let lines = std::fs::read_to_string(out_c.join("timeline.jsonl")).unwrap();
    let total: usize = c.runs.iter().map(|r| r.samples).sum();
    assert_eq!(lines.lines().count(), total);
    let mut seen = std::collections::BTreeMap::new();
    for l in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["type"], "sample");
        let key = (
            v["data"]["round"].as_u64().unwrap(),
            v["data"]["arm"].as_str().unwrap().to_string(),
        );
        *seen.entry(key).or_insert(0usize) += 1;
        assert!(v["data"]["t_seconds"].is_number());
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(std::fs::read_to_string(out_c.join("peaks.svg"))
        .unwrap()
        .contains("memory limit (512.0 MiB)"));
    assert!(std::fs::read(out_c.join("peaks.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
    // `run --out` writes the timeline and the plots.
    let s: RunSummary = twofold_json(&[
        "run".as_ref(),
        "--json".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
        "--memory-max".as_ref(),
        "512M".as_ref(),
        "--".as_ref(),
        bin.as_ref(),
        "__child".as_ref(),
        "map".as_ref(),
        f.as_ref(),
        "--exit-after-ms".as_ref(),
        "300".as_ref(),
    ]);
    let lines = std::fs::read_to_string(out.join("timeline.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), s.samples);
    // ...and the summary, as JSON and as Markdown.
    let written: RunSummary =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(written, s);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.starts_with("# twofold run: '"), "{md}");
    assert!(md.contains("- exit code 0 after"), "{md}");
    assert!(md.contains(&format!("samples {}", s.samples)), "{md}");
    for l in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["type"], "sample");
    }
    assert!(std::fs::read_to_string(out.join("timeline.svg"))
        .unwrap()
        .contains("<svg"));
    assert!(std::fs::read(out.join("timeline.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
    assert!(leftover_cgroups().is_empty());
}

#[test]
fn run_proves_the_copy_a_long_running_command_holds() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 32 * MIB);
    let f = file.to_str().unwrap();
    let bin = exe();
    let bin = bin.to_str().unwrap();
    let s = run_json(&[
        "run",
        "--json",
        "--memory-max",
        "512M",
        "--model",
        f,
        "--timeout",
        "1.5",
        "--",
        bin,
        "__child",
        "copy",
        f,
        // It read the file and closed it: only its memory holds the model.
        "--close",
        "--exit-after-ms",
        "60000",
    ]);
    assert!(s.timed_out);
    let copies = s.copies.unwrap();
    assert_eq!(copies.proven.len(), 1, "{copies:?}");
    assert!(copies.proven[0].fraction > 0.999, "{copies:?}");
    assert!(copies.suspected.is_empty(), "{copies:?}");
    assert!(!copies.representations.lower_bound, "{copies:?}");
    assert!(leftover_cgroups().is_empty());
}

#[test]
fn run_starts_cold_unless_warm_or_the_model_is_mapped() {
    let _group = crate::common::group(GROUP);
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 32 * MIB);
    let f = file.to_str().unwrap();
    let bin = exe();
    let bin = bin.to_str().unwrap();
    let run = |extra: &[&str]| -> RunSummary {
        let mut args = vec!["run", "--json", "--memory-max", "256M", "--model", f];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", bin, "__child", "map", f, "--exit-after-ms", "50"]);
        run_json(&args)
    };
    // Cached right before each round (idle page cache drains by itself, slowly).
    let cache_it = || assert_eq!(std::fs::read(&file).unwrap().len() as u64, 32 * MIB);

    // The default: evicted, ≈0 resident at the start.
    cache_it();
    let s = run(&[]);
    let c = s.start_cache.unwrap();
    assert!(c.evicted && c.eviction_skipped.is_none(), "{c:?}");
    assert!(c.resident_fraction.unwrap() < 0.02, "{c:?}");
    assert_eq!(s.exit_code, Some(0));

    // --warm keeps the cache: ≈1 resident.
    cache_it();
    let c = run(&["--warm"]).start_cache.unwrap();
    assert!(!c.evicted, "{c:?}");
    assert_eq!(c.eviction_skipped.as_deref(), Some("--warm"));
    assert!(c.resident_fraction.unwrap() > 0.98, "{c:?}");

    // Another process maps the model: no eviction, and the report names it.
    let holder = reader("map", Some(&file), &[]);
    let c = run(&[]).start_cache.unwrap();
    assert!(!c.evicted, "{c:?}");
    assert!(c.mapped_by.iter().any(|m| m.pid == holder.pid()), "{c:?}");
    let why = c.eviction_skipped.clone().unwrap();
    assert!(
        why.contains(&format!("pid {} (twofold)", holder.pid())),
        "{why}"
    );
    assert!(c.resident_fraction.unwrap() > 0.98, "{c:?}");
    // The human report says so too.
    let out = run_ok(Command::new(exe()).args([
        "run",
        "--memory-max",
        "256M",
        "--model",
        f,
        "--",
        "true",
    ]));
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains(&format!(
            "not evicted: the file is mapped by pid {}",
            holder.pid()
        )),
        "{text}"
    );
    drop(holder);
    assert!(leftover_cgroups().is_empty(), "{:?}", leftover_cgroups());
}
