//! Helpers for live tests: ground-truth files and readers, capability checks that never
//! skip silently (in CI, where `CI` is set, a missing capability fails the test).
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use twofold::spawn::Reader;

pub mod tmux;

pub const MIB: u64 = 1 << 20;

pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twofold"))
}

pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// `true` if the test may go on; prints why not otherwise (and fails in CI).
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if in_ci() {
        panic!("CI must provide {what}");
    }
    eprintln!("SKIPPED: {what} is not available here");
    false
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A file of `size` pseudo-random bytes, written back to disk (clean page cache).
pub fn model_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    // Seeded by the whole path too: two tests running at once must never hold files of
    // the same bytes, or each one's copying reader is (truly) a copy of the other's file.
    let mut state = 0x1234_5678_9abc_def1u64 ^ size;
    for b in path.as_os_str().as_encoded_bytes() {
        state = (state ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    state |= 1;
    let mut block = vec![0u8; MIB as usize];
    let mut left = size;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            w.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(MIB) as usize;
        f.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
    // The test process must not keep the file's last block in its freed heap: twofold
    // would (truly) find it there as a partial private copy. Volatile, so the writes are
    // not dropped as dead stores before the free.
    for b in block.iter_mut() {
        // SAFETY: `b` is a valid, exclusive reference into `block`.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    path
}

/// Drops the whole file from the page cache (it must not be mapped anywhere).
/// Resident pages of `path` by util-linux `fincore` (the ground truth: not twofold's reader).
pub fn fincore_pages(path: &Path) -> u64 {
    let out = run_ok(
        std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "PAGES"])
            .arg(path),
    );
    String::from_utf8_lossy(&out).trim().parse().unwrap()
}

/// `true` if python3 imports `modules` (a comma list); says why not otherwise (and fails in
/// CI).
pub fn python_has(modules: &str) -> bool {
    require(
        std::process::Command::new("python3")
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success()),
        &format!("python3 with {modules}"),
    )
}

/// `twofold scan --json FILE` and the file's model in it. (The proof given 300 s: on a
/// loaded host, other processes that read as much as the file, searched first as the
/// cheaper, must not cut a runtime's search short.)
pub fn scan_file(file: &Path) -> (twofold::model::Report, twofold::model::FileModel) {
    let r: twofold::model::Report = twofold_json(&[
        "scan".as_ref(),
        "--json".as_ref(),
        "--prove-budget".as_ref(),
        "300s".as_ref(),
        file.as_os_str(),
    ]);
    let f = r
        .files
        .iter()
        .find(|f| Path::new(&f.path) == file)
        .unwrap_or_else(|| panic!("{} not in the report", file.display()))
        .clone();
    (r, f)
}

/// Evicts `path` until `fincore` says no page of it is cached (10 s at most): a page some
/// process maps at that moment (another twofold copying it out of its mapping, for one)
/// is not evicted, and goes a moment later.
pub fn evict_all(path: &Path) {
    let start = std::time::Instant::now();
    loop {
        evict(path);
        if fincore_pages(path) == 0 || start.elapsed() > Duration::from_secs(10) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

pub fn reader(mode: &str, file: Option<&Path>, extra: &[&str]) -> Reader {
    Reader::start(&exe(), mode, file, extra, Duration::from_secs(60)).unwrap()
}

/// A reader started from a copy of the binary this test just wrote: a fork elsewhere in
/// the test binary (parallel tests) can inherit the copy's write descriptor for an instant,
/// and exec then fails with ETXTBSY. Tried again, as the race is brief.
pub fn reader_from_copy(exe_copy: &Path, mode: &str, file: Option<&Path>) -> Reader {
    let mut tries = 0;
    loop {
        match Reader::start(exe_copy, mode, file, &[], Duration::from_secs(60)) {
            Ok(r) => return r,
            Err(e) if format!("{e:#}").contains("Text file busy") && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e:#}"),
        }
    }
}

/// A `/proc/PID/status` field in bytes, read by the test itself (ground truth).
pub fn status_bytes(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// The pids of the other twofolds running now (their `maps` carry twofold's observer mark).
pub fn other_twofolds() -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| *p != me)
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/maps"))
                .is_ok_and(|t| twofold::collect::observer::marked(&t))
        })
        .collect()
}

