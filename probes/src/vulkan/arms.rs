//! The three endpoint arms on Vulkan. Every pass zeroes the result buffer, dispatches
//! the checksum kernel over each range of at most maxStorageBufferRange bytes, waits,
//! and compares the two sums with the CPU's.

use std::time::Instant;

use ash::vk;

use super::ctx::{Buffer, Ctx, PARAM_STRIDE};
use crate::backend::{ArmPlan, Observer};
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

struct Shared<'c> {
    result: Buffer<'c>,
}

impl<'c> Shared<'c> {
    fn zero(&mut self) {
        if let Some(b) = self.result.bytes_mut() {
            b[..8].fill(0);
        }
    }

    fn read(&mut self) -> Checksum {
        let Some(b) = self.result.bytes_mut() else {
            return Checksum::default();
        };
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Checksum {
            sum: word(0),
            weighted: word(4),
        }
    }
}

/// A params buffer with one slot per dispatch.
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

/// Runs warm-up and timed passes of `one`; fills the timing and checksum fields of `run`.
fn passes(
    plan: &ArmPlan,
    run: &mut ArmRun,
    mut one: impl FnMut() -> Result<Checksum, String>,
) -> Result<(), String> {
    run.checksums_ok = true;
    for i in 0..plan.warmup + plan.passes {
        let t = Instant::now();
        let got = one()?;
        let secs = t.elapsed().as_secs_f64();
        if got != plan.expected && run.checksums_ok {
            run.checksums_ok = false;
            run.device_checksum = Some(got);
            run.error = Some(format!(
                "pass {i}: device checksum {got} differs from the CPU's {}",
                plan.expected
            ));
        } else if run.checksums_ok {
            run.device_checksum = Some(got);
        }
        if i >= plan.warmup {
            run.pass_seconds.push(secs);
        }
    }
    Ok(())
}

