//! Where copies lie (issue #39): anonymous shared memory is no model file; a copy in huge
//! pages of the hugetlbfs pool counts and is named so; copies KSM merged count once and
//! are said to be merged, not forked. The memory is made by a small Python helper
//! (`mmap` flags and `madvise` that the reader child has no mode for); each setting the
//! tests raise (`vm.nr_hugepages`, `/sys/kernel/mm/ksm/*`) is put back by a guard.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use twofold::model::{FileModel, Report};
use twofold::spawn::Reader;

/// `python3 -c HELPER MODE [FILE]`: `shared` fills 64 MiB of `MAP_SHARED|MAP_ANONYMOUS`
/// memory with non-zero bytes; `sharedcopy FILE` reads FILE into such memory; `hugetlb
/// FILE` reads it into `MAP_HUGETLB` memory;
/// `ksm FILE` reads it into private memory marked `MADV_MERGEABLE`. The file is closed
/// once read; `ready` is printed, then it waits for stdin to close.
const HELPER: &str = r#"
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
mode = sys.argv[1]
if mode == "shared":
    n = 64 << 20
    m = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    block = bytes((i * 7 + 1) % 251 + 1 for i in range(1 << 20))
    for _ in range(n >> 20):
        m.write(block)
else:
    path = sys.argv[2]
    n = os.path.getsize(path)
    if mode == "hugetlb":
        huge = 2 << 20
        m = mmap.mmap(-1, (n + huge - 1) // huge * huge,
                      flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
    elif mode == "sharedcopy":
        m = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    else:
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = (ctypes.c_char * n).from_buffer(m)
        if libc.madvise(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(n), 12):
            raise OSError(ctypes.get_errno(), "madvise(MADV_MERGEABLE)")
    with open(path, "rb", buffering=0) as f:
        mv = memoryview(m)
        got = 0
        while got < n:
            k = f.readinto(mv[got:n])
            if not k:
                break
            got += k
        mv.release()
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.read()
"#;

fn helper(mode: &str, file: Option<&Path>) -> Reader {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(HELPER).arg(mode);
    if let Some(f) = file {
        cmd.arg(f);
    }
    let (r, line) = Reader::spawn(cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(line.trim(), "ready");
    r
}

fn twofold(args: &[&str]) -> String {
    let out = Command::new(exe()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The scans are given time: the host may be busy (other test binaries, few cores), and
/// a search cut short makes the count a lower bound.
const BUDGET: [&str; 2] = ["--prove-budget", "300s"];

fn scan_json(args: &[&str]) -> Report {
    let mut all = vec!["scan", "--json", BUDGET[0], BUDGET[1]];
    all.extend(args);
    serde_json::from_str(&twofold(&all)).unwrap()
}

/// The tests of this file one at a time: each one's copier is a candidate of the others'
/// files, and one that exits while another scans makes that count a lower bound.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `value` to each sysctl file and puts the old values back (in reverse order)
/// when dropped.
struct Settings(Vec<(PathBuf, String)>);

impl Settings {
    fn new() -> Settings {
        Settings(Vec::new())
    }

    fn set(&mut self, path: &str, value: &str) -> std::io::Result<()> {
        let old = std::fs::read_to_string(path)?;
        std::fs::write(path, value)?;
        self.0.push((PathBuf::from(path), old.trim().to_string()));
        Ok(())
    }
}

impl Drop for Settings {
    fn drop(&mut self) {
        for (path, old) in self.0.iter().rev() {
            if let Err(e) = std::fs::write(path, old) {
                eprintln!("cannot restore '{}' to '{old}': {e}", path.display());
            }
        }
    }
}

fn sys_u64(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn the_file<'a>(r: &'a Report, path: &Path) -> &'a FileModel {
    let path = path.to_str().unwrap();
    r.files.iter().find(|f| f.path == path).unwrap()
}

#[test]
fn anonymous_shared_memory_is_no_model_file() {
    let _group = crate::common::group(module_path!());
    let _one = one_at_a_time();
    if !require(have("python3"), "python3 (to map shared anonymous memory)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bystander = helper("shared", None);
    let pid = bystander.pid().to_string();
    // Ground truth: the kernel names it like a deleted file, with an inode.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("/dev/zero (deleted)"), "{maps}");
    assert!(status_bytes(bystander.pid(), "RssShmem") >= 64 * MIB);

    let r = scan_json(&["--pid", &pid]);
    assert!(r.processes.iter().any(|p| p.pid == bystander.pid()));
    assert!(
        r.files.iter().all(|f| !f.path.contains("/dev/zero")),
        "{:?}",
        r.files.iter().map(|f| &f.path).collect::<Vec<_>>()
    );
    assert!(r.findings.iter().all(|f| f.code != "replaced-file-held"));
    let text = twofold(&["scan", "--pid", &pid]);
    assert!(!text.contains("/dev/zero"), "{text}");
    assert!(!text.contains("replaced or deleted"), "{text}");
    // A recording and its dump.
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    twofold(&["scan", "--pid", &pid, "--no-prove", "--record", s]);
    // No file row of its shared memory (the rows there are the host's files of interest
    // it could hold a copy of: `scan --pid` searches it for them), and its process row.
    let out = Command::new(exe())
        .args(["dump", "--store", s, "--from", "1h ago", "--what", "files"])
        .output()
        .unwrap();
    let dumped = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!dumped.contains("/dev/zero"), "{dumped}");
    let procs = twofold(&[
        "dump",
        "--store",
        s,
        "--from",
        "1h ago",
        "--what",
        "processes",
    ]);
    assert!(procs.contains(&format!("\"pid\":{pid}")), "{procs}");
    // The exporter: no series of it, after a collection that saw the bystander.
    let zero = maps
        .lines()
        .find(|l| l.ends_with("/dev/zero (deleted)"))
        .unwrap();
    let f: Vec<&str> = zero.split_whitespace().collect();
    let (dev, inode) = (f[3], f[4]);
    let (major, minor) = dev.split_once(':').unwrap();
    let id = format!(
        "{}:{}:{inode}",
        u32::from_str_radix(major, 16).unwrap(),
        u32::from_str_radix(minor, 16).unwrap()
    );
    let port = free_port();
    let serve = Command::new(exe())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--interval", "1s", "--no-prove"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _serve = Killed(serve);
    let start = Instant::now();
    let collected = |b: &str| {
        b.lines()
            .find_map(|l| l.strip_prefix("twofold_collect_duration_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|n| n >= 1.0)
    };
    let body = loop {
        match metrics_text(port) {
            Some(b) if collected(&b) => break b,
            _ => {
                assert!(start.elapsed() < Duration::from_secs(120), "no collection");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert!(!body.contains("/dev/zero"), "{body}");
    assert!(!body.contains(&format!("file_id=\"{id}\"")), "{id}: {body}");
}

/// A child killed and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A copy read into `MAP_SHARED|MAP_ANONYMOUS` memory is a copy of the model file, in
/// shared memory; the memory it lies in is no file.
#[test]
fn a_copy_in_anonymous_shared_memory_is_a_copy_of_the_model() {
    let _group = crate::common::group(module_path!());
    let _one = one_at_a_time();
    if !require(is_root(), "root (to search the copier's memory)")
        || !require(have("python3"), "python3 (to map shared anonymous memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let copier = helper("sharedcopy", Some(&file));
    // Ground truth: the copy is shared memory, not RssAnon.
    assert!(status_bytes(copier.pid(), "RssShmem") >= size);
    let f = file.to_str().unwrap();
    let r = scan_json(&[f]);
    let paths: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, [f]);
    let m = the_file(&r, &file);
    let rep = &m.representations;
    assert!((rep.proven.unwrap() - 2.0).abs() < 0.01, "{rep:?}");
    let c = m
        .proven_copies
        .iter()
        .find(|c| c.pid == copier.pid())
        .unwrap();
    assert_eq!(c.how, twofold::model::CopyHow::SharedMemory, "{c:?}");
    assert!(m.shmem_copy_of.is_none());
    let text = twofold(&["scan", f, BUDGET[0], BUDGET[1]]);
    assert!(
        text.contains("copy in shared memory, 100% of the file"),
        "{text}"
    );
    assert!(!text.contains("/dev/zero"), "{text}");
}

#[test]
fn a_copy_in_huge_pages_counts_and_is_named() {
    let _group = crate::common::group(module_path!());
    let _one = one_at_a_time();
    if !require(is_root(), "root (to reserve huge pages and search memory)")
        || !require(have("python3"), "python3 (to map huge pages)")
    {
        return;
    }
    let size = 64 * MIB;
    let pages = size / (2 * MIB);
    let mut settings = Settings::new();
    let total = "/proc/sys/vm/nr_hugepages";
    let free = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
    let want = sys_u64(total) + pages + 4;
    settings.set(total, &want.to_string()).unwrap();
    if !require(
        sys_u64(free) >= pages,
        "32 free 2 MiB huge pages (memory too fragmented)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", size);
    let copier = helper("hugetlb", Some(&file));
    // Ground truth: the copy is in huge pages, not in RssAnon; the file is not held.
    let huge = status_bytes(copier.pid(), "HugetlbPages");
    assert_eq!(huge, size);
    assert!(status_bytes(copier.pid(), "RssAnon") < size / 8);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", copier.pid())).unwrap();
    assert!(fds
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .all(|l| l != file));

    let f = file.to_str().unwrap();
    let r = scan_json(&[f]);
    let m = the_file(&r, &file);
    let rep = &m.representations;
    let proven = rep.proven.unwrap();
    assert!((rep.page_cache.unwrap() - 1.0).abs() < 1e-9, "{rep:?}");
    assert!((proven - 2.0).abs() < 0.01, "count {proven}: {rep:?}");
    assert!(!rep.lower_bound, "{rep:?}");
    let c = m
        .proven_copies
        .iter()
        .find(|c| c.pid == copier.pid())
        .unwrap();
    assert!(c.huge_pages, "{c:?}");
    assert!((c.fraction - 1.0).abs() < 0.01, "{c:?}");
    let text = twofold(&["scan", f, BUDGET[0], BUDGET[1]]);
    // (The page cache part was checked to 0.01 above; the host may evict some of it
    // between the two scans, as it did once beside another build's serve: 0.94.)
    assert!(text.contains("+ private copies 1.00"), "{text}");
    assert!(text.contains("huge pages (hugetlbfs)"), "{text}");
    // `dupes` names the region for what it is.
    let d = dupes_report(copier.pid(), &file, &[]);
    let regions = &d.processes[0].files[0].regions;
    assert!(!regions.is_empty());
    assert!(
        regions
            .iter()
            .all(|r| r.kind == twofold::model::dupes::RegionKind::Hugetlb),
        "{regions:?}"
    );
    drop(copier);
}

#[test]
fn copies_merged_by_ksm_count_once_and_are_not_fork() {
    let _group = crate::common::group(module_path!());
    let _one = one_at_a_time();
    let ksm = "/sys/kernel/mm/ksm";
    if !require(is_root(), "root (to run KSM and read page flags)")
        || !require(have("python3"), "python3 (to mark memory mergeable)")
        || !require(Path::new(ksm).is_dir(), "KSM (/sys/kernel/mm/ksm)")
    {
        return;
    }
    let size = 32 * MIB;
    let pages = size / 4096;
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", size);
    let f = file.to_str().unwrap();
    let a = helper("ksm", Some(&file));
    let b = helper("ksm", Some(&file));
    // Before merging: two copies of their own.
    let before = scan_json(&[f]);
    let rep = &the_file(&before, &file).representations;
    assert!((rep.proven.unwrap() - 3.0).abs() < 0.01, "{rep:?}");

    let mut settings = Settings::new();
    settings
        .set(&format!("{ksm}/sleep_millisecs"), "1")
        .unwrap();
    settings
        .set(&format!("{ksm}/pages_to_scan"), "10000")
        .unwrap();
    settings.set(&format!("{ksm}/run"), "1").unwrap();
    // Ground truth: the kernel's count of each process's merged pages.
    let merged = |pid: i32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/ksm_merging_pages"))
            .map_or(0, |t| t.trim().parse().unwrap_or(0))
    };
    let start = Instant::now();
    while merged(a.pid()) < pages || merged(b.pid()) < pages {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "KSM merged {} and {} of {pages} pages",
            merged(a.pid()),
            merged(b.pid())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Stopped (merged pages stay merged) so that nothing moves while it is counted.
    drop(settings);

    // The two merged copies count once; the page cache as `fincore` reads it around the
    // scan (a full suite's run once saw 1 MiB of it reclaimed while KSM ran).
    let cached_before = fincore_pages(&file) as f64 / pages as f64;
    let after = scan_json(&[f]);
    let cached_after = fincore_pages(&file) as f64 / pages as f64;
    let m = the_file(&after, &file);
    let rep = &m.representations;
    assert!((rep.private_copies - 1.0).abs() < 0.01, "{rep:?}");
    let cache = rep.page_cache.unwrap();
    assert!(
        cache >= cached_before.min(cached_after) - 0.01
            && cache <= cached_before.max(cached_after) + 0.01,
        "{rep:?}: fincore {cached_before} and {cached_after}"
    );
    assert!((rep.proven.unwrap() - cache - 1.0).abs() < 0.01, "{rep:?}");
    for pid in [a.pid(), b.pid()] {
        let c = m.proven_copies.iter().find(|c| c.pid == pid).unwrap();
        let s = c.shared.as_ref().unwrap();
        assert!(s.ksm && !s.shmem && s.by == 2, "{c:?}");
        assert!((c.share - 0.5).abs() < 0.01, "{c:?}");
    }
    let shared: Vec<&twofold::model::Finding> = after
        .findings
        .iter()
        .filter(|x| x.code == "shared-private-copy")
        .collect();
    assert_eq!(shared.len(), 1, "{:?}", after.findings);
    let t = shared[0].text();
    assert!(
        t.message.contains("KSM") && !t.message.contains("fork"),
        "{t:?}"
    );
    assert!(t.remedy.unwrap().contains("KSM"));
    let text = twofold(&["scan", f, BUDGET[0], BUDGET[1]]);
    assert!(text.contains("merged by KSM"), "{text}");
    assert!(!text.contains("(fork"), "{text}");
    assert!(!text.contains("before forking"), "{text}");
    // Without CAP_SYS_ADMIN there are no frame numbers: smaps' `Pss` and `KSM:` tell it,
    // as an estimate.
    if !require(have("capsh"), "capsh (to drop CAP_SYS_ADMIN)") {
        return;
    }
    let scan = format!(
        "'{}' scan --json {} {} '{f}'",
        exe().display(),
        BUDGET[0],
        BUDGET[1]
    );
    let out = run_ok(Command::new("capsh").args(["--drop=cap_sys_admin", "--", "-c", &scan]));
    let r: Report = serde_json::from_slice(&out).unwrap();
    let m = the_file(&r, &file);
    let private = m.representations.private_copies;
    assert!((private - 1.0).abs() < 0.02, "{:?}", m.representations);
    for pid in [a.pid(), b.pid()] {
        let c = m.proven_copies.iter().find(|c| c.pid == pid).unwrap();
        let s = c.shared.as_ref().unwrap();
        assert!(s.ksm && s.estimated && !s.shmem, "{c:?}");
    }
}
