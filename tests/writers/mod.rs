//! Writers of real container files for the tests, the fuzz seed corpus and the benchmark:
//! GGUF v2/v3, safetensors, `.npy`, zip (stored, deflated, zip64), `torch.save`-style
//! archives and ONNX models (encoded with prost from the parser's own message structs,
//! the one writer that shares code with its parser: protobuf encoding is prost's). They follow the format specifications, not the parsers under test, and
//! return the tensor table the file should parse to.
#![allow(dead_code, clippy::unwrap_used)]

use twofold::container::{Dtype, Tensor};

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u64le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Deterministic filler bytes, different for each `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

// ---------------------------------------------------------------- GGUF

/// A GGUF key-value value.
#[derive(Clone)]
pub enum Kv {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and items (all of that type).
    Arr(u32, Vec<Kv>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Kv {
    fn type_id(&self) -> u32 {
        match self {
            Kv::U8(_) => 0,
            Kv::I8(_) => 1,
            Kv::U16(_) => 2,
            Kv::I16(_) => 3,
            Kv::U32(_) => 4,
            Kv::I32(_) => 5,
            Kv::F32(_) => 6,
            Kv::Bool(_) => 7,
            Kv::Str(_) => 8,
            Kv::Arr(..) => 9,
            Kv::U64(_) => 10,
            Kv::I64(_) => 11,
            Kv::F64(_) => 12,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Kv::U8(v) => out.push(*v),
            Kv::I8(v) => out.push(*v as u8),
            Kv::U16(v) => u16le(out, *v),
            Kv::I16(v) => u16le(out, *v as u16),
            Kv::U32(v) => u32le(out, *v),
            Kv::I32(v) => u32le(out, *v as u32),
            Kv::F32(v) => u32le(out, v.to_bits()),
            Kv::Bool(v) => out.push(u8::from(*v)),
            Kv::Str(s) => gguf_str(out, s.as_bytes()),
            Kv::Arr(ty, items) => {
                u32le(out, *ty);
                u64le(out, items.len() as u64);
                for i in items {
                    i.write(out);
                }
            }
            Kv::U64(v) => u64le(out, *v),
            Kv::I64(v) => u64le(out, *v as u64),
            Kv::F64(v) => u64le(out, v.to_bits()),
        }
    }
}

fn gguf_str(out: &mut Vec<u8>, s: &[u8]) {
    u64le(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// One GGUF tensor: ggml type id, dims (ne0 first), its data, and the dtype the parser
/// should report.
pub struct GgufTensor {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
    pub dtype: Dtype,
}

impl GgufTensor {
    pub fn new(name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>, dtype: Dtype) -> Self {
        GgufTensor {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            ggml_type,
            data,
            dtype,
        }
    }
}

/// A GGUF file. With `alignment`, writes `general.alignment` (u32) first; tensors are
/// laid out in order, each at the next multiple of the alignment, as gguf-py does.
pub fn gguf(
    version: u32,
    alignment: Option<u32>,
    kvs: &[(&str, Kv)],
    tensors: &[GgufTensor],
) -> (Vec<u8>, Vec<Tensor>) {
    let align = u64::from(alignment.unwrap_or(32));
    let mut kv: Vec<(&str, Kv)> = Vec::new();
    if let Some(a) = alignment {
        kv.push(("general.alignment", Kv::U32(a)));
    }
    kv.extend(kvs.iter().cloned());
    let mut out = b"GGUF".to_vec();
    u32le(&mut out, version);
    u64le(&mut out, tensors.len() as u64);
    u64le(&mut out, kv.len() as u64);
    for (k, v) in &kv {
        gguf_str(&mut out, k.as_bytes());
        u32le(&mut out, v.type_id());
        v.write(&mut out);
    }
    let mut rel = Vec::new();
    let mut pos = 0u64;
    for t in tensors {
        pos = pos.next_multiple_of(align);
        rel.push(pos);
        pos += t.data.len() as u64;
    }
    for (t, off) in tensors.iter().zip(&rel) {
        gguf_str(&mut out, &t.name);
        u32le(&mut out, t.dims.len() as u32);
        for d in &t.dims {
            u64le(&mut out, *d);
        }
        u32le(&mut out, t.ggml_type);
        u64le(&mut out, *off);
    }
    let data_start = (out.len() as u64).next_multiple_of(align);
    out.resize(data_start as usize, 0);
    let mut expected = Vec::new();
    for (t, off) in tensors.iter().zip(&rel) {
        out.resize((data_start + off) as usize, 0);
        out.extend_from_slice(&t.data);
        expected.push(Tensor {
            name: String::from_utf8_lossy(&t.name).into_owned(),
            dtype: t.dtype.clone(),
            shape: t.dims.clone(),
            offset: data_start + off,
            len: t.data.len() as u64,
        });
    }
    (out, expected)
}

/// A GGUF of `n` small tensors alternating Q4_K [256, 2] and F32 [64], with a
/// tokenizer-like string array: the benchmark's many-tensor file.
pub fn gguf_many(n: usize) -> Vec<u8> {
    let tensors: Vec<GgufTensor> = (0..n)
        .map(|i| {
            let name = format!("blk.{}.ffn_{}.weight", i / 8, i % 8);
            if i % 2 == 0 {
                GgufTensor::new(
                    &name,
                    &[256, 2],
                    12,
                    vec![1; 288],
                    Dtype::Quant("Q4_K".into()),
                )
            } else {
                GgufTensor::new(&name, &[64], 0, vec![2; 256], Dtype::F32)
            }
        })
        .collect();
    let vocab = (0..1000).map(|i| Kv::Str(format!("tok{i}"))).collect();
    let kvs = [
        ("general.architecture", Kv::Str("llama".into())),
        ("tokenizer.ggml.tokens", Kv::Arr(8, vocab)),
    ];
    gguf(3, None, &kvs, &tensors).0
}

// ---------------------------------------------------------------- safetensors

pub struct SafeTensor {
    pub name: String,
    /// safetensors dtype name (`F16`) and the dtype the parser should report.
    pub dtype: (&'static str, Dtype),
    pub shape: Vec<u64>,
    /// Offset relative to the data start; `None` packs it after the previous tensor.
    pub offset: Option<u64>,
    pub data: Vec<u8>,
}

/// A safetensors file; the header is padded with spaces so the data starts at a multiple
/// of 8, or at `data_start` if given (which must leave room for the header).
pub fn safetensors(tensors: &[SafeTensor], data_start: Option<u64>) -> (Vec<u8>, Vec<Tensor>) {
    let mut header = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    let mut pos = 0u64;
    let mut rel = Vec::new();
    for t in tensors {
        let off = t.offset.unwrap_or(pos);
        let end = off + t.data.len() as u64;
        header.push_str(&format!(
            r#","{}":{{"dtype":"{}","shape":{:?},"data_offsets":[{off},{end}]}}"#,
            t.name, t.dtype.0, t.shape
        ));
        rel.push(off);
        pos = end;
    }
    header.push('}');
    let want = data_start.unwrap_or_else(|| (8 + header.len() as u64).next_multiple_of(8));
    assert!(want >= 8 + header.len() as u64, "header does not fit");
    while 8 + (header.len() as u64) < want {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    let mut expected = Vec::new();
    for (t, off) in tensors.iter().zip(rel) {
        let at = (want + off) as usize;
        if out.len() < at + t.data.len() {
            out.resize(at + t.data.len(), 0);
        }
        out[at..at + t.data.len()].copy_from_slice(&t.data);
        expected.push(Tensor {
            name: t.name.clone(),
            dtype: t.dtype.1.clone(),
            shape: t.shape.clone(),
            offset: want + off,
            len: t.data.len() as u64,
        });
    }
    expected.sort_by_key(|t| t.offset);
    (out, expected)
}

// ---------------------------------------------------------------- npy

/// An `.npy` of format `major`.0; the header dict is padded with spaces so the data is
/// 64-byte aligned and the header at least `min_header` bytes long.
pub fn npy(major: u8, descr: &str, shape: &[u64], data: &[u8], min_header: usize) -> Vec<u8> {
    let shape_text = match shape {
        [one] => format!("({one},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    let pre = if major == 1 { 10 } else { 12 };
    while h.len() + 1 < min_header || (pre + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    if major == 1 {
        u16le(&mut out, u16::try_from(h.len()).unwrap());
    } else {
        u32le(&mut out, h.len() as u32);
    }
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

// ---------------------------------------------------------------- zip

pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Deflate with stored blocks only (BTYPE 00): valid deflate any inflater reads.
fn deflate_stored(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![&[]]
    } else {
        data.chunks(65535).collect()
    };
    for (i, c) in chunks.iter().enumerate() {
        out.push(u8::from(i + 1 == chunks.len()));
        u16le(&mut out, c.len() as u16);
        u16le(&mut out, !(c.len() as u16));
        out.extend_from_slice(c);
    }
    out
}

pub struct ZipEntry {
    pub name: String,
    pub data: Vec<u8>,
    pub deflate: bool,
    /// Pad the local header's extra field so the data starts at a multiple of this.
    pub align: u64,
}

impl ZipEntry {
    pub fn stored(name: &str, data: Vec<u8>) -> Self {
        ZipEntry {
            name: name.into(),
            data,
            deflate: false,
            align: 1,
        }
    }
}

/// A zip archive; returns it and each entry's data offset. With `zip64`, sizes and offsets
/// in the central directory go through zip64 extra fields and a zip64 end record.
pub fn zip(entries: &[ZipEntry], zip64: bool) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut offsets = Vec::new();
    for e in entries {
        let body = if e.deflate {
            deflate_stored(&e.data)
        } else {
            e.data.clone()
        };
        let local_at = out.len() as u64;
        let base = local_at + 30 + e.name.len() as u64;
        let pad = if e.align > 1 {
            // At least the 4-byte extra field header.
            (base + 4).next_multiple_of(e.align) - base
        } else {
            0
        };
        let fixed = |v: &mut Vec<u8>, extra_len: u16| {
            u16le(v, 45);
            u16le(v, 0x0800);
            u16le(v, if e.deflate { 8 } else { 0 });
            u32le(v, 0);
            u32le(v, crc32(&e.data));
            u32le(v, body.len() as u32);
            u32le(v, e.data.len() as u32);
            u16le(v, e.name.len() as u16);
            u16le(v, extra_len);
        };
        u32le(&mut out, 0x0403_4b50);
        fixed(&mut out, pad as u16);
        out.extend_from_slice(e.name.as_bytes());
        if pad > 0 {
            u16le(&mut out, 0x4246);
            u16le(&mut out, (pad - 4) as u16);
            out.resize(out.len() + (pad - 4) as usize, b'Z');
        }
        offsets.push(out.len() as u64);
        out.extend_from_slice(&body);

        u32le(&mut central, 0x0201_4b50);
        u16le(&mut central, 45);
        let mut c = Vec::new();
        fixed(&mut c, if zip64 { 28 } else { 0 });
        if zip64 {
            c[14..22].copy_from_slice(&[0xff; 8]);
        }
        central.extend_from_slice(&c);
        central.extend_from_slice(&[0; 10]);
        u32le(&mut central, if zip64 { u32::MAX } else { local_at as u32 });
        central.extend_from_slice(e.name.as_bytes());
        if zip64 {
            u16le(&mut central, 1);
            u16le(&mut central, 24);
            u64le(&mut central, e.data.len() as u64);
            u64le(&mut central, body.len() as u64);
            u64le(&mut central, local_at);
        }
    }
    let cd_at = out.len() as u64;
    out.extend_from_slice(&central);
    let n = entries.len() as u64;
    if zip64 {
        let rec_at = out.len() as u64;
        u32le(&mut out, 0x0606_4b50);
        u64le(&mut out, 44);
        u16le(&mut out, 45);
        u16le(&mut out, 45);
        u32le(&mut out, 0);
        u32le(&mut out, 0);
        u64le(&mut out, n);
        u64le(&mut out, n);
        u64le(&mut out, central.len() as u64);
        u64le(&mut out, cd_at);
        u32le(&mut out, 0x0706_4b50);
        u32le(&mut out, 0);
        u64le(&mut out, rec_at);
        u32le(&mut out, 1);
    }
    u32le(&mut out, 0x0605_4b50);
    u32le(&mut out, 0);
    let n16 = if zip64 { u16::MAX } else { n as u16 };
    u16le(&mut out, n16);
    u16le(&mut out, n16);
    u32le(
        &mut out,
        if zip64 {
            u32::MAX
        } else {
            central.len() as u32
        },
    );
    u32le(&mut out, if zip64 { u32::MAX } else { cd_at as u32 });
    let comment = b"written by the twofold tests";
    u16le(&mut out, comment.len() as u16);
    out.extend_from_slice(comment);
    (out, offsets)
}

// ---------------------------------------------------------------- torch

/// A pickle as CPython's protocol-2 pickler writes `torch.save`'s state dict
/// `{name: _rebuild_tensor_v2(storage, 0, (numel,), (1,), False, OrderedDict())}`, with
/// each storage a persistent id `('storage', torch.<class>, key, 'cpu', numel)` and
/// strings and globals memoised the way the pickler does.
pub fn torch_pickle(tensors: &[(&str, &str, &str, u64)]) -> Vec<u8> {
    struct P {
        out: Vec<u8>,
        memo: std::collections::HashMap<String, u32>,
        next: u32,
    }
    impl P {
        fn put(&mut self, key: String) {
            if self.next < 256 {
                self.out.extend_from_slice(&[b'q', self.next as u8]);
            } else {
                self.out.push(b'r');
                u32le(&mut self.out, self.next);
            }
            self.memo.insert(key, self.next);
            self.next += 1;
        }
        fn get(&mut self, key: &str) -> bool {
            let Some(&i) = self.memo.get(key) else {
                return false;
            };
            if i < 256 {
                self.out.extend_from_slice(&[b'h', i as u8]);
            } else {
                self.out.push(b'j');
                u32le(&mut self.out, i);
            }
            true
        }
        fn str(&mut self, s: &str, memo: bool) {
            if memo && self.get(&format!("s:{s}")) {
                return;
            }
            self.out.push(b'X');
            u32le(&mut self.out, s.len() as u32);
            self.out.extend_from_slice(s.as_bytes());
            self.put(format!("s:{s}"));
        }
        fn global(&mut self, module: &str, name: &str) {
            let key = format!("g:{module}.{name}");
            if self.get(&key) {
                return;
            }
            self.out
                .extend_from_slice(format!("c{module}\n{name}\n").as_bytes());
            self.put(key);
        }
        fn int(&mut self, v: u64) {
            match v {
                0..=0xff => self.out.extend_from_slice(&[b'K', v as u8]),
                0x100..=0xffff => {
                    self.out.push(b'M');
                    u16le(&mut self.out, v as u16);
                }
                0x1_0000..=0x7fff_ffff => {
                    self.out.push(b'J');
                    u32le(&mut self.out, v as u32);
                }
                _ => {
                    let mut b = v.to_le_bytes().to_vec();
                    while b.len() > 1 && b[b.len() - 1] == 0 && b[b.len() - 2] & 0x80 == 0 {
                        b.pop();
                    }
                    self.out.extend_from_slice(&[0x8a, b.len() as u8]);
                    self.out.extend_from_slice(&b);
                }
            }
        }
    }
    let mut p = P {
        out: vec![0x80, 2, b'}'],
        memo: Default::default(),
        next: 0,
    };
    p.put("dict".into());
    if tensors.len() > 1 {
        p.out.push(b'(');
    }
    for (i, (name, class, key, numel)) in tensors.iter().enumerate() {
        p.str(name, false);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.out.extend_from_slice(b"((");
        p.str("storage", true);
        p.global("torch", class);
        p.str(key, false);
        p.str("cpu", true);
        p.int(*numel);
        p.out.push(b't');
        p.put(format!("pid{i}"));
        p.out.push(b'Q');
        p.int(0);
        p.int(*numel);
        p.out.push(0x85);
        p.put(format!("shape{i}"));
        p.int(1);
        p.out.push(0x85);
        p.put(format!("stride{i}"));
        p.out.push(0x89);
        p.global("collections", "OrderedDict");
        p.out.extend_from_slice(b")R");
        p.put(format!("hooks{i}"));
        p.out.push(b't');
        p.put(format!("args{i}"));
        p.out.push(b'R');
        p.put(format!("tensor{i}"));
    }
    p.out.push(if tensors.len() > 1 { b'u' } else { b's' });
    p.out.push(b'.');
    p.out
}

/// A `torch.save` zip: `<prefix>/data.pkl`, `byteorder`, `data/<key>` (64-byte aligned),
/// `version` and `.data/serialization_id`. Storages are `(key, class, numel, bytes)`;
/// each is one tensor named `t<key>`. Returns the archive and each storage's data offset.
pub fn torch(prefix: &str, storages: &[(&str, &str, u64, Vec<u8>)]) -> (Vec<u8>, Vec<u64>) {
    let names: Vec<String> = storages.iter().map(|s| format!("t{}", s.0)).collect();
    let refs: Vec<(&str, &str, &str, u64)> = storages
        .iter()
        .zip(&names)
        .map(|(s, n)| (n.as_str(), s.1, s.0, s.2))
        .collect();
    let entry = |name: String, data: Vec<u8>| ZipEntry {
        name,
        data,
        deflate: false,
        align: 64,
    };
    let mut entries = vec![
        entry(format!("{prefix}/data.pkl"), torch_pickle(&refs)),
        entry(format!("{prefix}/byteorder"), b"little".to_vec()),
    ];
    for (key, _, _, data) in storages {
        entries.push(entry(format!("{prefix}/data/{key}"), data.clone()));
    }
    entries.push(entry(format!("{prefix}/version"), b"3\n".to_vec()));
    entries.push(entry(
        format!("{prefix}/.data/serialization_id"),
        b"0123456789".to_vec(),
    ));
    let (out, offsets) = zip(&entries, false);
    (out, offsets[2..2 + storages.len()].to_vec())
}

// ---------------------------------------------------------------- ONNX

use onnx_proto::{
    DataLocation, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto,
};
pub use twofold::container::onnx::proto as onnx_proto;

/// An initializer with its data in `raw_data` (little-endian bytes).
pub fn onnx_raw(name: &str, data_type: i32, dims: &[i64], data: Vec<u8>) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type,
        dims: dims.to_vec(),
        raw_data: data,
        ..Default::default()
    }
}

/// An initializer whose data is in `location` at `offset` (`length` given or not).
pub fn onnx_external(
    name: &str,
    data_type: i32,
    dims: &[i64],
    location: &str,
    offset: u64,
    length: Option<u64>,
) -> TensorProto {
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    let mut external_data = vec![
        entry("location", location.into()),
        entry("offset", offset.to_string()),
    ];
    if let Some(l) = length {
        external_data.push(entry("length", l.to_string()));
    }
    TensorProto {
        name: name.into(),
        data_type,
        dims: dims.to_vec(),
        data_location: DataLocation::External as i32,
        external_data,
        ..Default::default()
    }
}

/// A `ModelProto` (ir_version 8, opset 17) whose graph has a MatMul node, then the
/// initializers, in the field order `onnx.save` writes: ir_version, producer_name, graph,
/// opset_import.
pub fn onnx(initializers: Vec<TensorProto>) -> Vec<u8> {
    use prost::Message;
    ModelProto {
        ir_version: 8,
        producer_name: "twofold-tests".into(),
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                name: "matmul".into(),
                op_type: "MatMul".into(),
                attribute: Vec::new(),
            }],
            name: "g".into(),
            initializer: initializers,
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
    }
    .encode_to_vec()
}
