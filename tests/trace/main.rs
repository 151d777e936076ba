//! eBPF tracing, live: real programs attached to real tracepoints, counting work the
//! tests create themselves (children that wait for a go, files they evict and read back,
//! memory cgroups they fill), checked exactly against the kernel's own accounting
//! (`/proc/PID/stat`, `mincore`, cgroup OOM counters) and against bpftrace counting the
//! same tracepoints. Needs root; in CI (`CI` set) nothing here may skip.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod serve_trace;
mod uploads;

/// The tests here count events exactly, or disturb the whole host (OOM, direct reclaim,
/// LRU churn): they run one at a time, never beside each other.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
mod support;

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

#[test]
fn eviction_read_back_and_refaults_are_exact() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 24 * MIB;
    let n = pages(size);
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
    assert_eq!(
        f1.evicted_pages - s0.files.get(&k).map_or(0, |f| f.evicted_pages),
        n
    );
    assert_eq!(f1.added_pages, 0);

    // read() it back: every page added again, and each is a refault.
    assert_eq!(read_all(&file), size);
    let s2 = tracer.sample();
    // Ground truth: all of it is cached again, less what reclaim (memory pressure from
    // other work on the host) took since, which the tracer counts too.
    let resident = resident_pages(&file);
    let reclaimed = tracer.sample().files[&k].evicted_pages - f1.evicted_pages;
    assert_eq!(resident + reclaimed, n, "resident + reclaimed since");
    let f2 = s2.files[&k];
    assert_eq!(f2.added_pages, n, "added pages");
    assert_eq!(f2.refault_pages, n, "refaulted pages");
    assert_eq!(s2.io[&(me, k)].read_bytes, size, "read() bytes");

    // readv() it again after another eviction: N more of each.
    evict(&file);
    let got = readv_all(&file);
    assert_eq!(got, size);
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

fn twofold_cmd() -> Command {
    Command::new(exe())
}

