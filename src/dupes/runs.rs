//! Runs: the bytes of a file that are searched as blocks rather than as tensors.
//!
//! Bytes of a file's data that no parsed tensor covers (an ONNX model's
//! `Constant` nodes and subgraph initializers, data a parser does not know) are searched,
//! when they are a large part of the file, as [`OPAQUE_PIECE`] blocks at any byte
//! alignment, as a file twofold cannot parse is. A file whose runs would need more than
//! [`MAX_RUN_PIECES`] blocks is cut into larger blocks (a power of two times 32 KiB).

use crate::container::{Dtype, Format, Tensor};
use crate::sample::PAGE_BYTES as PAGE;

/// A file twofold cannot parse is searched as runs of this size, at any byte alignment, so
/// that a copy of any 32 KiB run of it is found.
pub const OPAQUE_PIECE: u64 = 32 << 10;

/// Uncovered bytes of a file's data are searched as runs when they hold this share of the
/// file or more (below it they are framing: protobuf tags, names, padding).
pub const RUN_SHARE: f64 = 0.125;

/// Most run blocks per file: a file whose runs would need more (a sparse or huge file
/// twofold cannot parse) is cut into larger blocks instead, so that memory is bounded by
/// this limit and not by the file's declared size (one block per 32 KiB of a 1 TiB file
/// was 3 GiB of pieces).
pub const MAX_RUN_PIECES: u64 = 1 << 16;

/// The block size for `run_bytes` of runs in one file: [`OPAQUE_PIECE`], doubled until
/// at most [`MAX_RUN_PIECES`] blocks are needed.
pub fn run_piece(run_bytes: u64) -> u64 {
    let mut piece = OPAQUE_PIECE;
    while run_bytes.div_ceil(piece) > MAX_RUN_PIECES {
        piece *= 2;
    }
    piece
}

/// `[offset, offset + len)` of a file cut into `piece`-byte blocks.
fn blocks(offset: u64, len: u64, piece: u64, out: &mut Vec<Tensor>) {
    let mut at = 0;
    while at < len {
        let n = piece.min(len - at);
        out.push(Tensor {
            name: format!("bytes {}..{}", offset + at, offset + at + n),
            dtype: Dtype::U8,
            shape: vec![n],
            offset: offset + at,
            len: n,
        });
        at += n;
    }
}

/// Ranges of at least a page of the file's data that no tensor covers: for ONNX the whole
/// file (weights may lie in `Constant` nodes and subgraphs), for other formats from the
/// first tensor to the end of the last (the header is no weight).
fn uncovered(format: &Format, tensors: &[Tensor], size: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = tensors
        .iter()
        .filter(|t| t.len > 0)
        .map(|t| (t.offset, t.offset.saturating_add(t.len).min(size)))
        .collect();
    spans.sort_unstable();
    let (mut at, end) = match format {
        Format::Onnx => (0, size),
        _ => match (spans.first(), spans.iter().map(|s| s.1).max()) {
            (Some(first), Some(last)) => (first.0, last),
            _ => return Vec::new(),
        },
    };
    let mut out = Vec::new();
    for (a, b) in spans.into_iter().chain([(end, end)]) {
        if a > at && a - at >= PAGE {
            out.push((at, a.min(end)));
        }
        at = at.max(b);
    }
    out
}

/// The tensors to search for, and the index from which they are runs searched at any byte
/// alignment: the container's tensors, then [`OPAQUE_PIECE`] blocks of the data no tensor
/// covers when it is a large part of the file ([`RUN_SHARE`]); a file twofold cannot parse
/// is runs only.
pub fn searchable_tensors(
    format: &Format,
    tensors: Vec<Tensor>,
    size: u64,
) -> (Vec<Tensor>, usize) {
    let mut out = Vec::new();
    if *format == Format::Opaque {
        let piece = run_piece(tensors.iter().map(|t| t.len).sum());
        for t in tensors {
            blocks(t.offset, t.len, piece, &mut out);
        }
        return (out, 0);
    }
    let gaps = uncovered(format, &tensors, size);
    out = tensors;
    let runs_from = out.len();
    let gap_bytes: u64 = gaps.iter().map(|(a, b)| b - a).sum();
    if size > 0 && gap_bytes as f64 >= RUN_SHARE * size as f64 {
        let piece = run_piece(gap_bytes);
        for (a, b) in gaps {
            blocks(a, b - a, piece, &mut out);
        }
    }
    (out, runs_from)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dupes::test_tensor as t;

    /// ONNX bytes no initializer covers (`Constant` nodes, subgraphs) are searched as runs
    /// when they are a large part of the file; framing between tensors is not.
    #[test]
    fn uncovered_data_is_searched_as_runs_only_when_it_matters() {
        let onnx = Format::Onnx;
        // Tensors cover 8 KiB of 100 KiB: the rest, before and between, is runs.
        let (ts, from) =
            searchable_tensors(&onnx, vec![t(40 << 10, 4096), t(60 << 10, 4096)], 100 << 10);
        assert_eq!(from, 2);
        let runs: Vec<(u64, u64)> = ts[from..].iter().map(|x| (x.offset, x.len)).collect();
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), (100 - 8) << 10);
        assert_eq!(runs[0], (0, OPAQUE_PIECE));
        assert!(runs
            .iter()
            .all(|r| r.0 + r.1 <= 40 << 10 || r.0 >= 44 << 10));
        // Framing only (gaps under a page, or under RUN_SHARE of the file): no runs.
        let tight: Vec<Tensor> = (0..20).map(|i| t(100 + i * 4196, 4096)).collect();
        let (ts, from) = searchable_tensors(&onnx, tight, 100 + 20 * 4196);
        assert_eq!((ts.len(), from), (20, 20));
        // Other formats: the header before the first tensor is no weight.
        let st = Format::Safetensors;
        let (ts, from) = searchable_tensors(&st, vec![t(64 << 10, 4096)], 68 << 10);
        assert_eq!(ts.len(), from);
    }

    /// A file twofold cannot parse of 1 TiB is cut into at most [`MAX_RUN_PIECES`] blocks
    /// covering all of it, not 32 Mi blocks of 32 KiB.
    #[test]
    fn runs_of_a_huge_file_are_bounded() {
        let size = 1u64 << 40;
        let whole = Tensor {
            name: "bytes".into(),
            dtype: Dtype::U8,
            shape: vec![size],
            offset: 0,
            len: size,
        };
        let (ts, from) = searchable_tensors(&Format::Opaque, vec![whole], size);
        assert_eq!(from, 0);
        assert!(ts.len() as u64 <= MAX_RUN_PIECES, "{}", ts.len());
        assert_eq!(ts.iter().map(|x| x.len).sum::<u64>(), size);
        assert!(ts.windows(2).all(|w| w[0].offset + w[0].len == w[1].offset));
        // A small file keeps 32 KiB blocks.
        assert_eq!(run_piece(100 << 20), OPAQUE_PIECE);
        assert_eq!(run_piece(size), size / MAX_RUN_PIECES);
    }
}
