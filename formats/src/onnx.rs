//! ONNX: a protobuf `ModelProto` (`onnx.proto3`). The tensors are the graph's
//! initializers (`ModelProto.graph` = 7 → `GraphProto.initializer` = 5, `TensorProto`s),
//! the values of its nodes' tensor attributes (`NodeProto.attribute` = 5 →
//! `AttributeProto.t` = 5 / `tensors` = 10: `Constant` nodes) and the same in subgraphs
//! (`AttributeProto.g` = 6 / `graphs` = 11: `If`, `Loop`, `Scan` bodies), to a depth of 16.
//! onnxruntime copies every one of them into its heap.
//!
//! Protobuf has no magic and no end marker, so a file is taken as ONNX only when its whole
//! top level walks as a `ModelProto`: `ir_version` (field 1, tag `0x08`) first, every
//! field well-formed and inside the file, known fields of the right wire type, and a
//! graph. Anything else (a truncated model included) is opaque.
//!
//! The graph is walked at the wire level ([`wire`]) so each `raw_data` payload is located
//! (its absolute offset in the file) and skipped by its length, never read: a model of
//! several GB costs reads of its small fields only. Each initializer's small fields
//! (dims, data_type, name, external_data, data_location) are copied out, bounded, and
//! decoded with prost ([`proto`]).
//!
//! Where the data lies:
//! - `raw_data` (9): little-endian bytes, one [`Tensor`] at the payload's offset;
//! - packed `float_data` (4) / `double_data` (10): the payload is the little-endian
//!   floats, so it is a [`Tensor`] too;
//! - varint-packed `int32_data` (5, also FLOAT16/BFLOAT16/INT8... as int32), `int64_data`
//!   (7), `uint64_data` (11) and `string_data` (6) are no byte range equal to the values
//!   in memory: listed in [`Container::unmapped`], not in `tensors`;
//! - `data_location: EXTERNAL` (14) with `external_data` (13) `location`, `offset`,
//!   `length`: the bytes are in another file, listed in [`Container::external`].
//!
//! Schema: <https://github.com/onnx/onnx/blob/main/onnx/onnx.proto3>; external data:
//! <https://github.com/onnx/onnx/blob/main/docs/ExternalData.md>.

pub mod proto;
pub mod wire;

use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

use super::source::{Seq, Source};
use super::{
    numel, sort_tensors, Container, ContainerError, Dtype, ExternalTensor, Format, Tensor,
    UnmappedTensor,
};
use wire::Value;

pub(crate) const FORMAT: &str = "onnx";
/// Highest `ir_version` taken as ONNX (the format is at 11 in 2025; the bound keeps the
/// version one byte, which the sniff relies on).
pub const MAX_IR_VERSION: u64 = 100;
/// A `ModelProto` with more top-level fields than this is not taken as ONNX.
const MAX_TOP_FIELDS: u32 = 1 << 16;
/// The small fields of one initializer (name, dims, external_data...) may take this much.
pub const MAX_TENSOR_META_BYTES: u64 = 1 << 20;
/// Read-ahead of the walk: tags and small fields between skipped payloads.
const CHUNK: u64 = 16 << 10;
const EXTERNAL: i32 = proto::DataLocation::External as i32;

/// `true` if `head` starts like a `ModelProto`: tag `0x08` (`ir_version`, varint) and a
/// one-byte version in `1..=MAX_IR_VERSION`. Only a first filter: see [`detect`].
pub fn sniff(head: &[u8]) -> bool {
    match head {
        [0x08, v, ..] => (1..=MAX_IR_VERSION).contains(&u64::from(*v)),
        _ => false,
    }
}

/// The top level of a `ModelProto`: its version and where its graph lies (protobuf merges
/// a repeated singular message, so every occurrence is kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub ir_version: u64,
    /// `(offset, len)` of each `graph` payload.
    pub graphs: Vec<(u64, u64)>,
}

