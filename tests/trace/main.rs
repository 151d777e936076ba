//! eBPF tracing, live: real programs attached to real tracepoints, counting work the
//! tests create themselves (children that wait for a go, files they evict and read back,
//! memory cgroups they fill), checked exactly against the kernel's own accounting
//! (`/proc/PID/stat`, `mincore`, cgroup OOM counters) and against bpftrace counting the
//! same tracepoints. Needs root; in CI (`CI` set) nothing here may skip.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod device_copies;
mod engine;
mod host_ledger;
mod loaders;
mod serve_trace;
mod sparse;
mod tasks;
mod uploads;

/// The tests here count events exactly, or disturb the whole host (OOM, direct reclaim,
/// LRU churn): they run one at a time, never beside each other.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
mod support;

/// twofold itself, built for these tests.
pub(crate) fn twofold_cmd() -> Command {
    Command::new(exe())
}

use std::process::Command;

use crate::common::*;
use support::*;
use twofold::sample::trace::Counter;

#[test]
fn anonymous_write_faults_match_proc_stat_exactly() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let n: u64 = 4096; // pages: 16 MiB
    let mut tracer = attach(&[], &[]);
    let mut child = Armed::start("anon", None, &["--bytes", &(n * 4096).to_string()]);
    let pid = child.pid();
    tracer.pin_pids(&[pid]).unwrap();
    // The child is stopped at both ends of the window: having said `armed` or `ready`
    // does not mean it is done faulting (it still returns to its blocking read).
    child.stop();
    let (b1, s1) = (tracer.sample(), proc_faults(pid));
    child.resume();
    assert_eq!(child.go(), "ready");
    child.stop();
    let (b2, s2) = (tracer.sample(), proc_faults(pid));
    let bpf = faults(&b2, pid) - faults(&b1, pid);
    assert_eq!(
        bpf,
        s2 - s1,
        "BPF faults vs /proc/{pid}/stat over the window"
    );
    // Since fork (the programs were attached before the child existed), /proc also
    // counts the faults exec takes through get_user_pages (copying argv and the
    // environment to the new stack), which no tracepoint reports.
    let since_fork = faults(&b2, pid);
    assert!(
        since_fork <= s2 && s2 - since_fork < 16,
        "since fork: BPF {since_fork}, /proc {s2}"
    );
    // N write faults on not-present pages, plus the few of the code that does it.
    let c2 = b2.pids[&pid];
    let c1 = b1.pids.get(&pid).copied().unwrap_or_default();
    let writes = c2.faults_by_code[2] - c1.faults_by_code[2];
    assert!(writes >= n, "{writes} write faults for {n} pages");
    assert!(bpf - n < 64, "{bpf} faults for {n} pages: too many extra");
    eprintln!(
        "faults: {bpf} in the window ({n} pages written), /proc says {}",
        s2 - s1
    );
}