#[test]
fn trace_json_lines_parse_into_typed_records() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    use twofold::render::trace::{Line, Record};
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.npy", size);
    let k = key(&file);
    evict(&file);
    let mut copy = Armed::start("copy", Some(&file), &[]);
    let mut trace = twofold_cmd()
        .args(["trace", "--json", "--interval", "300ms", "--duration", "3s"])
        .args(["--pid", &copy.pid().to_string(), "--file"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(trace.stdout.take().unwrap()).lines();
    let first: Line = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let Record::Attached(a) = first.record else {
        panic!("first record {first:?}")
    };
    assert_eq!(first.schema_version, twofold::render::trace::SCHEMA_VERSION);
    assert!(a.unavailable.is_empty(), "{:?}", a.unavailable);
    assert_eq!(a.pids, [copy.pid()]);
    assert_eq!(copy.go(), "ready");
    let records: Vec<Record> = lines
        .map(|l| serde_json::from_str::<Line>(&l.unwrap()).unwrap().record)
        .collect();
    assert!(trace.wait().unwrap().success());
    let intervals = records
        .iter()
        .filter(|r| matches!(r, Record::Interval(_)))
        .count();
    assert!(intervals >= 5, "{intervals} intervals in 3 s");
    let Some(Record::Summary(m)) = records.last() else {
        panic!("no summary last")
    };
    let f = m.files.iter().find(|f| f.inode == k.inode).unwrap();
    assert!(f.of_interest);
    assert_eq!(f.total.read_bytes, Some(size));
    assert_eq!(f.total.added_pages, Some(pages(size)));
    let p = m.processes.iter().find(|p| p.pid == copy.pid()).unwrap();
    assert_eq!(p.total.read_bytes, Some(size));
    assert_eq!(p.files[0].path.as_deref(), file.to_str());
    // Rates over the intervals add up to the totals.
    let sum: f64 = records
        .iter()
        .filter_map(|r| match r {
            Record::Interval(m) => m
                .files
                .iter()
                .find(|f| f.inode == k.inode)
                .and_then(|f| f.delta.read_bytes),
            _ => None,
        })
        .map(|v| v as f64)
        .sum();
    assert_eq!(sum, size as f64);
}

#[test]
fn scan_trace_names_the_copying_loader() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 80 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    // It reads the file during the window and closes it: the read() ledger is the only
    // trace of where its copy came from.
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut scan = twofold_cmd()
        .args(["scan", "--json", "--trace", "2s"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Lines before the window's (warnings) are kept for the failure message.
    let mut err = std::io::BufReader::new(scan.stderr.take().unwrap());
    let mut before = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "no window: {before}");
        if line.starts_with("twofold: tracing for 2.0 s") {
            break;
        }
        before.push_str(&line);
    }
    assert_eq!(copy.go(), "ready");
    // The rest of stderr on a thread: the report on stdout can fill its pipe first.
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        rest
    });
    let out = scan.wait_with_output().unwrap();
    let rest = rest.join().unwrap();
    assert!(out.status.success(), "{before}{rest}");
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    // Everything the scan said, for any assertion below that fails.
    let why = format!(
        "stderr: {before}{rest}\nreport: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let t = r.trace.as_ref().expect(&why);
    let p = t
        .processes
        .iter()
        .find(|p| p.pid == copy.pid())
        .expect(&why);
    assert_eq!(p.total.read_bytes, Some(size), "{why}");
    let f = r
        .findings
        .iter()
        .find(|f| f.code == "read-copy")
        .expect(&why);
    assert_eq!(
        f.message(),
        format!(
            "pid {} (twofold) read 80.0 MiB of 'model.gguf' with read() in {:.1} s: a copying loader",
            copy.pid(),
            t.interval_secs
        ),
        "{why}"
    );
    // The copy is proven, counted, and the ledger is its evidence.
    let file_model = r
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .expect(&why);
    let c = file_model
        .proven_copies
        .iter()
        .find(|c| c.pid == copy.pid())
        .expect(&why);
    assert_eq!(c.traced_read_bytes, Some(size), "{why}");
    assert!(c.fraction > 0.99, "{why}");
    // The count is the page cache (all of it, unless something reclaimed part of the
    // file since the child read it: the count follows) plus this one copy.
    let reps = &file_model.representations;
    let cache = reps.page_cache.expect(&why);
    assert!(cache > 0.5, "{why}");
    assert!((reps.private_copies - c.fraction).abs() < 0.01, "{why}");
    assert!(
        (reps.proven.expect(&why) - (cache + reps.cow.unwrap_or(0.0) + c.fraction)).abs() < 0.01,
        "{why}"
    );
    let proven = r
        .findings
        .iter()
        .find(|f| f.code == "proven-private-copy")
        .expect(&why);
    assert!(
        proven
            .message()
            .contains("read() 100% of the file during the trace"),
        "{why}"
    );
}

