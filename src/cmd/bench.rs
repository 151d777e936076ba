//! `twofold __bench`: helpers for `bench/` scripts.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;

use crate::cli::{BenchArgs, BenchWhat};
use crate::collect::memory::{ProcMemory, PAGE};
use crate::collect::Roots;

pub fn run(args: &BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    match &args.what {
        BenchWhat::WriteModel { file, size } => {
            crate::input::ensure_room("size", *size, file, 1)?;
            let n = super::common::write_safetensors(file, *size)?;
            writeln!(out, "{n}")?;
        }
        BenchWhat::Readmem { pid } => readmem(*pid, out)?,
        BenchWhat::PlotScaling { input, output } => plot_scaling(input, output)?,
        BenchWhat::UprobeFloor { lib } => {
            let (_held, n) = crate::collect::bpf::uploads::attach_floor(lib).map_err(|e| {
                anyhow::anyhow!("cannot attach the floor to '{}': {e}", lib.display())
            })?;
            writeln!(out, "attached {n}")?;
            out.flush()?;
            std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink())?;
        }
    }
    Ok(())
}

/// The plain-copy baseline: every eligible page of every searchable region, read once.
fn readmem(pid: i32, out: &mut dyn Write) -> anyhow::Result<()> {
    let roots = Roots::live();
    let target = ProcMemory::open(&roots.proc, pid)?;
    let maps_path = roots.proc.join(pid.to_string()).join("maps");
    let text = std::fs::read_to_string(&maps_path)
        .with_context(|| format!("failed to read '{}'", maps_path.display()))?;
    let regions = ProcMemory::regions(&maps_path, &text)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pm = Vec::new();
    let mut bytes = 0u64;
    let start = Instant::now();
    for r in &regions {
        target.pagemap(r.start, r.end, &mut pm)?;
        let mut i = 0;
        while i < pm.len() {
            // A run of eligible pages, at most 1 MiB.
            if !ProcMemory::eligible(pm[i], r.kind) {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < pm.len() && ProcMemory::eligible(pm[j], r.kind) && (j - i) < 256 {
                j += 1;
            }
            let len = (j - i) * PAGE as usize;
            bytes += target.read(r.start + i as u64 * PAGE, &mut buf[..len])? as u64;
            std::hint::black_box(&buf);
            i = j;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    writeln!(
        out,
        "{{\"bytes\": {bytes}, \"seconds\": {secs:.6}, \"gb_per_s\": {:.3}}}",
        bytes as f64 / secs / 1e9
    )?;
    Ok(())
}

/// One measured point of bench/scaling.sh.
#[derive(serde::Deserialize)]
struct Point {
    x: f64,
    scan_s: f64,
    rss_mib: f64,
}

/// The three curves of bench/scaling.sh: bare `scan` time (left) and twofold's peak RSS
/// (right) against processes, candidate memory and model files, one row each.
fn plot_scaling(input: &std::path::Path, output: &std::path::Path) -> anyhow::Result<()> {
    use crate::campaign::plot::{write_grid_png, Chart, Series, XTicks};
    let text = std::fs::read_to_string(input)
        .with_context(|| format!("cannot read '{}'", input.display()))?;
    let all: std::collections::BTreeMap<String, Vec<Point>> = serde_json::from_str(&text)
        .with_context(|| format!("'{}' is not scaling results", input.display()))?;
    let dims = [
        ("processes", "idle processes"),
        ("memory_gib", "candidate memory (GiB)"),
        ("files", "model files"),
    ];
    let mut series = Vec::new();
    for (key, x_label) in dims {
        let pts = all
            .get(key)
            .with_context(|| format!("'{}' has no '{key}'", input.display()))?;
        let line = |name: &str, f: fn(&Point) -> f64| Series {
            name: name.to_string(),
            points: pts.iter().map(|p| (p.x, f(p))).collect(),
            markers: true,
        };
        series.push((x_label, "scan time (s)", line("scan s", |p| p.scan_s)));
        series.push((x_label, "peak RSS (MiB)", line("RSS MiB", |p| p.rss_mib)));
    }
    let titles: Vec<String> = series
        .iter()
        .map(|(x, y, _)| format!("twofold scan: {y} vs {x}"))
        .collect();
    let one: Vec<[Series; 1]> = series.into_iter().map(|(_, _, s)| [s]).collect();
    let charts: Vec<Chart> = one
        .iter()
        .zip(&titles)
        .zip(dims.iter().flat_map(|d| [d.1, d.1]))
        .enumerate()
        .map(|(i, ((s, title), x_label))| Chart {
            title,
            x_label,
            y_label: if i % 2 == 0 { "seconds" } else { "MiB" },
            series: s,
            limit: None,
            x_ticks: XTicks::Continuous,
        })
        .collect();
    write_grid_png(output, (3, 2), (800, 450), &charts)
}
