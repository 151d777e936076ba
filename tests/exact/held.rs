//! A live engine keeps model files open between snapshots (`collect::heldfiles`): what it
//! reads through a kept descriptor is what `fincore` says at every snapshot, a file that
//! leaves the files of interest is closed at that snapshot, and a file deleted is never
//! kept past the snapshot that sees it unlinked.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use twofold::collect::gather::Request;
use twofold::engine::Engine;
use twofold::sample::{FileSample, Sample};

/// This process's descriptors open on `path` (or on it unlinked: `PATH (deleted)`).
fn fds_to(path: &Path) -> usize {
    let deleted = format!("{} (deleted)", path.display());
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == path || l.as_os_str() == deleted.as_str())
        .count()
}

/// The file at `path`: the one it names now first, else the one it named (deleted).
fn file_in<'a>(s: &'a Sample, path: &Path) -> &'a FileSample {
    let shown = path.display().to_string();
    let named = |f: &&FileSample| f.path == shown || f.path == format!("{shown} (deleted)");
    s.files
        .iter()
        .filter(named)
        .find(|f| !f.deleted)
        .or_else(|| s.files.iter().find(named))
        .unwrap_or_else(|| panic!("{shown} not in the sample"))
}

fn cached(s: &Sample, path: &Path) -> u64 {
    file_in(s, path).residency.as_ref().unwrap().cached_bytes
}

/// A snapshot whose count of `path`'s cached bytes is fincore's: taken where fincore said
/// the same before and after it (readahead still running, or reclaim elsewhere taking
/// pages, moves it during one; tried again, up to 10 times).
fn agreeing(engine: &mut Engine, path: &Path) -> Sample {
    let mut w = Vec::new();
    for _ in 0..10 {
        let before = fincore_pages(path);
        let s = engine.snapshot(&mut w).unwrap().sample;
        if fincore_pages(path) == before {
            assert_eq!(cached(&s, path), before * 4096, "{w:?}");
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "fincore of {} never held still over a snapshot",
        path.display()
    );
}

#[test]
fn a_kept_file_is_read_as_fincore_sees_it_and_closed_when_replaced() {
    let _group = crate::common::group(module_path!());
    kept_and_replaced(false);
}

/// The same, the file found by a walk of its directory (kept between snapshots while its
/// directory is unchanged, and what the file's name names taken from it).
#[test]
fn a_kept_file_of_a_walked_directory_is_closed_when_replaced() {
    let _group = crate::common::group(module_path!());
    kept_and_replaced(true);
}

fn kept_and_replaced(walked: bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 8 * MIB);
    // A process of the test's (it copies the file and closes it): the gather reads it
    // alone rather than the whole host.
    let copy = reader("copy", Some(&file), &[]);
    let named = if walked { dir.path() } else { &file };
    if walked {
        // Its last change settled (10 s back): the walk is kept between snapshots.
        let t = std::time::SystemTime::now() - Duration::from_secs(10);
        let d = std::fs::File::open(dir.path()).unwrap();
        d.set_times(std::fs::FileTimes::new().set_modified(t))
            .unwrap();
    }
    let req = Request {
        paths: vec![named.to_path_buf()],
        pids: vec![copy.pid()],
        ..Request::default()
    };
    let mut engine = Engine::new(req, None).incremental(Duration::from_secs(3600));
    agreeing(&mut engine, &file);
    assert_eq!(fds_to(&file), 1, "the engine keeps the file open");
    // Evicted, then half read back by the test: each snapshot reads it through the
    // descriptor it kept, and agrees with fincore.
    evict_all(&file);
    agreeing(&mut engine, &file);
    let mut f = std::fs::File::open(&file).unwrap();
    let mut half = vec![0u8; (4 * MIB) as usize];
    std::io::Read::read_exact(&mut f, &mut half).unwrap();
    drop(f);
    let s = agreeing(&mut engine, &file);
    assert!(cached(&s, &file) >= 4 * MIB, "half the file read back");
    assert_eq!(fds_to(&file), 1, "one descriptor, kept");
    // A new model renamed over the path: the old inode has no link left (the reader's
    // descriptor may keep it, and it among the files of interest), and the engine's
    // descriptor of it is closed at that snapshot; the new one is kept.
    let new = model_file(dir.path(), "new.gguf", 4 * MIB);
    std::fs::rename(&new, &file).unwrap();
    let s = agreeing(&mut engine, &file);
    assert_eq!(file_in(&s, &file).size_bytes, Some(4 * MIB));
    assert_eq!(fds_to(&file), 1, "only the new file is kept");
    drop(engine);
    assert_eq!(fds_to(&file), 0);
}

