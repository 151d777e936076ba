//! GGUF v2 and v3 (llama.cpp): magic `GGUF`, u32 version, u64 tensor and key-value counts,
//! typed key-values, tensor infos, then the data section at the header end rounded up to
//! `general.alignment` (u32, default 32). Tensor offsets are relative to the data section.
//!
//! Only the header is read; values other than `general.alignment` are skipped unread.
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use super::source::{Seq, Source};
use super::{
    check_overlaps, numel, sort_tensors, Container, ContainerError, Dtype, Format, Tensor,
};

const FORMAT: &str = "gguf";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Smallest encoding of a tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
/// Smallest encoding of a key-value: key length, value type, a one-byte value.
const MIN_KV: u64 = 8 + 4 + 1;
/// Tensor names longer than this are refused (ggml's own limit is 64 bytes).
pub const MAX_NAME_BYTES: u64 = 64 << 10;
const ALIGNMENT_KEY: &[u8] = b"general.alignment";
/// Arrays of arrays nest at most this deep (a guard for the stack, not a format rule).
const MAX_NESTING: u32 = 16;

/// `true` if the file starts with the GGUF magic.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(b"GGUF")
}

/// A GGML tensor type: its name, elements per block and bytes per block (ggml's
/// `type_traits`; ids ggml removed from files are unknown).
pub fn ggml_type(id: u32) -> Option<(&'static str, u64, u64)> {
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        40 => ("NVFP4", 64, 36),
        _ => return None,
    })
}

/// Bits per element of a GGML type named `name` (`Q4_0` 4.5, `Q4_K` 4.5, `Q6_K` 6.5625,
/// `Q8_0` 8.5...), from its block geometry in [`ggml_type`].
pub fn bits_per_element(name: &str) -> Option<f64> {
    (0..64u32)
        .filter_map(ggml_type)
        .find(|(n, _, _)| *n == name)
        .map(|(_, elems, bytes)| (bytes * 8) as f64 / elems as f64)
}

fn dtype(id: u32, name: &str) -> Dtype {
    match id {
        0 => Dtype::F32,
        1 => Dtype::F16,
        24 => Dtype::I8,
        25 => Dtype::I16,
        26 => Dtype::I32,
        27 => Dtype::I64,
        28 => Dtype::F64,
        30 => Dtype::BF16,
        _ => Dtype::Quant(name.to_string()),
    }
}

/// Value types of key-values.
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U32: u32 = 4;

/// Size of a fixed-size value type.
fn fixed_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// Skips one value of type `ty`.
fn skip_value(r: &mut Seq, ty: u32, depth: u32) -> Result<(), ContainerError> {
    if let Some(n) = fixed_size(ty) {
        return r.skip(n, "gguf value");
    }
    match ty {
        T_STRING => {
            let len = r.u64("gguf string length")?;
            r.skip(len, "gguf string")
        }
        T_ARRAY => {
            if depth >= MAX_NESTING {
                return Err(ContainerError::invalid(
                    FORMAT,
                    format!("arrays nested deeper than '{MAX_NESTING}'"),
                ));
            }
            let item = r.u32("gguf array type")?;
            let count = r.u64("gguf array length")?;
            if let Some(n) = fixed_size(item) {
                let bytes = count.checked_mul(n).ok_or(ContainerError::AbsurdCount {
                    what: "array length",
                    count,
                    size: r.size(),
                })?;
                return r.skip(bytes, "gguf array");
            }
            let min = if item == T_STRING { 8 } else { 12 };
            if count > r.remaining() / min {
                return Err(ContainerError::AbsurdCount {
                    what: "array length",
                    count,
                    size: r.size(),
                });
            }
            for _ in 0..count {
                skip_value(r, item, depth + 1)?;
            }
            Ok(())
        }
        other => Err(ContainerError::invalid(
            FORMAT,
            format!("unknown value type '{other}' at offset '{}'", r.pos() - 4),
        )),
    }
}

/// Reads the key-values, returning `general.alignment` if present.
fn key_values(r: &mut Seq, count: u64) -> Result<Option<u64>, ContainerError> {
    let mut alignment = None;
    for _ in 0..count {
        // Keys are compared, never stored: only one length can match.
        let len = r.u64("gguf key length")?;
        let is_alignment = if len == ALIGNMENT_KEY.len() as u64 {
            r.take(len, "gguf key")? == ALIGNMENT_KEY
        } else {
            r.skip(len, "gguf key")?;
            false
        };
        let ty = r.u32("gguf value type")?;
        if is_alignment {
            if ty != T_U32 {
                return Err(ContainerError::invalid(
                    FORMAT,
                    format!("'general.alignment' has value type '{ty}', not u32 ('{T_U32}')"),
                ));
            }
            let a = u64::from(r.u32("general.alignment")?);
            if !a.is_power_of_two() {
                return Err(ContainerError::invalid(
                    FORMAT,
                    format!("'general.alignment' is '{a}', not a power of two"),
                ));
            }
            alignment = Some(a);
        } else {
            skip_value(r, ty, 0)?;
        }
    }
    Ok(alignment)
}

