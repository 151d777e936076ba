//! A bounded protobuf wire-format reader over a [`Seq`]: tags, varints and the position of
//! each field's payload, so the parser can skip tensor data by its length without reading
//! it. Encoding: <https://protobuf.dev/programming-guides/encoding/>.

use super::super::source::Seq;
use super::super::ContainerError;
use super::FORMAT;

/// A field's value: scalars are read, length-delimited payloads only located.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Varint(u64),
    Fixed64,
    Fixed32,
    /// A payload of `len` bytes at absolute offset `start`, not consumed: the caller takes
    /// or skips exactly `len` bytes.
    Len {
        start: u64,
        len: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub number: u32,
    /// Absolute offset of the field's tag.
    pub at: u64,
    pub value: Value,
}

/// One base-128 varint (at most 10 bytes, the last holding at most one bit).
pub fn varint(r: &mut Seq, what: &'static str) -> Result<u64, ContainerError> {
    let at = r.pos();
    let mut v = 0u64;
    for i in 0..10 {
        let b = r.u8(what)?;
        if i == 9 && b > 1 {
            break;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ContainerError::invalid(
        FORMAT,
        format!("{what} at offset '{at}' is not a valid varint"),
    ))
}

/// The next field of a message that ends at `end`, or `None` at `end`. The field, with
/// its payload, must end by `end`.
pub fn field(r: &mut Seq, end: u64, what: &'static str) -> Result<Option<Field>, ContainerError> {
    if r.pos() >= end {
        return Ok(None);
    }
    let at = r.pos();
    let key = varint(r, what)?;
    let number = key >> 3;
    if number == 0 || number > (1 << 29) - 1 {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("{what} at offset '{at}' has field number '{number}'"),
        ));
    }
    let value = match key & 7 {
        0 => Value::Varint(varint(r, what)?),
        1 => {
            r.skip(8, what)?;
            Value::Fixed64
        }
        2 => {
            let len = varint(r, what)?;
            Value::Len {
                start: r.pos(),
                len,
            }
        }
        5 => {
            r.skip(4, what)?;
            Value::Fixed32
        }
        w => {
            return Err(ContainerError::invalid(
                FORMAT,
                format!("{what} at offset '{at}' has wire type '{w}'"),
            ))
        }
    };
    let stop = match value {
        Value::Len { start, len } => start.checked_add(len),
        _ => Some(r.pos()),
    };
    match stop {
        Some(s) if s <= end => {}
        Some(s) if s <= r.size() => {
            return Err(ContainerError::invalid(
                FORMAT,
                format!(
                    "{what} at offset '{at}' runs to '{s}', past the end of its message at '{end}'"
                ),
            ))
        }
        _ => {
            return Err(ContainerError::Truncated {
                what,
                offset: at,
                needed: stop.map_or(u64::MAX, |s| s - at),
                size: r.size(),
            })
        }
    }
    // `number` < 2^29 fits.
    Ok(Some(Field {
        number: number as u32,
        at,
        value,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields() {
        let b: &[u8] = &[0x08, 0x96, 0x01, 0x12, 0x02, 0xaa, 0xbb, 0x1d, 1, 2, 3, 4];
        let mut r = Seq::new(&b, 0);
        let f = field(&mut r, 12, "f").unwrap().unwrap();
        assert_eq!((f.number, f.value), (1, Value::Varint(150)));
        let f = field(&mut r, 12, "f").unwrap().unwrap();
        assert_eq!(f.value, Value::Len { start: 5, len: 2 });
        r.skip(2, "f").unwrap();
        let f = field(&mut r, 12, "f").unwrap().unwrap();
        assert_eq!((f.number, f.at, f.value), (3, 7, Value::Fixed32));
        assert!(field(&mut r, 12, "f").unwrap().is_none());
    }

    #[test]
    fn rejects_bad_wire() {
        let err = |b: &[u8], end| {
            let mut r = Seq::new(&b, 0);
            field(&mut r, end, "f").unwrap_err().to_string()
        };
        assert!(err(&[0x0b], 1).contains("wire type '3'"));
        assert!(err(&[0x00, 0x00], 2).contains("field number '0'"));
        assert!(err(&[0x12, 0x05, 0, 0], 4).starts_with("truncated f"));
        assert!(err(&[0x12, 0x02, 0, 0, 0], 3).contains("past the end of its message"));
        assert!(err(
            &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
            11
        )
        .contains("not a valid varint"));
        assert!(err(&[0x08, 0x80], 2).starts_with("truncated"));
    }
}