#[test]
fn without_privileges_trace_fails_cleanly_and_scan_goes_on() {
    let _serial = serial();
    let Some((_dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    let nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .output()
            .unwrap()
    };
    let out = nobody(&["trace", "--duration", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("twofold: error: eBPF tracing needs root, or CAP_BPF and CAP_PERFMON"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = nobody(&["scan", "--json", "--trace", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--trace: eBPF tracing needs root"), "{err}");
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r.trace.is_none());
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
    for family in &twofold::collect::bpf::FAMILIES {
        let name = format!("{}.bpf.o", family.name);
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

#[test]
fn trace_json_follows_the_comm_across_exec() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::{BufRead, Write};
    use twofold::render::trace::{Line, Record};
    // A shell that waits for a line, then becomes `sleep`: comm 'sh', then 'sleep'.
    let mut sh = Command::new("sh")
        .args(["-c", "read x; exec sleep 30"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sh.id() as i32;
    let mut trace = twofold_cmd()
        .args(["trace", "--json", "--interval", "200ms", "--duration", "4s"])
        .args(["--pid", &pid.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let comm_in = |r: &Record| match r {
        Record::Interval(m) | Record::Summary(m) => m
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.comm.clone()),
        Record::Attached(_) => None,
    };
    let mut lines = std::io::BufReader::new(trace.stdout.take().unwrap()).lines();
    let mut next = || {
        serde_json::from_str::<Line>(&lines.next().unwrap().unwrap())
            .unwrap()
            .record
    };
    assert!(matches!(next(), Record::Attached(_)));
    let first = next();
    assert!(matches!(first, Record::Interval(_)), "{first:?}");
    assert_eq!(comm_in(&first).as_deref(), Some("sh"));
    // Exec, and wait for it to show in /proc before reading on.
    sh.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let start = std::time::Instant::now();
    while comm().trim() != "sleep" {
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut rest = Vec::new();
    for l in lines {
        rest.push(serde_json::from_str::<Line>(&l.unwrap()).unwrap().record);
    }
    assert!(trace.wait().unwrap().success());
    let _ = sh.kill();
    let _ = sh.wait();
    // Every record after the exec was seen carries the new comm, the summary too.
    let last = rest.last().unwrap();
    assert!(matches!(last, Record::Summary(_)), "{last:?}");
    assert_eq!(comm_in(last).as_deref(), Some("sleep"));
    let before_last = &rest[rest.len() - 2];
    assert_eq!(comm_in(before_last).as_deref(), Some("sleep"));
}

#[test]
fn record_trace_keeps_the_read_ledger_of_a_loader_that_closed_the_file() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    let store = dir.path().join("store");
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut rec = twofold_cmd()
        .args(["record", "--trace", "--interval", "300ms", "--store"])
        .arg(&store)
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first line comes once the tracer is attached.
    let mut out = std::io::BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("twofold record:"), "{line}");
    assert_eq!(copy.go(), "ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(rec.wait().unwrap().code(), Some(0));
    let out = twofold_cmd()
        .args(["replay", "--json", "--at", "now", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
    let f = r
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == file)
        .unwrap();
    let c = f
        .proven_copies
        .iter()
        .find(|c| c.pid == copy.pid())
        .unwrap();
    assert_eq!(c.traced_read_bytes, Some(size));
    assert_eq!(c.how, twofold::model::CopyHow::Read);
}

/// A model file of `size` in a fresh directory, its key, and an engine (no proof) whose
/// request names it, with candidates.
fn engine_on_file(
    size: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    twofold::sample::FileKey,
    twofold::engine::Engine,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", size);
    let k = key(&file);
    let e = twofold::engine::Engine::new(
        twofold::collect::gather::Request {
            paths: vec![file.clone()],
            candidates: true,
            ..Default::default()
        },
        None,
    );
    (dir, file, k, e)
}

/// The engine's tracing switch (what `top`'s `t` key and `serve --trace` use): off, the
/// snapshots carry no counters; on, they carry them, with the read() ledger of a loader
/// that closed its file; off again, none; on again, a new attachment whose rates do not
/// subtract the old one's counters.
#[test]
fn engine_tracing_turns_on_and_off_at_run_time() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use twofold::engine;
    let size = 8 * MIB;
    let (_dir, file, k, mut e) = engine_on_file(size);
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let mut w = Vec::new();
    assert!(!e.tracing());
    assert!(e.snapshot(&mut w).unwrap().trace.is_none());

    e.set_tracing(true).unwrap();
    assert!(e.tracing());
    assert_eq!(e.set_tracing(true), Ok(()), "on twice is on");
    assert!(
        e.trace_unavailable().is_empty(),
        "{:?}",
        e.trace_unavailable()
    );
    let s1 = e.snapshot(&mut w).unwrap();
    assert!(s1.trace.is_some());
    assert_eq!(copy.go(), "ready");
    let s2 = e.snapshot(&mut w).unwrap();
    let t2 = s2.trace.as_ref().unwrap();
    assert_eq!(t2.io[&(copy.pid(), k)].read_bytes, size, "the ledger");
    assert!(s2.sample.reads.is_empty(), "the ledger is not stored twice");
    // The report: the file is of interest; the loader read all of it in this interval.
    let r = engine::report(&s2, Some(&s1));
    let t = r.trace.as_ref().unwrap();
    let f = t.files.iter().find(|f| f.key == k).unwrap();
    assert!(f.of_interest);
    assert_eq!(f.path.as_deref(), file.to_str());
    let p = t.processes.iter().find(|p| p.pid == copy.pid()).unwrap();
    assert_eq!(p.delta.read_bytes, Some(size));
    assert_eq!(p.total.read_bytes, Some(size));
    let interval = (t2.at_secs - s1.trace.as_ref().unwrap().at_secs).max(1e-9);
    assert_eq!(t.interval_secs, interval);
    assert_eq!(p.read_bytes_per_sec, Some(size as f64 / interval));

    e.set_tracing(false).unwrap();
    assert!(!e.tracing());
    let s3 = e.snapshot(&mut w).unwrap();
    assert!(s3.trace.is_none());
    assert!(engine::report(&s3, Some(&s2)).trace.is_none());

    e.set_tracing(true).unwrap();
    let s4 = e.snapshot(&mut w).unwrap();
    let t4 = s4.trace.as_ref().unwrap();
    assert_ne!(t4.attached_mono_ns, t2.attached_mono_ns);
    // Nothing read since the new attach; the old attachment's counters are not a base.
    assert!(!t4.io.contains_key(&(copy.pid(), k)));
    assert_eq!(
        engine::report(&s4, Some(&s2)).trace,
        engine::report(&s4, None).trace
    );
    // One window (`scan --trace`): the next snapshot carries the counters and tracing is
    // off again, before the collection.
    e.set_tracing(false).unwrap();
    e.trace_once().unwrap();
    assert!(e.tracing());
    let s5 = e.snapshot(&mut w).unwrap();
    assert!(s5.trace.is_some());
    assert!(!e.tracing());
    assert!(e.snapshot(&mut w).unwrap().trace.is_none());
    assert!(
        w.iter()
            .all(|w| w.kind != twofold::sample::WarningKind::Trace && !w.text.contains("--trace")),
        "warnings: {w:?}"
    );
}

/// `scan --trace` recorded, then replayed: the same bytes, trace section and all.
#[test]
fn scan_trace_replays_byte_for_byte() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 4 * MIB);
    let _map = reader("map", Some(&file), &[]);
    for json in [false, true] {
        let store = dir.path().join(format!("store-{json}"));
        let mut scan = twofold_cmd();
        scan.args(["scan", "--no-prove", "--trace", "500ms", "--record"])
            .arg(&store)
            .arg(&file);
        let mut replay = twofold_cmd();
        replay
            .args(["replay", "--at", "now", "--store"])
            .arg(&store);
        if json {
            scan.arg("--json");
            replay.arg("--json");
        }
        let live = scan.output().unwrap();
        assert!(live.status.success());
        let replayed = replay.output().unwrap();
        assert!(replayed.status.success());
        let (live, mut replayed) = (
            String::from_utf8(live.stdout).unwrap(),
            String::from_utf8(replayed.stdout).unwrap(),
        );
        // Text replay first names the moment it shows; the rest is what scan printed.
        if !json {
            let (first, rest) = replayed.split_once('\n').unwrap();
            assert!(
                first.starts_with("twofold replay: the snapshot of "),
                "{first}"
            );
            replayed = rest.to_string();
        }
        assert_eq!(live, replayed, "json {json}");
        if json {
            let r: twofold::model::Report = serde_json::from_str(&live).unwrap();
            let t = r.trace.unwrap();
            assert!(t
                .files
                .iter()
                .any(|f| f.of_interest && f.path.as_deref() == file.to_str()));
        } else {
            assert!(live.contains("\nTRACED FOR "), "{live}");
        }
    }
}

/// `record --trace` of a loader that copies a model with pread64() and closes it: the
/// counters stored in the snapshots, replayed and dumped (JSON Lines, CSV, OpenMetrics),
/// equal the ground truth (the file's size, all of its pages added to the page cache after
/// an eviction) and bpftrace counting the same tracepoints.
#[test]
fn record_trace_stores_counters_that_replay_and_dump_agree_with_bpftrace() {
    let _serial = serial();
    if !bpf_ready() || !require(have("bpftrace"), "bpftrace") {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "model.gguf", size);
    let k = key(&file);
    let store = dir.path().join("store");
    let mut copy = Armed::start("copy", Some(&file), &["--close"]);
    let pid = copy.pid();
    let mut rec = twofold_cmd()
        .args([
            "record",
            "--trace",
            "--no-prove",
            "--interval",
            "300ms",
            "--store",
        ])
        .arg(&store)
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first line comes once the tracer is attached.
    let mut out = std::io::BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("twofold record:"), "{line}");
    // bpftrace from now on; the file (fully cached since it was written) is evicted only
    // now, so both count every page that goes back (whoever else on the host reads the
    // file: a scan of /tmp by another tool would refill the cache before the attach).
    let bt = Bpftrace::start(&format!(
        "tracepoint:filemap:mm_filemap_add_to_page_cache /args->i_ino == {ino}/ {{ @added = sum(1 << args->order); }}\n\
         tracepoint:syscalls:sys_exit_pread64 /pid == {pid} && args->ret > 0/ {{ @pread = sum(args->ret); }}\n\
         tracepoint:syscalls:sys_exit_read /pid == {pid} && args->ret > 0/ {{ @read = sum(args->ret); }}",
        ino = k.inode
    ));
    evict(&file);
    assert_eq!(copy.go(), "ready");
    // Three more snapshots (32-byte index entries), however slow a snapshot is here.
    let index = store.join(format!(
        "{}.index",
        &twofold::timespec::format(twofold::engine::now().0)[..10]
    ));
    let frames = |i: &std::path::Path| std::fs::metadata(i).map_or(0, |m| m.len()) / 32;
    let want = frames(&index) + 3;
    let start = std::time::Instant::now();
    while frames(&index) < want {
        assert!(start.elapsed().as_secs() < 60, "record is too slow");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(rec.wait().unwrap().code(), Some(0));
    let got = bt.stop();
    assert_eq!(got["pread"], size, "bpftrace: pread64 bytes of the loader");
    // Ground truth: the whole file went back into the page cache after its eviction (more
    // only if memory pressure evicted some of it again meanwhile).
    assert!(got["added"] >= pages(size), "bpftrace: pages added {got:?}");

    let run = |args: &[&str]| {
        let out = twofold_cmd()
            .args(args)
            .arg("--store")
            .arg(&store)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Replay: the trace section of the last snapshot, totals since attach.
    let r: twofold::model::Report =
        serde_json::from_str(&run(&["replay", "--json", "--at", "now"])).unwrap();
    let t = r.trace.as_ref().unwrap();
    let f = t.files.iter().find(|f| f.key == k).unwrap();
    assert!(f.of_interest);
    assert_eq!(
        f.total.added_pages,
        Some(got["added"]),
        "replayed page-cache adds (unavailable {:?}, lost updates {}, all files added {:?})",
        t.unavailable,
        t.lost_updates,
        t.cache_added_pages
    );
    let p = t.processes.iter().find(|p| p.pid == pid).unwrap();
    let pf = p.files.iter().find(|x| x.key == k).unwrap();
    assert_eq!(
        pf.read_bytes, got["pread"],
        "replayed read bytes of the loader"
    );
    assert_eq!(pf.path.as_deref(), file.to_str());
    // Its only reads of regular files after attach were the file's.
    assert_eq!(p.total.read_bytes, Some(size));
    let human = run(&["replay", "--at", "now"]);
    assert!(human.contains("TRACED FOR"), "{human}");

    // JSON Lines: a page-cache, file and process row per snapshot; rates add up.
    let json = run(&["dump", "--what", "trace", "--from", "1h ago"]);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(rows.iter().all(|r| r["type"] == "trace"));
    let file_id = format!("{}:{}:{}", k.major, k.minor, k.inode);
    let file_rows: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "file" && r["data"]["file_id"] == file_id.as_str())
        .collect();
    let proc_rows: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "process" && r["data"]["pid"] == pid)
        .collect();
    let snaps = rows
        .iter()
        .filter(|r| r["data"]["scope"] == "page_cache")
        .count();
    assert!(snaps >= 3, "{snaps} snapshots");
    assert_eq!(
        file_rows.len(),
        snaps,
        "the file of interest in every snapshot"
    );
    let last = &file_rows.last().unwrap()["data"];
    assert_eq!(
        last["added_pages_total"], got["added"],
        "dumped page-cache adds"
    );
    assert_eq!(last["path"], file.to_str().unwrap());
    let last = &proc_rows.last().unwrap()["data"];
    assert_eq!(
        last["read_bytes_total"], size,
        "dumped read bytes of the loader"
    );
    let added: f64 = file_rows
        .iter()
        .map(|r| {
            r["data"]["added_pages_per_sec"].as_f64().unwrap()
                * r["data"]["interval_secs"].as_f64().unwrap()
        })
        .sum();
    assert!(
        // dump rounds rates and intervals to 6 decimals, as JSON does.
        (added - got["added"] as f64).abs() < 1e-5 * got["added"] as f64,
        "rates × intervals = {added}, total {}",
        got["added"]
    );
    // CSV: one header, one line per row.
    let csv = run(&[
        "dump", "--what", "trace", "--from", "1h ago", "--format", "csv",
    ]);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("added_pages_per_sec,"), "{}", lines[0]);
    assert!(lines[0].contains("scope") && lines[0].contains("read_bytes_total"));
    assert_eq!(lines.len(), rows.len() + 1);
    // OpenMetrics: counters named `_total`, the last value the ground truth; promtool
    // accepts it and backfills it.
    let om = run(&[
        "dump",
        "--what",
        "trace",
        "--from",
        "1h ago",
        "--format",
        "openmetrics",
    ]);
    assert!(om.ends_with("# EOF\n"));
    assert!(
        om.contains("# TYPE twofold_trace_file_added_pages_total counter\n"),
        "{om}"
    );
    let series = format!("twofold_trace_file_added_pages_total{{file_id=\"{file_id}\"}} ");
    let last_added = om
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap();
    assert_eq!(
        last_added.split(' ').next().unwrap(),
        got["added"].to_string(),
        "{om}"
    );
    let series =
        format!("twofold_trace_process_read_bytes_total{{pid=\"{pid}\",comm=\"twofold\"}} ");
    let last_read = om
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap();
    assert_eq!(last_read.split(' ').next().unwrap(), size.to_string());
    if !require(have("promtool"), "promtool (Debian's prometheus package)") {
        return;
    }
    let om_file = dir.path().join("trace.om");
    std::fs::write(&om_file, &om).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&om_file).unwrap())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om_file)
        .arg(dir.path().join("tsdb"))
        .output()
        .unwrap();
    assert!(
        backfill.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&backfill.stderr)
    );
}

/// A traced engine forgets a reader once it has exited and done nothing for a sample: its
/// counters leave the snapshot and the kernel's maps, and what it read stays in the
/// file's totals (`exited_read_bytes`), so totals never go back and rates stay right.
#[test]
fn an_exited_reader_is_folded_into_the_file_totals() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    use twofold::engine;
    let size = 8 * MIB;
    let (_dir, file, k, mut e) = engine_on_file(size);
    let mut w = Vec::new();
    e.set_tracing(true).unwrap();
    let s1 = e.snapshot(&mut w).unwrap();
    // A loader that reads the whole file with read() and exits.
    let st = std::process::Command::new(exe())
        .args(["__child", "copy"])
        .arg(&file)
        .args(["--close", "--exit-after-ms", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = st.id() as i32;
    let out = st.wait_with_output().unwrap();
    assert!(out.status.success());
    // The sample after its last event still shows it (it exited meanwhile)...
    let s2 = e.snapshot(&mut w).unwrap();
    let t2 = s2.trace.as_ref().unwrap();
    assert_eq!(t2.io[&(pid, k)].read_bytes, size);
    assert!(t2.pids.contains_key(&pid));
    let r2 = engine::report(&s2, Some(&s1));
    let f2 = r2
        .trace
        .as_ref()
        .unwrap()
        .files
        .iter()
        .find(|f| f.key == k)
        .unwrap()
        .clone();
    assert_eq!(f2.total.read_bytes, Some(size));
    // ...the next one has folded it: gone from the processes, kept in the file's total.
    let s3 = e.snapshot(&mut w).unwrap();
    let t3 = s3.trace.as_ref().unwrap();
    assert!(!t3.io.contains_key(&(pid, k)), "{:?}", t3.io.keys());
    assert!(!t3.pids.contains_key(&pid));
    assert_eq!(t3.exited_read_bytes.get(&k), Some(&size));
    let r3 = engine::report(&s3, Some(&s2));
    let t = r3.trace.as_ref().unwrap();
    assert!(t.processes.iter().all(|p| p.pid != pid));
    let f3 = t.files.iter().find(|f| f.key == k).unwrap();
    assert_eq!(f3.total.read_bytes, Some(size), "the total never goes back");
    assert_eq!(
        f3.delta.read_bytes,
        Some(0),
        "nothing read in this interval"
    );
    // And the kernel's maps forgot it: the next sample has no entry to fold again.
    let s4 = e.snapshot(&mut w).unwrap();
    let t4 = s4.trace.as_ref().unwrap();
    assert!(!t4.io.contains_key(&(pid, k)));
    assert_eq!(t4.exited_read_bytes.get(&k), Some(&size), "folded once");
}
