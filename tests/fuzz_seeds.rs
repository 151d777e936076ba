//! Replays the committed fuzz inputs on stable, so the main suite covers them without
//! cargo-fuzz: every seed (`fuzz/seeds/<target>/*`, valid files) must parse, and every
//! regression input (`fuzz/regressions/<target>/*`, crashes the fuzzer once found) must
//! give a result or an error, never a panic.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use twofold::container::{self, pickle, Format};

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

#[test]
fn regressions_do_not_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    for (target, path) in files(&root) {
        let bytes = std::fs::read(&path).unwrap();
        let _ = replay(&target, &bytes);
    }
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
