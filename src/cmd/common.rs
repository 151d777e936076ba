//! Pieces several commands share, so that no command calls another: one snapshot and
//! its report rendered as `scan` prints it, the recording store as the commands open it,
//! the stop flag of the long-running ones, the sandbox checks of the campaigns and the
//! synthetic model of `demo` and `__bench`.

use crate::sample::{Warning, WarningKind};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::campaign::sandbox::{check_limit, host_memory};
use crate::cli::SandboxArgs;
use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use crate::engine::{self, Engine, Snapshot};
use crate::model::Report;
use crate::render;
use crate::store::Store;

/// One snapshot through the engine; with `trace`, the eBPF counters of a traced window
/// of that length go into it (a warning, and none, when tracing is impossible).
pub fn snapshot(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: TraceWindow,
    warnings: &mut Vec<Warning>,
) -> anyhow::Result<Snapshot> {
    let mut engine = Engine::new(req.clone(), prove);
    let (flag, what, d, started) = match trace {
        TraceWindow::Off => return engine.snapshot(warnings),
        TraceWindow::All(d) => ("--trace", "", d, engine.trace_once()),
        TraceWindow::Uploads(d) => (
            "--trace-uploads",
            " (uploads to GPUs only)",
            d,
            engine.set_upload_tracing(),
        ),
    };
    match started {
        Ok(()) => {
            // Progress, on stderr: also tells a caller when the window starts.
            eprintln!("twofold: tracing for {:.1} s{what}", d.as_secs_f64());
            std::thread::sleep(d);
        }
        Err(e) => warnings.push(Warning::host(
            WarningKind::Trace,
            format!("{flag}: {e}; the scan goes on without it"),
        )),
    }
    engine.snapshot(warnings)
}

/// A window of eBPF tracing before a one-shot snapshot: everything `trace` counts (and the
/// uploads), or the uploads to GPUs alone.
#[derive(Debug, Clone, Copy)]
pub enum TraceWindow {
    Off,
    All(std::time::Duration),
    Uploads(std::time::Duration),
}

/// collect → byte-level proof of the candidates' copies (unless `prove` is `None`) →
/// model, on the live system; warnings go to stderr.
pub fn report(
    req: &Request,
    prove: Option<ProveOptions>,
    trace: TraceWindow,
) -> anyhow::Result<Report> {
    let mut warnings = Vec::new();
    let snap = snapshot(req, prove, trace, &mut warnings)?;
    let report = engine::report(&snap, None);
    super::warn_all(&warnings);
    Ok(report)
}

/// Renders a report as `scan` does.
pub fn render_report(report: &Report, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    if json {
        render::json(out, report)?;
    } else {
        out.write_all(render::safe::terminal(&render::scan::human(report)).as_bytes())?;
    }
    Ok(())
}

/// Where recordings go unless `--store` says: `/var/lib/twofold/store` as root, else
/// `$XDG_DATA_HOME/twofold/store` (`~/.local/share/twofold/store`).
pub fn default_store() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/twofold/store");
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("twofold/store")
}

pub fn store_dir(arg: &Option<PathBuf>) -> PathBuf {
    arg.clone().unwrap_or_else(default_store)
}

pub fn warn_damage(lines: &[String]) {
    super::warn_all(lines);
}

/// Opens a store for reading (never taking a recorder's lock, never changing it).
pub fn open_read(arg: &Option<PathBuf>) -> anyhow::Result<Store> {
    let (store, damage) = open_read_quiet(arg)?;
    warn_damage(&damage);
    Ok(store)
}

/// [`open_read`], handing back the damage found rather than printing it (`top` shows it
/// in its status line: stderr would land over its screen).
pub fn open_read_quiet(arg: &Option<PathBuf>) -> anyhow::Result<(Store, Vec<String>)> {
    let dir = store_dir(arg);
    let header = dir.join("store.json");
    match std::fs::metadata(&header) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no recording store at '{}'", dir.display())
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            bail!("the store '{}' is not a directory", dir.display())
        }
        Err(e) => return Err(store_error(&dir, &header, e)),
    }
    Store::open_read_only(&dir).map_err(|e| open_error(&dir, e))
}

