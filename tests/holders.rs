//! Who holds a model file, seen through `twofold scan` as a user runs it: twofold's own
//! processes are observers, never holders; a replaced inode still mapped is opened
//! through its holder; a holder that exits mid-scan leaves no lower bound; a file mapped
//! from another mount namespace is shown by its host path; `scan FILE` is about FILE.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use twofold::model::{FileModel, Report};

/// A child killed and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scan_json(args: &[&str]) -> Report {
    let mut all: Vec<&std::ffi::OsStr> = vec!["scan".as_ref(), "--json".as_ref()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    twofold_json(&all)
}

/// Every pid the report ties to `f`: mappers, holders, proven and suspected copies.
fn tied(f: &FileModel) -> Vec<i32> {
    let mut v: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
    v.extend(f.holders.iter().map(|h| h.pid));
    v.extend(f.proven_copies.iter().map(|c| c.pid));
    v.extend(f.suspected_copies.iter().map(|c| c.pid));
    v
}

/// Whether `/proc/PID/fd` has a link to `file` (the test's own reading).
fn holds_fd(pid: u32, file: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == file))
        })
        .unwrap_or(false)
}

#[test]
fn a_second_twofold_is_an_observer_not_a_holder() {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 16 * MIB);
    let map = reader("map", Some(&file), &[]);
    // A recorder that holds the model open: it inherits an fd of it (no close-on-exec),
    // as an exporter that has the file open between snapshots does.
    let f = std::fs::File::open(&file).unwrap();
    // SAFETY: plain syscall on an fd we own; the duplicate is closed below.
    let inherited = unsafe { libc::dup(f.as_raw_fd()) };
    assert!(inherited >= 0);
    let store = dir.path().join("store");
    let mut cmd = Command::new(exe());
    cmd.args(["record", "--no-prove", "--interval", "1h", "--store"])
        .arg(&store)
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let recorder = Killed(cmd.spawn().unwrap());
    // SAFETY: our own duplicate, inherited by the recorder, closed here.
    unsafe { libc::close(inherited) };
    drop(f);
    let rpid = recorder.0.id();
    assert!(
        holds_fd(rpid, &file),
        "ground truth: the recorder holds the file open"
    );
    let r = scan_json(&[file.to_str().unwrap()]);
    let fm = r.files.iter().find(|x| Path::new(&x.path) == file).unwrap();
    let rpid = rpid as i32;
    assert!(
        tied(fm).contains(&map.pid()),
        "the real reader is a mapper: {fm:?}"
    );
    assert!(
        !tied(fm).contains(&rpid),
        "the recorder is no holder, mapper or suspect: {fm:?}"
    );
    assert!(r.processes.iter().all(|p| p.pid != rpid));
    assert!(
        r.observers.contains(&rpid),
        "the recorder is an observer: {:?}",
        r.observers
    );
    assert!(r
        .findings
        .iter()
        .all(|x| !x.message().contains(&format!("pid {rpid} "))));
    // The human output names it once, on its own line.
    let out = run_ok(Command::new(exe()).arg("scan").arg(&file));
    let out = String::from_utf8(out).unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("observers: pid "))
        .unwrap_or_else(|| panic!("no observers line in:\n{out}"));
    assert!(line.contains(&rpid.to_string()), "{line}");
}
