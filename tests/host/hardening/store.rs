//! A recording store with something other than regular files in it, or one twofold may
//! not write or read: every command that opens it ends at once with one line naming the
//! file (and, for a permission, its mode and owner), before any work or output.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{assert_refused, mkfifo, GROUP};
use crate::common::*;

/// A sleeping child for `record --pid` (killed and reaped on drop).
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A store of one snapshot (of the sleeper alone: quick, whatever else runs), made by
/// `exe` (run as whoever runs the test).
fn one_snapshot_store(store: &Path, pid: &str) {
    let out = Command::new(exe())
        .args([
            "record",
            "--count",
            "1",
            "--no-prove",
            "--pid",
            pid,
            "--store",
        ])
        .arg(store)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for ent in std::fs::read_dir(from).unwrap() {
        let ent = ent.unwrap();
        std::fs::copy(ent.path(), to.join(ent.file_name())).unwrap();
    }
}

/// The store's `.index` and `.frames` file names (one day).
fn shard_files(store: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "index" || e == "frames"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 2, "{v:?}");
    v
}

#[test]
fn a_fifo_in_a_store_is_refused_without_blocking() {
    let _group = crate::common::group(GROUP);
    let dir = tempfile::tempdir().unwrap();
    let sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let good = dir.path().join("good");
    one_snapshot_store(&good, &pid);
    let mut names: Vec<String> = shard_files(&good)
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    names.extend(["store.json".into(), "store.lock".into()]);
    for (i, name) in names.iter().enumerate() {
        let store = dir.path().join(format!("s{i}"));
        copy_store(&good, &store);
        let fifo = store.join(name);
        std::fs::remove_file(&fifo).unwrap();
        mkfifo(&fifo);
        let s = store.to_str().unwrap();
        let out = dir.path().join(format!("out{i}"));
        let o = out.to_str().unwrap();
        let needle = format!("'{}' is a pipe, not a regular file", fifo.display());
        let cases: &[&[&str]] = &[
            &["replay", "--store", s],
            &["replay", "--json", "--store", s],
            &["dump", "--store", s],
            &["dump", "--format", "csv", "--store", s],
            &["dump", "--format", "openmetrics", "--store", s],
            &["snapshot", "--store", s, "--out", o],
            &[
                "record",
                "--count",
                "1",
                "--no-prove",
                "--pid",
                &pid,
                "--store",
                s,
            ],
        ];
        for args in cases {
            assert_refused(args, &needle);
        }
        // Nothing written: no snapshot store, the FIFO left as it was.
        assert!(!out.exists());
        use std::os::unix::fs::FileTypeExt;
        let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(ft.is_fifo(), "{name}");
    }
}

/// Runs the copied binary as 'nobody'.
fn as_nobody(bin: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exit 2, one line on stderr with every one of `needles`, nothing on stdout.
fn refused_as_nobody(bin: &Path, args: &[&str], needles: &[&str]) {
    let (code, out, err) = as_nobody(bin, args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("twofold: error: "), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: want '{n}' in {err}");
    }
    assert!(out.is_empty(), "{args:?}: stdout {out}");
}

#[test]
fn a_store_it_may_not_write_or_read_is_refused_naming_the_permission() {
    let _group = crate::common::group(GROUP);
    let Some((dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let sleeper = Sleeper::start();
    let pid = sleeper.pid();
    // Root's store: 'nobody' may read it, not write it. record says so before its banner
    // and before any snapshot.
    let store = dir.path().join("S");
    one_snapshot_store(&store, &pid);
    mode(&store, 0o755);
    let s = store.to_str().unwrap();
    let before: Vec<u64> = shard_files(&store)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    let record = [
        "record",
        "--count",
        "1",
        "--no-prove",
        "--pid",
        &pid,
        "--store",
    ];
    let args: Vec<&str> = record.iter().copied().chain([s]).collect();
    refused_as_nobody(
        &bin,
        &args,
        &[
            &format!("permission denied on '{s}' (mode 0755, owner uid 0)"),
            "run as its owner or as root",
        ],
    );
    let after: Vec<u64> = shard_files(&store)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert_eq!(before, after);
    // An empty read-only directory: no store.json is created in it.
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    mode(&ro, 0o555);
    let r = ro.to_str().unwrap();
    let args: Vec<&str> = record.iter().copied().chain([r]).collect();
    refused_as_nobody(
        &bin,
        &args,
        &[&format!("permission denied on '{r}' (mode 0555")],
    );
    assert!(std::fs::read_dir(&ro).unwrap().next().is_none());
    // A store it may not enter, then one whose header it may not read: replay and dump
    // name the permission, not "no recording store".
    mode(&store, 0o700);
    for args in [&["replay", "--store", s][..], &["dump", "--store", s]] {
        refused_as_nobody(
            &bin,
            args,
            &[&format!(
                "permission denied on '{s}/store.json' ('{s}' is mode 0700, owner uid 0)"
            )],
        );
    }
    mode(&store, 0o755);
    mode(&store.join("store.json"), 0o600);
    refused_as_nobody(
        &bin,
        &["replay", "--json", "--store", s],
        &[&format!(
            "permission denied on '{s}/store.json' (mode 0600, owner uid 0)"
        )],
    );
    // And one that is not there at all is still "no recording store".
    let missing = dir.path().join("missing");
    let m = missing.to_str().unwrap();
    refused_as_nobody(&bin, &["replay", "--store", m], &["no recording store at"]);
}
