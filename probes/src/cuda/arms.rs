//! The three endpoint arms on CUDA, timed with CUDA events, and the two copy rates the
//! kernels are judged against (device-to-device, pinned host-to-device).

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{result, sys};

use super::driver::{check, driver_error, Driver, Registered, READ_ONLY};
use super::kernel::Kernel;
use crate::backend::{interleave, prepared, ArmPlan, Observer, PassFn};
use crate::mapping::{align_down, split};
use crate::types::{Arm, ArmRun, ArmsReport, BackendKind, Checksum, CudaDeviceCaps, ReferenceRate};

/// Device memory, freed on drop.
pub(super) struct DevBuf(pub(super) sys::CUdeviceptr);

impl DevBuf {
    pub(super) fn new(bytes: u64) -> Result<DevBuf, String> {
        // SAFETY: plain allocation in the current context.
        unsafe { result::malloc_sync(bytes as usize) }
            .map(DevBuf)
            .map_err(|e| format!("cuMemAlloc({bytes} bytes): {}", driver_error(e)))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`; all work using it was synchronised.
        unsafe {
            let _ = result::free_sync(self.0);
        }
    }
}

struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Event, String> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Event)
            .map_err(|e| format!("cuEventCreate: {}", driver_error(e)))
    }

    fn record(&self, s: sys::CUstream) -> Result<(), String> {
        // SAFETY: event and stream belong to the current context.
        unsafe { result::event::record(self.0, s) }
            .map_err(|e| format!("cuEventRecord: {}", driver_error(e)))
    }

    /// Seconds from `self` to `end`, once `end` has completed.
    fn until(&self, end: &Event) -> Result<f64, String> {
        // SAFETY: both events were recorded; we wait for the later one first.
        unsafe {
            result::event::synchronize(end.0)
                .map_err(|e| format!("cuEventSynchronize: {}", driver_error(e)))?;
            result::event::elapsed(self.0, end.0)
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| format!("cuEventElapsedTime: {}", driver_error(e)))
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`, no longer awaited.
        unsafe {
            let _ = result::event::destroy(self.0);
        }
    }
}

struct Stream(sys::CUstream);

impl Stream {
    fn new() -> Result<Stream, String> {
        result::stream::create(result::stream::StreamKind::NonBlocking)
            .map(Stream)
            .map_err(|e| format!("cuStreamCreate: {}", driver_error(e)))
    }

    fn wait(&self, e: &Event) -> Result<(), String> {
        // SAFETY: both belong to the current context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.0, e.0, 0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `new`; synchronised before dropping.
        unsafe {
            let _ = result::stream::synchronize(self.0);
            let _ = result::stream::destroy(self.0);
        }
    }
}

fn htod_async(dst: sys::CUdeviceptr, src: &[u8], s: sys::CUstream) -> Result<(), String> {
    // SAFETY: `src` stays alive until the stream is synchronised (callers do so before
    // returning), and `dst` has room for `src.len()` bytes.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), s)
    })
}

/// One segment a pass reads: device address, bytes, offset in the working set.
type Segment = (sys::CUdeviceptr, u64, u64);

struct Probe<'a> {
    k: Kernel,
    grid: u32,
    out: DevBuf,
    main: Stream,
    copy: Stream,
    plan: &'a ArmPlan,
}

impl Probe<'_> {
    fn zero(&self) -> Result<(), String> {
        // SAFETY: `out` holds 8 bytes.
        unsafe { result::memset_d8_async(self.out.0, 0, 8, self.main.0) }
            .map_err(|e| format!("cuMemsetD8Async: {}", driver_error(e)))
    }

    fn read(&self) -> Result<Checksum, String> {
        let mut v = [0u32; 2];
        // SAFETY: every launch writing `out` is on `main`, synchronised here first.
        unsafe {
            result::stream::synchronize(self.main.0)
                .map_err(|e| format!("cuStreamSynchronize: {}", driver_error(e)))?;
            result::memcpy_dtoh_sync(&mut v, self.out.0)
                .map_err(|e| format!("cuMemcpyDtoH: {}", driver_error(e)))?;
        }
        Ok(Checksum {
            sum: v[0],
            weighted: v[1],
        })
    }

    fn launch(&self, s: sys::CUstream, seg: Segment) -> Result<(), String> {
        self.k.launch(
            s,
            self.grid,
            seg.0,
            seg.1 / 16,
            (seg.2 / 4) as u32,
            self.out.0,
        )
    }

    /// One pass over fixed segments: seconds and checksum.
    fn kernel_pass(&self, segs: &[Segment]) -> Result<(f64, Checksum), String> {
        self.zero()?;
        let (a, b) = (Event::new()?, Event::new()?);
        a.record(self.main.0)?;
        for s in segs {
            self.launch(self.main.0, *s)?;
        }
        b.record(self.main.0)?;
        let t = a.until(&b)?;
        Ok((t, self.read()?))
    }

    /// One per-use copy pass: chunks copied on `copy` into two device buffers while
    /// `main` reads the previous chunk.
    fn copy_pass(
        &self,
        data: &[u8],
        bufs: &[DevBuf; 2],
        chunk: u64,
    ) -> Result<(f64, Checksum), String> {
        self.zero()?;
        let start = Event::new()?;
        let end = Event::new()?;
        let copied = [Event::new()?, Event::new()?];
        let consumed = [Event::new()?, Event::new()?];
        start.record(self.main.0)?;
        self.copy.wait(&start)?;
        for (i, (off, len)) in split(data.len() as u64, chunk, 16).into_iter().enumerate() {
            let slot = i % 2;
            if i >= 2 {
                self.copy.wait(&consumed[slot])?;
            }
            htod_async(
                bufs[slot].0,
                &data[off as usize..(off + len) as usize],
                self.copy.0,
            )?;
            copied[slot].record(self.copy.0)?;
            self.main.wait(&copied[slot])?;
            self.launch(self.main.0, (bufs[slot].0, len, off))?;
            consumed[slot].record(self.main.0)?;
        }
        end.record(self.main.0)?;
        let t = start.until(&end)?;
        Ok((t, self.read()?))
    }
}

