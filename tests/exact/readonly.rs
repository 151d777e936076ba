//! Never change what is observed: a copy shared copy-on-write by `fork()` (gunicorn
//! `--preload`, multiprocessing `fork` pools, DataLoader workers) must stay shared while
//! every command of twofold reads it, and it counts once.
//!
//! Ground truth is the test's own: the page frame numbers of the copy's pages in every
//! process, from `/proc/PID/pagemap` (root only), before and after each command. A reader
//! that pinned the pages (`process_vm_readv`) would make the kernel unshare them: the
//! child's frame numbers would change.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::tmux::Tmux;
use crate::common::*;

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A `.npy` of `bytes` of pseudo-random f32 values (written by NumPy itself).
/// Each test's file has its own seed: two tests' files of the same bytes would be copies
/// of each other (and counted so).
fn npy(dir: &Path, bytes: u64, seed: u32) -> PathBuf {
    let path = dir.join("weights.npy");
    let code = format!(
        "import numpy as np; np.save({:?}, np.random.default_rng({seed}).random({}, dtype=np.float32))",
        path.to_str().unwrap(),
        bytes / 4
    );
    run_ok(Command::new("python3").args(["-c", &code]));
    path
}

/// The copy's data and the processes that share it.
struct Shared {
    _parent: twofold::spawn::Reader,
    addr: u64,
    len: u64,
    pids: Vec<i32>,
}

/// `tests/runtimes/fork.py MODE FILE 3`: a parent copies the file with `np.load` and
/// shares it with three workers.
fn start(mode: &str, file: &Path) -> Shared {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/fork.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(mode).arg(file).arg("3");
    spawn_shared(cmd)
}

