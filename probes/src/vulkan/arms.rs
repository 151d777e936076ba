//! The three endpoint arms on Vulkan. Each arm is prepared first (imports, the resident
//! copy, staging buffers), then the passes run interleaved. A pass zeroes the arm's
//! result buffer, dispatches the checksum kernel over each range of at most
//! maxStorageBufferRange bytes, waits, and returns the two sums.

use std::time::Instant;

use ash::vk;

use super::ctx::{Buffer, Ctx, PARAM_STRIDE};
use crate::backend::{interleave, prepared, ArmPlan, Observer, PassFn};
use crate::mapping::{align_down, split};
use crate::types::{Arm, ArmRun, ArmsReport, BackendKind, Checksum, ReferenceRate, Topology};

type Flags = vk::MemoryPropertyFlags;
type Usage = vk::BufferUsageFlags;

/// One dispatch: a buffer range and where it starts in the working set.
struct Range {
    buf: vk::Buffer,
    offset: u64,
    len: u64,
    first_byte: u64,
}

/// Largest bytes bound to one descriptor.
fn range_bytes(ctx: &Ctx<'_>, plan: &ArmPlan) -> u64 {
    let align = ctx.caps.min_storage_buffer_offset_alignment.max(16);
    let limit = plan
        .range_limit
        .unwrap_or(u64::MAX)
        .min(ctx.caps.max_storage_buffer_range);
    align_down(limit, align).max(align)
}

/// Largest bytes in one allocation (import or device-local).
fn alloc_bytes(ctx: &Ctx<'_>, align: u64) -> u64 {
    let max = ctx
        .caps
        .max_memory_allocation_size
        .unwrap_or(1 << 30)
        .min(ctx.caps.max_buffer_size.unwrap_or(u64::MAX));
    align_down(max, align).max(align)
}

