//! `scan --fail-on`, the CI gate: exit 1 when a condition holds (each named on stderr,
//! with the file), 0 when none does, 2 for bad input; against readers the test started.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::common::*;

fn scan(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(exe()).arg("scan").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn fail_on_exits_1_naming_each_condition_and_0_when_none_holds() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to search the copier's memory)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 16 * MIB);
    let f = file.to_str().unwrap();
    let map = reader("map", Some(&file), &[]);
    // Only a mapping: the file is in memory once; no condition holds.
    let (rc, out, err) = scan(&[f, "--fail-on", "copies,suspected,lower-bound"]);
    assert_eq!(rc, Some(0), "{out}{err}");
    assert!(!err.contains("--fail-on"), "{err}");
    // A reader that copied the file into its heap and closed it: a proven copy.
    let copy = reader("copy", Some(&file), &["--close"]);
    let (rc, out, err) = scan(&[f, "--fail-on", "copies"]);
    assert_eq!(rc, Some(1), "{out}{err}");
    assert!(
        err.contains(&format!(
            "twofold: --fail-on copies: '{f}': proven 1.00 private copies"
        )),
        "{err}"
    );
    // The report is printed as without the gate.
    assert!(out.contains("m.gguf"), "{out}");
    // Without the proof the same copy is only suspected, and the count a lower bound:
    // both named, in the order asked.
    let (rc, _, err) = scan(&[f, "--no-prove", "--fail-on", "lower-bound,suspected,copies"]);
    assert_eq!(rc, Some(1), "{err}");
    let lb = err.find("--fail-on lower-bound: ").unwrap();
    let sus = err.find("--fail-on suspected: ").unwrap();
    assert!(lb < sus, "{err}");
    assert!(!err.contains("--fail-on copies"), "{err}");
    // --json keeps stdout a document; the gate still speaks on stderr.
    let (rc, out, _) = scan(&[f, "--json", "--fail-on", "copies"]);
    assert_eq!(rc, Some(1));
    let _: twofold::model::Report = serde_json::from_str(&out).unwrap();
    // A condition that does not exist is bad input.
    let (rc, _, err) = scan(&[f, "--fail-on", "bogus"]);
    assert_eq!(rc, Some(2), "{err}");
    assert!(err.contains("'bogus'"), "{err}");
    // One meaning of holders: the mapper and the copier that closed the file (it holds
    // the bytes) are both holders, in dump as in top and scan.
    let store = dir.path().join("store");
    let st = store.to_str().unwrap();
    let (rc, _, err) = scan(&[f, "--record", st]);
    assert_eq!(rc, Some(0), "{err}");
    let out = Command::new(exe())
        .args(["dump", "--store", st, "--from", "1h ago"])
        .output()
        .unwrap();
    let line: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["data"]["holders"], 2, "{line}");
    let r: twofold::model::Report = serde_json::from_str(&scan(&[f, "--json"]).1).unwrap();
    let fm = r.files.iter().find(|x| x.path == f).unwrap();
    let top = twofold::model::fields::FileField::Holders
        .value(fm)
        .number();
    assert_eq!(top, Some(2.0));
    drop((map, copy));
}