/// Starts `cmd` (fork.py) and reads where its shared copy is.
fn spawn_shared(cmd: Command) -> Shared {
    let (reader, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(120)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    Shared {
        _parent: reader,
        addr: v["addr"].as_u64().unwrap(),
        len: v["len"].as_u64().unwrap(),
        pids: v["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap() as i32)
            .collect(),
    }
}

/// Frame number of each whole page of the copy, per process (0: not present).
fn frames(s: &Shared) -> BTreeMap<i32, Vec<u64>> {
    let first = s.addr.div_ceil(4096);
    let last = (s.addr + s.len) / 4096;
    s.pids
        .iter()
        .map(|&pid| {
            let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
            let mut buf = vec![0u8; ((last - first) * 8) as usize];
            f.read_exact_at(&mut buf, first * 8).unwrap();
            let pfns = buf
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .map(|e| if e >> 63 == 1 { e & ((1 << 55) - 1) } else { 0 })
                .collect();
            (pid, pfns)
        })
        .collect()
}

/// Pages whose frame is the same (and present) in every process.
fn shared_pages(f: &BTreeMap<i32, Vec<u64>>) -> usize {
    let mut it = f.values();
    let first = it.next().unwrap();
    let rest: Vec<&Vec<u64>> = it.collect();
    (0..first.len())
        .filter(|&i| first[i] != 0 && rest.iter().all(|r| r[i] == first[i]))
        .count()
}

/// Asserts that nothing of the copy was unshared (or moved) since `before`.
fn assert_unchanged(before: &BTreeMap<i32, Vec<u64>>, s: &Shared, after_what: &str) {
    let after = frames(s);
    let changed: usize = before
        .iter()
        .map(|(pid, b)| b.iter().zip(&after[pid]).filter(|(x, y)| x != y).count())
        .sum();
    assert_eq!(
        changed, 0,
        "{after_what} changed {changed} page frames of the shared copy"
    );
    assert_eq!(shared_pages(&after), before.values().next().unwrap().len());
}

fn scan_json(file: &Path, extra: &[&str]) -> serde_json::Value {
    let out = run_ok(
        Command::new(exe())
            .args(["scan", "--json", "--prove-budget", "60s"])
            .args(extra)
            .arg(file),
    );
    serde_json::from_slice(&out).unwrap()
}

/// The count of `file` in a scan: it is 2.00 (the page cache as measured, plus one
/// physical copy), and each of the four processes holds a quarter of the copy.
fn assert_counted_once(report: &serde_json::Value, file: &Path, pids: &[i32]) {
    let f = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == file.to_str())
        .unwrap_or_else(|| panic!("no entry for the file in {report}"));
    let r = &f["representations"];
    let page_cache = r["page_cache"].as_f64().unwrap();
    let copies = r["private_copies"].as_f64().unwrap();
    assert!(
        (copies - 1.0).abs() < 0.01,
        "one physical copy, counted {copies}: {r}"
    );
    assert!(
        (r["proven"].as_f64().unwrap() - (page_cache + copies)).abs() < 1e-6,
        "{r}"
    );
    let proven = f["proven_copies"].as_array().unwrap();
    assert_eq!(proven.len(), pids.len(), "{proven:?}");
    for c in proven {
        let pid = c["pid"].as_i64().unwrap() as i32;
        assert!(pids.contains(&pid));
        assert_eq!(c["shared"]["by"].as_u64(), Some(4), "{c}");
        assert_eq!(c["shared"]["shmem"].as_bool(), Some(false), "{c}");
        assert!((c["share"].as_f64().unwrap() - 0.25).abs() < 0.01, "{c}");
    }
}

/// One test at a time: each searches the whole host's candidates.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup(seed: u32) -> Option<(tempfile::TempDir, PathBuf)> {
    if !require(is_root(), "root (page frame numbers in pagemap)")
        || !require(
            python_ready(),
            "python3 with numpy (scripts/test.sh installs it)",
        )
    {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = npy(dir.path(), 32 * MIB, seed);
    Some((dir, file))
}

#[test]
fn no_command_unshares_a_copy_shared_by_fork_and_it_counts_once() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((dir, file)) = setup(11) else { return };
    let s = start("fork", &file);
    let child = s.pids[1].to_string();
    let before = frames(&s);
    assert_eq!(
        shared_pages(&before),
        before[&s.pids[0]].len(),
        "the workers share the parent's copy before twofold runs"
    );

    let report = scan_json(&file, &[]);
    assert_unchanged(&before, &s, "scan");
    assert_counted_once(&report, &file, &s.pids);
    let text = String::from_utf8(run_ok(Command::new(exe()).arg("scan").arg(&file))).unwrap();
    assert!(text.contains("shared by 4 processes (fork)"), "{text}");
    assert!(text.contains("in memory 2.00 times"), "{text}");
    assert!(
        text.contains("+ private copies 1.00 (in 1 process)"),
        "{text}"
    );
    assert!(text.contains("share one private copy"), "{text}");

    let report = scan_json(&file, &["--exact"]);
    assert_unchanged(&before, &s, "scan --exact");
    assert_counted_once(&report, &file, &s.pids);
    // One search per physical frame: the workers' copy is the parent's frames, compared
    // once (each of the 4 processes compared it whole before: 4 times the copy). Only the
    // pool is searched (other tests' processes may be candidates too).
    let mut only_pool = vec!["--exact".to_string()];
    for p in &s.pids {
        only_pool.extend(["--pid".to_string(), p.to_string()]);
    }
    let only_pool: Vec<&str> = only_pool.iter().map(String::as_str).collect();
    let report = scan_json(&file, &only_pool);
    let f = &report["files"][0];
    let compared = f["candidates"]["compared_bytes"].as_u64().unwrap();
    assert!(
        compared < 2 * s.len,
        "compared {compared} bytes for a {} byte copy",
        s.len
    );

    run_ok(
        Command::new(exe())
            .args(["dupes", "--json", "--pid", &child])
            .arg(&file),
    );
    assert_unchanged(&before, &s, "dupes --pid CHILD");

    // 20 s of top (in a terminal), serve and record at once, each checking the copies in
    // place on its own cadence.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut serve = Command::new(exe())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--interval", "1s", "--prove-budget", "30s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let store = dir.path().join("store");
    let mut record = Command::new(exe())
        .args(["record", "--interval", "1s", "--store"])
        .arg(&store)
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let tmux = Tmux::new("readonly");
    tmux.start(
        140,
        40,
        &format!("{} top --interval 1s {}", exe().display(), file.display()),
    );
    let started = Instant::now();
    let screen = tmux.wait_for("top's count of 2.00", Duration::from_secs(60), |sc| {
        sc.lines()
            .any(|l| l.contains("weights.npy") && l.contains(" 2.00"))
    });
    std::thread::sleep(Duration::from_secs(20).saturating_sub(started.elapsed()));
    // On a loaded host the first collection may take longer than the 20 s: its body is
    // waited for (503 until then).
    let fetch = || {
        let mut body = String::new();
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        use std::io::Write;
        write!(
            conn,
            "GET /metrics HTTP/1.0\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n"
        )
        .unwrap();
        conn.read_to_string(&mut body).unwrap();
        body
    };
    let mut metrics = fetch();
    let waited = std::time::Instant::now();
    while metrics.starts_with("HTTP/1.1 503") && waited.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(500));
        metrics = fetch();
    }
    tmux.keys(&["q"]);
    for p in [&mut serve, &mut record] {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        p.wait().unwrap();
    }
    drop(tmux);
    assert_unchanged(&before, &s, "20 s of top, serve and record");
    assert!(screen.contains("weights.npy"), "{screen}");
    // The exporter's count of the file: 2.00 too.
    let id = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&file).unwrap();
        format!(
            "file_id=\"{}:{}:{}\"",
            libc::major(m.dev()),
            libc::minor(m.dev()),
            m.ino()
        )
    };
    let count = metrics
        .lines()
        .filter(|l| l.starts_with("twofold_file_copies{") && l.contains(&id))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    let count = count.unwrap_or_else(|| panic!("no twofold_file_copies in:\n{metrics}"));
    assert!((count - 2.0).abs() < 0.02, "exporter count {count}");
    // The recording replays to the same count.
    let replay = run_ok(
        Command::new(exe())
            .args(["replay", "--json", "--store"])
            .arg(&store),
    );
    let replay: serde_json::Value = serde_json::from_slice(&replay).unwrap();
    assert_counted_once(&replay, &file, &s.pids);
}

