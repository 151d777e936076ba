//! `twofold __child MODE FILE`: reader processes with a known footprint, for the demo and
//! for tests that need ground truth. Each prints `ready` once its memory is in place and
//! then waits until its stdin closes (so it never outlives its parent), or is killed.

use std::fs::File;

use anyhow::Context;

use crate::cli::{ChildArgs, ChildMode};
use crate::container::convert::Conversion;
use crate::dupes::index::{Convert, CopyKind};

/// One byte touched per 4 KiB touches every page whatever the system's page size.
const PAGE: usize = crate::sample::PAGE_BYTES as usize;

/// `START:LEN` ranges; none means the whole file.
fn parse_ranges(ranges: &[String], file_len: u64) -> anyhow::Result<Vec<(u64, u64)>> {
    if ranges.is_empty() {
        return Ok(vec![(0, file_len)]);
    }
    ranges
        .iter()
        .map(|r| {
            let (a, b) = r
                .split_once(':')
                .with_context(|| format!("range '{r}' is not START:LEN"))?;
            let (a, b): (u64, u64) = (a.parse()?, b.parse()?);
            if a.checked_add(b).is_none_or(|e| e > file_len) {
                anyhow::bail!("range '{r}' is past the end of the file");
            }
            Ok((a, b))
        })
        .collect()
}

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and changes only this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

fn touch_read(bytes: &[u8]) -> u64 {
    let mut sum = 0u64;
    for chunk in bytes.chunks(PAGE) {
        sum = sum.wrapping_add(u64::from(chunk[0]));
    }
    std::hint::black_box(sum)
}

/// `bytes` of anonymous memory: pseudo-random, or one byte touched per page.
fn extra_anon(bytes: u64, random: bool) -> Vec<u8> {
    let mut v = vec![0u8; bytes as usize];
    // Base pages, whatever the host's transparent-huge-page setting: a test counts the
    // faults and pages of this memory (with THP "always", one fault maps 2 MiB).
    let sys = crate::collect::system::page_size() as usize;
    let start = (v.as_mut_ptr() as usize).next_multiple_of(sys);
    let end = (v.as_ptr() as usize + v.len()) / sys * sys;
    if end > start {
        // SAFETY: advice on whole pages inside our own allocation; it changes no contents.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_NOHUGEPAGE,
            );
        }
    }
    if random {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for w in v.chunks_exact_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            w.copy_from_slice(&s.to_le_bytes());
        }
    } else {
        for i in (0..v.len()).step_by(PAGE) {
            v[i] = 1;
        }
    }
    std::hint::black_box(v)
}

