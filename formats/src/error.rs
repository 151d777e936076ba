//! The one error type of the container parsers. Messages are lower-case and quote values.

use std::io;
use std::path::PathBuf;

/// Why a container could not be read. Parse variants do not name the file: the caller that
/// opened it adds the path (see [`ContainerError::names_path`]).
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// The file could not be opened or its metadata read.
    #[error("cannot open '{path}'")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path is not a regular file (a directory, a device, a socket...).
    #[error("'{path}' is not a regular file ({kind})")]
    NotAFile { path: PathBuf, kind: &'static str },
    /// A read failed part-way (the file shrank, or an I/O error).
    #[error("cannot read '{len}' bytes at offset '{offset}'")]
    Read {
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    /// The file ends before a structure it announces.
    #[error(
        "truncated {what}: needs '{needed}' bytes at offset '{offset}' but the file has '{size}'"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        size: u64,
    },
    /// A header length field that runs the header past the end of the file: `end` is
    /// the byte where the header would end, `size` where the file does (same origin).
    #[error("header runs past the end of the file: it would end at byte '{end}' but the file ends at byte '{size}'")]
    HeaderTooLong { end: u128, size: u64 },
    /// Two tensors whose bytes overlap (or start at the same offset): the formats that
    /// forbid it (safetensors, GGUF) are malformed, not padded.
    #[error("tensors '{first}' and '{second}' overlap at offset '{offset}'")]
    Overlap {
        first: String,
        second: String,
        offset: u64,
    },
    /// A header length above what this parser accepts (a guard against huge reads).
    #[error("header length '{len}' exceeds the limit '{limit}'")]
    HeaderLimit { len: u64, limit: u64 },
    /// A count (tensors, key-values, zip entries) that cannot fit in the file.
    #[error("{what} '{count}' cannot fit in a file of '{size}' bytes")]
    AbsurdCount {
        what: &'static str,
        count: u64,
        size: u64,
    },
    /// A version of the format this parser does not read.
    #[error("unsupported {format} version '{version}'")]
    Version { format: &'static str, version: u64 },
    /// Text that should be UTF-8 is not.
    #[error("{what} at offset '{offset}' is not valid utf-8")]
    Utf8 { what: &'static str, offset: u64 },
    /// A dtype name or type id this parser does not know.
    #[error("tensor '{tensor}': unknown dtype '{dtype}'")]
    UnknownDtype { tensor: String, dtype: String },
    /// A GGML tensor type id this parser does not know (or that ggml removed).
    #[error("tensor '{tensor}': unknown ggml type id '{id}'")]
    UnknownGgmlType { tensor: String, id: u32 },
    /// A tensor whose bytes lie outside the file or its data section.
    #[error("tensor '{tensor}' at '{start}..{end}' lies outside the data section '{data_start}..{data_end}'")]
    OutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        data_start: u64,
        data_end: u64,
    },
    /// A tensor whose shape and dtype disagree with its byte length.
    #[error("tensor '{tensor}': shape {shape:?} of '{dtype}' needs '{expected}' bytes but it spans '{actual}'")]
    SizeMismatch {
        tensor: String,
        dtype: String,
        shape: Vec<u64>,
        expected: u64,
        actual: u64,
    },
    /// A tensor whose element or byte count overflows 64 bits.
    #[error("tensor '{tensor}': shape {shape:?} overflows")]
    ShapeOverflow { tensor: String, shape: Vec<u64> },
    /// Any other malformed structure, described.
    #[error("invalid {format}: {detail}")]
    Invalid {
        format: &'static str,
        detail: String,
    },
}

impl ContainerError {
    /// `true` if the message already names the file (open errors); parse errors do not.
    pub fn names_path(&self) -> bool {
        matches!(
            self,
            ContainerError::Open { .. } | ContainerError::NotAFile { .. }
        )
    }

    pub(crate) fn invalid(format: &'static str, detail: impl Into<String>) -> Self {
        ContainerError::Invalid {
            format,
            detail: detail.into(),
        }
    }
}