/// Copies with a few threads: one core cannot saturate memory bandwidth.
fn par_copy(dst: &mut [u8], src: &[u8]) {
    const PART: usize = 16 << 20;
    if src.len() < 2 * PART {
        dst[..src.len()].copy_from_slice(src);
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let per = src.len().div_ceil(threads).next_multiple_of(4096);
    std::thread::scope(|s| {
        for (d, c) in dst[..src.len()].chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// A host-visible 8-byte buffer the kernel adds its two sums into.
fn result_buffer<'c>(ctx: &'c Ctx<'c>) -> Result<Buffer<'c>, String> {
    ctx.alloc(
        8,
        Usage::STORAGE_BUFFER,
        Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
        Flags::empty(),
    )
}

fn zero(result: &mut Buffer<'_>) {
    if let Some(b) = result.bytes_mut() {
        b[..8].fill(0);
    }
}

fn read(result: &mut Buffer<'_>) -> Checksum {
    let Some(b) = result.bytes_mut() else {
        return Checksum::default();
    };
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    Checksum {
        sum: word(0),
        weighted: word(4),
    }
}

/// A params buffer with one slot per dispatch: (first byte in the working set, bytes).
fn params<'c>(ctx: &'c Ctx<'c>, slots: &[(u64, u64)]) -> Result<Buffer<'c>, String> {
    let size = (slots.len().max(1) as u64) * PARAM_STRIDE;
    let mut p = ctx.alloc(
        size,
        Usage::UNIFORM_BUFFER,
        Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
        Flags::empty(),
    )?;
    let b = p.bytes_mut().ok_or("params buffer is not mapped")?;
    for (i, (first_byte, len)) in slots.iter().enumerate() {
        let at = i * PARAM_STRIDE as usize;
        b[at..at + 4].copy_from_slice(&((first_byte / 4) as u32).to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&((len / 16) as u32).to_le_bytes());
    }
    Ok(p)
}

/// A pass over fixed ranges; `keep` holds the buffers the ranges live in.
fn fixed_ranges<'c>(
    ctx: &'c Ctx<'c>,
    run: &mut ArmRun,
    ranges: Vec<Range>,
    keep: Vec<Buffer<'c>>,
) -> Result<PassFn<'c>, String> {
    let slots: Vec<_> = ranges.iter().map(|r| (r.first_byte, r.len)).collect();
    let p = params(ctx, &slots)?;
    let mut result = result_buffer(ctx)?;
    let pool = ctx.descriptor_pool(ranges.len() as u32)?;
    let sets = ranges
        .iter()
        .map(|r| ctx.set(&pool, (r.buf, r.offset, r.len), &p, &result))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cmd = ctx.command_buffer()?;
    run.ranges = ranges.len() as u32;
    run.max_range_bytes = ranges.iter().map(|r| r.len).max().unwrap_or(0);
    Ok(Box::new(move || {
        let _keep = (&keep, &p, &pool);
        let t = Instant::now();
        zero(&mut result);
        ctx.begin(cmd.cb)?;
        for (i, (set, r)) in sets.iter().zip(&ranges).enumerate() {
            ctx.dispatch(cmd.cb, *set, i as u32, r.len / 16);
        }
        ctx.barrier(
            cmd.cb,
            (
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::AccessFlags::SHADER_WRITE,
            ),
            (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
        );
        ctx.submit(&mut cmd)?;
        ctx.wait(&mut cmd)?;
        let sum = read(&mut result);
        Ok((t.elapsed().as_secs_f64(), sum))
    }))
}

/// Ranges of at most `range` bytes over consecutive buffers holding the working set.
fn ranges_over(bufs: &[(&Buffer<'_>, u64)], range: u64) -> Vec<Range> {
    let mut out = Vec::new();
    for (b, first_byte) in bufs {
        for (off, len) in split(b.size, range, 16) {
            out.push(Range {
                buf: b.buf,
                offset: off,
                len,
                first_byte: first_byte + off,
            });
        }
    }
    out
}

fn map_arm<'c>(
    ctx: &'c Ctx<'c>,
    data: &'c [u8],
    plan: &ArmPlan,
    run: &mut ArmRun,
) -> Result<PassFn<'c>, String> {
    let align = ctx.caps.min_imported_host_pointer_alignment.unwrap_or(4096);
    let max = align_down(
        alloc_bytes(ctx, align).min(plan.import_limit.unwrap_or(u64::MAX)),
        align,
    )
    .max(align);
    let pieces = split(data.len() as u64, max, align);
    let imports = pieces
        .iter()
        .map(|&(off, len)| ctx.import(&data[off as usize..(off + len) as usize]))
        .collect::<Result<Vec<_>, _>>()?;
    let bufs: Vec<_> = imports.iter().zip(&pieces).map(|(b, p)| (b, p.0)).collect();
    let ranges = ranges_over(&bufs, range_bytes(ctx, plan));
    run.detail = Some(format!(
        "kernel reads {} host-pointer import(s) of the mapping",
        imports.len()
    ));
    fixed_ranges(ctx, run, ranges, imports)
}

/// Device-local buffers holding the working set, each with its offset in it.
type Pieces<'c> = Vec<(Buffer<'c>, u64)>;

/// The working set copied once into device-local buffers; returns them and how they
/// were filled.
fn upload<'c>(
    ctx: &'c Ctx<'c>,
    data: &[u8],
    plan: &ArmPlan,
) -> Result<(Pieces<'c>, &'static str), String> {
    let pieces = split(data.len() as u64, alloc_bytes(ctx, 4096), 4096);
    let usage = Usage::STORAGE_BUFFER | Usage::TRANSFER_DST | Usage::TRANSFER_SRC;
    let mut bufs = Vec::new();
    let mut how = "memcpy into mapped device memory";
    let mut staging: Option<Buffer<'c>> = None;
    let mut cmd = ctx.command_buffer()?;
    for (off, len) in pieces {
        let mut b = ctx.alloc(len, usage, Flags::DEVICE_LOCAL, Flags::HOST_VISIBLE)?;
        let src = &data[off as usize..(off + len) as usize];
        if let Some(dst) = b.bytes_mut() {
            par_copy(dst, src);
        } else {
            how = "staging buffer and vkCmdCopyBuffer";
            if staging.is_none() {
                let chunk = plan.chunk_bytes.clamp(1 << 20, 256 << 20);
                staging = Some(ctx.alloc(
                    chunk,
                    Usage::TRANSFER_SRC,
                    Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
                    Flags::DEVICE_LOCAL,
                )?);
            }
            let s = staging.as_mut().ok_or("no staging buffer")?;
            for (c_off, c_len) in split(len, s.size, 16) {
                let dst = s.bytes_mut().ok_or("staging buffer is not mapped")?;
                par_copy(dst, &src[c_off as usize..(c_off + c_len) as usize]);
                ctx.begin(cmd.cb)?;
                let region = vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: c_off,
                    size: c_len,
                };
                ctx.copy(cmd.cb, s.buf, b.buf, region);
                ctx.submit(&mut cmd)?;
                ctx.wait(&mut cmd)?;
            }
        }
        bufs.push((b, off));
    }
    Ok((bufs, how))
}

