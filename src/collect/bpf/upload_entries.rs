//! The CUDA driver entry points the upload tracer attaches (`ebpf/uploads.bpf.c`): each
//! symbol with the program that handles it and its number, the attach cookie the program
//! reads back (`_v2`, `_ptds` and `_ptsz` variants are entries of their own).

use std::path::Path;

use aya::programs::uprobe::{UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};

use super::setup::{ensure_tracefs, raise_memlock};

/// One driver entry point: its symbol, the program that handles it and its number (the
/// attach cookie). Numbers 30-39 are device-to-device copies, 100-199 unified copies
/// (`cuMemcpy`, `cuMemcpyAsync`), 300-399 libcufile's (GPUDirect Storage).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub id: u32,
    pub symbol: &'static str,
    pub(super) program: &'static str,
    /// The program attached at its return too (`ret_alloc`, `ret_gds`).
    pub(super) ret: Option<&'static str>,
}

const fn e(id: u32, symbol: &'static str, program: &'static str) -> Entry {
    Entry {
        id,
        symbol,
        program,
        ret: None,
    }
}

const fn r(id: u32, symbol: &'static str, program: &'static str) -> Entry {
    Entry {
        id,
        symbol,
        program,
        ret: Some("ret_alloc"),
    }
}

/// A libcufile entry point, with `ret_gds` at its return.
const fn g(id: u32, symbol: &'static str, program: &'static str) -> Entry {
    Entry {
        id,
        symbol,
        program,
        ret: Some("ret_gds"),
    }
}

/// Every entry point twofold attaches (those a library lacks are skipped).
#[rustfmt::skip]
pub static ENTRIES: &[Entry] = &[
    e(1, "cuMemcpyHtoD", "up_copy"),
    e(2, "cuMemcpyHtoD_v2", "up_copy"),
    e(3, "cuMemcpyHtoD_v2_ptds", "up_copy"),
    e(4, "cuMemcpyHtoDAsync", "up_copy"),
    e(5, "cuMemcpyHtoDAsync_v2", "up_copy"),
    e(6, "cuMemcpyHtoDAsync_v2_ptsz", "up_copy"),
    e(10, "cuMemcpy2D", "up_copy2d"),
    e(11, "cuMemcpy2D_v2", "up_copy2d"),
    e(12, "cuMemcpy2D_v2_ptds", "up_copy2d"),
    e(13, "cuMemcpy2DAsync", "up_copy2d"),
    e(14, "cuMemcpy2DAsync_v2", "up_copy2d"),
    e(15, "cuMemcpy2DAsync_v2_ptsz", "up_copy2d"),
    e(16, "cuMemcpy2DUnaligned", "up_copy2d"),
    e(17, "cuMemcpy2DUnaligned_v2", "up_copy2d"),
    e(18, "cuMemcpy2DUnaligned_v2_ptds", "up_copy2d"),
    e(20, "cuMemcpy3D", "up_copy3d"),
    e(21, "cuMemcpy3D_v2", "up_copy3d"),
    e(22, "cuMemcpy3D_v2_ptds", "up_copy3d"),
    e(23, "cuMemcpy3DAsync", "up_copy3d"),
    e(24, "cuMemcpy3DAsync_v2", "up_copy3d"),
    e(25, "cuMemcpy3DAsync_v2_ptsz", "up_copy3d"),
    e(30, "cuMemcpyDtoD", "up_dtod"),
    e(31, "cuMemcpyDtoD_v2", "up_dtod"),
    e(32, "cuMemcpyDtoD_v2_ptds", "up_dtod"),
    e(33, "cuMemcpyDtoDAsync", "up_dtod"),
    e(34, "cuMemcpyDtoDAsync_v2", "up_dtod"),
    e(35, "cuMemcpyDtoDAsync_v2_ptsz", "up_dtod"),
    e(36, "cuMemcpyPeer", "up_peer"),
    e(37, "cuMemcpyPeer_ptds", "up_peer"),
    e(38, "cuMemcpyPeerAsync", "up_peer"),
    e(39, "cuMemcpyPeerAsync_ptsz", "up_peer"),
    e(100, "cuMemcpy", "up_copy_unified"),
    e(101, "cuMemcpy_ptds", "up_copy_unified"),
    e(102, "cuMemcpyAsync", "up_copy_unified"),
    e(103, "cuMemcpyAsync_ptsz", "up_copy_unified"),
    e(110, "cuMemcpyBatchAsync", "up_batch"),
    e(111, "cuMemcpyBatchAsync_ptsz", "up_batch"),
    e(112, "cuMemcpyBatchAsync_v2", "up_batch"),
    e(113, "cuMemcpyBatchAsync_v2_ptsz", "up_batch"),
    e(200, "cuMemHostRegister", "up_register"),
    e(201, "cuMemHostRegister_v2", "up_register"),
    e(202, "cuMemHostUnregister", "up_unregister"),
    r(210, "cuMemAlloc", "up_alloc"),
    r(211, "cuMemAlloc_v2", "up_alloc"),
    r(212, "cuMemAllocAsync", "up_alloc"),
    r(213, "cuMemAllocAsync_ptsz", "up_alloc"),
    r(214, "cuMemAllocFromPoolAsync", "up_alloc"),
    r(215, "cuMemAllocFromPoolAsync_ptsz", "up_alloc"),
    r(216, "cuMemAllocManaged", "up_alloc"),
    r(217, "cuMemAllocPitch", "up_alloc_pitch"),
    r(218, "cuMemAllocPitch_v2", "up_alloc_pitch"),
    e(220, "cuMemFree", "up_free"),
    e(221, "cuMemFree_v2", "up_free"),
    e(222, "cuMemFreeAsync", "up_free"),
    e(223, "cuMemFreeAsync_ptsz", "up_free"),
    r(230, "cuMemAllocHost", "up_alloc_host"),
    r(231, "cuMemAllocHost_v2", "up_alloc_host"),
    r(232, "cuMemHostAlloc", "up_alloc_host"),
    e(233, "cuMemFreeHost", "up_free_host"),
    // GPUDirect Storage (libcufile): file bytes read straight into device memory.
    g(300, "cuFileHandleRegister", "up_gds_register"),
    g(301, "cuFileRead", "up_gds_read"),
];

