//! Replays the committed fuzz inputs on stable, so the main suite covers them without
//! cargo-fuzz: every seed (`fuzz/seeds/<target>/*`, valid files) must parse, and every
//! regression input (`fuzz/regressions/<target>/*`: crafted malformed files, truncated
//! headers, huge lengths and counts, offsets past the end or overlapping, and crashes the
//! fuzzer finds) must give an error or a container whose tensors lie inside the file,
//! quickly and never a panic. A missing or empty regressions directory fails.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use twofold::container::{self, pickle, zip, Format};

fn files(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(targets) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in targets.flatten() {
        let target = t.file_name().to_string_lossy().into_owned();
        for f in std::fs::read_dir(t.path()).unwrap().flatten() {
            out.push((target.clone(), f.path()));
        }
    }
    out.sort();
    out
}

fn replay(target: &str, bytes: &[u8]) -> Result<(), String> {
    if target == "pickle" {
        pickle::storages(bytes).map(|_| ())
    } else {
        let c = container::parse_bytes(bytes).map_err(|e| e.to_string())?;
        // ONNX has no magic: a seed that fell back to opaque would test nothing.
        if target == "onnx" && c.format != Format::Onnx {
            return Err(format!("parsed as {:?}, not onnx", c.format));
        }
        Ok(())
    }
}

#[test]
fn seeds_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let seeds = files(&root);
    assert!(seeds.len() >= 10, "seeds missing under {}", root.display());
    for (target, path) in seeds {
        let bytes = std::fs::read(&path).unwrap();
        if let Err(e) = replay(&target, &bytes) {
            panic!("seed '{}' does not parse: {e}", path.display());
        }
    }
}

/// What a regression input gave: the fuzz target's own calls (for the zip target the
/// archive reader too), then the invariant every accepted container keeps: each tensor
/// lies inside the file. `Ok` describes the outcome; `Err` is a broken invariant.
fn replay_regression(target: &str, bytes: &[u8]) -> Result<String, String> {
    if target == "zip" {
        if let Ok(archive) = zip::read(&bytes) {
            for e in &archive.entries {
                let _ = zip::data_offset(&bytes, &archive, e);
            }
        }
    }
    if target == "pickle" {
        return Ok(match pickle::storages(bytes) {
            Ok(_) => "accepted".into(),
            Err(e) => format!("rejected: {e}"),
        });
    }
    let c = match container::parse_bytes(bytes) {
        Ok(c) => c,
        Err(e) => return Ok(format!("rejected: {e}")),
    };
    if c.file_size != bytes.len() as u64 {
        return Err(format!("file size {} of {}", c.file_size, bytes.len()));
    }
    for t in &c.tensors {
        if t.offset
            .checked_add(t.len)
            .is_none_or(|end| end > c.file_size)
        {
            return Err(format!(
                "tensor '{}' at {}+{} outside the file",
                t.name, t.offset, t.len
            ));
        }
    }
    Ok(format!(
        "accepted as {:?}, {} tensors",
        c.format,
        c.tensors.len()
    ))
}

#[test]
fn regressions_do_not_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    assert!(
        root.is_dir(),
        "'{}' is missing: the regression replay would check nothing",
        root.display()
    );
    let inputs = files(&root);
    // Every target has its malformed inputs (truncated headers, huge lengths, offsets
    // past the end or overlapping).
    for t in std::fs::read_dir(root.parent().unwrap().join("fuzz_targets"))
        .unwrap()
        .flatten()
    {
        let name = t.path().file_stem().unwrap().to_string_lossy().into_owned();
        let n = inputs.iter().filter(|(target, _)| *target == name).count();
        assert!(
            n >= 3,
            "fuzz target '{name}' has {n} regression inputs under fuzz/regressions/{name}/"
        );
    }
    let mut failures = Vec::new();
    for (target, path) in inputs {
        let bytes = std::fs::read(&path).unwrap();
        let start = std::time::Instant::now();
        let result = std::panic::catch_unwind(|| replay_regression(&target, &bytes));
        let shown = path.strip_prefix(&root).unwrap().display().to_string();
        let secs = start.elapsed().as_secs_f64();
        match result {
            Err(_) => failures.push(format!("'{shown}' panicked")),
            Ok(Err(e)) => failures.push(format!("'{shown}': {e}")),
            Ok(Ok(outcome)) => eprintln!("'{shown}': {outcome}"),
        }
        if secs > 2.0 {
            failures.push(format!("'{shown}' took {secs:.1} s"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_fuzz_target_has_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = files(&root.join("seeds"));
    for t in std::fs::read_dir(root.join("fuzz_targets"))
        .unwrap()
        .flatten()
    {
        let name = t.path().file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            seeds.iter().any(|(target, _)| *target == name),
            "fuzz target '{name}' has no seed under fuzz/seeds/{name}/"
        );
    }
}
