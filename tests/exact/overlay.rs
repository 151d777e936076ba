//! One file per inode, whatever the mount: a model read through an overlayfs mount
//! (`merged/model`) and through its lower layer (`lower/model`) is one file with one page
//! cache, whose residency is the lower file's, with both readers as its mappers and both
//! names shown (issue #39).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use twofold::model::{FileModel, Report};

/// An overlay mounted for the test, unmounted on drop (also on panic).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Mounts `lower` (read-only layer) with `upper` and `work` at `merged`.
fn mount_overlay(dir: &Path) -> Option<(PathBuf, Mounted)> {
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| dir.join(d));
    for d in [&upper, &work, &merged] {
        std::fs::create_dir_all(d).unwrap();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let ok = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&merged)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    Some((merged.clone(), Mounted(merged)))
}

/// (Rss, Pss) bytes of the mapping of `path` in `/proc/PID/smaps` (ground truth).
fn smaps_of(pid: i32, path: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let want = path.to_str().unwrap();
    let mut lines = text.lines().skip_while(|l| !l.ends_with(want));
    assert!(lines.next().is_some(), "pid {pid} maps {want}");
    let mut field = |name: &str| -> u64 {
        let l = lines.find(|l| l.starts_with(name)).unwrap();
        l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let rss = field("Rss:");
    let pss = field("Pss:");
    (rss, pss)
}

fn scan(args: &[&Path], pids: &[i32]) -> Report {
    let mut all: Vec<std::ffi::OsString> =
        vec!["scan".into(), "--json".into(), "--no-prove".into()];
    for p in pids {
        all.push("--pid".into());
        all.push(p.to_string().into());
    }
    all.extend(args.iter().map(|p| p.as_os_str().to_owned()));
    let all: Vec<&std::ffi::OsStr> = all.iter().map(|s| s.as_os_str()).collect();
    twofold_json(&all)
}

/// The one file of the report that is `lower`'s inode; no other file of the test's.
fn the_file<'a>(r: &'a Report, lower: &Path, dir: &Path) -> &'a FileModel {
    let key = file_key(lower);
    let ours: Vec<&FileModel> = r
        .files
        .iter()
        .filter(|f| f.key == key || f.path.starts_with(dir.to_str().unwrap()))
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "one file, not one per mount: {:?}",
        ours.iter().map(|f| (&f.path, f.key)).collect::<Vec<_>>()
    );
    assert_eq!(ours[0].key, key, "the inode that holds the bytes");
    ours[0]
}

#[test]
fn a_file_read_through_an_overlay_and_its_lower_layer_is_one_file() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to mount an overlay)")
        || !require(have("fincore"), "util-linux fincore")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("lower")).unwrap();
    let size = 32 * MIB;
    let lower = model_file(&dir.path().join("lower"), "model.safetensors", size);
    let Some((merged_dir, _mounted)) = mount_overlay(dir.path()) else {
        require(false, "overlayfs mounts");
        return;
    };
    let merged = merged_dir.join("model.safetensors");
    let a = reader("map", Some(&merged), &[]);
    let b = reader("map", Some(&lower), &[]);
    // Ground truth: one page cache, all of it resident through either name; each of the
    // two mappings is charged half of its pages.
    let pages = size / 4096;
    assert_eq!(fincore_pages(&lower), pages);
    assert_eq!(fincore_pages(&merged), pages);
    for (pid, p) in [(a.pid(), &merged), (b.pid(), &lower)] {
        // Another twofold beside the suite reading the file's pages is a third mapper.
        let (rss, pss) = while_others_quiet(|| smaps_of(pid, p));
        assert_eq!(rss, size, "pid {pid} touched every page");
        assert_near(pss, size / 2, tolerance(size), "its Pss is half its Rss");
    }
    let names = |f: &FileModel| {
        let mut v: Vec<String> = std::iter::once(f.path.clone())
            .chain(f.seen_as.clone())
            .collect();
        v.sort();
        v
    };
    let both = {
        let mut v = vec![lower.display().to_string(), merged.display().to_string()];
        v.sort();
        v
    };
    // Found through its mappers, named through both paths, and named through the
    // overlay alone: the same single file each time.
    for (how, r) in [
        (
            "found through the readers",
            while_others_quiet(|| scan(&[], &[a.pid(), b.pid()])),
        ),
        (
            "both paths named",
            while_others_quiet(|| scan(&[&lower, &merged], &[])),
        ),
        (
            "the merged path named",
            while_others_quiet(|| scan(&[&merged], &[])),
        ),
    ] {
        let f = the_file(&r, &lower, dir.path());
        assert_eq!(
            f.resident_bytes,
            Some(size),
            "{how}: resident as fincore says"
        );
        assert_eq!(f.representations.page_cache, Some(1.0), "{how}");
        assert_eq!(f.representations.proven, Some(1.0), "{how}: the count");
        let mut mappers: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
        mappers.sort();
        let mut want = vec![a.pid(), b.pid()];
        want.sort();
        assert_eq!(mappers, want, "{how}: both readers map it");
        for m in &f.mappers {
            assert_near(
                m.pss_bytes.unwrap(),
                size / 2,
                tolerance(size),
                "a mapper's Pss",
            );
        }
        assert_eq!(names(f), both, "{how}: both names shown");
        assert!(
            !r.findings.iter().any(|x| x.code == "low-residency"),
            "{how}: no cold overlay file: {:?}",
            r.findings
        );
    }
    // The text names both paths under one file.
    let text = String::from_utf8(run_ok(
        Command::new(exe())
            .args(["scan", "--no-prove"])
            .arg(&merged),
    ))
    .unwrap();
    let files: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "MODEL FILES")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  /"))
        .collect();
    assert_eq!(files, [format!("  {}", merged.display())], "{text}");
    assert!(
        text.contains(&format!("seen as {}", lower.display())),
        "{text}"
    );
    assert!(text.contains("in memory ≥ 1.00 times"), "{text}");
}