/// The symbol of entry point `id`.
pub fn entry_name(id: u32) -> &'static str {
    ENTRIES
        .iter()
        .find(|e| e.id == id)
        .map_or("unknown", |e| e.symbol)
}

/// The uprobe floor (`__bench uprobe-floor`): the empty program `up_floor` on every entry
/// point of the library at `lib`, attached as the tracer attaches its own; how many.
/// Dropping the returned object detaches them.
pub fn attach_floor(lib: &Path) -> Result<(Ebpf, u32), String> {
    raise_memlock();
    ensure_tracefs().map_err(|e| e.to_string())?;
    let mut ebpf = EbpfLoader::new()
        .load(aya::include_bytes_aligned!("../../../ebpf/uploads.bpf.o"))
        .map_err(|e| super::chain(&e))?;
    let p: &mut UProbe = ebpf
        .program_mut("up_floor")
        .and_then(|p| p.try_into().ok())
        .ok_or("no program 'up_floor' in uploads.bpf.o")?;
    p.load().map_err(|e| super::chain(&e))?;
    let mut n = 0;
    for entry in ENTRIES {
        let at = UProbeAttachPoint {
            location: entry.symbol.into(),
            cookie: Some(u64::from(entry.id)),
        };
        if p.attach(at, lib, UProbeScope::AllProcesses).is_ok() {
            n += 1;
        }
    }
    if n == 0 {
        return Err(format!(
            "no entry point of '{}' could be attached",
            lib.display()
        ));
    }
    Ok((ebpf, n))
}