/// `f()`, run again (up to 50 times, 100 ms apart) until no other twofold (a `top` or
/// `serve` beside the suite) faulted while it ran: one that maps a file's pages for a
/// moment, to read cached ones, is a third mapper then, and a test that expects two
/// mappers' PSS must not read that moment. The last result where it never held.
pub fn while_others_quiet<T>(mut f: impl FnMut() -> T) -> T {
    let root = Path::new("/proc");
    let mut last = None;
    for _ in 0..50 {
        let quiet = twofold::collect::quiet::Quiet::before(root, &other_twofolds(), false);
        let r = f();
        if quiet.held(root) {
            return r;
        }
        last = Some(r);
        std::thread::sleep(Duration::from_millis(100));
    }
    last.expect("ran at least once")
}

/// Allowed error: one page per MiB of `size`.
pub fn tolerance(size: u64) -> u64 {
    (size / MIB).max(1) * 4096
}

pub fn assert_near(got: u64, want: u64, tol: u64, what: &str) {
    let diff = got.abs_diff(want);
    assert!(
        diff <= tol,
        "{what}: got {got}, want {want} ± {tol} (off by {diff})"
    );
}

/// A tensor the test wrote: name, dtype, byte offset in the file, length.
#[derive(Clone, Debug)]
pub struct Written {
    pub name: String,
    pub offset: u64,
    pub len: u64,
    pub searchable: bool,
}

pub enum Fill {
    Random(u64),
    Zero,
    /// F16 1.0 everywhere.
    Ones,
}

/// Writes a safetensors file of F16 tensors; returns the tensors with absolute offsets.
pub fn safetensors(dir: &Path, specs: &[(&str, u64, Fill)]) -> (PathBuf, Vec<Written>) {
    let mut header = String::from("{");
    let mut rel = 0u64;
    for (i, (name, len, _)) in specs.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{name}":{{"dtype":"F16","shape":[{}],"data_offsets":[{rel},{}]}}"#,
            len / 2,
            rel + len
        ));
        rel += len;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let base = 8 + header.len() as u64;
    // One buffer of the final size, zeroed before it is freed: a buffer grown by
    // reallocation leaves its earlier parts in freed heap, and a freed one its bytes, so
    // this test process would hold real fragments of the model (found byte by byte, as
    // a copy: 75 KB of one once made a test see a third holder).
    let mut bytes = Vec::with_capacity((base + rel) as usize);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    let mut out = Vec::new();
    for (name, len, fill) in specs {
        let offset = bytes.len() as u64;
        match fill {
            Fill::Random(seed) => {
                let mut s = seed * 2 + 1;
                for _ in 0..len / 8 {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    // Finite F16 values only (clear exponent's top bit), as real weights.
                    let v = s & 0x3fff_3fff_3fff_3fff;
                    bytes.extend_from_slice(&v.to_le_bytes());
                }
            }
            Fill::Zero => bytes.extend(std::iter::repeat_n(0u8, *len as usize)),
            Fill::Ones => {
                for _ in 0..len / 2 {
                    bytes.extend_from_slice(&0x3c00u16.to_le_bytes());
                }
            }
        }
        out.push(Written {
            name: name.to_string(),
            offset,
            len: *len,
            searchable: matches!(fill, Fill::Random(_)) && *len >= twofold::dupes::grid::SMALL_MIN,
        });
    }
    assert_eq!(bytes.len() as u64, base + rel);
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    bytes.fill(0);
    std::hint::black_box(&bytes);
    (path, out)
}

/// Runs a command that must succeed; returns its stdout.
pub fn run_ok(cmd: &mut std::process::Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs `twofold ARGS...`, which must succeed, and parses its JSON output.
pub fn twofold_json<T: serde::de::DeserializeOwned>(args: &[&std::ffi::OsStr]) -> T {
    let stdout = run_ok(std::process::Command::new(exe()).args(args));
    serde_json::from_slice(&stdout).unwrap()
}

/// `twofold dupes --json --pid PID [EXTRA...] FILE`.
pub fn dupes_report(pid: i32, file: &Path, extra: &[&str]) -> twofold::model::dupes::DupesReport {
    let pid = pid.to_string();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "dupes".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
    ];
    args.extend(extra.iter().map(|e| std::ffi::OsStr::new(*e)));
    args.push(file.as_os_str());
    twofold_json(&args)
}

/// Held by the test that runs twofold as 'nobody' ([`nobody_setup`]).
pub type NobodyGuard = std::sync::MutexGuard<'static, ()>;

