//! Model containers: safetensors, GGUF, NumPy (`.npy`, `.npz`), PyTorch zip, ONNX; anything
//! else is opaque (one region covering the file).
//!
//! Parsers are pure functions over a [`Source`] of bytes (memory or a file read with
//! `pread`), never panic on any input, and bound their allocations by the file size
//! whatever a header claims. The format is sniffed from the first bytes, never from the
//! file name. Only headers are read (and, for torch, `data.pkl`), never tensor data.
//!
//! ```no_run
//! let c = twofold_formats::open(std::path::Path::new("model.gguf"))?;
//! for t in &c.tensors {
//!     println!("{} {} bytes at {}", t.name, t.len, t.offset);
//! }
//! # Ok::<(), twofold_formats::ContainerError>(())
//! ```
//!
//! See `docs/containers.md` for what each parser reads and its limits.

pub mod convert;
mod error;
pub mod gguf;
pub mod npy;
pub mod npz;
pub mod onnx;
pub mod pickle;
mod pyliteral;
pub mod repack;
pub mod safetensors;
pub mod source;
pub mod torch;
mod types;
pub mod zip;

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub use error::ContainerError;
pub use source::{FileSource, Source};
pub use types::{Container, Dtype, ExternalTensor, Format, Tensor, UnmappedTensor};

/// Elements of a shape (1 for a scalar), `None` on overflow.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Sorts tensors by offset, then by name (the order [`Container::tensors`] promises).
pub(crate) fn sort_tensors(tensors: &mut [Tensor]) {
    tensors.sort_by(|a, b| a.offset.cmp(&b.offset).then_with(|| a.name.cmp(&b.name)));
}

/// Refuses tensors (sorted by offset) whose bytes overlap; empty tensors take no bytes.
pub(crate) fn check_overlaps(tensors: &[Tensor]) -> Result<(), ContainerError> {
    let mut last: Option<&Tensor> = None;
    for t in tensors.iter().filter(|t| t.len > 0) {
        if let Some(p) = last {
            if t.offset < p.offset.saturating_add(p.len) {
                return Err(ContainerError::Overlap {
                    first: p.name.clone(),
                    second: t.name.clone(),
                    offset: t.offset,
                });
            }
        }
        if last.is_none_or(|p| t.offset.saturating_add(t.len) > p.offset.saturating_add(p.len)) {
            last = Some(t);
        }
    }
    Ok(())
}

/// An unknown format: the whole file as one region.
fn opaque(size: u64) -> Container {
    Container {
        format: Format::Opaque,
        file_size: size,
        data_offset: None,
        alignment: None,
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors: vec![Tensor {
            name: "file".into(),
            dtype: Dtype::Other("opaque".into()),
            shape: vec![size],
            offset: 0,
            len: size,
        }],
    }
}

/// A zip: a torch archive, an `.npz`, or opaque.
fn parse_zip(src: &dyn Source) -> Result<Container, ContainerError> {
    let archive = zip::read(src)?;
    if torch::detect(&archive) {
        torch::parse(src, &archive)
    } else if npz::detect(&archive) {
        npz::parse(src, &archive)
    } else {
        Ok(opaque(src.size()))
    }
}

/// Sniffs the format from the first bytes and parses the container.
pub fn parse(src: &dyn Source) -> Result<Container, ContainerError> {
    let head = src.read_at(0, src.size().min(16), "magic")?;
    if gguf::sniff(&head) {
        gguf::parse(src)
    } else if npy::sniff(&head) {
        npy::parse(src)
    } else if zip::sniff(&head) {
        parse_zip(src)
    } else if safetensors::sniff(&head) {
        safetensors::parse(src)
    } else if onnx::sniff(&head) {
        // Protobuf has no magic: only a whole `ModelProto` top level makes it ONNX.
        match onnx::detect(src)? {
            Some(model) => onnx::parse_model(src, &model),
            None => Ok(opaque(src.size())),
        }
    } else {
        Ok(opaque(src.size()))
    }
}

/// Parses a container held in memory (tests, fuzzing).
pub fn parse_bytes(bytes: &[u8]) -> Result<Container, ContainerError> {
    parse(&bytes)
}

/// Opens `path` read-only and parses its headers (never its tensor data).
pub fn open(path: &Path) -> Result<Container, ContainerError> {
    let open_err = |source| ContainerError::Open {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer comes;
    // the fstat of the very fd opened then refuses it (no race between check and open).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a device, socket or pipe"
        };
        return Err(ContainerError::NotAFile {
            path: path.to_path_buf(),
            kind,
        });
    }
    parse(&FileSource::new(file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_bytes_are_one_opaque_region() {
        let c = parse_bytes(b"hello world").unwrap();
        assert_eq!(c.format, Format::Opaque);
        assert_eq!(c.tensors.len(), 1);
        assert_eq!((c.tensors[0].offset, c.tensors[0].len), (0, 11));
        assert_eq!(parse_bytes(b"").unwrap().tensors[0].len, 0);
    }

    fn t(name: &str, offset: u64, len: u64) -> Tensor {
        Tensor {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![len],
            offset,
            len,
        }
    }

    #[test]
    fn overlapping_tensors_are_refused() {
        assert!(check_overlaps(&[t("a", 0, 4), t("b", 4, 4), t("e", 8, 0)]).is_ok());
        assert!(check_overlaps(&[t("e", 0, 0), t("a", 0, 4)]).is_ok());
        let err = check_overlaps(&[t("a", 0, 4), t("b", 0, 4)]).unwrap_err();
        assert_eq!(err.to_string(), "tensors 'a' and 'b' overlap at offset '0'");
        // A tensor inside an earlier, longer one.
        let err = check_overlaps(&[t("a", 0, 100), t("b", 10, 4), t("c", 50, 4)]).unwrap_err();
        assert!(err.to_string().starts_with("tensors 'a' and 'b'"), "{err}");
        let err = check_overlaps(&[t("a", 0, 100), t("b", 200, 4), t("c", 202, 4)]);
        assert!(err.is_err());
    }

    #[test]
    fn open_rejects_what_is_not_a_file() {
        let err = open(Path::new("/")).unwrap_err();
        assert_eq!(err.to_string(), "'/' is not a regular file (a directory)");
        let err = open(Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("device"));
        let err = open(Path::new("/no/such/file")).unwrap_err();
        assert_eq!(err.to_string(), "cannot open '/no/such/file'");
        assert!(err.names_path());
    }
}
