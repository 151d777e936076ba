//! Exact while memory moves: a serving process that holds a read() copy and allocates
//! and frees buffers every 100 ms (as Python does with each request's tensors) is
//! searched again, in the same snapshot, only where its memory moved; every snapshot of
//! a long-running engine (top, serve, record) is exact, and a second copy made in new
//! memory is found in the first snapshot after it.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use twofold::collect::gather::Request;
use twofold::engine::{report, Engine};

/// python3: reads MODEL into a bytes object (closed), then every 100 ms allocates a new
/// 4 MiB buffer of random bytes and frees the oldest of 8; on "copy" from stdin, makes a
/// second copy of the model in new memory and says "copied".
const CHURN: &str = r#"
import os, sys, select, collections
d = open(os.environ['MODEL'], 'rb').read()
bufs = collections.deque()
keep = []
print('ready', flush=True)
while True:
    r, _, _ = select.select([sys.stdin], [], [], 0.1)
    if r:
        line = sys.stdin.readline()
        if not line:
            break
        keep.append(bytearray(d))
        print('copied', flush=True)
    bufs.append(bytearray(os.urandom(4 << 20)))
    if len(bufs) > 8:
        bufs.popleft()
"#;

struct Churn(Child, BufReader<std::process::ChildStdout>);

impl Churn {
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.1.read_line(&mut l).unwrap();
        l.trim().to_string()
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A 16 MiB-tensor model in `dir`, python3 running `script` on it (said "ready"), and a
/// live engine (with the task iterator where `tasks`) on the file and that process; with
/// the tensor's share of the file.
fn start(dir: &Path, script: &str, seed: u64, tasks: bool) -> (PathBuf, Churn, Engine, f64) {
    let (file, _) = safetensors(dir, &[("w", 16 * MIB, Fill::Random(seed))]);
    let size = std::fs::metadata(&file).unwrap().len();
    let mut c = Command::new("python3")
        .args(["-c", script])
        .env("MODEL", &file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    let mut child = Churn(c, out);
    assert_eq!(child.line(), "ready");
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![child.0.id() as i32],
        candidates: true,
        ..Request::default()
    };
    let mut engine =
        Engine::new(req, Some(Default::default())).incremental(twofold::collect::cache::MAX_AGE);
    if tasks {
        engine = engine.task_iterator(true);
    }
    (file, child, engine, 16.0 * MIB as f64 / size as f64)
}

/// Takes a snapshot and asserts that `file`'s count is exact: `copies` tensors' worth of
/// private copies, no lower bound.
fn exact(engine: &mut Engine, file: &Path, copies: f64, what: &str) {
    let mut warnings = Vec::new();
    let s = engine.snapshot(&mut warnings).unwrap();
    let f = report(&s, None)
        .files
        .into_iter()
        .find(|f| Path::new(&f.path) == file)
        .unwrap();
    let r = &f.representations;
    assert!(!r.lower_bound, "{what}: {r:?} {:?}", f.suspected_copies);
    assert!((r.private_copies - copies).abs() < 0.01, "{what}: {r:?}");
}

#[test]
fn a_process_whose_memory_moves_stays_exact_at_every_snapshot() {
    let _group = crate::common::group(module_path!());
    if !require(
        is_root(),
        "frame numbers and other processes' memory need root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, mut churn, mut engine, tensor) = start(dir.path(), CHURN, 21, false);
    let mut moved = 0;
    for i in 0..8 {
        exact(&mut engine, &file, tensor, &format!("snapshot {i}"));
        moved += engine.last_moved;
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(moved > 0, "the memory never moved between snapshots");

    // A second copy, in new memory: found in the next snapshot, the count exact.
    writeln!(churn.0.stdin.as_mut().unwrap(), "copy").unwrap();
    assert_eq!(churn.line(), "copied");
    exact(&mut engine, &file, 2.0 * tensor, "after the second copy");
    assert!(engine.last_moved >= 1, "searched again only where it moved");
}

/// python3: reads MODEL into a bytes object (closed), then every 50 ms reads 64 KiB of
/// /dev/zero into one buffer it already has (its `rchar` moves, none of its pages); on
/// "grow" from stdin, faults in 8 MiB of new memory and says "grown".
const READER: &str = r#"
import os, sys, select
d = open(os.environ['MODEL'], 'rb').read()
buf = bytearray(1 << 16)
z = open('/dev/zero', 'rb', buffering=0)
z.readinto(buf)
keep = []
print('ready', flush=True)
while True:
    r, _, _ = select.select([sys.stdin], [], [], 0.05)
    if r:
        if not sys.stdin.readline():
            break
        keep.append(bytearray(os.urandom(8 << 20)))
        print('grown', flush=True)
    z.readinto(buf)
"#;

/// Minor plus major faults of `pid` (`/proc/PID/stat`; one thread).
fn faults(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    f[7].parse::<u64>().unwrap() + f[9].parse::<u64>().unwrap()
}

#[test]
fn a_process_that_reads_without_faulting_stays_exact_without_reading_where_its_memory_is() {
    let _group = crate::common::group(module_path!());
    if !require(
        is_root(),
        "frame numbers and the task iterator (a BPF program) need root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, mut reader, mut engine, tensor) = start(dir.path(), READER, 22, true);
    let pid = reader.0.id() as i32;
    exact(&mut engine, &file, tensor, "the first search");
    // Its rchar moves at every snapshot (the proof is checked in place); where /proc says
    // it took no fault from the start of the snapshot before to the end of this one, this
    // one read no placement of it.
    let mut quiet = 0;
    let mut before = faults(pid);
    for i in 0..8 {
        std::thread::sleep(Duration::from_millis(200));
        let start = faults(pid);
        exact(&mut engine, &file, tensor, &format!("snapshot {i}"));
        let after = faults(pid);
        if before == after && engine.last_rechecked == 1 {
            assert_eq!(
                engine.last_placements, 0,
                "snapshot {i}: no fault since, yet its placement was read"
            );
            quiet += 1;
        }
        before = start;
    }
    assert!(
        quiet > 0,
        "it faulted across every snapshot, or was never checked in place"
    );

    // New memory faulted in: its placement is read again, and the count stays exact.
    writeln!(reader.0.stdin.as_mut().unwrap(), "grow").unwrap();
    assert_eq!(reader.line(), "grown");
    exact(&mut engine, &file, tensor, "after it grew");
    assert!(
        engine.last_placements >= 1,
        "it faulted in 8 MiB, yet no placement was read"
    );
}

/// python3: reads MODEL into a bytes object (closed), then every 100 ms runs a child that
/// reads 1 MiB of it (the kernel adds a reaped child's reads to its parent's `rchar`), and
/// reads nothing itself.
const SPAWNER: &str = r#"
import os, sys, time
d = open(os.environ['MODEL'], 'rb').read()
print('ready', flush=True)
while True:
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.environ['MODEL'], os.O_RDONLY)
        os.read(fd, 1 << 20)
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.1)
"#;

fn rchar(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_parent_whose_rchar_moves_by_its_childrens_reads_is_not_searched_again_for_them() {
    let _group = crate::common::group(module_path!());
    if !require(
        is_root(),
        "frame numbers and the task iterator (a BPF program) need root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, spawner, mut engine, tensor) = start(dir.path(), SPAWNER, 23, true);
    let pid = spawner.0.id() as i32;
    let began = std::time::Instant::now();
    let read_before = rchar(pid);
    let mut searched = Vec::new();
    // Past the cadence at which a process that read since its search is searched again
    // (RESEARCH_MIN), each snapshot exact.
    let mut i = 0;
    while began.elapsed() < twofold::engine::RESEARCH_MIN + Duration::from_secs(2) {
        exact(&mut engine, &file, tensor, &format!("snapshot {i}"));
        // One candidate: searched in full unless reused, checked in place or searched
        // where it moved.
        let kept = engine.last_reused + engine.last_rechecked + engine.last_moved;
        if kept == 0 {
            searched.push(i);
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
    let read = rchar(pid) - read_before;
    assert!(
        read >= 10 << 20,
        "its children read {read} bytes: the test did not move its rchar"
    );
    assert_eq!(
        searched,
        vec![0],
        "searched in full at snapshots {searched:?} of {i}, though none of its threads read"
    );
}