/// Writes `ready` on stdout with a raw write (no buffer to allocate after it).
fn report_ready() -> anyhow::Result<()> {
    let ready = b"ready\n";
    // SAFETY: fd 1 is open for the life of the process; the buffer is valid.
    let n = unsafe { libc::write(1, ready.as_ptr().cast(), ready.len()) };
    if n != ready.len() as isize {
        anyhow::bail!(
            "cannot report readiness: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// `--go`: says `armed`, then blocks until a line (or EOF) arrives on stdin.
fn wait_for_go() -> anyhow::Result<()> {
    let armed = b"armed\n";
    let mut byte = [0u8; 1];
    // SAFETY: fds 1 and 0 are open for the life of the process; the buffers are valid.
    unsafe {
        if libc::write(1, armed.as_ptr().cast(), armed.len()) != armed.len() as isize {
            anyhow::bail!(
                "cannot report being armed: {}",
                std::io::Error::last_os_error()
            );
        }
        while libc::read(0, byte.as_mut_ptr().cast(), 1) == 1 && byte[0] != b'\n' {}
    }
    Ok(())
}

pub fn run(args: &ChildArgs) -> anyhow::Result<()> {
    die_with_parent();
    // cuda-load waits after creating its CUDA context instead (see `cuda_load`).
    if args.go && args.mode != ChildMode::CudaLoad {
        wait_for_go()?;
    }
    let file_arg = || {
        args.file
            .as_ref()
            .context("this child mode needs a FILE argument")
    };
    // Kept alive until the end of the function.
    let mut _keep_file: Option<File> = None;
    let mut _keep_heap: Option<Vec<u8>> = None;
    let mut _keep_extra: Option<Vec<u8>> = None;
    let mut _keep_map: Option<memmap2::MmapMut> = None;
    let mut _keep_ro: Option<memmap2::Mmap> = None;
    let mut _keep_device: Option<DeviceHeld> = None;
    match args.mode {
        ChildMode::CudaLoad => {
            let held = cuda_load(file_arg()?, args.gpu, args.go)?;
            if !args.free_host {
                _keep_heap = Some(held.1);
            }
            _keep_device = Some(held.0);
        }
        ChildMode::Copy | ChildMode::Widen => {
            let path = file_arg()?;
            let f =
                File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
            let len = f.metadata()?.len();
            let ranges = parse_ranges(&args.ranges, len)?;
            let kind = match (args.mode, args.dtype.as_str()) {
                (ChildMode::Copy, _) => CopyKind::Identical,
                (_, "f16") => CopyKind::WidenedF16,
                (_, "bf16") => CopyKind::WidenedBf16,
                (_, other) => serde_json::from_value::<Conversion>(other.into())
                    .map(CopyKind::from)
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "unknown --dtype '{other}' (f16, bf16 or a conversion: f32_to_f16, bf16_to_f16, ...)"
                        )
                    })?,
            };
            let total: u64 = ranges
                .iter()
                .map(|r| kind.mem_bytes(r.1).next_multiple_of(16))
                .sum();
            let mut buf = vec![0u8; args.offset + total as usize];
            let mut at = args.offset;
            let mut src = Vec::new();
            let mut out = Vec::new();
            for (start, n) in ranges {
                let read_err = || format!("cannot read '{}'", path.display());
                if kind == CopyKind::Identical {
                    // Straight into the heap buffer: exactly one private copy.
                    let dst = &mut buf[at..at + n as usize];
                    std::os::unix::fs::FileExt::read_exact_at(&f, dst, start)
                        .with_context(read_err)?;
                    at += (n as usize).next_multiple_of(16);
                    continue;
                }
                src.resize(n as usize, 0);
                std::os::unix::fs::FileExt::read_exact_at(&f, &mut src, start)
                    .with_context(read_err)?;
                kind.convert(&src, &mut out);
                buf[at..at + out.len()].copy_from_slice(&out);
                at += out.len().next_multiple_of(16);
            }
            _keep_heap = Some(buf);
            if !args.close {
                _keep_file = Some(f);
            }
            _keep_extra = Some(extra_anon(args.bytes, args.random));
        }
        ChildMode::Map => {
            let path = file_arg()?;
            let f =
                File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
            // SAFETY: read-only shared mapping of a file this test owns; it is not truncated
            // while we read it during setup.
            let map = unsafe { memmap2::Mmap::map(&f) }.context("mmap failed")?;
            touch_read(&map);
            _keep_ro = Some(map);
            _keep_file = Some(f);
        }
        ChildMode::MapLoop => {
            let path = file_arg()?;
            let f =
                File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
            // SAFETY: a read-only mapping (shared, or private and never written) of a file
            // the campaign never truncates.
            let map = unsafe {
                if args.private {
                    memmap2::MmapOptions::new().map_copy_read_only(&f)
                } else {
                    memmap2::Mmap::map(&f)
                }
            }
            .context("mmap failed")?;
            let stats_path = args.stats.as_ref().context("map-loop needs --stats FILE")?;
            let mut stats = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(stats_path)
                .with_context(|| format!("cannot open '{}'", stats_path.display()))?;
            touch_read(&map);
            report_ready()?;
            let start = std::time::Instant::now();
            loop {
                let t = std::time::Instant::now();
                touch_read(&map);
                use std::io::Write;
                let _ = writeln!(
                    stats,
                    "{:.3} {:.3}",
                    start.elapsed().as_secs_f64(),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
        }
        ChildMode::PrivateWrite => {
            let path = file_arg()?;
            let f =
                File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
            // SAFETY: a private copy-on-write mapping: writes never reach the file.
            let mut map =
                unsafe { memmap2::MmapOptions::new().map_copy(&f) }.context("mmap failed")?;
            touch_read(&map);
            let n = (args.bytes as usize).min(map.len());
            for i in (0..n).step_by(PAGE) {
                map[i] = map[i].wrapping_add(1);
            }
            _keep_map = Some(map);
            _keep_file = Some(f);
        }
        ChildMode::Anon => {
            // With a FILE, hold it open (without reading it) beside the anonymous memory.
            if let Some(path) = &args.file {
                _keep_file = Some(
                    File::open(path)
                        .with_context(|| format!("cannot open '{}'", path.display()))?,
                );
            }
            _keep_heap = Some(extra_anon(args.bytes, args.random));
            if args.touch_loop {
                report_ready()?;
                loop {
                    if let Some(v) = _keep_heap.as_mut() {
                        for i in (0..v.len()).step_by(PAGE) {
                            v[i] = v[i].wrapping_add(1);
                        }
                        std::hint::black_box(&v);
                    }
                }
            }
        }
    }
    if args.drift {
        return drift(_keep_heap.as_mut());
    }
    let mut kv = (args.kv > 0).then(|| extra_anon(args.kv, true));
    fork_workers(args.fork)?;
    if let Some(kv) = kv.as_mut() {
        return kv_loop(kv, args.kv_rate);
    }
    // Raw fds from here on: nothing may allocate or touch new memory after `ready`, so
    // the footprint a test measures is the one it set up.
    let mut sink = [0u8; 64];
    let stat = std::fs::File::open("/proc/self/stat")?;
    report_ready()?;
    if args.io_loop {
        return io_loop(&stat, _keep_extra.as_mut(), &mut sink);
    }
    // Wait for the parent: EOF (or an error) on stdin.
    if args.exit_after_ms.is_none() {
        // SAFETY: fd 0 is open for the life of the process; the buffer is valid.
        while unsafe { libc::read(0, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
    }
    if let Some(ms) = args.exit_after_ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    drop(_keep_device);
    Ok(())
}

/// `--io-loop`: until stdin closes, every 100 ms a read of /proc/self/stat (rchar grows)
/// and a rewrite in place of the first byte of each page of `heap` (nothing faulted in).
fn io_loop(stat: &File, mut heap: Option<&mut Vec<u8>>, sink: &mut [u8; 64]) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) };
        if n > 0 {
            // SAFETY: fd 0 is open; the buffer is valid.
            if unsafe { libc::read(0, sink.as_mut_ptr().cast(), sink.len()) } <= 0 {
                return Ok(());
            }
            continue;
        }
        // SAFETY: the fd is open and the buffer valid for its length.
        unsafe { libc::pread(stat.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len(), 0) };
        if let Some(v) = heap.as_deref_mut() {
            for i in (0..v.len()).step_by(PAGE) {
                v[i] = v[i].wrapping_add(1);
            }
            std::hint::black_box(&v);
        }
    }
}