/// The wire type each known `ModelProto` field must have: 0 varint, 2 length-delimited.
fn model_field_wire(number: u32) -> Option<u8> {
    match number {
        1 | 5 => Some(0),
        2..=4 | 6..=8 | 14 | 20 | 25 | 26 => Some(2),
        _ => None,
    }
}

fn walk_model(src: &dyn Source) -> Result<Model, ContainerError> {
    let size = src.size();
    if !sniff(&src.read_at(0, size.min(2), "onnx ir_version")?) {
        return Err(ContainerError::invalid(
            FORMAT,
            "no 'ir_version' field first (tag 0x08, a version up to 100)",
        ));
    }
    let mut r = Seq::new(src, 0).with_chunk(CHUNK);
    let mut ir_version = 0;
    let mut graphs = Vec::new();
    let mut fields = 0u32;
    while let Some(f) = wire::field(&mut r, size, "onnx model field")? {
        fields += 1;
        if fields > MAX_TOP_FIELDS {
            return Err(ContainerError::invalid(
                FORMAT,
                format!("more than '{MAX_TOP_FIELDS}' top-level fields"),
            ));
        }
        let wire = match f.value {
            Value::Varint(_) => 0,
            Value::Len { .. } => 2,
            Value::Fixed64 => 1,
            Value::Fixed32 => 5,
        };
        if model_field_wire(f.number).is_some_and(|w| w != wire) {
            return Err(ContainerError::invalid(
                FORMAT,
                format!(
                    "model field '{}' at offset '{}' has wire type '{wire}'",
                    f.number, f.at
                ),
            ));
        }
        match f.value {
            Value::Varint(v) if f.number == 1 => ir_version = v,
            Value::Len { start, len } => {
                if f.number == 7 {
                    graphs.push((start, len));
                }
                r.skip(len, "onnx model field")?;
            }
            _ => {}
        }
    }
    if !(1..=MAX_IR_VERSION).contains(&ir_version) {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("ir_version '{ir_version}' is not in '1..={MAX_IR_VERSION}'"),
        ));
    }
    if graphs.is_empty() {
        return Err(ContainerError::invalid(FORMAT, "the model has no graph"));
    }
    Ok(Model { ir_version, graphs })
}

