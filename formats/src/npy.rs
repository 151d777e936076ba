//! NumPy `.npy` format 1.0, 2.0 and 3.0: magic `\x93NUMPY`, major and minor version, a
//! header length (u16 in 1.0, u32 after), and a Python-literal dict with `descr`,
//! `fortran_order` and `shape`; the array data follows the header.
//!
//! The dict is parsed by [`super::pyliteral`], never evaluated.
//! Format: <https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>.

use super::pyliteral::{self, Lit};
use super::source::{check_range, Source};
use super::{numel, Container, ContainerError, Dtype, Format, Tensor};

const FORMAT: &str = "npy";
pub const MAGIC: &[u8] = b"\x93NUMPY";
/// Headers longer than this are refused (NumPy itself refuses more than 10,000 bytes
/// unless told otherwise).
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// `true` if the file starts with the NumPy magic.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// One array's header, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    pub major: u8,
    pub minor: u8,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub fortran_order: bool,
    /// Absolute offset of the first data byte.
    pub data_offset: u64,
    /// Data bytes: elements × item size, or, for object and structured dtypes whose size
    /// we do not compute, everything up to the end of the array's region.
    pub len: u64,
}

/// Our dtype and the item size of a NumPy type string (`<f4`, `|b1`, `>i8`, `<U10`).
fn typestr(descr: &str) -> Option<(Dtype, u64)> {
    let (order, rest) = match descr.as_bytes().first()? {
        b'<' | b'>' | b'|' | b'=' => descr.split_at(1),
        _ => ("", descr),
    };
    let mut chars = rest.chars();
    let kind = chars.next()?;
    let digits: String = chars.take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().ok()?;
    let dtype = match (kind, n) {
        ('b', 1) => Dtype::Bool,
        ('i', 1) => Dtype::I8,
        ('u', 1) => Dtype::U8,
        _ if order == ">" => Dtype::Other(descr.to_string()),
        ('i', 2) => Dtype::I16,
        ('i', 4) => Dtype::I32,
        ('i', 8) => Dtype::I64,
        ('u', 2) => Dtype::U16,
        ('u', 4) => Dtype::U32,
        ('u', 8) => Dtype::U64,
        ('f', 2) => Dtype::F16,
        ('f', 4) => Dtype::F32,
        ('f', 8) => Dtype::F64,
        ('f' | 'c' | 'V' | 'S' | 'a' | 'M' | 'm', _) => Dtype::Other(rest.to_string()),
        ('U', _) => return Some((Dtype::Other(rest.to_string()), n.checked_mul(4)?)),
        _ => return None,
    };
    Some((dtype, n))
}