/// The error of opening the store `dir`: one denied access names the file, its owner and
/// mode, and who may (`cannot open the store 'S': permission denied on 'S/store.json'
/// (mode 0600, owner uid 0): run as its owner or as root`).
pub fn open_error(dir: &Path, e: crate::store::StoreError) -> anyhow::Error {
    match e {
        crate::store::StoreError::Io { path, source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied
                || source.raw_os_error() == Some(libc::EROFS) =>
        {
            store_error(dir, &path, source)
        }
        e => anyhow::Error::from(e).context(format!("cannot open the store '{}'", dir.display())),
    }
}

/// [`open_error`] of an I/O error met on `path` in the store `dir`.
fn store_error(dir: &Path, path: &Path, e: std::io::Error) -> anyhow::Error {
    let head = format!("cannot open the store '{}'", dir.display());
    if e.raw_os_error() == Some(libc::EROFS) {
        return anyhow::anyhow!("{head}: '{}' is on a read-only file system", path.display());
    }
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return anyhow::Error::from(e)
            .context(format!("{head}: cannot access '{}'", path.display()));
    }
    // The nearest of the path and its parents that can be looked at: the one in the way.
    use std::os::unix::fs::MetadataExt;
    let owner = path
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok().map(|m| (p, m)))
        .map(|(p, m)| {
            let (mode, uid) = (m.mode() & 0o7777, m.uid());
            if p == path {
                format!(" (mode {mode:04o}, owner uid {uid})")
            } else {
                format!(" ('{}' is mode {mode:04o}, owner uid {uid})", p.display())
            }
        })
        .unwrap_or_default();
    anyhow::anyhow!(
        "{head}: permission denied on '{}'{owner}: run as its owner or as root",
        path.display()
    )
}

/// A recorded snapshot: any version up to this build's (a version-1 one has no trace).
pub fn decode(payload: &[u8]) -> anyhow::Result<Snapshot> {
    let snap: Snapshot =
        serde_json::from_slice(payload).context("a recorded snapshot does not parse")?;
    if snap.version > engine::SNAPSHOT_VERSION {
        bail!(
            "a snapshot of version {} was recorded by a newer twofold (this one reads up to {})",
            snap.version,
            engine::SNAPSHOT_VERSION
        );
    }
    Ok(snap)
}

/// Appends one snapshot to an open store, its JSON written into `buf` (kept by a
/// recorder from one snapshot to the next: about 1 MiB, grown once rather than every time).
pub fn append(store: &mut Store, snap: &Snapshot, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    buf.clear();
    serde_json::to_writer(&mut *buf, snap)?;
    store.append(snap.at_unix_ns, buf)?;
    store.flush()?;
    Ok(())
}

/// `scan --record DIR`: appends the scan's snapshot.
pub fn append_to(dir: &Path, snap: &Snapshot) -> anyhow::Result<()> {
    let (mut store, damage) = Store::open_or_create(dir).map_err(|e| open_error(dir, e))?;
    warn_damage(&damage);
    append(&mut store, snap, &mut Vec::new())
}

/// The report of the recorded snapshot nearest `at`, with rates from the one before.
pub fn replayed(store: &Store, at_ns: u64) -> anyhow::Result<Report> {
    let mut damage = Vec::new();
    let r = replayed_quiet(store, at_ns, &mut damage);
    warn_damage(&damage);
    r
}

/// [`replayed`], appending the damage the store found to `damage` rather than printing it.
pub fn replayed_quiet(
    store: &Store,
    at_ns: u64,
    damage: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let Some(frame) = store.nearest(at_ns)? else {
        bail!("the store '{}' holds no snapshot", store.dir().display());
    };
    let snap = decode(&frame.payload)?;
    let prev = match store.before(frame.at_ns)? {
        Some(f) => Some(decode(&f.payload)?),
        None => None,
    };
    damage.extend(store.take_damage());
    Ok(engine::report(&snap, prev.as_ref()))
}

