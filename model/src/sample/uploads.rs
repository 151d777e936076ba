//! Uploads to a GPU as the upload tracer saw them (uprobes on the CUDA driver library,
//! `ebpf/uploads.bpf.c`): which byte ranges of which model file each process copied to a
//! device, matched by content at the moment of the copy, and which processes the tracer
//! has seen from before their first allocation. Raw evidence: the model
//! (`model::device`) decides what it proves.

use serde::{Deserialize, Serialize};

use super::converted::Conversion;
use super::FileKey;

/// What the upload tracer saw since it attached. Part of a snapshot's GPU sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UploadsSample {
    /// Wall clock (Unix ns) when the first driver library was attached.
    pub since_unix_ns: u64,
    /// The driver libraries attached, each with when and who had it loaded already.
    pub libraries: Vec<TracedLibrary>,
    /// Why nothing is traced (no driver library found, no uprobe support), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    pub processes: Vec<UploadProcess>,
    /// Model-file bytes uploaded, per (process, file, form).
    pub uploads: Vec<FileUpload>,
    /// `cuMemHostRegister` of a range inside a mapping of a model file.
    pub registrations: Vec<HostRegistration>,
    /// Records the ring buffer had no room for (calls not seen).
    pub lost_events: u64,
    /// How many content samples were matched and how (for the docs' bound).
    pub samples_per_copy: u32,
    /// Model bytes uploaded by processes that exited since tracing started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredUpload>,
    /// Device-to-device copies (`cuMemcpyDtoD*`, `cuMemcpyPeer*`, unified `cuMemcpy*`) of
    /// device ranges holding matched model bytes, still allocated: per (process, file, form).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clones: Vec<DeviceClone>,
    /// The files uploads were matched against (empty in recordings made before: every
    /// file of interest was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub indexed: Vec<FileKey>,
    /// The resident tracer this ledger was read from (another twofold process of the host:
    /// `serve --trace-uploads`, `record --trace-uploads`); `None`: this process traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracer: Option<ResidentTracer>,
    /// GPUDirect Storage (`cuFileRead` of libcufile, reads from a file into device memory
    /// that bypass both the page cache and `cuMemcpyHtoD`): the libraries traced, or why
    /// none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gds: Option<GdsTrace>,
}

/// The twofold process whose upload ledger a command read (one tracer per host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResidentTracer {
    pub pid: i32,
    /// Its command (`serve`, `record`).
    pub command: String,
    /// Wall clock (Unix ns) when it last wrote the ledger.
    pub written_unix_ns: u64,
}

/// What GPUDirect Storage tracing saw: the `libcufile` files attached, or why none was.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GdsTrace {
    pub libraries: Vec<String>,
    /// Why reads into device memory by `cuFileRead` are not traced (no libcufile found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// Model bytes one process copied from device memory to device memory (a `clone()`, a
/// tensor-parallel slice, a fused QKV): another device copy of those file bytes, for as
/// long as its destination is allocated (`cuMemFree*` of it ends it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceClone {
    pub pid: i32,
    pub file: FileKey,
    /// The form of the bytes on the device (`None`: as in the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
    /// Other files whose bytes the cloned upload matched too.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<FileKey>,
    /// The file ranges cloned, merged (for display).
    pub ranges: Vec<(u64, u64)>,
    /// File bytes the live clones hold, summed over clones (two clones of one range hold
    /// its bytes twice).
    pub file_bytes: u64,
    /// Device bytes they take.
    pub device_bytes: u64,
    pub copies: u64,
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
    /// The entry point of the last clone (`cuMemcpyDtoDAsync_v2`).
    pub entry: String,
}

/// Device bytes of one file that processes uploaded and then exited with, per GPU each was
/// last seen on (NVML; `None`: not one GPU): what a counter of uploaded bytes keeps once
/// its uploader is gone, so that it never goes down.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetiredUpload {
    pub file: FileKey,
    pub gpu: Option<u32>,
    /// File bytes, or twice them widened (as [`crate::model::device::UploadModel`]).
    pub device_bytes: u64,
}