#[test]
fn a_deleted_file_is_never_kept_past_the_snapshot_that_sees_it_unlinked() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "d.safetensors", 8 * MIB);
    let map = reader("map", Some(&file), &[]);
    let req = Request {
        pids: vec![map.pid()],
        ..Request::default()
    };
    let mut engine = Engine::new(req, None).incremental(Duration::from_secs(3600));
    let mut w = Vec::new();
    let s = engine.snapshot(&mut w).unwrap().sample;
    assert_eq!(cached(&s, &file), 8 * MIB, "mapped whole: {w:?}");
    assert_eq!(fds_to(&file), 1, "the engine keeps the file open");
    std::fs::remove_file(&file).unwrap();
    // The mapper keeps the inode alive; the snapshot reads it through the kept descriptor,
    // sees no link left, and closes it.
    let s = engine.snapshot(&mut w).unwrap().sample;
    assert_eq!(cached(&s, &file), 8 * MIB);
    assert_eq!(fds_to(&file), 0, "an unlinked file is not kept");
    // Still mapped: the next snapshot reads it again (opened through the mapper's
    // `map_files`) and keeps nothing of it either.
    let s = engine.snapshot(&mut w).unwrap().sample;
    assert_eq!(cached(&s, &file), 8 * MIB);
    assert_eq!(fds_to(&file), 0);
}

/// With the task iterator (root), a kept file's residency stands while its page count
/// (the iterator's `nrpages` of the kept descriptor) and stamp do, and is read again with
/// `cachestat` as soon as either moves: every snapshot agrees with `fincore`.
#[test]
fn a_kept_files_residency_stands_while_its_page_count_does() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (the task iterator is a BPF program)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "s.gguf", 8 * MIB);
    // Written back: a file with dirty pages is read at every snapshot.
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    let copy = reader("copy", Some(&file), &[]);
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![copy.pid()],
        ..Request::default()
    };
    let mut engine = Engine::new(req, None)
        .incremental(Duration::from_secs(3600))
        .task_iterator(true)
        .held_pages_always(true);
    // Opened at the first snapshot, read through the kept descriptor at the second.
    for _ in 0..2 {
        agreeing(&mut engine, &file);
        assert_eq!(engine.residencies_stood(), 0, "the first two are read");
    }
    let s = agreeing(&mut engine, &file);
    assert_eq!(engine.residencies_stood(), 1, "unchanged: it stands");
    assert_eq!(cached(&s, &file), 8 * MIB);
    // Evicted: its page count moved, so it is read again, and stands after.
    evict_all(&file);
    // (A sample left standing would still say 8 MiB.)
    let s = agreeing(&mut engine, &file);
    assert_eq!(cached(&s, &file), 0, "moved: read again");
    agreeing(&mut engine, &file);
    assert_eq!(engine.residencies_stood(), 1);
    // A quarter read back by the test (readahead may add more while a snapshot runs:
    // `agreeing` takes one that fincore held still over).
    let mut f = std::fs::File::open(&file).unwrap();
    let mut part = vec![0u8; (2 * MIB) as usize];
    std::io::Read::read_exact(&mut f, &mut part).unwrap();
    drop(f);
    let s = agreeing(&mut engine, &file);
    assert!(cached(&s, &file) >= 2 * MIB, "read back: read again");
}