/// Set on SIGINT or SIGTERM: a long-running command stops at its next check (and, say,
/// flushes or prints its summary first).
pub fn stop_flag() -> Arc<AtomicBool> {
    crate::collect::stop::watch_signals(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    stop
}

/// Waits for a deadline or for SIGINT/SIGTERM, whichever comes first, without waking in
/// between (a loop that sleeps 50 ms at a time to look at a flag wakes 20 times a second
/// for nothing). The signals also set the [`stop_flag`]s registered for them.
pub struct StopWait {
    rx: std::os::unix::net::UnixStream,
}

impl StopWait {
    /// `None` where the signals cannot be routed to a socket (the caller sleeps in steps).
    pub fn new() -> Option<StopWait> {
        let (rx, tx) = std::os::unix::net::UnixStream::pair().ok()?;
        rx.set_nonblocking(true).ok()?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::low_level::pipe::register(sig, tx.try_clone().ok()?).ok()?;
        }
        Some(StopWait { rx })
    }

    /// Sleeps until `deadline` or a signal; true when a signal came.
    pub fn until(&self, deadline: std::time::Instant) -> bool {
        use std::os::fd::AsRawFd;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut fds = [libc::pollfd {
                fd: self.rx.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
            if n > 0 {
                return true;
            }
            // 0: timed out (the loop checks the deadline); -1: EINTR, poll again.
        }
    }
}

/// Sleeps until `deadline` or until `stop` is set: through `wait` where there is one
/// (no wake-ups between), else in steps of 50 ms. True when stopped.
pub fn sleep_until(
    wait: Option<&StopWait>,
    stop: &AtomicBool,
    deadline: std::time::Instant,
) -> bool {
    use std::sync::atomic::Ordering;
    match wait {
        Some(w) => w.until(deadline) || stop.load(Ordering::Relaxed),
        None => {
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                std::thread::sleep(std::time::Duration::from_millis(50).min(left));
            }
            stop.load(Ordering::Relaxed)
        }
    }
}

/// The limit to use: the one given, else a quarter of MemAvailable; either way refused
/// above MemAvailable minus the margin (one rule for every campaign).
pub fn memory_max(args: &SandboxArgs) -> anyhow::Result<u64> {
    let (avail, total) = host_memory(Path::new("/proc"))?;
    let limit = args.memory_max.unwrap_or(avail / 4);
    check_limit(limit, avail, total)?;
    Ok(limit)
}

/// Checks the sandbox flags before anything starts: the memory limit, and that `--out`
/// is a directory or can become one. Returns the limit.
pub fn check_sandbox(args: &SandboxArgs) -> anyhow::Result<u64> {
    if let Some(dir) = &args.out {
        if let Ok(meta) = std::fs::metadata(dir) {
            if !meta.is_dir() {
                anyhow::bail!("--out '{}' exists and is not a directory", dir.display());
            }
        }
    }
    memory_max(args)
}

/// Checks `--model` and every `--watch` before anything starts: each must be a regular
/// file (a FIFO would block the sampler, a directory has no residency).
pub fn check_inputs(model: Option<&Path>, watch: &[std::path::PathBuf]) -> anyhow::Result<()> {
    if let Some(m) = model {
        crate::input::check_regular(m, "--model")?;
    }
    for w in watch {
        crate::input::check_regular(w, "--watch")?;
    }
    Ok(())
}

/// Bytes per tensor in the synthetic model (F16 [2048, 2048]).
const TENSOR_BYTES: u64 = 2048 * 2048 * 2;

/// Writes a valid safetensors file of about `size` bytes: F16 tensors of pseudo-random
/// data (so no page is all zeros), header padded to 8 bytes as the format requires.
pub fn write_safetensors(path: &Path, size: u64) -> anyhow::Result<u64> {
    let n = (size / TENSOR_BYTES).max(1);
    let mut header = String::from(r#"{"__metadata__":{"format":"pt","generator":"twofold demo"}"#);
    for i in 0..n {
        let (a, b) = (i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES);
        header.push_str(&format!(
            r#","layers.{i}.weight":{{"dtype":"F16","shape":[2048,2048],"data_offsets":[{a},{b}]}}"#
        ));
    }
    header.push('}');
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let file = std::fs::File::create_new(path)
        .with_context(|| format!("cannot create '{}'", path.display()))?;
    let write_err = || format!("cannot write '{}'", path.display());
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .with_context(write_err)?;
    w.write_all(header.as_bytes()).with_context(write_err)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = n * TENSOR_BYTES;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            // xorshift64*: cheap, deterministic, never all-zero.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let take = left.min(block.len() as u64) as usize;
        w.write_all(&block[..take]).with_context(write_err)?;
        left -= take as u64;
    }
    // Write back now: a just-written file's pages are dirty page cache, which smaps shows
    // as Private_Dirty of the mapping reader and would blur the clean/dirty split.
    w.into_inner()
        .map_err(|e| e.into_error())
        .with_context(write_err)?
        .sync_all()
        .with_context(|| format!("cannot sync '{}'", path.display()))?;
    Ok(8 + header.len() as u64 + n * TENSOR_BYTES)
}