#[test]
fn a_multiprocessing_fork_pool_shares_one_copy() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_dir, file)) = setup(12) else {
        return;
    };
    let s = start("pool", &file);
    let before = frames(&s);
    assert_eq!(shared_pages(&before), before[&s.pids[0]].len());
    let report = scan_json(&file, &[]);
    assert_unchanged(&before, &s, "scan");
    assert_counted_once(&report, &file, &s.pids);
}

/// A copy in /dev/shm mapped by one process and a memfd copy mapped by another: both are
/// copies of the original (3.00), and the /dev/shm file is shown as a copy of it.
#[test]
fn copies_in_shared_memory_count_as_copies_of_the_original() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let shm = Path::new("/dev/shm");
    if !require(shm.is_dir(), "/dev/shm (tmpfs)")
        || !require(python_ready(), "python3 (scripts/test.sh installs it)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 8 * MIB, Fill::Random(21)),
            ("b", 8 * MIB, Fill::Random(22)),
        ],
    );
    // A /dev/shm copy of our own (removed on drop), mapped by a reader.
    let shm_dir = tempfile::tempdir_in(shm).unwrap();
    let copy = shm_dir.path().join("m.safetensors");
    std::fs::copy(&file, &copy).unwrap();
    let mapper = reader("map", Some(&copy), &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/memfd.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(&file);
    let (memfd, _) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(60)).unwrap();
    let memfd_pid = memfd.pid() as i64;
    let copy_s = copy.to_str().unwrap();
    // Named alone, with the copy's path, or not at all: the original is 3.00 each time,
    // and neither copy has an entry of its own.
    for args in [
        vec![file.as_os_str()],
        vec![file.as_os_str(), copy.as_os_str()],
        vec![],
    ] {
        let out = run_ok(
            Command::new(exe())
                .args(["scan", "--json", "--prove-budget", "60s"])
                .args(&args),
        );
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let files = report["files"].as_array().unwrap();
        let original = files
            .iter()
            .find(|f| f["path"].as_str() == file.to_str())
            .unwrap_or_else(|| panic!("{args:?}: the original is listed"));
        let r = &original["representations"];
        let page_cache = r["page_cache"].as_f64().unwrap();
        let copies = r["private_copies"].as_f64().unwrap();
        assert!(
            (copies - 2.0).abs() < 0.01,
            "{args:?}: the /dev/shm and the memfd copy: {r}"
        );
        assert!(
            (r["proven"].as_f64().unwrap() - (page_cache + copies)).abs() < 1e-6,
            "{r}"
        );
        assert!((page_cache - 1.0).abs() < 0.01, "{args:?}: {r}");
        assert_eq!(r["lower_bound"].as_bool(), Some(false), "{args:?}: {r}");
        let pids: Vec<i64> = original["proven_copies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                assert_eq!(c["how"].as_str(), Some("shared_memory"), "{c}");
                c["pid"].as_i64().unwrap()
            })
            .collect();
        assert!(pids.contains(&memfd_pid), "{args:?}: {pids:?}");
        // No entry of its own for either copy: no file but the original is mapped or
        // held by the /dev/shm mapper or the memfd holder.
        let ours = [i64::from(mapper.pid()), memfd_pid];
        for f in files.iter().filter(|f| f["path"].as_str() != file.to_str()) {
            let path = f["path"].as_str().unwrap();
            let by: Vec<i64> = ["mappers", "holders"]
                .iter()
                .flat_map(|k| f[*k].as_array().into_iter().flatten())
                .filter_map(|m| m["pid"].as_i64())
                .collect();
            assert!(
                path != copy_s && !by.iter().any(|p| ours.contains(p)),
                "{args:?}: a copy listed as a model of its own: {path}"
            );
        }
        // Where they live, under the original, when they are files of the report.
        let places: Vec<&str> = original["shmem_places"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["path"].as_str()).collect())
            .unwrap_or_default();
        if args.len() == 2 {
            assert_eq!(places, vec![copy_s], "{args:?}");
        }
        if args.is_empty() {
            // The memfd (16 MiB, no model extension) is no file of interest of a bare scan:
            // its copy is the memfd holder's row above.
            assert!(places.contains(&copy_s), "{args:?}: {places:?}");
        }
    }
    let text = String::from_utf8(run_ok(
        Command::new(exe()).arg("scan").arg(&file).arg(&copy),
    ))
    .unwrap();
    assert!(
        text.contains(&format!("copy in shared memory: {}", copy.display())),
        "{text}"
    );
    assert!(text.contains("in memory 3.00 times"), "{text}");
}