/// `--drift`: says `ready`, then touches a new page every 50 ms (every 12.8 s the pages
/// touched are freed and touching starts again) and zeroes `copy` on each line from
/// stdin, until stdin closes.
fn drift(mut copy: Option<&mut Vec<u8>>) -> anyhow::Result<()> {
    const RESERVE: usize = 512 << 20;
    // One touch per 2 MiB: each maps new memory, also where transparent huge pages are
    // "always" (a 4 KiB step would stay inside one huge page for 25 s).
    const STEP: usize = 2 << 20;
    let mut reserve: Vec<u8> = Vec::with_capacity(RESERVE);
    let mut touched = 0usize;
    let mut sink = [0u8; 64];
    report_ready()?;
    loop {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd; fd 0 is open for the life of the process.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 50) };
        if ready > 0 {
            // SAFETY: as above; the buffer is valid.
            let n = unsafe { libc::read(0, sink.as_mut_ptr().cast(), sink.len()) };
            if n <= 0 {
                return Ok(());
            }
            if sink[..n as usize].contains(&b'\n') {
                if let Some(c) = copy.as_deref_mut() {
                    c.fill(0);
                    std::hint::black_box(&c);
                }
            }
        } else {
            if touched + STEP > RESERVE {
                // All touched: freed and reserved again, so the memory keeps moving.
                drop(std::mem::take(&mut reserve));
                reserve = Vec::with_capacity(RESERVE);
                touched = 0;
            }
            // SAFETY: within the reserved capacity; the byte is written before any read.
            unsafe { reserve.as_mut_ptr().add(touched).write_volatile(1) };
            touched += STEP;
        }
    }
}

/// `--fork N`: N children that keep everything set up so far (copy-on-write), set their
/// own parent-death signal and wait for stdin to close. They touch no memory.
fn fork_workers(n: u32) -> anyhow::Result<()> {
    for _ in 0..n {
        // SAFETY: this process is single-threaded here; the child calls only
        // async-signal-safe functions (prctl, read, _exit) before it exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            anyhow::bail!("fork failed: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            let mut sink = [0u8; 64];
            // SAFETY: as above; fd 0 is open; the buffer is on this stack.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                while libc::read(0, sink.as_mut_ptr().cast(), sink.len()) > 0 {}
                libc::_exit(0);
            }
        }
    }
    Ok(())
}