/// Records and submits one pass over fixed ranges; returns the checksum.
fn dispatch_pass(
    ctx: &Ctx<'_>,
    shared: &mut Shared<'_>,
    sets: &[vk::DescriptorSet],
    ranges: &[Range],
    cmd: (vk::CommandBuffer, vk::Fence),
) -> Result<Checksum, String> {
    shared.zero();
    ctx.begin(cmd.0)?;
    for (i, (set, r)) in sets.iter().zip(ranges).enumerate() {
        ctx.dispatch(cmd.0, *set, i as u32, r.len / 16);
    }
    ctx.barrier(
        cmd.0,
        (
            vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::AccessFlags::SHADER_WRITE,
        ),
        (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
    );
    ctx.submit(cmd.0, cmd.1)?;
    ctx.wait(cmd.1)?;
    Ok(shared.read())
}

/// Descriptor sets for `ranges`, timed passes, and the run record.
fn fixed_ranges(
    ctx: &Ctx<'_>,
    shared: &mut Shared<'_>,
    plan: &ArmPlan,
    arm: Arm,
    ranges: &[Range],
) -> Result<ArmRun, String> {
    let bytes = ranges.iter().map(|r| r.len).sum();
    let slots: Vec<_> = ranges.iter().map(|r| (r.first_byte, r.len)).collect();
    let p = params(ctx, &slots)?;
    let pool = ctx.descriptor_pool(ranges.len() as u32)?;
    let result = (|| {
        let sets = ranges
            .iter()
            .map(|r| ctx.set(pool, (r.buf, r.offset, r.len), &p, &shared.result))
            .collect::<Result<Vec<_>, _>>()?;
        let cmd = ctx.command_buffer()?;
        let mut run = ArmRun::failed(arm, bytes, "");
        run.error = None;
        run.ranges = ranges.len() as u32;
        run.max_range_bytes = ranges.iter().map(|r| r.len).max().unwrap_or(0);
        let r = passes(plan, &mut run, || {
            dispatch_pass(ctx, shared, &sets, ranges, cmd)
        });
        ctx.destroy_fence(cmd.1);
        r.map(|()| run)
    })();
    ctx.destroy_pool(pool);
    result
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

fn map_arm(
    ctx: &Ctx<'_>,
    shared: &mut Shared<'_>,
    data: &[u8],
    plan: &ArmPlan,
    observe: Observer<'_>,
) -> Result<ArmRun, String> {
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
    let mut run = fixed_ranges(ctx, shared, plan, Arm::Map, &ranges)?;
    run.detail = Some(format!("{} host-pointer import(s)", imports.len()));
    run.resident_fraction_after = observe(Arm::Map);
    Ok(run)
}

/// Device-local buffers holding the working set (each with its offset in it), the
/// seconds the one-time copy took, and how it was made.
struct Uploaded<'c> {
    bufs: Vec<(Buffer<'c>, u64)>,
    seconds: f64,
    how: &'static str,
}

/// Device-local buffers holding the working set, filled once.
fn upload<'c>(ctx: &'c Ctx<'c>, data: &[u8], plan: &ArmPlan) -> Result<Uploaded<'c>, String> {
    let pieces = split(data.len() as u64, alloc_bytes(ctx, 4096), 4096);
    let usage = Usage::STORAGE_BUFFER | Usage::TRANSFER_DST | Usage::TRANSFER_SRC;
    let t = Instant::now();
    let mut bufs = Vec::new();
    let mut how = "mapped device memory";
    let mut staging: Option<(Buffer<'c>, (vk::CommandBuffer, vk::Fence))> = None;
    for (off, len) in pieces {
        let mut b = ctx.alloc(len, usage, Flags::DEVICE_LOCAL, Flags::HOST_VISIBLE)?;
        let src = &data[off as usize..(off + len) as usize];
        if let Some(dst) = b.bytes_mut() {
            par_copy(dst, src);
        } else {
            how = "staged copy";
            if staging.is_none() {
                let chunk = plan.chunk_bytes.clamp(1 << 20, 256 << 20);
                let s = ctx.alloc(
                    chunk,
                    Usage::TRANSFER_SRC,
                    Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
                    Flags::DEVICE_LOCAL,
                )?;
                staging = Some((s, ctx.command_buffer()?));
            }
            let Some((s, cmd)) = staging.as_mut() else {
                return Err("no staging buffer".into());
            };
            for (c_off, c_len) in split(len, s.size, 16) {
                let dst = s.bytes_mut().ok_or("staging buffer is not mapped")?;
                par_copy(dst, &src[c_off as usize..(c_off + c_len) as usize]);
                ctx.begin(cmd.0)?;
                let region = vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: c_off,
                    size: c_len,
                };
                ctx.copy(cmd.0, s.buf, b.buf, region);
                ctx.submit(cmd.0, cmd.1)?;
                ctx.wait(cmd.1)?;
            }
        }
        bufs.push((b, off));
    }
    if let Some((_, cmd)) = staging {
        ctx.destroy_fence(cmd.1);
    }
    Ok(Uploaded {
        bufs,
        seconds: t.elapsed().as_secs_f64(),
        how,
    })
}

fn resident_arm(
    ctx: &Ctx<'_>,
    shared: &mut Shared<'_>,
    data: &[u8],
    plan: &ArmPlan,
    observe: Observer<'_>,
) -> Result<ArmRun, String> {
    let Uploaded {
        bufs,
        seconds: setup,
        how,
    } = upload(ctx, data, plan)?;
    let refs: Vec<_> = bufs.iter().map(|(b, off)| (b, *off)).collect();
    let ranges = ranges_over(&refs, range_bytes(ctx, plan));
    let mut run = fixed_ranges(ctx, shared, plan, Arm::Resident, &ranges)?;
    run.setup_seconds = Some(setup);
    run.detail = Some(format!("one-time copy through {how}"));
    run.resident_fraction_after = observe(Arm::Resident);
    Ok(run)
}

/// A staging slot of the per-use copy arm.
struct Slot<'c> {
    staging: Buffer<'c>,
    device: Option<Buffer<'c>>,
    set: vk::DescriptorSet,
    cmd: (vk::CommandBuffer, vk::Fence),
    busy: bool,
}

fn per_use_copy_arm(
    ctx: &Ctx<'_>,
    shared: &mut Shared<'_>,
    data: &[u8],
    plan: &ArmPlan,
    observe: Observer<'_>,
) -> Result<ArmRun, String> {
    let chunk = align_down(plan.chunk_bytes.min(range_bytes(ctx, plan)), 4096).max(4096);
    let chunks = split(data.len() as u64, chunk, 16);
    let p = params(ctx, &chunks)?;
    let pool = ctx.descriptor_pool(2)?;
    let unified = ctx.caps.topology == Topology::Unified;
    let mut slots = Vec::new();
    let result = (|| {
        for _ in 0..2 {
            let staging = ctx.alloc(
                chunk,
                Usage::STORAGE_BUFFER | Usage::TRANSFER_SRC,
                Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
                if unified {
                    Flags::empty()
                } else {
                    Flags::DEVICE_LOCAL
                },
            )?;
            let direct = unified && staging.flags.contains(Flags::DEVICE_LOCAL);
            let device = if direct {
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
            let set = ctx.set(pool, (target, 0, chunk), &p, &shared.result)?;
            slots.push(Slot {
                staging,
                device,
                set,
                cmd: ctx.command_buffer()?,
                busy: false,
            });
        }
        let direct = slots[0].device.is_none();
        let mut run = ArmRun::failed(Arm::PerUseCopy, data.len() as u64, "");
        run.error = None;
        run.ranges = chunks.len() as u32;
        run.max_range_bytes = chunk;
        run.detail = Some(if direct {
            format!("memcpy into device-visible host memory, {chunk} bytes at a time")
        } else {
            format!("memcpy into staging, then vkCmdCopyBuffer, {chunk} bytes at a time")
        });
        passes(plan, &mut run, || {
            shared.zero();
            for (i, &(off, len)) in chunks.iter().enumerate() {
                let s = &mut slots[i % 2];
                if s.busy {
                    ctx.wait(s.cmd.1)?;
                }
                let dst = s
                    .staging
                    .bytes_mut()
                    .ok_or("staging buffer is not mapped")?;
                par_copy(dst, &data[off as usize..(off + len) as usize]);
                ctx.begin(s.cmd.0)?;
                if let Some(d) = &s.device {
                    let region = vk::BufferCopy {
                        src_offset: 0,
                        dst_offset: 0,
                        size: len,
                    };
                    ctx.copy(s.cmd.0, s.staging.buf, d.buf, region);
                    ctx.barrier(
                        s.cmd.0,
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
                ctx.dispatch(s.cmd.0, s.set, i as u32, len / 16);
                ctx.barrier(
                    s.cmd.0,
                    (
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::AccessFlags::SHADER_WRITE,
                    ),
                    (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
                );
                ctx.submit(s.cmd.0, s.cmd.1)?;
                s.busy = true;
            }
            for s in slots.iter_mut().filter(|s| s.busy) {
                ctx.wait(s.cmd.1)?;
                s.busy = false;
            }
            Ok(shared.read())
        })?;
        run.resident_fraction_after = observe(Arm::PerUseCopy);
        Ok(run)
    })();
    for s in &slots {
        if s.busy {
            let _ = ctx.wait(s.cmd.1);
        }
        ctx.destroy_fence(s.cmd.1);
    }
    drop(slots);
    ctx.destroy_pool(pool);
    result
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
    let cmd = ctx.command_buffer()?;
    let copy_rate = |src: vk::Buffer, dst: vk::Buffer| {
        median_secs(5, || {
            ctx.begin(cmd.0)?;
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            };
            ctx.copy(cmd.0, src, dst, region);
            ctx.submit(cmd.0, cmd.1)?;
            ctx.wait(cmd.1)
        })
        .map(|s| size as f64 / s / 1e9)
    };
    let d2d = copy_rate(a.buf, b.buf);
    let h2d = copy_rate(h.buf, a.buf);
    ctx.destroy_fence(cmd.1);
    Ok(vec![
        ReferenceRate {
            what: "device-to-device copy (vkCmdCopyBuffer)".into(),
            bytes: size,
            gbps: d2d?,
        },
        ReferenceRate {
            what: "host-to-device copy from host-visible memory (vkCmdCopyBuffer)".into(),
            bytes: size,
            gbps: h2d?,
        },
    ])
}

pub fn run(
    ctx: &Ctx<'_>,
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
    let result = ctx.alloc(
        8,
        Usage::STORAGE_BUFFER,
        Flags::HOST_VISIBLE | Flags::HOST_COHERENT,
        Flags::empty(),
    )?;
    let mut shared = Shared { result };
    let device_free_bytes = device_local_budget(ctx);
    let mut runs = Vec::new();
    for &arm in &plan.order {
        let r = match arm {
            Arm::Map => map_arm(ctx, &mut shared, data, plan, observe),
            Arm::Resident => resident_arm(ctx, &mut shared, data, plan, observe),
            Arm::PerUseCopy => per_use_copy_arm(ctx, &mut shared, data, plan, observe),
        };
        runs.push(r.unwrap_or_else(|e| ArmRun::failed(arm, bytes, e)));
    }
    let references = if plan.references {
        references(ctx, bytes).unwrap_or_default()
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

/// The budget (or size) of the largest device-local heap.
fn device_local_budget(ctx: &Ctx<'_>) -> Option<u64> {
    ctx.caps
        .heaps
        .iter()
        .filter(|h| h.device_local)
        .map(|h| h.budget_bytes.unwrap_or(h.size_bytes))
        .max()
}