/// One driver library with probes on it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedLibrary {
    pub path: String,
    pub attached_unix_ns: u64,
    /// Entry points attached (of those twofold knows).
    pub entry_points: u32,
    /// Processes that had it loaded when it was attached: what they did before is not
    /// known.
    pub preloaded_pids: Vec<i32>,
}

/// One process that called a traced entry point (or had a traced library loaded).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UploadProcess {
    pub pid: i32,
    pub comm: String,
    /// It loaded the traced library after the probes were attached: every allocation and
    /// upload it made was seen.
    pub traced_from_start: bool,
    /// Wall clock (Unix ns) since when its calls are traced.
    pub traced_since_unix_ns: u64,
    /// Host-to-device copies seen, and their bytes.
    pub copies: u64,
    pub copy_bytes: u64,
    /// Of them, bytes matched to a model file (device bytes: widened counts twice).
    pub model_bytes: u64,
    /// Bytes whose samples matched no model file.
    pub other_bytes: u64,
    /// Bytes that could not be examined (source pages not present, strided copies, a
    /// unified copy whose destination is not a traced device allocation).
    pub unexamined_bytes: u64,
    /// Device memory it allocated through traced calls and has not freed.
    pub device_alloc_bytes: u64,
    /// Pinned host memory it allocated (staging buffers).
    pub pinned_host_bytes: u64,
    /// Wall clock (Unix ns) of its first and last copy; 0 when none.
    pub first_copy_unix_ns: u64,
    pub last_copy_unix_ns: u64,
    /// GPUs it holds memory on (NVML, when the ledger was read; empty: none or unknown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Device-to-device copies seen, and their bytes (model bytes or not).
    #[serde(skip_serializing_if = "crate::sample::is_zero")]
    pub device_copies: u64,
    #[serde(skip_serializing_if = "crate::sample::is_zero")]
    pub device_copy_bytes: u64,
    /// Field 22 of `/proc/PID/stat` when the tracer first saw it: a ledger read by another
    /// process holds this row only while that pid runs with that start time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
}

/// Bytes of one model file one process uploaded, merged into file ranges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FileUpload {
    pub pid: i32,
    pub file: FileKey,
    /// The device holds the F16/BF16 → F32 widening of these bytes (also said by
    /// `conversion`; kept for readers of recordings made before).
    pub widened: bool,
    /// The dtype conversion the device holds of these bytes (`None`: as in the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
    /// Other files whose bytes the same copies matched (identical tensors: a `.bin` or
    /// `.pt` beside a `.safetensors`, a second download); the model attributes the upload
    /// to one of them ([`crate::model::relation`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<FileKey>,
    /// The process held this file open or mapped when a copy that matched several files
    /// was matched.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held_at_upload: bool,
    /// `[start, end)` byte ranges of the file, merged, sorted.
    pub ranges: Vec<(u64, u64)>,
    /// File bytes in `ranges`.
    pub file_bytes: u64,
    /// Of `ranges`, what the device still holds: not overwritten by a later copy into the
    /// same device range, nor freed with its allocation (`cuMemFree*`) since. `None` in
    /// recordings made before it was kept (then `ranges` is taken).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_ranges: Option<Vec<(u64, u64)>>,
    /// Device bytes written (file bytes, or as the conversion makes them), summed over
    /// copies.
    pub device_bytes: u64,
    pub copies: u64,
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
    /// The entry point of the last copy (`cuMemcpyHtoDAsync_v2`).
    pub entry: String,
}

/// A process registered host memory that a mapping of a model file backs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostRegistration {
    pub pid: i32,
    pub file: FileKey,
    /// The file range the registered range maps.
    pub file_offset: u64,
    pub bytes: u64,
    pub at_unix_ns: u64,
    pub entry: String,
}