/// `--kv`: says `ready`, then rewrites `rate` percent of `kv` per second (paced every
/// 100 ms by the clock, cycling through the buffer) with new pseudo-random words, until
/// stdin closes.
fn kv_loop(kv: &mut [u8], rate: f64) -> anyhow::Result<()> {
    let per_sec = kv.len() as f64 * rate.max(0.0) / 100.0;
    let start = std::time::Instant::now();
    let (mut done, mut at) = (0u64, 0usize);
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let mut sink = [0u8; 64];
    report_ready()?;
    loop {
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd; fd 0 is open for the life of the process.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) } > 0 {
            // SAFETY: as above; the buffer is valid.
            if unsafe { libc::read(0, sink.as_mut_ptr().cast(), sink.len()) } <= 0 {
                return Ok(());
            }
        }
        let due = (start.elapsed().as_secs_f64() * per_sec) as u64;
        let mut left = due.saturating_sub(done) as usize / 8 * 8;
        done += left as u64;
        while left > 0 {
            let n = left.min(kv.len() - at);
            for w in kv[at..at + n].chunks_exact_mut(8) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                w.copy_from_slice(&s.to_le_bytes());
            }
            std::hint::black_box(&kv[at..at + n]);
            at = (at + n) % kv.len();
            left -= n;
        }
    }
}

/// A device copy held by this process, and its attestation (removed on drop).
struct DeviceHeld {
    _copy: twofold_probes::cuda::loader::DeviceCopy,
    attestation: std::path::PathBuf,
}

impl Drop for DeviceHeld {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.attestation);
    }
}

/// Reads `path` into the heap, copies it to device `gpu`, reads the device bytes back and
/// compares their xxh3 with the file's, then writes the attestation.
/// The file is closed once read, as runtimes that read() weights do. With `go`, says
/// `armed` once its CUDA context exists and waits for a line before the upload, so that a
/// test can see the device memory of the context alone.
fn cuda_load(path: &std::path::Path, gpu: i32, go: bool) -> anyhow::Result<(DeviceHeld, Vec<u8>)> {
    use crate::collect::gpu::{attest_dir, Attestation};
    use crate::sample::{DeviceProofSample, FileKey};
    use std::os::unix::fs::MetadataExt;
    use xxhash_rust::xxh3::Xxh3;
    const CHUNK: usize = 64 << 20;
    let mut f = File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
    let meta = f.metadata()?;
    let mut heap = Vec::with_capacity(meta.len() as usize);
    std::io::Read::read_to_end(&mut f, &mut heap)
        .with_context(|| format!("cannot read '{}'", path.display()))?;
    drop(f);
    let file_xxh3 = xxhash_rust::xxh3::xxh3_64(&heap);
    let cuda = |e: String| anyhow::anyhow!("CUDA device {gpu}: {e}");
    let loader = twofold_probes::cuda::loader::Loader::open(gpu).map_err(cuda)?;
    if go {
        wait_for_go()?;
    }
    let copy = loader.upload(&heap, CHUNK).map_err(cuda)?;
    let mut h = Xxh3::new();
    copy.read_back(CHUNK, |b| h.update(b)).map_err(cuda)?;
    let device_xxh3 = h.digest();
    if device_xxh3 != file_xxh3 {
        anyhow::bail!("CUDA device {gpu}: the bytes read back differ from the file");
    }
    let pid = std::process::id() as i32;
    let proc_root = std::path::Path::new("/proc");
    let start_ticks = crate::cleanup::leftovers::start_time(proc_root, pid)
        .context("cannot read this process's start time")?;
    let mut gpu_uuid = None;
    if let Ok(devs) = crate::collect::gpu::NvmlSource::open().devices_by_bus() {
        let bus = copy
            .pci_bus_id
            .as_deref()
            .map(crate::collect::gpu::normal_bus_id);
        gpu_uuid = devs
            .into_iter()
            .find(|(b, _)| Some(b) == bus.as_ref())
            .map(|(_, u)| u);
    }
    let a = Attestation {
        proof: DeviceProofSample {
            pid,
            file: FileKey::from_dev(meta.dev(), meta.ino()),
            gpu_uuid,
            file_bytes: copy.bytes,
            device_bytes: copy.device_bytes,
            file_xxh3: format!("{file_xxh3:016x}"),
            device_xxh3: format!("{device_xxh3:016x}"),
        },
        start_ticks,
    };
    let dir = attest_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
    let attestation = dir.join(format!("twofold-{pid}-s{start_ticks}.json"));
    std::fs::write(&attestation, serde_json::to_vec_pretty(&a)?)
        .with_context(|| format!("cannot write '{}'", attestation.display()))?;
    Ok((
        DeviceHeld {
            _copy: copy,
            attestation,
        },
        heap,
    ))
}