fn resident_arm<'c>(
    ctx: &'c Ctx<'c>,
    data: &[u8],
    plan: &ArmPlan,
    run: &mut ArmRun,
) -> Result<PassFn<'c>, String> {
    let t = Instant::now();
    let (bufs, how) = upload(ctx, data, plan)?;
    run.setup_seconds = Some(t.elapsed().as_secs_f64());
    run.detail = Some(format!("one-time copy ({how}), kernel reads device memory"));
    let refs: Vec<_> = bufs.iter().map(|(b, off)| (b, *off)).collect();
    let ranges = ranges_over(&refs, range_bytes(ctx, plan));
    let keep = bufs.into_iter().map(|(b, _)| b).collect();
    fixed_ranges(ctx, run, ranges, keep)
}

/// A staging slot of the per-use copy arm.
struct Slot<'c> {
    staging: Buffer<'c>,
    device: Option<Buffer<'c>>,
    set: vk::DescriptorSet,
    cmd: super::ctx::Cmd<'c>,
}

fn per_use_copy_arm<'c>(
    ctx: &'c Ctx<'c>,
    data: &'c [u8],
    plan: &ArmPlan,
    run: &mut ArmRun,
) -> Result<PassFn<'c>, String> {
    let chunk = align_down(plan.chunk_bytes.min(range_bytes(ctx, plan)), 4096).max(4096);
    let chunks = split(data.len() as u64, chunk, 16);
    let p = params(ctx, &chunks)?;
    let mut result = result_buffer(ctx)?;
    let pool = ctx.descriptor_pool(2)?;
    let unified = ctx.caps.topology == Topology::Unified;
    let mut slots = Vec::new();
    for _ in 0..2 {
        let avoid = if unified {
            Flags::empty()
        } else {
            Flags::DEVICE_LOCAL
        };
        let staging = ctx.alloc(
            chunk,
            Usage::STORAGE_BUFFER | Usage::TRANSFER_SRC,
            Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
            avoid,
        )?;
        let device = if unified && staging.flags.contains(Flags::DEVICE_LOCAL) {
            None
        } else {
            Some(ctx.alloc(
                chunk,
                Usage::STORAGE_BUFFER | Usage::TRANSFER_DST,
                Flags::DEVICE_LOCAL,
                Flags::HOST_VISIBLE,
            )?)
        };
        let target = device.as_ref().map_or(staging.buf, |d| d.buf);
        let set = ctx.set(&pool, (target, 0, chunk), &p, &result)?;
        slots.push(Slot {
            staging,
            device,
            set,
            cmd: ctx.command_buffer()?,
        });
    }
    run.ranges = chunks.len() as u32;
    run.max_range_bytes = chunk;
    run.detail = Some(if slots[0].device.is_none() {
        format!("memcpy of {chunk}-byte chunks into device-visible memory, then the kernel")
    } else {
        format!("memcpy of {chunk}-byte chunks into staging, vkCmdCopyBuffer, then the kernel")
    });
    Ok(Box::new(move || {
        let _keep = (&p, &pool);
        let t = Instant::now();
        zero(&mut result);
        for (i, &(off, len)) in chunks.iter().enumerate() {
            let s = &mut slots[i % 2];
            ctx.wait(&mut s.cmd)?;
            let dst = s
                .staging
                .bytes_mut()
                .ok_or("staging buffer is not mapped")?;
            par_copy(dst, &data[off as usize..(off + len) as usize]);
            ctx.begin(s.cmd.cb)?;
            if let Some(d) = &s.device {
                let region = vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: 0,
                    size: len,
                };
                ctx.copy(s.cmd.cb, s.staging.buf, d.buf, region);
                ctx.barrier(
                    s.cmd.cb,
                    (
                        vk::PipelineStageFlags::TRANSFER,
                        vk::AccessFlags::TRANSFER_WRITE,
                    ),
                    (
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::AccessFlags::SHADER_READ,
                    ),
                );
            }
            ctx.dispatch(s.cmd.cb, s.set, i as u32, len / 16);
            ctx.barrier(
                s.cmd.cb,
                (
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::SHADER_WRITE,
                ),
                (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
            );
            ctx.submit(&mut s.cmd)?;
        }
        for s in slots.iter_mut() {
            ctx.wait(&mut s.cmd)?;
        }
        let sum = read(&mut result);
        Ok((t.elapsed().as_secs_f64(), sum))
    }))
}

