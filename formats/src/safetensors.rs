//! safetensors: an 8-byte little-endian header length, a JSON header, then the data.
//!
//! The header maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}`,
//! offsets relative to the data start (`8 + header length`); `__metadata__` holds strings.
//! Format: <https://github.com/huggingface/safetensors#format>.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::source::Source;
use super::{
    check_overlaps, numel, sort_tensors, Container, ContainerError, Dtype, Format, Tensor,
};

/// The reference implementation refuses headers above 100 MB; so do we.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

const FORMAT: &str = "safetensors";

/// `true` if `head` (the first bytes of a file) starts like safetensors: 8 bytes of
/// length, then the start of a JSON object: `{}`, or `{"` and printable ASCII up to the
/// end of `head` or the key's closing quote. The length is not judged here: an
/// impossible one in a file that starts like safetensors is one error,
/// [`ContainerError::HeaderTooLong`], whatever its size.
pub fn sniff(head: &[u8]) -> bool {
    if head.get(8) != Some(&b'{') {
        return false;
    }
    match head.get(9) {
        None | Some(b'}') => true,
        Some(b'"') => head[10..]
            .iter()
            .take_while(|&&c| c != b'"')
            .all(|c| (0x20..0x7f).contains(c)),
        Some(_) => false,
    }
}