fn shape(lit: Option<&Lit>) -> Result<Vec<u64>, ContainerError> {
    let bad = || ContainerError::invalid(FORMAT, "'shape' is not a tuple of non-negative integers");
    match lit {
        Some(Lit::Tuple(items)) => items
            .iter()
            .map(|d| match d {
                Lit::Int(n) => u64::try_from(*n).map_err(|_| bad()),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// Reads the array whose `.npy` bytes lie in `start..end` of `src`.
pub fn array(src: &dyn Source, start: u64, end: u64) -> Result<Array, ContainerError> {
    let read = |at: u64, len: u64, what| {
        check_range(at, len, end, what)?;
        src.read_at(at, len, what)
    };
    let pre = read(start, 8, "npy preamble")?;
    let (Some(magic), Some(&major), Some(&minor)) = (pre.get(..6), pre.get(6), pre.get(7)) else {
        return Err(ContainerError::invalid(FORMAT, "short preamble"));
    };
    if magic != MAGIC {
        return Err(ContainerError::invalid(FORMAT, "no '\\x93NUMPY' magic"));
    }
    let (len_at, len_size) = match major {
        1 => (8, 2),
        2 | 3 => (8, 4),
        _ => {
            return Err(ContainerError::Version {
                format: FORMAT,
                version: major.into(),
            })
        }
    };
    let len_bytes = read(start + len_at, len_size, "npy header length")?;
    let header_len = len_bytes
        .iter()
        .rev()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    let header_at = start + len_at + len_size;
    if header_len > MAX_HEADER_BYTES {
        return Err(ContainerError::HeaderLimit {
            len: header_len,
            limit: MAX_HEADER_BYTES,
        });
    }
    if header_at.saturating_add(header_len) > end {
        return Err(ContainerError::HeaderTooLong {
            end: u128::from(header_at) + u128::from(header_len),
            size: end,
        });
    }
    let text = read(header_at, header_len, "npy header")?;
    let dict = pyliteral::parse(&text, major >= 3)
        .map_err(|e| ContainerError::invalid(FORMAT, format!("header dict: {e}")))?;
    if !matches!(dict, Lit::Dict(_)) {
        return Err(ContainerError::invalid(FORMAT, "header is not a dict"));
    }
    let shape = shape(dict.get("shape"))?;
    let fortran_order = match dict.get("fortran_order") {
        Some(Lit::Bool(b)) => *b,
        _ => {
            return Err(ContainerError::invalid(
                FORMAT,
                "'fortran_order' is not a bool",
            ))
        }
    };
    let data_offset = header_at + header_len;
    let rest = end - data_offset;
    let (dtype, len) = match dict.get("descr") {
        Some(Lit::Str(s)) if s.trim_start_matches(['<', '>', '|', '=']) == "O" => {
            (Dtype::Other("object".into()), rest)
        }
        Some(Lit::Str(s)) => {
            let Some((dtype, item)) = typestr(s) else {
                return Err(ContainerError::UnknownDtype {
                    tensor: "array".into(),
                    dtype: s.clone(),
                });
            };
            let Some(len) = numel(&shape).and_then(|n| n.checked_mul(item)) else {
                return Err(ContainerError::ShapeOverflow {
                    tensor: "array".into(),
                    shape,
                });
            };
            (dtype, len)
        }
        Some(Lit::List(_)) => (Dtype::Other("structured".into()), rest),
        _ => {
            return Err(ContainerError::invalid(
                FORMAT,
                "'descr' is missing or not a string",
            ))
        }
    };
    if len > rest {
        return Err(ContainerError::OutOfBounds {
            tensor: "array".into(),
            start: data_offset,
            end: data_offset.saturating_add(len),
            data_start: data_offset,
            data_end: end,
        });
    }
    Ok(Array {
        major,
        minor,
        dtype,
        shape,
        fortran_order,
        data_offset,
        len,
    })
}

/// Parses a whole `.npy` file: one tensor named `array`.
pub fn parse(src: &dyn Source) -> Result<Container, ContainerError> {
    let a = array(src, 0, src.size())?;
    Ok(Container {
        format: Format::Npy {
            major: a.major,
            minor: a.minor,
        },
        file_size: src.size(),
        data_offset: Some(a.data_offset),
        alignment: None,
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors: vec![Tensor {
            name: "array".into(),
            dtype: a.dtype,
            shape: a.shape,
            offset: a.data_offset,
            len: a.len,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(major: u8, dict: &str, data: usize) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&[major, 0]);
        let pre = if major == 1 { 10 } else { 12 };
        let mut h = dict.to_string();
        while (pre + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        if major == 1 {
            f.extend_from_slice(&(h.len() as u16).to_le_bytes());
        } else {
            f.extend_from_slice(&(h.len() as u32).to_le_bytes());
        }
        f.extend_from_slice(h.as_bytes());
        f.resize(f.len() + data, 1);
        f
    }

    #[test]
    fn parses_versions_and_dtypes() {
        let f = file(
            1,
            "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }",
            12,
        );
        let c = parse(&f).unwrap();
        assert_eq!(c.format, Format::Npy { major: 1, minor: 0 });
        assert_eq!(c.data_offset, Some(128));
        assert_eq!(c.tensors[0].dtype, Dtype::F16);
        assert_eq!((c.tensors[0].offset, c.tensors[0].len), (128, 12));
        let f = file(
            3,
            "{'descr': '>i4', 'fortran_order': True, 'shape': (), }",
            4,
        );
        let c = parse(&f).unwrap();
        assert_eq!(c.tensors[0].dtype, Dtype::Other(">i4".into()));
        assert_eq!(c.tensors[0].len, 4);
        let f = file(
            2,
            "{'descr': '|O', 'fortran_order': False, 'shape': (5,), }",
            33,
        );
        assert_eq!(parse(&f).unwrap().tensors[0].len, 33);
        assert_eq!(typestr("<U3"), Some((Dtype::Other("U3".into()), 12)));
        assert_eq!(typestr("|b1"), Some((Dtype::Bool, 1)));
        assert_eq!(typestr("<x4"), None);
    }

    #[test]
    fn rejects_malformed_headers() {
        let err = |f: Vec<u8>| parse(&f).unwrap_err().to_string();
        assert!(err(file(
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
            15
        ))
        .contains("lies outside"));
        assert!(err(file(1, "{'descr': '<f4', 'shape': (4,), }", 16)).contains("fortran_order"));
        assert!(err(file(
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
            0
        ))
        .contains("'shape'"));
        assert!(err(file(
            1,
            "{'descr': '<q9', 'fortran_order': False, 'shape': (), }",
            0
        ))
        .contains("unknown dtype '<q9'"));
        assert!(err(file(4, "{}", 0)).contains("unsupported npy version '4'"));
        let mut f = file(1, "{}", 0);
        f[8..10].copy_from_slice(&9999u16.to_le_bytes());
        assert!(err(f).contains("it would end at byte '10009'"));
    }
}
