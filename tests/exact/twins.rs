//! Files of the same bytes ("twins"): a model copied to a second path, both cached and
//! each mapped, is in memory twice. `scan` links them both ways and says so in a finding;
//! each keeps its own count; the exporter carries the link (issue #39).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use twofold::model::{FileModel, Report};

/// A child killed and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scan(paths: &[&PathBuf]) -> Report {
    let mut all: Vec<&std::ffi::OsStr> =
        vec!["scan".as_ref(), "--json".as_ref(), "--no-prove".as_ref()];
    all.extend(paths.iter().map(|p| p.as_os_str()));
    twofold_json(&all)
}

fn of<'a>(r: &'a Report, path: &Path) -> &'a FileModel {
    let key = file_key(path);
    r.files.iter().find(|f| f.key == key).unwrap()
}

#[test]
fn a_model_copied_to_a_second_path_is_linked_and_said_to_be_cached_twice() {
    let _group = crate::common::group(module_path!());
    if !require(have("fincore"), "util-linux fincore") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let a = model_file(&dir.path().join("a"), "model.safetensors", size);
    let b = dir.path().join("b/model.safetensors");
    std::fs::copy(&a, &b).unwrap();
    std::fs::File::open(&b).unwrap().sync_all().unwrap();
    // The same size, other bytes: no twin.
    let c = model_file(&dir.path().join("c"), "model.safetensors", size);
    let readers: Vec<_> = [&a, &b, &c].map(|p| reader("map", Some(p), &[])).into();
    // Ground truth: the same bytes, two inodes, each wholly cached.
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_ne!(file_key(&a), file_key(&b));
    for p in [&a, &b, &c] {
        assert_eq!(fincore_pages(p), size / 4096, "{} cached", p.display());
    }
    let r = scan(&[&a, &b, &c]);
    let twins = |p: &Path| -> Vec<(twofold::sample::FileKey, String)> {
        of(&r, p)
            .same_bytes
            .iter()
            .map(|t| (t.key, t.path.clone()))
            .collect()
    };
    assert_eq!(twins(&a), [(file_key(&b), b.display().to_string())]);
    assert_eq!(twins(&b), [(file_key(&a), a.display().to_string())]);
    assert!(twins(&c).is_empty(), "other bytes of one size are no twin");
    // Each counts itself alone: 1.00 each, never the other's bytes added.
    for p in [&a, &b, &c] {
        let f = of(&r, p);
        assert_eq!(f.resident_bytes, Some(size));
        assert_eq!(f.representations.proven, Some(1.0), "{}", p.display());
        assert_eq!(f.mappers.len(), 1);
    }
    let same: Vec<_> = r
        .findings
        .iter()
        .filter(|x| x.code == "same-bytes-cached")
        .collect();
    assert_eq!(same.len(), 1, "{:?}", r.findings);
    let want = format!(
        "the same bytes are cached 2 times: '{}', '{}' (up to 16.0 MiB that one copy would not need)",
        a.display(),
        b.display()
    );
    assert_eq!(same[0].message(), want);

    // The text: each names the other, and the finding.
    let text = String::from_utf8(run_ok(
        Command::new(exe())
            .args(["scan", "--no-prove"])
            .args([&a, &b, &c]),
    ))
    .unwrap();
    assert!(
        text.contains(&format!("same bytes as {}", b.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("same bytes as {}", a.display())),
        "{text}"
    );
    assert!(text.contains(&want), "{text}");

    // The exporter: one same-bytes series each way, none for the third file.
    let port = free_port();
    let _serve = Killed(
        Command::new(exe())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--interval",
                "1s",
            ])
            .arg("--no-prove")
            .arg("--model-glob")
            .arg(dir.path().join("*/model.safetensors"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (ia, ib, ic) = (file_id(&a), file_id(&b), file_id(&c));
    let until = Instant::now() + Duration::from_secs(60);
    let body = loop {
        match metrics_text(port) {
            Some(body) if body.contains(&format!("twin_file_id=\"{ib}\"")) => break body,
            _ if Instant::now() > until => panic!("no same-bytes series in a minute"),
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    };
    // (Other files of this host may have twins of their own: only ours are looked at.)
    let ours = |l: &&str| {
        [&ia, &ib, &ic]
            .iter()
            .any(|i| l.contains(&format!("\"{i}\"")))
    };
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("twofold_file_same_bytes_info{"))
        .filter(ours)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (x, y) in [(&ia, &ib), (&ib, &ia)] {
        assert!(
            lines.iter().any(|l| l.contains(&format!("file_id=\"{x}\""))
                && l.contains(&format!("twin_file_id=\"{y}\""))
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(1.0)),
            "{lines:?}"
        );
    }
    assert!(!lines.iter().any(|l| l.contains(ic.as_str())), "{lines:?}");
    drop(readers);
}