struct Info {
    name: String,
    shape: Vec<u64>,
    ty: u32,
    offset: u64,
}

fn tensor_info(r: &mut Seq) -> Result<Info, ContainerError> {
    let at = r.pos();
    let len = r.u64("gguf tensor name length")?;
    if len > MAX_NAME_BYTES {
        return Err(ContainerError::invalid(
            FORMAT,
            format!(
                "tensor name at offset '{at}' is '{len}' bytes long (at most '{MAX_NAME_BYTES}')"
            ),
        ));
    }
    let name = std::str::from_utf8(r.take(len, "gguf tensor name")?)
        .map_err(|_| ContainerError::Utf8 {
            what: "gguf tensor name",
            offset: at,
        })?
        .to_string();
    let n_dims = r.u32("gguf tensor dimensions")?;
    if n_dims > MAX_DIMS {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("tensor '{name}' has '{n_dims}' dimensions (ggml allows '{MAX_DIMS}')"),
        ));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(r.u64("gguf tensor dimension")?);
    }
    let ty = r.u32("gguf tensor type")?;
    let offset = r.u64("gguf tensor offset")?;
    Ok(Info {
        name,
        shape,
        ty,
        offset,
    })
}

/// Parses the header and validates every tensor against the file.
pub fn parse(src: &dyn Source) -> Result<Container, ContainerError> {
    let size = src.size();
    let mut r = Seq::new(src, 0);
    if r.take(4, "gguf magic")? != b"GGUF" {
        return Err(ContainerError::invalid(FORMAT, "no 'GGUF' magic"));
    }
    let version = r.u32("gguf version")?;
    if !(2..=3).contains(&version) {
        if (2..=3).contains(&version.swap_bytes()) {
            return Err(ContainerError::invalid(
                FORMAT,
                "big-endian files are not supported",
            ));
        }
        return Err(ContainerError::Version {
            format: FORMAT,
            version: version.into(),
        });
    }
    let n_tensors = r.u64("gguf tensor count")?;
    let n_kv = r.u64("gguf key-value count")?;
    let left = r.remaining();
    if n_tensors > left / MIN_TENSOR_INFO {
        return Err(ContainerError::AbsurdCount {
            what: "tensor count",
            count: n_tensors,
            size,
        });
    }
    if n_kv > left / MIN_KV || n_tensors * MIN_TENSOR_INFO + n_kv * MIN_KV > left {
        return Err(ContainerError::AbsurdCount {
            what: "key-value count",
            count: n_kv,
            size,
        });
    }
    let alignment = key_values(&mut r, n_kv)?.unwrap_or(DEFAULT_ALIGNMENT);
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        infos.push(tensor_info(&mut r)?);
    }
    let data_offset = r
        .pos()
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| ContainerError::invalid(FORMAT, "data offset overflows"))?;
    let mut tensors = infos
        .into_iter()
        .map(|i| tensor(i, data_offset, alignment, size))
        .collect::<Result<Vec<_>, _>>()?;
    sort_tensors(&mut tensors);
    check_overlaps(&tensors)?;
    Ok(Container {
        format: Format::Gguf { version },
        file_size: size,
        data_offset: Some(data_offset),
        alignment: Some(alignment),
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors,
    })
}

