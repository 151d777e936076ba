//! Who holds a model file, seen through `twofold scan` as a user runs it: twofold's own
//! processes are observers, never holders; a replaced inode still mapped is opened
//! through its holder; a holder that exits mid-scan leaves no lower bound; a file mapped
//! from another mount namespace is shown by its host path; `scan FILE` is about FILE.

#![allow(clippy::unwrap_used)]

use std::os::fd::AsRawFd;
use std::path::Path;
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
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    second_twofold_observes(dir.path(), &exe());
}

/// A twofold of another build under another name (a copy of this binary: another inode,
/// named `tf-other`): neither the executable nor the name tells it, the mark it carries
/// does ([`twofold::collect::observer`]).
#[test]
fn a_renamed_twofold_of_another_inode_is_an_observer_too() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("tf-other");
    std::fs::copy(exe(), &copy).unwrap();
    second_twofold_observes(dir.path(), &copy);
}

fn second_twofold_observes(dir: &Path, program: &Path) {
    let file = model_file(dir, "m.gguf", 16 * MIB);
    let map = reader("map", Some(&file), &[]);
    // A recorder that holds the model open: it inherits an fd of it (no close-on-exec),
    // as an exporter that has the file open between snapshots does.
    let f = std::fs::File::open(&file).unwrap();
    // SAFETY: plain syscall on an fd we own; the duplicate is closed below.
    let inherited = unsafe { libc::dup(f.as_raw_fd()) };
    assert!(inherited >= 0);
    let store = dir.join("store");
    let mut cmd = Command::new(program);
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
    // It maps its mark first thing in `main`; a loaded host can run the scan before that
    // (the recorder then truly is a process holding the file, not yet an observer).
    let marked = || {
        std::fs::read_to_string(format!("/proc/{rpid}/maps"))
            .is_ok_and(|m| twofold::collect::observer::marked(&m))
    };
    let start = Instant::now();
    while !marked() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the recorder never mapped its mark"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// `fincore`'s resident bytes of `path` (util-linux; ground truth, by mincore).
fn fincore_bytes(path: &Path) -> u64 {
    let out = run_ok(
        Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path),
    );
    String::from_utf8_lossy(&out).trim().parse().unwrap()
}

/// `/proc/PID/map_files/START-END` of `pid`'s mapping of inode `ino`, from its maps.
fn map_files_of(pid: i32, ino: u64) -> std::path::PathBuf {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(&ino.to_string()))
        .unwrap();
    let range = line.split_whitespace().next().unwrap();
    Path::new(&format!("/proc/{pid}/map_files")).join(range)
}

