//! The words of a proven private copy: how it was made, where it lies, what it counts
//! (a converted copy by the bytes it holds) and the remedy.

use super::{name, text, Text};
use crate::model::findings::Code;
use crate::model::CopyHow;
use crate::units::iec;

/// The subject, sentence and remedy of a [`Code::ProvenPrivateCopy`] (`text.rs` passes
/// no other code; one would read as an empty finding).
pub(super) fn render(code: &Code) -> Text {
    let Code::ProvenPrivateCopy {
        path,
        size_bytes,
        pid,
        comm,
        how,
        fraction,
        file_bytes,
        converted_bytes,
        conversion,
        traced_read_bytes,
        huge_pages,
        ..
    } = code
    else {
        return text("", String::new(), None);
    };
    let repack = conversion.is_some_and(|c| c.is_repack());
    let conv = conversion.map_or_else(
        || "converted to another dtype".to_string(),
        crate::sample::converted::words,
    );
    let converted_how = if repack {
        format!("{conv} out of its mapping of the file (its CPU_REPACK buffer: rows interleaved for SIMD, the same size as the tensors)")
    } else {
        format!(
            "{conv} out of its mapping of the file (a dtype conversion, {})",
            "such as .float(), .half() or .astype(np.float16), not a read"
        )
    };
    let (kind, place) = match how {
        CopyHow::SharedMemory => ("copy", "shared memory"),
        CopyHow::Pinned => ("pinned host copy", "host memory the NVIDIA driver maps"),
        _ if *huge_pages => ("private copy", "huge pages (hugetlbfs)"),
        _ => ("private copy", "private memory"),
    };
    let (how, remedy) = match how {
        CopyHow::Read if repack => (
            "copied with read()",
            "the file's pages cached are the second copy of the repacked tensors: evict them after load (or read with O_DIRECT); --no-repack (-nr) keeps one copy at some speed",
        ),
        CopyHow::Read if *converted_bytes > 0 => (
            "copied with read()",
            "load it with mmap (llama.cpp's default, np.load(mmap_mode='r'), torch.load(mmap=True)) to share the page cache instead of copying it, and keep the stored dtype (or convert the file once on disk)",
        ),
        CopyHow::Read => (
            "copied with read()",
            "load it with mmap (llama.cpp's default, np.load(mmap_mode='r'), torch.load(mmap=True)) to share the page cache instead of copying it",
        ),
        CopyHow::CopiedFromMapping => (
            "copied out of its mapping of the file",
            "use the mapped tensors in place instead of copying them (no .clone()/.copy() of weights at load)",
        ),
        CopyHow::Converted if repack => (
            converted_how.as_str(),
            "the mapped pages of the repacked tensors are the waste: load with --no-mmap (each weight is read and repacked, no mapped copy stays; or a llama.cpp that releases the mapped source of repacked tensors), or run with --no-repack (-nr) to keep one copy at some speed",
        ),
        CopyHow::Converted => (
            converted_how.as_str(),
            "store the dtype it runs in: keep the stored dtype (use the mapped tensors as they are), or convert the file once on disk to the dtype it runs in and load that",
        ),
        CopyHow::Pinned => (
            "copied into pinned (page-locked) host memory, a staging copy for the GPU (cudaHostAlloc, pin_memory())",
            "free the pinned copy once it is uploaded, or register the file's own mapping for device access in place (cudaHostRegister with cudaHostRegisterReadOnly) instead of staging a copy",
        ),
        CopyHow::SharedMemory => (
            "copied into shared memory (anonymous shared memory, or a shmem, tmpfs or memfd file)",
            "map the model file itself (read-only, MAP_SHARED): its page cache is already shared between processes, a shared-memory copy is one more",
        ),
        CopyHow::Copied => (
            "copied",
            "load it with mmap to share the page cache instead of copying it",
        ),
    };
    let traced = match (traced_read_bytes, size_bytes) {
        (Some(r), Some(size)) if *size > 0 => format!(
            "; it read() {:.0}% of the file during the trace",
            *r as f64 * 100.0 / *size as f64
        ),
        _ => String::new(),
    };
    let found = match size_bytes {
        Some(size) if *size > 0 => *file_bytes as f64 / *size as f64,
        _ => *fraction,
    };
    let converted = if *converted_bytes > 0 {
        format!(
            " ({} of it {conv}; the copy counts {fraction:.2} of the file by the bytes it holds)",
            iec(*converted_bytes)
        )
    } else {
        String::new()
    };
    // More than the file's bytes: a heap that holds each tensor several times (onnxruntime
    // keeps the parsed protobuf, the initializers and their session copies) holds copies.
    let (kind, amount) = if found > 1.005 {
        let plural = kind.replace("copy", "copies");
        (
            format!("{found:.2} {plural}"),
            format!("{found:.2} times the file's bytes"),
        )
    } else {
        (
            format!("a {kind}"),
            format!("{} of the file", crate::units::percent(found)),
        )
    };
    text(
        path,
        format!(
            "pid {pid} ({comm}) holds {kind} of '{}' {how}: {amount} found byte by byte in its {place}{converted}{traced}",
            name(path),
        ),
        Some(remedy),
    )
}