fn tensor(i: Info, data_offset: u64, alignment: u64, size: u64) -> Result<Tensor, ContainerError> {
    let Some((type_name, block, block_bytes)) = ggml_type(i.ty) else {
        return Err(ContainerError::UnknownGgmlType {
            tensor: i.name,
            id: i.ty,
        });
    };
    let Some(n) = numel(&i.shape) else {
        return Err(ContainerError::ShapeOverflow {
            tensor: i.name,
            shape: i.shape,
        });
    };
    let row = i.shape.first().copied().unwrap_or(1);
    if row % block != 0 {
        return Err(ContainerError::invalid(
            FORMAT,
            format!(
                "tensor '{}': row length '{row}' is not a multiple of the '{type_name}' block size '{block}'",
                i.name
            ),
        ));
    }
    let Some(len) = (n / block).checked_mul(block_bytes) else {
        return Err(ContainerError::ShapeOverflow {
            tensor: i.name,
            shape: i.shape,
        });
    };
    if i.offset % alignment != 0 {
        return Err(ContainerError::invalid(
            FORMAT,
            format!(
                "tensor '{}': offset '{}' is not a multiple of the alignment '{alignment}'",
                i.name, i.offset
            ),
        ));
    }
    let start = data_offset.checked_add(i.offset);
    match start.and_then(|s| s.checked_add(len)) {
        Some(end) if end <= size => Ok(Tensor {
            name: i.name,
            dtype: dtype(i.ty, type_name),
            shape: i.shape,
            offset: end - len,
            len,
        }),
        _ => Err(ContainerError::OutOfBounds {
            tensor: i.name,
            start: data_offset.saturating_add(i.offset),
            end: data_offset.saturating_add(i.offset).saturating_add(len),
            data_start: data_offset,
            data_end: size,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_per_element_of_common_types() {
        let b = |n| bits_per_element(n).unwrap();
        assert_eq!(
            [
                b("Q4_0"),
                b("Q4_K"),
                b("Q5_K"),
                b("Q6_K"),
                b("Q8_0"),
                b("F16")
            ],
            [4.5, 4.5, 5.5, 6.5625, 8.5, 16.0]
        );
        assert_eq!(bits_per_element("Q9_X"), None);
    }

    fn s(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    /// A v3 file: one alignment key, a string-array key, and the given tensors
    /// `(name, dims, type, offset)`, data padded to `data` bytes.
    fn file(align: u32, tensors: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes());
        s(&mut f, "general.alignment");
        f.extend_from_slice(&T_U32.to_le_bytes());
        f.extend_from_slice(&align.to_le_bytes());
        s(&mut f, "tokenizer.tokens");
        f.extend_from_slice(&T_ARRAY.to_le_bytes());
        f.extend_from_slice(&T_STRING.to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes());
        s(&mut f, "a");
        s(&mut f, "bc");
        for (name, dims, ty, off) in tensors {
            s(&mut f, name);
            f.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                f.extend_from_slice(&d.to_le_bytes());
            }
            f.extend_from_slice(&ty.to_le_bytes());
            f.extend_from_slice(&off.to_le_bytes());
        }
        f.resize(f.len().next_multiple_of(align as usize) + data, 0);
        f
    }

    #[test]
    fn parses_quantised_tensors() {
        let f = file(
            64,
            &[("b", &[256, 2], 12, 64), ("a", &[32], 2, 0)],
            64 + 288,
        );
        let c = parse(&f).unwrap();
        let d = c.data_offset.unwrap();
        assert_eq!(d % 64, 0);
        assert_eq!(c.alignment, Some(64));
        assert_eq!(c.format, Format::Gguf { version: 3 });
        assert_eq!(c.tensors[0].name, "a");
        assert_eq!(c.tensors[0].dtype, Dtype::Quant("Q4_0".into()));
        assert_eq!((c.tensors[0].offset, c.tensors[0].len), (d, 18));
        assert_eq!((c.tensors[1].offset, c.tensors[1].len), (d + 64, 288));
    }

    #[test]
    fn rejects_malformed_headers() {
        let err = |f: &Vec<u8>| parse(f).unwrap_err().to_string();
        assert!(err(&file(32, &[("a", &[32], 99, 0)], 64)).contains("unknown ggml type id '99'"));
        assert!(err(&file(32, &[("a", &[33], 2, 0)], 64)).contains("not a multiple of the 'Q4_0'"));
        assert!(
            err(&file(32, &[("a", &[8], 0, 1)], 64)).contains("not a multiple of the alignment")
        );
        assert!(err(&file(32, &[("a", &[64], 0, 0)], 64)).contains("lies outside"));
        assert!(err(&file(24, &[], 0)).contains("not a power of two"));
        let mut f = file(32, &[], 0);
        f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            err(&f),
            format!(
                "tensor count '{}' cannot fit in a file of '{}' bytes",
                u64::MAX,
                f.len()
            )
        );
        let mut f = file(32, &[], 0);
        f[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(err(&f), "unsupported gguf version '1'");
        f[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(err(&f).contains("big-endian"));
        let mut f = file(32, &[("\u{e9}", &[1], 0, 0)], 32);
        let at = f.windows(2).position(|w| w == "\u{e9}".as_bytes()).unwrap();
        f[at] = 0xff;
        assert!(err(&f).contains("not valid utf-8"));
    }

    #[test]
    fn ggml_sizes_match_ggml() {
        // Spot checks against ggml's block structs.
        assert_eq!(ggml_type(8), Some(("Q8_0", 32, 34)));
        assert_eq!(ggml_type(14), Some(("Q6_K", 256, 210)));
        assert_eq!(ggml_type(15), Some(("Q8_K", 256, 292)));
        assert_eq!(ggml_type(4), None);
        assert_eq!(ggml_type(31), None);
    }
}