/// Median seconds of `n` runs of `f`.
fn median_secs(n: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut t = Vec::new();
    for _ in 0..n {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Device-local to device-local and staging to device-local copy rates.
fn references(ctx: &Ctx<'_>, bytes: u64) -> Result<Vec<ReferenceRate>, String> {
    let size = align_down(bytes.min(1 << 30).min(alloc_bytes(ctx, 4096)), 4096).max(4096);
    let usage = Usage::TRANSFER_SRC | Usage::TRANSFER_DST;
    let a = ctx.alloc(size, usage, Flags::DEVICE_LOCAL, Flags::HOST_VISIBLE)?;
    let b = ctx.alloc(size, usage, Flags::DEVICE_LOCAL, Flags::HOST_VISIBLE)?;
    let h = ctx.alloc(
        size,
        usage,
        Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
        Flags::DEVICE_LOCAL,
    )?;
    let mut cmd = ctx.command_buffer()?;
    let mut copy_rate = |src: vk::Buffer, dst: vk::Buffer| {
        median_secs(5, || {
            ctx.begin(cmd.cb)?;
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            };
            ctx.copy(cmd.cb, src, dst, region);
            ctx.submit(&mut cmd)?;
            ctx.wait(&mut cmd)
        })
        .map(|s| size as f64 / s / 1e9)
    };
    let d2d = copy_rate(a.buf, b.buf)?;
    let h2d = copy_rate(h.buf, a.buf)?;
    Ok(vec![
        ReferenceRate {
            what: "device-to-device copy (vkCmdCopyBuffer)".into(),
            bytes: size,
            gbps: d2d,
        },
        ReferenceRate {
            what: "host-to-device copy from host-visible memory (vkCmdCopyBuffer)".into(),
            bytes: size,
            gbps: h2d,
        },
    ])
}

/// The budget (or size) of the largest device-local heap.
fn device_local_budget(ctx: &Ctx<'_>) -> Option<u64> {
    ctx.caps
        .heaps
        .iter()
        .filter(|h| h.device_local)
        .map(|h| h.budget_bytes.unwrap_or(h.size_bytes))
        .max()
}

pub fn run<'c>(
    ctx: &'c Ctx<'c>,
    data: &'c [u8],
    plan: &ArmPlan,
    observe: Observer<'_>,
) -> Result<ArmsReport, String> {
    let bytes = data.len() as u64;
    if bytes == 0 || !bytes.is_multiple_of(16) {
        return Err(format!(
            "working set of {bytes} bytes is not a positive multiple of 16"
        ));
    }
    let device_free_bytes = device_local_budget(ctx);
    let mut arms: Vec<(ArmRun, Option<PassFn<'c>>)> = Vec::new();
    // Set up device allocations before host imports: on NVIDIA's driver (580) a failed
    // host-pointer import made the next 4 GiB device-local allocation of the same
    // device fail too. The passes still run in the plan's (rotated) order.
    let mut setup = plan.order.clone();
    setup.sort_by_key(|a| match a {
        Arm::Resident => 0,
        Arm::PerUseCopy => 1,
        Arm::Map => 2,
    });
    for &arm in &setup {
        let mut run = prepared(arm, bytes);
        let f = match arm {
            Arm::Map => map_arm(ctx, data, plan, &mut run),
            Arm::Resident => resident_arm(ctx, data, plan, &mut run),
            Arm::PerUseCopy => per_use_copy_arm(ctx, data, plan, &mut run),
        };
        match f {
            Ok(f) => arms.push((run, Some(f))),
            Err(e) => arms.push((ArmRun::failed(arm, bytes, e), None)),
        }
    }
    arms.sort_by_key(|(r, _)| plan.order.iter().position(|a| *a == r.arm));
    interleave(plan, &mut arms);
    // Every arm's allocations are still alive: the coexistence check.
    for (run, _) in &mut arms {
        run.resident_fraction_after = observe(run.arm);
    }
    let runs: Vec<ArmRun> = arms.into_iter().map(|(r, _)| r).collect();
    let references = if plan.references {
        references(ctx, bytes).unwrap_or_else(|e| {
            vec![ReferenceRate {
                what: format!("failed: {e}"),
                bytes: 0,
                gbps: 0.0,
            }]
        })
    } else {
        Vec::new()
    };
    Ok(ArmsReport {
        backend: BackendKind::Vulkan,
        device: ctx.caps.name.clone(),
        topology: ctx.caps.topology,
        runs,
        references,
        device_free_bytes,
        kernel: "WGSL via naga (SPIR-V 1.0)".into(),
    })
}
