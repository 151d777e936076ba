//! The upload tracer's records (`ebpf/twofold.h`, `struct upload_*`): what each ring-buffer
//! record says, parsed from its bytes ([`parse`]), and what the tracer tells its sink.

use crate::sample::uploads::TracedLibrary;
use crate::sample::FileKey;

/// Layout constants of `ebpf/twofold.h` (`UP_*`).
pub const ANCHOR: usize = 2064;
pub const SAMPLES: usize = 16;
pub const SAMPLE: usize = 32;
/// Copies of at most this many bytes come whole in a small record (`UP_SMALL`).
pub const SMALL: usize = 256;
const HEAD: usize = 56;
const COPY: usize = HEAD + 8 + ANCHOR + SAMPLES * SAMPLE;
const SMALL_COPY: usize = HEAD + 8 + SMALL;
/// `struct upload_gds`.
const GDS: usize = HEAD + 32;
/// `UPF_SMALL`: a `struct upload_small` record.
const FLAG_SMALL: u32 = 4;

/// Offset of content sample `i` in a copy of `len` contiguous bytes (`len >= 32`).
pub fn sample_offset(len: u64, i: usize) -> u64 {
    (len - SAMPLE as u64) * i as u64 / (SAMPLES as u64 - 1)
}

/// One host-to-device copy as the probe saw it.
#[derive(Debug, Clone)]
pub struct CopyRecord {
    pub entry: u32,
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
    /// The destination is device memory only if it lies in a traced device allocation.
    pub unified: bool,
    /// Rows not contiguous: only the first row was sampled.
    pub strided: bool,
    /// The first bytes of the source (empty: not present, or not readable).
    pub anchor: Vec<u8>,
    /// `(offset, bytes)` of each sample that was read.
    pub samples: Vec<(u64, [u8; SAMPLE])>,
}

/// What a record says.
#[derive(Debug, Clone)]
pub enum Call {
    Copy(CopyRecord),
    Register {
        entry: u32,
        addr: u64,
        bytes: u64,
    },
    Unregister {
        addr: u64,
    },
    Alloc {
        dst: u64,
        bytes: u64,
    },
    Free {
        dst: u64,
    },
    HostAlloc {
        addr: u64,
        bytes: u64,
    },
    HostFree {
        addr: u64,
    },
    /// Tiny copies (at most [`SMALL`] bytes each) counted since the last such record:
    /// their number and bytes, signed (see [`super::tiny`]). No content: not examined.
    Tiny {
        copies: i64,
        bytes: i64,
    },
    /// The process took a slot of the tiny-copy counters (read by the tracer itself).
    TinySlot {
        slot: u32,
    },
    /// A device-to-device copy (`cuMemcpyDtoD*`, `cuMemcpyPeer*`): no content (device
    /// memory cannot be read from the host).
    DeviceCopy {
        entry: u32,
        dst: u64,
        src: u64,
        bytes: u64,
    },
    /// `cuFileHandleRegister` of a file (GPUDirect Storage): later reads through `handle`
    /// are of `file`.
    GdsHandle {
        handle: u64,
        file: FileKey,
    },
    /// `cuFileRead`: `bytes` of the file at `file_offset` read into device memory at `dst`.
    GdsRead {
        entry: u32,
        handle: u64,
        dst: u64,
        bytes: u64,
        file_offset: u64,
    },
}

/// One record: who, when (wall clock) and what.
#[derive(Debug, Clone)]
pub struct Record {
    pub pid: i32,
    pub at_unix_ns: u64,
    pub call: Call,
}

/// What the tracer tells its sink.
#[derive(Debug, Clone)]
pub enum Note {
    Record(Record),
    /// A library file was attached.
    Library(TracedLibrary),
    /// A process maps an attached library (`preloaded`: since before it was attached).
    Mapped {
        pid: i32,
        preloaded: bool,
    },
    /// Records lost since the last note (the ring buffer was full).
    Lost(u64),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]))
}

/// Parses one ring-buffer record (`struct upload_head`, or `struct upload_copy`).
pub fn parse(b: &[u8], mono_to_unix: i128) -> Option<Record> {
    if b.len() < HEAD {
        return None;
    }
    let at = (u64_at(b, 0) as i128 + mono_to_unix).max(0) as u64;
    let pid = u32_at(b, 8) as i32;
    let entry = u32_at(b, 16);
    let kind = u32_at(b, 20);
    let (dst, src, bytes, flags) = (u64_at(b, 24), u64_at(b, 32), u64_at(b, 40), u32_at(b, 48));
    let call = match kind {
        1 => {
            let small = flags & FLAG_SMALL != 0;
            if b.len() < if small { SMALL_COPY } else { COPY } {
                return None;
            }
            let anchor_len = (u32_at(b, HEAD) as usize).min(if small { SMALL } else { ANCHOR });
            let sampled = u32_at(b, HEAD + 4);
            let strided = flags & 2 != 0;
            let first = if strided { 0 } else { bytes };
            let samples = (0..SAMPLES)
                .filter(|i| !small && sampled & (1 << i) != 0 && first >= SAMPLE as u64)
                .map(|i| {
                    let o = HEAD + 8 + ANCHOR + i * SAMPLE;
                    let mut w = [0u8; SAMPLE];
                    w.copy_from_slice(&b[o..o + SAMPLE]);
                    (sample_offset(first, i), w)
                })
                .collect();
            Call::Copy(CopyRecord {
                entry,
                dst,
                src,
                bytes,
                unified: flags & 1 != 0,
                strided,
                anchor: b[HEAD + 8..HEAD + 8 + anchor_len].to_vec(),
                samples,
            })
        }
        2 => Call::Register {
            entry,
            addr: src,
            bytes,
        },
        3 => Call::Unregister { addr: src },
        4 => Call::Alloc { dst, bytes },
        5 => Call::Free { dst },
        6 => Call::HostAlloc { addr: src, bytes },
        7 => Call::HostFree { addr: src },
        8 => Call::TinySlot { slot: dst as u32 },
        9 => Call::DeviceCopy {
            entry,
            dst,
            src,
            bytes,
        },
        10 if b.len() >= GDS => Call::GdsHandle {
            handle: u64_at(b, HEAD),
            file: super::layout::file_key(u32_at(b, HEAD + 24), u64_at(b, HEAD + 16)),
        },
        11 if b.len() >= GDS => Call::GdsRead {
            entry,
            handle: u64_at(b, HEAD),
            dst,
            bytes,
            file_offset: u64_at(b, HEAD + 8),
        },
        _ => return None,
    };
    Some(Record {
        pid,
        at_unix_ns: at,
        call,
    })
}

#[cfg(test)]
#[path = "uploads_tests.rs"]
mod tests;
