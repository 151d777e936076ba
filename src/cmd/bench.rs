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