/// One run of the eviction test's first part: a file of `size` fully cached, the tracer
/// attached, the file evicted and read() back, evicted again and readv() back, each step
/// checked against the ground truth. `None` when the tracer saw pages of the file evicted
/// that the test did not evict (reclaim elsewhere on the host): its exact counts cannot
/// hold then.
fn read_back(
    size: u64,
) -> Option<(
    tempfile::TempDir,
    std::path::PathBuf,
    twofold::sample::FileKey,
    twofold::collect::bpf::Tracer,
)> {
    let n = pages(size);
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", size);
    let k = key(&file);
    // Fully cached now, whatever DAMON or reclaim (other work on the host) did meanwhile.
    for _ in 0..10 {
        if resident_pages(&file) == n {
            break;
        }
        read_all(&file);
    }
    assert_eq!(resident_pages(&file), n);
    let tracer = attach(&[], &[k]);
    let me = std::process::id() as i32;

    let s0 = tracer.sample();
    evict(&file);
    let s1 = tracer.sample();
    assert_eq!(
        resident_pages(&file),
        0,
        "ground truth: all of it left the cache"
    );
    let f1 = s1.files[&k];
    let evicted0 = s0.files.get(&k).map_or(0, |f| f.evicted_pages);
    if f1.evicted_pages - evicted0 > n {
        return None;
    }
    assert_eq!(f1.evicted_pages - evicted0, n);
    assert_eq!(f1.added_pages, 0);

    // read() it back: every page added again, and each is a refault.
    assert_eq!(read_all(&file), size);
    let s2 = tracer.sample();
    // Ground truth: all of it is cached again; a page reclaim took since is counted by
    // the tracer, and the run is made again.
    let resident = resident_pages(&file);
    let reclaimed = tracer.sample().files[&k].evicted_pages - f1.evicted_pages;
    if reclaimed > 0 {
        return None;
    }
    assert_eq!(resident, n, "resident after the read");
    let f2 = s2.files[&k];
    assert_eq!(f2.added_pages, n, "added pages");
    assert_eq!(f2.refault_pages, n, "refaulted pages");
    assert_eq!(s2.io[&(me, k)].read_bytes, size, "read() bytes");

    // readv() it again after another eviction: N more of each.
    evict(&file);
    let got = readv_all(&file);
    assert_eq!(got, size);
    let f3 = tracer.sample().files[&k];
    if f3.evicted_pages > 2 * n || resident_pages(&file) != n {
        return None;
    }
    Some((dir, file, k, tracer))
}

#[test]
fn eviction_read_back_and_refaults_are_exact() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let size = 24 * MIB;
    let n = pages(size);
    let me = std::process::id() as i32;
    // Reclaim by other work on the host (DAMON, memory pressure) can take a page while it
    // is read back, and readahead bring it again: the exact counts below hold only where
    // nothing but the test moved the file's pages, which the tracer itself tells (its
    // evictions beyond the test's own). A run so disturbed is run again, said so.
    let (_dir, file, k, tracer) = (0..5)
        .find_map(|attempt| {
            let r = read_back(size);
            if r.is_none() {
                eprintln!("run {attempt}: reclaim elsewhere took pages of the file; again");
            }
            r
        })
        .expect("reclaim elsewhere took pages of the file in 5 runs out of 5");
    let s3 = tracer.sample();
    let f3 = s3.files[&k];
    assert_eq!(f3.evicted_pages, 2 * n);
    assert_eq!(f3.added_pages, 2 * n);
    assert_eq!(f3.refault_pages, 2 * n);
    assert_eq!(
        s3.io[&(me, k)].read_bytes,
        2 * size,
        "read() + readv() bytes"
    );

    // A child that pread64()s it into its heap, and one that maps it.
    let mut copy = Armed::start("copy", Some(&file), &[]);
    let mut map = Armed::start("map", Some(&file), &[]);
    // Both children are stopped whenever the counters are read: a child that has said
    // `armed` or `ready` may still fault on its way to its blocking read, and a fault
    // between the BPF sample and the read of /proc would be counted by one side only.
    copy.stop();
    map.stop();
    let (pre, p_copy, p_map) = (
        tracer.sample(),
        proc_faults(copy.pid()),
        proc_faults(map.pid()),
    );
    copy.resume();
    map.resume();
    assert_eq!(copy.go(), "ready");
    assert_eq!(map.go(), "ready");
    copy.stop();
    map.stop();
    // The BPF counters are final (both children stopped); /proc is read after them.
    let s4 = tracer.sample();
    // Faults over the window equal /proc's (user mode and kernel mode together).
    for (pid, before) in [(copy.pid(), p_copy), (map.pid(), p_map)] {
        assert_eq!(
            faults(&s4, pid) - faults(&pre, pid),
            proc_faults(pid) - before,
            "faults of pid {pid} vs /proc"
        );
    }
    let io = &s4.io[&(copy.pid(), k)];
    assert_eq!(io.read_bytes, size, "pread64() bytes of the copying child");
    assert_eq!(io.comm, "twofold");
    let io = &s4.io[&(map.pid(), k)];
    assert_eq!(
        (io.mmap_shared, io.mmap_private, io.mmap_bytes),
        (1, 0, size)
    );
    assert_eq!(io.read_bytes, 0);
    let fm = s4.files[&k];
    assert!(fm.file_faults + fm.fault_around_events > 0);
    assert!(fm.fault_around_pages > 0);
    assert_eq!(s4.lost_updates, 0);
}