/// Registers the working set (read-only flag first, then default flags), in pieces of
/// at most `limit` bytes.
fn register(d: &Driver, data: &[u8], limit: u64) -> Result<Vec<Registered>, String> {
    let pieces = split(data.len() as u64, align_down(limit, 4096).max(4096), 4096);
    let mut errors = Vec::new();
    for flags in [READ_ONLY, 0] {
        let r: Result<Vec<_>, _> = pieces
            .iter()
            .map(|&(o, l)| d.register(&data[o as usize..(o + l) as usize], flags))
            .collect();
        match r {
            Ok(v) => return Ok(v),
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

fn median_rate(bytes: u64, mut one: impl FnMut() -> Result<f64, String>) -> Result<f64, String> {
    let mut t = (0..5).map(|_| one()).collect::<Result<Vec<_>, _>>()?;
    t.sort_by(f64::total_cmp);
    Ok(bytes as f64 / t[2] / 1e9)
}

fn references(p: &Probe<'_>, data: &[u8], registered: bool) -> Result<Vec<ReferenceRate>, String> {
    let mut out = Vec::new();
    let dsize = (data.len() as u64).min(2 << 30);
    let (a, b) = (DevBuf::new(dsize)?, DevBuf::new(dsize)?);
    let timed = |f: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
        let (s, e) = (Event::new()?, Event::new()?);
        s.record(p.main.0)?;
        f()?;
        e.record(p.main.0)?;
        s.until(&e)
    };
    let d2d = median_rate(dsize, || {
        timed(&|| {
            // SAFETY: both buffers hold `dsize` bytes.
            unsafe { result::memcpy_dtod_async(b.0, a.0, dsize as usize, p.main.0) }
                .map_err(|e| format!("cuMemcpyDtoDAsync: {}", driver_error(e)))
        })
    })?;
    out.push(ReferenceRate {
        what: "device-to-device copy (cuMemcpyDtoD)".into(),
        bytes: dsize,
        gbps: d2d,
    });
    let hsize = (data.len() as u64).min(1 << 30);
    // SAFETY: a pinned host allocation, freed below.
    let host = unsafe { result::malloc_host(hsize as usize, 0) }
        .map_err(|e| format!("cuMemAllocHost: {}", driver_error(e)))?;
    // SAFETY: `host` points to `hsize` bytes we own.
    let hslice = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), hsize as usize) };
    hslice.fill(1);
    let pinned = median_rate(hsize, || timed(&|| htod_async(a.0, hslice, p.main.0)));
    // SAFETY: no copy from `host` is pending (each was timed to completion).
    unsafe {
        let _ = result::free_host(host);
    }
    out.push(ReferenceRate {
        what: "pinned host-to-device copy (cuMemAllocHost)".into(),
        bytes: hsize,
        gbps: pinned?,
    });
    let src = &data[..hsize as usize];
    let mapped = median_rate(hsize, || timed(&|| htod_async(a.0, src, p.main.0)))?;
    out.push(ReferenceRate {
        what: format!(
            "host-to-device copy from the file mapping ({})",
            if registered { "registered" } else { "pageable" }
        ),
        bytes: hsize,
        gbps: mapped,
    });
    Ok(out)
}