/// Without page frame numbers (not root: a user scanning their own workers), the shared
/// copy is weighed from the exclusive-mapping bit and Pss/Rss: about one copy, marked as
/// an estimate, and still nothing is unshared.
#[test]
fn without_frame_numbers_the_share_is_estimated() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require(
        python_ready(),
        "python3 with numpy (scripts/test.sh installs it)",
    ) {
        return;
    }
    let Some((dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let file = npy(dir.path(), 32 * MIB, 13);
    let script = dir.path().join("fork.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/fork.py"),
        &script,
    )
    .unwrap();
    for p in [&file, &script] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let python = String::from_utf8(run_ok(
        Command::new("python3").args(["-c", "import sys; print(sys.executable)"]),
    ))
    .unwrap();
    let as_nobody = |prog: &str| {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            prog,
        ]);
        c
    };
    // An interpreter nobody can run (a pyenv under a private /root) is started as root and
    // becomes nobody before it reads the file (fork.py's FORK_PY_RUN_AS).
    let reachable = as_nobody(python.trim())
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = if reachable {
        as_nobody(python.trim())
    } else {
        let mut c = Command::new(python.trim());
        c.env("FORK_PY_RUN_AS", "65534");
        c
    };
    cmd.arg(&script).arg("fork").arg(&file).arg("3");
    let s = spawn_shared(cmd);
    let before = frames(&s);
    let out = run_ok(
        as_nobody(bin.to_str().unwrap())
            .args(["scan", "--json", "--prove-budget", "60s"])
            .arg(&file),
    );
    assert_unchanged(&before, &s, "scan as nobody");
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let f = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == file.to_str())
        .unwrap();
    let copies = f["representations"]["private_copies"].as_f64().unwrap();
    assert!(
        (copies - 1.0).abs() < 0.1,
        "one physical copy, estimated {copies}: {}",
        f["representations"]
    );
    for c in f["proven_copies"].as_array().unwrap() {
        assert_eq!(c["shared"]["estimated"].as_bool(), Some(true), "{c}");
        assert_eq!(c["shared"]["by"].as_u64(), Some(4), "{c}");
    }
}

/// The proof reads the model file to compare it with memory, and must not bring back the
/// pages that were evicted: `preadv2(RWF_NOWAIT)` of an uncached page starts readahead
/// before it fails. A file half evicted (every other 4 MiB) stays half evicted through
/// `scan` and `scan --exact`, while the copy in the reader's heap is still proven whole.
#[test]
fn the_proof_leaves_the_page_cache_of_the_file_as_it_found_it() {
    let _group = crate::common::group(module_path!());
    if !require(have("fincore"), "util-linux fincore")
        || !require(is_root(), "root (to search the copying reader's memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "half.safetensors", 64 * MIB);
    let copy = reader("copy", Some(&file), &["--close"]);
    let f = std::fs::File::open(&file).unwrap();
    f.sync_all().unwrap();
    let evict = |off: u64, len: u64| {
        // SAFETY: advice on the test's own descriptor of its own file.
        let rc = unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                off as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0);
    };
    for i in (0..16u64).filter(|i| i % 2 == 1) {
        evict(i * 4 * MIB, 4 * MIB);
    }
    let before = fincore_pages(&file);
    let pages = 64 * MIB / 4096;
    assert!(
        before < pages * 3 / 4,
        "the eviction did not take: {before} of {pages} pages resident"
    );
    for extra in [&[][..], &["--exact"][..]] {
        let report = scan_json(&file, extra);
        let after = fincore_pages(&file);
        assert!(
            after <= before,
            "scan {extra:?} brought {} pages of the file back into the page cache",
            after - before
        );
        let f = report["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| Path::new(f["path"].as_str().unwrap()) == file)
            .unwrap();
        let copies = f["representations"]["private_copies"].as_f64().unwrap();
        assert!(
            copies > 0.999,
            "scan {extra:?}: the copy was not proven: {f}"
        );
        assert_eq!(f["representations"]["lower_bound"], false, "{f}");
        let _ = copy.pid();
    }
}