#[test]
fn pinned_file_survives_lru_churn() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 8 * MIB;
    let n = pages(size);
    let file = model_file(dir.path(), "pinned.safetensors", size);
    let k = key(&file);
    read_all(&file);
    let tracer = attach(&[], &[k]);
    evict(&file);
    // Churn: more files than the LRU maps hold are cached and evicted (adds, deletes
    // and remembered evictions of 36864 other inodes).
    let churn = dir.path().join("churn");
    std::fs::create_dir(&churn).unwrap();
    let block = vec![7u8; 4096];
    for i in 0..36_864 {
        let p = churn.join(i.to_string());
        std::fs::write(&p, &block).unwrap();
        evict(&p);
    }
    let s = tracer.sample();
    assert!(
        s.files.len() < 36_864,
        "the LRU maps are bounded ({} files)",
        s.files.len()
    );
    assert_eq!(read_all(&file), size);
    let s = tracer.sample();
    let f = s.files[&k];
    assert_eq!(
        (f.evicted_pages, f.added_pages, f.refault_pages),
        (n, n, n),
        "counters and remembered evictions of the pinned file survived the churn"
    );
    assert_eq!(s.lost_updates, 0);
}

#[test]
fn direct_reclaim_in_a_small_cgroup_agrees_with_bpftrace() {
    let _serial = serial();
    if !bpf_ready() || !require(have("bpftrace"), "bpftrace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 96 * MIB;
    let file = model_file(dir.path(), "big.bin", size);
    evict(&file);
    let cg = TestCgroup::new("reclaim", 32 * MIB);
    let mut tracer = attach(&[], &[]);
    let mut child = Armed::start("map", Some(&file), &[]);
    child.join(&cg);
    tracer.pin_pids(&[child.pid()]).unwrap();
    let bt = Bpftrace::start(&format!(
        "tracepoint:vmscan:mm_vmscan_memcg_reclaim_end /pid == {pid}/ {{ @reclaims = count(); @pages = sum(args->nr_reclaimed); }}\n\
         tracepoint:vmscan:mm_vmscan_direct_reclaim_end /pid == {pid}/ {{ @direct = count(); }}",
        pid = child.pid()
    ));
    // Mapping 96 MiB of page cache in a 32 MiB cgroup: the child reclaims its own
    // pages as it faults them in (no OOM: clean file pages are reclaimable).
    assert_eq!(child.go(), "ready");
    let s = tracer.sample();
    let got = bt.stop();
    let c = s.pids[&child.pid()];
    assert!(c.memcg_reclaims > 0, "no memcg reclaim seen: {c:?}");
    assert!(c.reclaim_ns > 0 && c.reclaim_max_ns > 0);
    assert_eq!(c.memcg_reclaims, got.get("reclaims").copied().unwrap_or(0));
    assert_eq!(c.direct_reclaims, got.get("direct").copied().unwrap_or(0));
    assert_eq!(c.reclaimed_pages, got.get("pages").copied().unwrap_or(0));
    let hist: u64 = c.reclaim_hist_us_log2.iter().sum();
    assert_eq!(hist, c.memcg_reclaims + c.direct_reclaims);
}

#[test]
fn oom_kill_is_reported_with_the_victims_pid() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let cg = TestCgroup::new("oom", 32 * MIB);
    let tracer = attach(&[], &[]);
    // No swap here: 96 MiB of anonymous memory cannot fit in 32 MiB.
    let mut child = Armed::start("anon", None, &["--bytes", "96M"]);
    child.join(&cg);
    let pid = child.pid();
    assert_eq!(child.go(), "", "the child should have died");
    assert_eq!(child.wait_killed(), Some(libc::SIGKILL));
    let s = tracer.sample();
    let kill = s
        .oom_kills
        .iter()
        .find(|k| k.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not among {:?}", s.oom_kills));
    assert_eq!(kill.comm, "twofold");
    assert!(kill.anon_rss_bytes > 16 * MIB, "{kill:?}");
    assert!(kill.at_secs > 0.0);
    assert_eq!(cg.oom_kills(), 1, "ground truth: the cgroup's own counter");
    // It reclaimed before it was killed.
    assert!(s.pids[&pid].memcg_reclaims > 0);
}

#[test]
fn counts_agree_with_bpftrace_on_the_same_tracepoints() {
    let _serial = serial();
    if !bpf_ready() || !require(have("bpftrace"), "bpftrace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 32 * MIB;
    let file = model_file(dir.path(), "m.bin", size);
    let k = key(&file);
    evict(&file);
    let tracer = attach(&[], &[k]);
    let mut child = Armed::start("copy", Some(&file), &["--bytes", "8M"]);
    let pid = child.pid();
    let bt = Bpftrace::start(&format!(
        "tracepoint:exceptions:page_fault_user /pid == {pid}/ {{ @faults = count(); }}\n\
         tracepoint:exceptions:page_fault_kernel /pid == {pid} && args->address <= 0x00ffffffffffffff/ {{ @faults = count(); }}\n\
         tracepoint:filemap:mm_filemap_add_to_page_cache /args->i_ino == {ino}/ {{ @added = sum(1 << args->order); }}\n\
         tracepoint:filemap:mm_filemap_delete_from_page_cache /args->i_ino == {ino}/ {{ @evicted = sum(1 << args->order); }}\n\
         tracepoint:syscalls:sys_exit_pread64 /pid == {pid} && args->ret > 0/ {{ @pread = sum(args->ret); }}",
        ino = k.inode
    ));
    let b1 = tracer.sample();
    assert_eq!(child.go(), "ready");
    // The child takes one more fault just after `ready` (going back to wait on stdin): let
    // it land inside both windows, which otherwise close at different instants and
    // disagreed by that one fault in about half the runs.
    std::thread::sleep(std::time::Duration::from_millis(300));
    evict(&file);
    let got = bt.stop();
    let b2 = tracer.sample();
    let (f1, f2) = (b1.files.get(&k).copied().unwrap_or_default(), b2.files[&k]);
    assert_eq!(faults(&b2, pid) - faults(&b1, pid), got["faults"], "faults");
    assert_eq!(f2.added_pages - f1.added_pages, got["added"], "added pages");
    assert_eq!(
        f2.evicted_pages - f1.evicted_pages,
        got["evicted"],
        "evicted pages"
    );
    assert_eq!(got["added"], pages(size));
    assert_eq!(b2.io[&(pid, k)].read_bytes, got["pread"], "pread64 bytes");
    assert_eq!(got["pread"], size);
    eprintln!("bpftrace and twofold agree: {got:?}");
}

/// The committed objects are what `ebpf/build.sh` makes of the committed sources, and
/// freshly built ones load and attach.
#[test]
fn committed_bpf_objects_match_their_sources_and_rebuilt_ones_load() {
    let _serial = serial();
    if !bpf_ready() || !require(have("clang"), "clang (to rebuild the BPF objects)") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(root.join("ebpf/objects.lock")).unwrap();
    let field = |name: &str| {
        lock.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    let sh = |cmd: &str| {
        let o = Command::new("sh")
            .args(["-c", cmd])
            .current_dir(root.join("ebpf"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let sources =
        sh("cat build.sh twofold.h kernel.h common.h uargs.h *.bpf.c | sha256sum | cut -d' ' -f1");
    assert_eq!(
        sources,
        field("sources:"),
        "sources changed: run ebpf/build.sh and commit the objects"
    );
    let out = tempfile::tempdir().unwrap();
    sh(&format!("./build.sh {}", out.path().display()));
    let same_clang = sh("clang --version | head -1") == field("clang:");
    let names = twofold::collect::bpf::FAMILIES.iter().map(|f| f.name);
    for family in names.chain(["uploads", "tasks"]) {
        let name = format!("{family}.bpf.o");
        let rebuilt = std::fs::read(out.path().join(&name)).unwrap();
        let committed = std::fs::read(root.join("ebpf").join(&name)).unwrap();
        if same_clang {
            assert!(
                rebuilt == committed,
                "{name} differs from a rebuild with the same clang"
            );
        } else {
            eprintln!(
                "note: another clang than the committed objects'; {name} compared by loading only"
            );
        }
    }
    let t = twofold::collect::bpf::Tracer::attach(&twofold::collect::bpf::TraceOptions {
        objects_dir: Some(out.path().to_path_buf()),
        ..Default::default()
    })
    .unwrap();
    assert!(t.unavailable().is_empty(), "{:?}", t.unavailable());
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
    assert!(!t.unavailable().contains_key(&Counter::Reads));
}

#[test]
fn a_missing_tracepoint_disables_only_its_counter() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use twofold::collect::bpf::{TraceOptions, Tracer};
    use twofold::model::trace::{TraceContext, TraceModel};
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.bin", 4 * MIB);
    let k = key(&file);
    evict(&file);
    let t = Tracer::attach(&TraceOptions {
        files: vec![k],
        rename_events: vec![(
            "filemap:mm_filemap_fault".into(),
            "twofold_no_such_event".into(),
        )],
        ..TraceOptions::default()
    })
    .unwrap();
    let why = &t.unavailable()[&Counter::FileFaults];
    assert_eq!(t.unavailable().len(), 1, "{:?}", t.unavailable());
    assert!(
        why.starts_with("tracepoint 'filemap:twofold_no_such_event' not attached")
            && why.contains("No such file"),
        "{why}"
    );
    assert_eq!(read_all(&file), 4 * MIB);
    let m = TraceModel::new(
        &t.sample(),
        None,
        &TraceContext {
            files: vec![k],
            ..TraceContext::default()
        },
    );
    let f = &m.files[0];
    assert_eq!(f.total.file_faults, None, "unknown, not 0");
    assert_eq!(f.total.added_pages, Some(pages(4 * MIB)));
    let json = serde_json::to_value(f).unwrap();
    assert!(json["file_faults_per_sec"].is_null());
}

/// A system-wide `drop_caches` evicts millions of pages of other files; the counters of a
/// file of interest stay exact. It empties every page cache of the machine, so it only
/// runs when asked: `cargo test --test trace -- --ignored`.
#[test]
#[ignore = "drops the page cache of the whole machine; run with --ignored"]
fn drop_caches_keeps_the_counters_of_files_of_interest() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let n = pages(size);
    let file = model_file(dir.path(), "m.safetensors", size);
    let k = key(&file);
    read_all(&file);
    let tracer = attach(&[], &[k]);
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let s1 = tracer.sample();
    let kept: u64 = s1.files.values().map(|f| f.evicted_pages).sum();
    eprintln!(
        "drop_caches: {} pages evicted in all; the bounded per-file maps kept {} files ({kept} pages)",
        s1.evicted_pages_all,
        s1.files.len()
    );
    assert!(s1.evicted_pages_all >= kept);
    assert_eq!(read_all(&file), size);
    let s2 = tracer.sample();
    let f = s2.files[&k];
    assert_eq!((f.evicted_pages, f.added_pages, f.refault_pages), (n, n, n));
    assert_eq!(s2.lost_updates, 0);
}