#[derive(Deserialize)]
struct Info {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The header's tensors in file order of keys, `__metadata__` checked and skipped.
struct Header(Vec<(String, Info)>);

const BAD_TENSOR: &str = "twofold-bad-tensor ";
const BAD_METADATA: &str = "twofold-bad-metadata";

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Header;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a json object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Header, A::Error> {
                use serde::de::Error;
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(name) = m.next_key::<String>()? {
                    if name == "__metadata__" {
                        m.next_value::<Map<String, Value>>()
                            .map_err(|_| A::Error::custom(BAD_METADATA))?;
                        continue;
                    }
                    let info = m
                        .next_value::<Info>()
                        .map_err(|e| A::Error::custom(format!("{BAD_TENSOR}'{name}': {e}")))?;
                    out.push((name, info));
                }
                Ok(Header(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A safetensors dtype name: our dtype and its size in bytes.
pub fn dtype(name: &str) -> Option<(Dtype, u64)> {
    Some(match name {
        "BOOL" => (Dtype::Bool, 1),
        "U8" => (Dtype::U8, 1),
        "I8" => (Dtype::I8, 1),
        "F8_E5M2" => (Dtype::F8E5M2, 1),
        "F8_E4M3" => (Dtype::F8E4M3, 1),
        "F8_E8M0" => (Dtype::Other("F8_E8M0".into()), 1),
        "I16" => (Dtype::I16, 2),
        "U16" => (Dtype::U16, 2),
        "F16" => (Dtype::F16, 2),
        "BF16" => (Dtype::BF16, 2),
        "I32" => (Dtype::I32, 4),
        "U32" => (Dtype::U32, 4),
        "F32" => (Dtype::F32, 4),
        "F64" => (Dtype::F64, 8),
        "I64" => (Dtype::I64, 8),
        "U64" => (Dtype::U64, 8),
        "C64" => (Dtype::Other("C64".into()), 8),
        _ => return None,
    })
}

/// Parses the header and validates every tensor against the file.
pub fn parse(src: &dyn Source) -> Result<Container, ContainerError> {
    let size = src.size();
    let mut len = [0u8; 8];
    len.copy_from_slice(&src.read_at(0, 8, "safetensors header length")?);
    let header_len = u64::from_le_bytes(len);
    if header_len > size - 8 {
        return Err(ContainerError::HeaderTooLong {
            end: 8 + u128::from(header_len),
            size,
        });
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(ContainerError::HeaderLimit {
            len: header_len,
            limit: MAX_HEADER_BYTES,
        });
    }
    let header = src.read_at(8, header_len, "safetensors header")?;
    // Typed, entry by entry: a header of 200,000 tensors never becomes a tree of JSON
    // values (that took 280 MB for a 15 MB file).
    let Header(entries) = serde_json::from_slice(&header).map_err(|e| {
        let msg = e.to_string();
        match msg.strip_prefix(BAD_TENSOR) {
            Some(rest) => ContainerError::invalid(FORMAT, format!("tensor {rest}")),
            None if msg.starts_with(BAD_METADATA) => {
                ContainerError::invalid(FORMAT, "'__metadata__' is not an object")
            }
            None => ContainerError::invalid(FORMAT, format!("header is not a json object: {e}")),
        }
    })?;
    drop(header);
    let data_start = 8 + header_len;
    let data_len = size - data_start;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, info) in entries {
        tensors.push(tensor(name, info, data_start, data_len)?);
    }
    sort_tensors(&mut tensors);
    check_overlaps(&tensors)?;
    Ok(Container {
        format: Format::Safetensors,
        file_size: size,
        data_offset: Some(data_start),
        alignment: None,
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors,
    })
}

fn tensor(
    name: String,
    info: Info,
    data_start: u64,
    data_len: u64,
) -> Result<Tensor, ContainerError> {
    let Some((dtype, elem)) = dtype(&info.dtype) else {
        return Err(ContainerError::UnknownDtype {
            tensor: name,
            dtype: info.dtype,
        });
    };
    let (begin, end) = info.data_offsets;
    if begin > end || end > data_len {
        return Err(ContainerError::OutOfBounds {
            tensor: name,
            start: data_start.saturating_add(begin),
            end: data_start.saturating_add(end),
            data_start,
            data_end: data_start + data_len,
        });
    }
    let expected = numel(&info.shape).and_then(|n| n.checked_mul(elem));
    let Some(expected) = expected else {
        return Err(ContainerError::ShapeOverflow {
            tensor: name,
            shape: info.shape,
        });
    };
    if expected != end - begin {
        return Err(ContainerError::SizeMismatch {
            tensor: name,
            dtype: info.dtype,
            shape: info.shape,
            expected,
            actual: end - begin,
        });
    }
    Ok(Tensor {
        name,
        dtype,
        shape: info.shape,
        offset: data_start + begin,
        len: end - begin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut f = (header.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(header.as_bytes());
        f.resize(f.len() + data, 7);
        f
    }

    #[test]
    fn parses_tensors_and_metadata() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],"data_offsets":[8,20]},"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#;
        let f = file(h, 20);
        let c = parse(&f).unwrap();
        let start = 8 + h.len() as u64;
        assert_eq!(c.format, Format::Safetensors);
        assert_eq!(c.data_offset, Some(start));
        assert_eq!(c.tensors.len(), 2);
        assert_eq!(c.tensors[0].name, "a");
        assert_eq!(c.tensors[0].dtype, Dtype::I64);
        assert_eq!((c.tensors[0].offset, c.tensors[0].len), (start, 8));
        assert_eq!(c.tensors[1].shape, vec![2, 3]);
        assert_eq!((c.tensors[1].offset, c.tensors[1].len), (start + 8, 12));
    }

    #[test]
    fn rejects_bad_headers() {
        let mut f = file("{}", 0);
        f[..8].copy_from_slice(&999_999u64.to_le_bytes());
        f.resize(1024, b' ');
        assert_eq!(
            parse(&f).unwrap_err().to_string(),
            "header runs past the end of the file: it would end at byte '1000007' but the file ends at byte '1024'"
        );
        let err = |h: &str, data| parse(&file(h, data)).unwrap_err().to_string();
        assert!(err("{not json", 0).contains("not a json object"));
        assert!(err(
            r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
            1
        )
        .contains("unknown dtype 'Q9'"));
        assert!(err(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
            3
        )
        .contains("lies outside the data section"));
        assert!(err(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[3,1]}}"#,
            4
        )
        .contains("lies outside"));
        assert!(err(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8
        )
        .contains("needs '12' bytes but it spans '8'"));
        assert!(err(
            r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
            8
        )
        .contains("overflows"));
        assert!(err(r#"{"__metadata__":3}"#, 0).contains("'__metadata__'"));
        // Identical and overlapping offsets are malformed, not padding.
        let same = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        assert_eq!(
            err(same, 4),
            format!("tensors 'a' and 'b' overlap at offset '{}'", 8 + same.len())
        );
        assert!(err(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
            6
        )
        .contains("overlap"));
        // Empty tensors take no bytes.
        assert!(parse(&file(
            r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
            4
        ))
        .is_ok());
        assert!(err(r#"{"a":{"dtype":"U8"}}"#, 0).contains("tensor 'a'"));
    }

    #[test]
    fn sniffs() {
        assert!(sniff(&file("{}", 0)));
        assert!(!sniff(b"{}"));
        assert!(!sniff(b"GGUF\x03\0\0\0\0\0\0\0"));
        assert!(!sniff(b"\0\0\0\0\0\0\0\0{x"));
        assert!(!sniff(b"\0\0\0\0\0\0\0\0{\"ab\x01cd"));
        assert!(sniff(b"\0\0\0\0\0\0\0\0{\"__metadata__\""));
    }

    /// One rule for impossible header lengths: 2^63 and 1000 in a 10-byte file are the
    /// same error, never opaque.
    #[test]
    fn impossible_header_lengths_are_one_error() {
        for len in [1000u64, 1 << 40, 1 << 63, u64::MAX] {
            let mut f = len.to_le_bytes().to_vec();
            f.extend_from_slice(b"{}");
            let err = crate::parse_bytes(&f).unwrap_err().to_string();
            assert!(
                err.starts_with("header runs past the end of the file"),
                "{len}: {err}"
            );
            assert!(err.ends_with("the file ends at byte '10'"), "{len}: {err}");
        }
    }
}