#[test]
fn a_replaced_model_still_mapped_is_counted_through_its_holder() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to open /proc/PID/map_files)")
        || !require(have("fincore"), "util-linux fincore")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.gguf", size);
    let old = file_key(&file);
    let map = reader("map", Some(&file), &[]);
    // A new model renamed over the path, as a deployment does.
    let new = model_file(dir.path(), "new.gguf", 8 * MIB);
    std::fs::rename(&new, &file).unwrap();
    let now = file_key(&file);
    assert_ne!(old, now);
    let truth = fincore_bytes(&map_files_of(map.pid(), old.inode));
    assert!(truth > 0, "ground truth: the old inode is cached");
    let r = scan_json(&[file.to_str().unwrap()]);
    let olds: Vec<&FileModel> = r.files.iter().filter(|f| f.key == old).collect();
    assert_eq!(olds.len(), 1, "one entry for the old inode: {:?}", r.files);
    let f = olds[0];
    assert_eq!(f.size_bytes, Some(size));
    assert_eq!(
        f.resident_bytes,
        Some(truth),
        "{:?}",
        f.residency_unknown_reason
    );
    assert!(f.deleted);
    assert_eq!(f.now_at_path, Some(now));
    let count = f.representations.proven.expect("a count, not unknown");
    assert!(
        (count - truth as f64 / size as f64).abs() < 1e-9 && (count - 1.0).abs() < 0.005,
        "count {count}, truth {truth} of {size}"
    );
    assert!(f.mappers.iter().any(|m| m.pid == map.pid()));
    let finding = r
        .findings
        .iter()
        .find(|x| x.code == "replaced-file-held" && Path::new(&x.subject()) == file)
        .expect("a finding about the old file");
    let msg = finding.message();
    assert!(msg.contains(&format!("pid {} (", map.pid())), "{msg}");
    assert!(
        msg.contains(&format!("until pid {} restarts", map.pid())),
        "{msg}"
    );
    assert!(msg.contains(&format!("inode {}", now.inode)), "{msg}");
    assert!(msg.contains("16.0 MiB of page cache"), "{msg}");
    assert!(r
        .findings
        .iter()
        .all(|x| x.code != "residency-unknown" || Path::new(&x.subject()) != file));

    // The exporter has the old inode's series too.
    let port = free_port();
    let serve = Killed(
        Command::new(exe())
            .args(["serve", "--no-prove", "--interval", "1s", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let id = format!("{}:{}:{}", old.major, old.minor, old.inode);
    let want = format!("twofold_file_copies{{file_id=\"{id}\"}} ");
    let until = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    let line = loop {
        if let Some(body) = metrics_text(port) {
            if let Some(l) = body.lines().find(|l| l.starts_with(&want)) {
                break l.to_string();
            }
            last = body;
        }
        assert!(
            Instant::now() < until,
            "no '{want}' series; last exposition:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((v - 1.0).abs() < 0.005, "{line}");
    drop(serve);
}

/// Every remedy of a report: none may tell root to run as root.
fn assert_no_root_advice(r: &Report) {
    for x in &r.findings {
        let remedy = x.remedy().unwrap_or_default();
        assert!(
            !remedy.contains("run as root"),
            "{}: {} → {remedy}",
            x.code,
            x.message()
        );
    }
}

#[test]
fn a_holder_that_exits_mid_scan_leaves_no_lower_bound() {
    let _group = crate::common::group(module_path!());
    use twofold::collect::gather::{gather, Request};
    use twofold::collect::Roots;
    use twofold::dupes::prove::{prove, ProveOptions};
    if !require(is_root(), "root (to search the copying reader's memory)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let key = file_key(&file);
    let mut mappers = vec![
        reader("map", Some(&file), &[]),
        reader("map", Some(&file), &[]),
    ];
    let copy = reader("copy", Some(&file), &["--close"]);
    // Unlinked: only its holders' fds and map_files reach the inode now.
    std::fs::remove_file(&file).unwrap();
    let mut pids: Vec<i32> = mappers.iter().map(|m| m.pid()).collect();
    pids.push(copy.pid());
    let req = Request {
        pids,
        ..Request::default()
    };
    let roots = Roots::live();
    let mut warnings = Vec::new();
    let mut sample = gather(&roots, &req, &mut warnings).unwrap();
    assert!(sample
        .candidates
        .iter()
        .any(|c| c.pid == copy.pid() && c.file == key));
    // The holder whose path comes first exits between the collection and the proof.
    let first = sample
        .processes
        .iter()
        .find(|p| p.mappings.iter().any(|m| m.key() == key))
        .unwrap()
        .pid;
    mappers.retain(|m| m.pid() != first);
    assert_eq!(mappers.len(), 1);
    assert!(!Path::new(&format!("/proc/{first}")).exists());
    let opts = ProveOptions {
        budget: Some(Duration::from_secs(60)),
        exact: false,
    };
    sample.proofs = prove(&roots, &sample, opts, &mut warnings);
    let r = twofold::model::from_sample(&sample);
    let f = r.files.iter().find(|f| f.key == key).unwrap();
    assert!(f.deleted);
    assert!(
        !f.representations.lower_bound,
        "{:?} {:?}",
        f.representations, sample.proofs
    );
    let c = f
        .proven_copies
        .iter()
        .find(|c| c.pid == copy.pid())
        .unwrap();
    assert!(c.fraction > 0.99, "{c:?}");
    assert_no_root_advice(&r);

    // A candidate that exits before its search holds no memory: searched, nothing
    // there, and no lower bound either.
    let gone = copy.pid();
    drop(copy);
    sample.proofs = prove(&roots, &sample, opts, &mut warnings);
    let p = sample.proofs.iter().find(|p| p.pid == gone).unwrap();
    assert_eq!(p.unsearched, None, "{p:?}");
    let r = twofold::model::from_sample(&sample);
    let f = r.files.iter().find(|f| f.key == key).unwrap();
    assert!(!f.representations.lower_bound, "{:?}", f.representations);
    assert!(f.proven_copies.is_empty() && f.suspected_copies.is_empty());
    assert_no_root_advice(&r);
}

/// This sandbox's pid 1 refuses its `maps` even to root: it must not make a small file's
/// count a lower bound, and no advice may tell root to become root.
#[test]
fn a_process_that_refuses_root_is_no_candidate_without_evidence() {
    let _group = crate::common::group(module_path!());
    let refused = std::fs::read_to_string("/proc/1/maps")
        .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if !require(is_root(), "root")
        || !require(
            refused,
            "a process that refuses /proc/PID/maps to root (pid 1 here)",
        )
    {
        return;
    }
    let anon = status_bytes(1, "RssAnon");
    let dir = tempfile::tempdir().unwrap();
    // Small enough for pid 1's private memory to hold a copy of it by size.
    let size = (anon / 2).max(64 << 10) / 4096 * 4096;
    let file = model_file(dir.path(), "small.onnx", size);
    let r = scan_json(&["--pid", "1", file.to_str().unwrap()]);
    let f = r.files.iter().find(|x| Path::new(&x.path) == file).unwrap();
    assert!(
        f.suspected_copies.iter().all(|s| s.pid != 1),
        "{:?}",
        f.suspected_copies
    );
    assert!(!f.representations.lower_bound, "{:?}", f.representations);
    assert_no_root_advice(&r);
    let out = String::from_utf8(run_ok(
        Command::new(exe()).args(["scan", "--pid", "1"]).arg(&file),
    ))
    .unwrap();
    assert!(
        out.contains("denied even to root by a security policy"),
        "{out}"
    );
    assert!(!out.contains("run as root"), "{out}");
    assert!(!out.contains("root or CAP_SYS_PTRACE needed"), "{out}");
}

#[test]
fn a_file_mapped_from_another_mount_namespace_is_shown_by_its_host_path() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root (to create a mount namespace)")
        || !require(have("unshare"), "util-linux unshare")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&models).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let file = model_file(&models, "m.gguf", 16 * MIB);
    let key = file_key(&file);
    let inside = mnt.join("m.gguf");
    // A child in its own mount namespace, where `models` is bind-mounted on `mnt`.
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$1\" \"$2\" && exec \"$3\" __child map \"$2/m.gguf\"")
        .arg("sh")
        .arg(&models)
        .arg(&mnt)
        .arg(exe());
    let (child, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(line.trim(), "ready");
    // Ground truth: the child maps the file by its namespace's name, which the host lacks.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.pid())).unwrap();
    assert!(maps.contains(inside.to_str().unwrap()), "{maps}");
    assert!(!inside.exists(), "the bind mount is the child's only");
    let pid = child.pid().to_string();
    for args in [vec!["--pid", &pid], vec![file.to_str().unwrap()]] {
        let r = scan_json(&args);
        let entries: Vec<&FileModel> = r.files.iter().filter(|f| f.key == key).collect();
        assert_eq!(entries.len(), 1, "{args:?}: {:?}", r.files);
        let f = entries[0];
        assert_eq!(Path::new(&f.path), file, "{args:?}: the host path");
        assert_eq!(f.seen_as, [inside.to_str().unwrap()], "{args:?}");
        assert!(f.mappers.iter().any(|m| m.pid == child.pid()));
        assert_eq!(f.resident_bytes, Some(16 * MIB));
        assert!(r.files.iter().all(|x| Path::new(&x.path) != inside));
    }
    let out = String::from_utf8(run_ok(Command::new(exe()).args(["scan", "--pid", &pid]))).unwrap();
    assert!(out.contains(&format!("  {}\n", file.display())), "{out}");
    assert!(
        out.contains(&format!("seen as {}", inside.display())),
        "{out}"
    );
}

#[test]
fn scan_of_a_file_is_about_that_file_and_all_keeps_the_host() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let a = model_file(dir.path(), "a.gguf", 8 * MIB);
    let b = model_file(dir.path(), "b.gguf", 8 * MIB);
    let ma = reader("map", Some(&a), &[]);
    let mb = reader("map", Some(&b), &[]);
    let r = scan_json(&[a.to_str().unwrap()]);
    let paths: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, [a.to_str().unwrap()], "only the file named");
    assert!(r.files[0].mappers.iter().any(|m| m.pid == ma.pid()));
    assert!(
        r.processes.iter().all(|p| p.pid != mb.pid()),
        "a holder of another file is not reported"
    );
    let r = scan_json(&["--all", a.to_str().unwrap()]);
    for (f, m) in [(&a, &ma), (&b, &mb)] {
        let fm = r
            .files
            .iter()
            .find(|x| Path::new(&x.path) == f.as_path())
            .unwrap_or_else(|| panic!("--all shows '{}'", f.display()));
        assert!(fm.mappers.iter().any(|x| x.pid == m.pid()));
    }
}