/// For tests that drop to 'nobody': `None` (with the reason printed, or a failure in CI)
/// unless root and `setpriv` are there; else a world-readable temp dir holding a copy of
/// the binary that 'nobody' may execute wherever the checkout lives, and a guard: one such
/// test at a time in a test binary. 'nobody' may read every process of 'nobody', so a
/// `record` of one test, beside another's `scan`, reads the scan's mapping of its file,
/// maps the file in turn, and is then listed by the scan as a mapper it can see (a fresh
/// clone's suite showed it twice).
pub fn nobody_setup() -> Option<(tempfile::TempDir, PathBuf, NobodyGuard)> {
    static NOBODY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !require(is_root(), "root (to drop to 'nobody' with setpriv)")
        || !require(have("setpriv"), "util-linux setpriv")
    {
        return None;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("twofold");
    std::fs::copy(exe(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let guard = NOBODY.lock().unwrap_or_else(|e| e.into_inner());
    Some((dir, bin, guard))
}

/// `GET /metrics` of an exporter on loopback, in Prometheus text 0.0.4 (the format
/// `promtool check metrics` lints without complaint): the body of a 200, else `None`.
pub fn metrics_text(port: u16) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: x\r\nAccept: text/plain; version=0.0.4\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

/// Runs `cmd` to its end with stdin closed, killing it (and failing) past `limit`:
/// (status, stdout, stderr). Both pipes are drained while it runs, so a large output
/// never blocks it.
pub fn bounded(
    cmd: &mut std::process::Command,
    limit: Duration,
) -> (std::process::ExitStatus, String, String) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, out.join().unwrap(), err.join().unwrap());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tests of one module may run beside each other, never beside another module's: the
/// guard of [`group`]. Folded into one binary, the files of `tests/exact` and `tests/host`
/// keep the isolation they had as binaries of their own (cargo runs binaries one at a
/// time): an exact count never runs beside another file's tests, which start, evict and
/// measure processes of their own.
pub struct GroupGuard;

struct Groups {
    current: Option<&'static str>,
    running: usize,
}

static GROUPS: std::sync::Mutex<Groups> = std::sync::Mutex::new(Groups {
    current: None,
    running: 0,
});
static GROUP_FREE: std::sync::Condvar = std::sync::Condvar::new();

/// The test process must not look like a copy holder of the files its tests write: a
/// buffer it wrote a model from and freed must go back to the kernel, not stay resident in
/// its heap, where a proof would find the model's bytes (and its `RssAnon` would make it a
/// candidate for every file). glibc raises its mmap threshold after each large free, so in
/// a binary that runs many tests, later buffers of 8 or 16 MiB came from the heap and
/// stayed there; a fixed threshold keeps every large buffer mapped, and freed ones
/// unmapped.
fn quiet_heap() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: mallopt only sets allocator parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
        }
        // Engines made in this process read `/proc`, not the BPF task iterator: loading it
        // parses the kernel's BTF here (tens of MiB of small allocations), after which
        // this heap kept freed fragments of the files the tests write, found (rightly) as
        // copies. `tests/exact/tasks.rs` turns it on for its engine; the twofolds the
        // tests start (`serve`, `top`, `record`) use it as root.
        twofold::collect::taskview::OFF_IN_THIS_PROCESS
            .store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

/// Waits until no test of another module runs, then runs as one of `module`'s (pass
/// `module_path!()`).
pub fn group(module: &'static str) -> GroupGuard {
    quiet_heap();
    let mut g = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
    while g.current.is_some_and(|m| m != module) {
        g = GROUP_FREE.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.current = Some(module);
    g.running += 1;
    GroupGuard
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let mut g = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        g.running -= 1;
        if g.running == 0 {
            // What this file's tests freed goes back before the next file's run.
            // SAFETY: malloc_trim only takes the allocator's own locks.
            unsafe {
                libc::malloc_trim(0);
            }
            g.current = None;
            GROUP_FREE.notify_all();
        }
    }
}

/// The (device, inode) key of a path, as twofold keys files.
pub fn file_key(path: &Path) -> twofold::sample::FileKey {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    twofold::sample::FileKey::from_dev(m.dev(), m.ino())
}

/// A loopback port free now (for a server the test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `file_id` label of a path (`major:minor:inode`), as the exporter writes it.
pub fn file_id(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    format!(
        "{}:{}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    )
}

/// Starts `python3 -c CODE ARGS...` with piped stdin and stdout and waits for the line
/// `ready` it prints once set up; returns it and its pid (it waits for its stdin to close).
pub fn python_ready(code: &str, args: &[&std::ffi::OsStr]) -> (std::process::Child, i32) {
    use std::io::BufRead;
    let mut c = std::process::Command::new("python3")
        .args(["-c", code])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = c.id() as i32;
    (c, pid)
}