pub fn run(
    d: &Driver,
    caps: &CudaDeviceCaps,
    data: &[u8],
    plan: &ArmPlan,
    observe: Observer<'_>,
) -> Result<ArmsReport, String> {
    let bytes = data.len() as u64;
    if bytes == 0 || !bytes.is_multiple_of(16) {
        return Err(format!(
            "working set of {bytes} bytes is not a positive multiple of 16"
        ));
    }
    let p = Probe {
        k: Kernel::load(&caps.compute_capability)?,
        grid: caps.multiprocessors.max(1) * 4,
        out: DevBuf::new(8)?,
        main: Stream::new()?,
        copy: Stream::new()?,
        plan,
    };
    let limit = plan.import_limit.unwrap_or(u64::MAX);
    let reg = register(d, data, limit);
    let reg_detail = match &reg {
        Ok(r) => format!(
            "{} registration(s), flags {:#x}",
            r.len(),
            r.first().map_or(0, |r| r.flags)
        ),
        Err(e) => format!("not registered: {e}"),
    };
    let (device_free, _) = d.mem_info()?;
    let mut arms: Vec<(ArmRun, Option<PassFn<'_>>)> = Vec::new();
    for &arm in &plan.order {
        let mut run = prepared(arm, bytes);
        let f = match arm {
            Arm::Map => map_arm(&p, caps, data, &reg, &mut run),
            Arm::Resident => resident_arm(&p, d, data, &mut run),
            Arm::PerUseCopy => copy_arm(&p, data, &mut run),
        };
        if arm != Arm::Resident {
            let detail = run.detail.take().unwrap_or_default();
            run.detail = Some(format!("{detail}; {reg_detail}"));
        }
        match f {
            Ok(f) => arms.push((run, Some(f))),
            Err(e) => arms.push((ArmRun::failed(arm, bytes, e), None)),
        }
    }
    interleave(plan, &mut arms);
    // Every arm's allocations are still alive: the coexistence check.
    for (run, _) in &mut arms {
        run.resident_fraction_after = observe(run.arm);
    }
    let runs: Vec<ArmRun> = arms.into_iter().map(|(r, _)| r).collect();
    let references = if plan.references {
        references(&p, data, reg.is_ok()).unwrap_or_else(|e| {
            vec![ReferenceRate {
                what: format!("failed: {e}"),
                bytes: 0,
                gbps: 0.0,
            }]
        })
    } else {
        Vec::new()
    };
    drop(reg);
    Ok(ArmsReport {
        backend: BackendKind::Cuda,
        device: caps.name.clone(),
        topology: caps.topology,
        runs,
        references,
        device_free_bytes: Some(device_free),
        kernel: p.k.origin.clone(),
    })
}

fn map_arm<'a>(
    p: &'a Probe<'a>,
    caps: &CudaDeviceCaps,
    data: &'a [u8],
    reg: &Result<Vec<Registered>, String>,
    run: &mut ArmRun,
) -> Result<PassFn<'a>, String> {
    let segs: Vec<Segment> = match reg {
        Ok(regs) => {
            let mut at = 0u64;
            let mut v = Vec::new();
            for r in regs {
                v.push((r.device_ptr()?, r.len as u64, at));
                at += r.len as u64;
            }
            run.detail = Some("kernel reads the registered mapping".into());
            v
        }
        Err(e) if caps.pageable_memory_access => {
            run.detail = Some(format!(
                "kernel reads the pageable mapping (pageableMemoryAccess); registration failed: {e}"
            ));
            vec![(data.as_ptr() as u64, data.len() as u64, 0)]
        }
        Err(e) => {
            return Err(format!(
                "the mapping could not be registered ({e}) and the device cannot read pageable memory (pageableMemoryAccess 0)"
            ))
        }
    };
    run.ranges = segs.len() as u32;
    run.max_range_bytes = segs.iter().map(|s| s.1).max().unwrap_or(0);
    Ok(Box::new(move || p.kernel_pass(&segs)))
}

fn resident_arm<'a>(
    p: &'a Probe<'a>,
    d: &Driver,
    data: &[u8],
    run: &mut ArmRun,
) -> Result<PassFn<'a>, String> {
    let bytes = data.len() as u64;
    let (free, _) = d.mem_info()?;
    if bytes + (256 << 20) > free {
        return Err(format!(
            "a resident copy of {bytes} bytes does not fit in the {free} bytes of free device memory"
        ));
    }
    let buf = DevBuf::new(bytes)?;
    let t = Instant::now();
    htod_async(buf.0, data, p.main.0)?;
    // SAFETY: the stream is ours.
    unsafe { result::stream::synchronize(p.main.0) }
        .map_err(|e| format!("cuStreamSynchronize: {}", driver_error(e)))?;
    run.setup_seconds = Some(t.elapsed().as_secs_f64());
    run.detail = Some("one-time cuMemcpyHtoD into cuMemAlloc memory, kernel reads it".into());
    run.ranges = 1;
    run.max_range_bytes = bytes;
    // `&buf` (not `buf.0`) so the closure owns the allocation, not a copy of its address.
    Ok(Box::new(move || {
        let b = &buf;
        p.kernel_pass(&[(b.0, bytes, 0)])
    }))
}

fn copy_arm<'a>(p: &'a Probe<'a>, data: &'a [u8], run: &mut ArmRun) -> Result<PassFn<'a>, String> {
    let chunk = align_down(p.plan.chunk_bytes.min(data.len() as u64), 16).max(16);
    let bufs = [DevBuf::new(chunk)?, DevBuf::new(chunk)?];
    run.ranges = split(data.len() as u64, chunk, 16).len() as u32;
    run.max_range_bytes = chunk;
    run.detail = Some(format!(
        "cuMemcpyHtoDAsync of {chunk}-byte chunks into two device buffers, overlapped with the kernel"
    ));
    Ok(Box::new(move || p.copy_pass(data, &bufs, chunk)))
}