/// The top level of a `ModelProto`, or `None` if the file is not a whole one (then it is
/// opaque). Only I/O errors are errors.
pub fn detect(src: &dyn Source) -> Result<Option<Model>, ContainerError> {
    match walk_model(src) {
        Ok(m) => Ok(Some(m)),
        Err(e @ ContainerError::Read { .. }) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Parses an ONNX model; an error if it is not one (see [`detect`]).
pub fn parse(src: &dyn Source) -> Result<Container, ContainerError> {
    let model = walk_model(src)?;
    parse_model(src, &model)
}

/// The tensor tables of a model [`detect`] found.
pub fn parse_model(src: &dyn Source, model: &Model) -> Result<Container, ContainerError> {
    let mut out = Tables::default();
    for &(start, len) in &model.graphs {
        let mut r = Seq::new(src, start).with_chunk(CHUNK);
        graph(&mut r, start, len, 0, &mut out)?;
    }
    sort_tensors(&mut out.tensors);
    Ok(Container {
        format: Format::Onnx,
        file_size: src.size(),
        data_offset: None,
        alignment: None,
        tensors: out.tensors,
        external: out.external,
        unmapped: out.unmapped,
    })
}

/// Graphs nested deeper than this (subgraphs of subgraphs...) are not walked: their
/// tensors are searched as the file's uncovered bytes, like any unparsed data.
const MAX_GRAPH_DEPTH: u32 = 16;

/// Walks one `GraphProto` at `start..start + len` (the reader at `start`): its
/// initializers (5), and the tensors its nodes (1) hold, at any depth up to
/// [`MAX_GRAPH_DEPTH`].
fn graph(
    r: &mut Seq,
    start: u64,
    len: u64,
    depth: u32,
    out: &mut Tables,
) -> Result<(), ContainerError> {
    let end = start.saturating_add(len);
    while let Some(f) = wire::field(r, end, "onnx graph field")? {
        match (f.number, f.value) {
            (5, Value::Len { start, len }) => initializer(r, start, len, None, out)?,
            (5, _) => {
                return Err(ContainerError::invalid(
                    FORMAT,
                    format!("initializer at offset '{}' is not a message", f.at),
                ))
            }
            (1, Value::Len { start, len }) => node(r, start, len, depth, out)?,
            (_, Value::Len { len, .. }) => r.skip(len, "onnx graph field")?,
            _ => {}
        }
    }
    Ok(())
}

/// Walks one `NodeProto`: the tensors of its attributes (5), as a `Constant` node holds
/// its value (`AttributeProto.t` = 5, `tensors` = 10), and the subgraphs of an `If`,
/// `Loop` or `Scan` (`g` = 6, `graphs` = 11), whose initializers are the model's weights
/// in exports such as silero_vad's. A tensor with no name of its own is named after the
/// node's first output (`Constant`'s value usually is).
fn node(
    r: &mut Seq,
    start: u64,
    len: u64,
    depth: u32,
    out: &mut Tables,
) -> Result<(), ContainerError> {
    let end = start.saturating_add(len);
    let mut output: Option<String> = None;
    while let Some(f) = wire::field(r, end, "onnx node field")? {
        match (f.number, f.value) {
            (2, Value::Len { len, .. }) if output.is_none() && len <= 4096 => {
                let b = r.take(len, "onnx node output")?;
                output = Some(String::from_utf8_lossy(b).into_owned());
            }
            (5, Value::Len { start: a, len: n }) => {
                let aend = a.saturating_add(n);
                while let Some(g) = wire::field(r, aend, "onnx attribute field")? {
                    match (g.number, g.value) {
                        (5 | 10, Value::Len { start, len }) => {
                            let fallback = output
                                .clone()
                                .unwrap_or_else(|| format!("constant@{start}"));
                            initializer(r, start, len, Some(fallback), out)?
                        }
                        (6 | 11, Value::Len { start, len }) if depth < MAX_GRAPH_DEPTH => {
                            graph(r, start, len, depth + 1, out)?
                        }
                        (_, Value::Len { len, .. }) => r.skip(len, "onnx attribute field")?,
                        _ => {}
                    }
                }
            }
            (_, Value::Len { len, .. }) => r.skip(len, "onnx node field")?,
            _ => {}
        }
    }
    Ok(())
}

#[derive(Default)]
struct Tables {
    tensors: Vec<Tensor>,
    external: Vec<ExternalTensor>,
    unmapped: Vec<UnmappedTensor>,
}

/// Where one initializer's data lies, from the wire walk.
#[derive(Default)]
struct Data {
    /// Last `raw_data` payload (protobuf: the last one wins).
    raw: Option<(u64, u64)>,
    /// Packed `float_data` / `double_data` payloads.
    fixed: Vec<(u64, u64)>,
    /// A typed field with no contiguous in-memory form.
    other: Option<&'static str>,
}

/// Walks one `TensorProto` at `start..start + len`: locates its data, copies its small
/// fields into a bounded buffer and decodes that with prost. `unnamed`: the name of a
/// tensor that has none (a `Constant` node's value), else a nameless one is an error.
fn initializer(
    r: &mut Seq,
    start: u64,
    len: u64,
    unnamed: Option<String>,
    out: &mut Tables,
) -> Result<(), ContainerError> {
    let end = start.saturating_add(len);
    let mut meta = Vec::new();
    let mut data = Data::default();
    let too_big = || {
        ContainerError::invalid(
            FORMAT,
            format!("initializer at offset '{start}' has more than '{MAX_TENSOR_META_BYTES}' bytes of metadata"),
        )
    };
    while let Some(f) = wire::field(r, end, "onnx tensor field")? {
        match f.value {
            Value::Len { start: p, len: n } => match f.number {
                // dims (packed), name, external_data entries: small, decoded below.
                1 | 8 | 13 => {
                    if (meta.len() as u64).saturating_add(n) > MAX_TENSOR_META_BYTES {
                        return Err(too_big());
                    }
                    encode_key(f.number, WireType::LengthDelimited, &mut meta);
                    encode_varint(n, &mut meta);
                    meta.extend_from_slice(r.take(n, "onnx tensor field")?);
                }
                9 | 4 | 10 => {
                    if f.number == 9 {
                        data.raw = Some((p, n));
                    } else {
                        data.fixed.push((p, n));
                    }
                    r.skip(n, "onnx tensor data")?;
                }
                5 | 7 | 11 | 6 => {
                    data.other = Some(storage_name(f.number));
                    r.skip(n, "onnx tensor data")?;
                }
                _ => r.skip(n, "onnx tensor field")?,
            },
            Value::Varint(v) => match f.number {
                // dims (unpacked), data_type, data_location.
                1 | 2 | 14 => {
                    if meta.len() as u64 + 11 > MAX_TENSOR_META_BYTES {
                        return Err(too_big());
                    }
                    encode_key(f.number, WireType::Varint, &mut meta);
                    encode_varint(v, &mut meta);
                }
                5 | 7 | 11 => data.other = Some(storage_name(f.number)),
                _ => {}
            },
            Value::Fixed32 if f.number == 4 => data.other = Some("float_data (unpacked)"),
            Value::Fixed64 if f.number == 10 => data.other = Some("double_data (unpacked)"),
            _ => {}
        }
    }
    let mut t = proto::TensorProto::decode(&meta[..]).map_err(|e| {
        ContainerError::invalid(FORMAT, format!("initializer at offset '{start}': {e}"))
    })?;
    if t.name.is_empty() {
        t.name = unnamed.unwrap_or_default();
    }
    place(t, start, data, out)
}

fn storage_name(field: u32) -> &'static str {
    match field {
        5 => "int32_data (varints)",
        7 => "int64_data (varints)",
        11 => "uint64_data (varints)",
        _ => "string_data",
    }
}

/// Puts a decoded initializer in the right table after checking its size.
fn place(
    t: proto::TensorProto,
    start: u64,
    data: Data,
    out: &mut Tables,
) -> Result<(), ContainerError> {
    if t.name.is_empty() {
        return Err(ContainerError::invalid(
            FORMAT,
            format!("initializer at offset '{start}' has no name"),
        ));
    }
    let name = t.name;
    if t.data_type == 0 {
        return Err(ContainerError::UnknownDtype {
            tensor: name,
            dtype: "UNDEFINED".into(),
        });
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for d in t.dims {
        let Ok(d) = u64::try_from(d) else {
            return Err(ContainerError::invalid(
                FORMAT,
                format!("tensor '{name}': negative dimension '{d}'"),
            ));
        };
        shape.push(d);
    }
    let dtype = dtype(t.data_type);
    let expected = match byte_size(t.data_type, &shape) {
        Ok(e) => e,
        Err(()) => {
            return Err(ContainerError::ShapeOverflow {
                tensor: name,
                shape,
            })
        }
    };
    let check = |actual: u64, name: &str, shape: &[u64]| match expected {
        Some(e) if e != actual => Err(ContainerError::SizeMismatch {
            tensor: name.to_string(),
            dtype: dtype.name(),
            shape: shape.to_vec(),
            expected: e,
            actual,
        }),
        _ => Ok(()),
    };
    if t.data_location == EXTERNAL {
        let (location, offset, length) = external_entries(&name, &t.external_data)?;
        let Some(len) = length.or(expected) else {
            return Err(ContainerError::invalid(
                FORMAT,
                format!("external tensor '{name}' has no 'length' and no known element size"),
            ));
        };
        check(len, &name, &shape)?;
        out.external.push(ExternalTensor {
            name,
            dtype,
            shape,
            location,
            offset,
            len,
        });
        return Ok(());
    }
    let bytes = match (data.raw, data.fixed.as_slice()) {
        (Some(range), _) => Some(range),
        (None, [range]) => Some(*range),
        (None, []) if data.other.is_none() && expected == Some(0) => Some((start, 0)),
        _ => None,
    };
    match bytes {
        Some((offset, len)) => {
            check(len, &name, &shape)?;
            out.tensors.push(Tensor {
                name,
                dtype,
                shape,
                offset,
                len,
            });
        }
        None => {
            let storage = match (data.fixed.len(), data.other) {
                (n, _) if n > 1 => "float_data (split)",
                (_, Some(s)) => s,
                _ => "no data",
            };
            out.unmapped.push(UnmappedTensor {
                name,
                dtype,
                shape,
                storage: storage.into(),
            });
        }
    }
    Ok(())
}

/// `location`, `offset` (default 0) and `length` of an external tensor.
fn external_entries(
    name: &str,
    entries: &[proto::StringStringEntryProto],
) -> Result<(String, u64, Option<u64>), ContainerError> {
    let mut location = None;
    let mut offset = 0;
    let mut length = None;
    let number = |key: &str, value: &str| {
        value.trim().parse::<u64>().map_err(|_| {
            ContainerError::invalid(
                FORMAT,
                format!("tensor '{name}': external_data '{key}' is '{value}', not a byte count"),
            )
        })
    };
    for e in entries {
        match e.key.as_str() {
            "location" => location = Some(e.value.clone()),
            "offset" => offset = number("offset", &e.value)?,
            "length" => length = Some(number("length", &e.value)?),
            _ => {}
        }
    }
    match location {
        Some(l) if !l.is_empty() => Ok((l, offset, length)),
        _ => Err(ContainerError::invalid(
            FORMAT,
            format!("external tensor '{name}' has no 'location'"),
        )),
    }
}

/// Our dtype for an ONNX `TensorProto.DataType`.
pub fn dtype(data_type: i32) -> Dtype {
    let other = |s: &str| Dtype::Other(s.into());
    match data_type {
        1 => Dtype::F32,
        2 => Dtype::U8,
        3 => Dtype::I8,
        4 => Dtype::U16,
        5 => Dtype::I16,
        6 => Dtype::I32,
        7 => Dtype::I64,
        8 => other("STRING"),
        9 => Dtype::Bool,
        10 => Dtype::F16,
        11 => Dtype::F64,
        12 => Dtype::U32,
        13 => Dtype::U64,
        14 => other("COMPLEX64"),
        15 => other("COMPLEX128"),
        16 => Dtype::BF16,
        17 => Dtype::F8E4M3,
        18 => other("FLOAT8E4M3FNUZ"),
        19 => Dtype::F8E5M2,
        20 => other("FLOAT8E5M2FNUZ"),
        21 => other("UINT4"),
        22 => other("INT4"),
        23 => other("FLOAT4E2M1"),
        24 => other("FLOAT8E8M0"),
        25 => other("UINT2"),
        26 => other("INT2"),
        n => Dtype::Other(format!("onnx type {n}")),
    }
}

/// Bits per element of a `DataType` stored as raw bytes; `None` for STRING and unknown ids.
fn elem_bits(data_type: i32) -> Option<u64> {
    Some(match data_type {
        2 | 3 | 9 | 17..=20 | 24 => 8,
        4 | 5 | 10 | 16 => 16,
        1 | 6 | 12 => 32,
        7 | 11 | 13 | 14 => 64,
        15 => 128,
        21..=23 => 4,
        25 | 26 => 2,
        _ => return None,
    })
}

/// Bytes of `shape` elements (sub-byte types packed, rounded up); `Ok(None)` where the
/// element size is unknown, `Err` on overflow.
fn byte_size(data_type: i32, shape: &[u64]) -> Result<Option<u64>, ()> {
    let Some(bits) = elem_bits(data_type) else {
        return Ok(None);
    };
    let n = numel(shape).ok_or(())?;
    let total = n.checked_mul(bits).ok_or(())?;
    Ok(Some(total.div_ceil(8)))
}

#[cfg(test)]
mod tests;
