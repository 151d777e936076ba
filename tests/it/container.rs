//! The container parsers on real files the tests write: every tensor's name, dtype, shape,
//! offset and length checked exactly, and the bytes at that offset compared with what was
//! written. Then malformed files: every truncation, lying lengths and counts, wrong magic,
//! non-UTF-8 names: a clear error each time, never a panic.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::writers::*;
use twofold::container::{
    self, gguf, npy, onnx, pickle, safetensors, Container, Dtype, ExternalTensor, Format, Tensor,
};

/// Writes `bytes` to a file, parses it from the file and from memory, and checks both agree.
fn parse_file(name: &str, bytes: &[u8]) -> Container {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let from_file = container::open(&path).unwrap();
    assert_eq!(from_file, container::parse_bytes(bytes).unwrap());
    assert_eq!(from_file.file_size, bytes.len() as u64);
    from_file
}

/// Each named tensor's bytes in the file are `data`.
fn assert_data(file: &[u8], c: &Container, data: &[(&str, &[u8])]) {
    assert_eq!(c.tensors.len(), data.len());
    for (name, d) in data {
        let t = c.tensors.iter().find(|t| t.name == *name).unwrap();
        assert_eq!(
            &file[t.offset as usize..(t.offset + t.len) as usize],
            *d,
            "{name}"
        );
    }
}

fn gguf_tensors() -> Vec<GgufTensor> {
    let q = |s: &str| Dtype::Quant(s.into());
    vec![
        GgufTensor::new("token_embd.weight", &[8, 2], 0, bytes(1, 64), Dtype::F32),
        GgufTensor::new("blk.0.attn_q.weight", &[64, 2], 2, bytes(2, 72), q("Q4_0")),
        GgufTensor::new(
            "blk.0.ffn_up.weight",
            &[256, 3],
            12,
            bytes(3, 432),
            q("Q4_K"),
        ),
        GgufTensor::new(
            "blk.0.ffn_down.weight",
            &[512],
            14,
            bytes(4, 420),
            q("Q6_K"),
        ),
        GgufTensor::new("output.weight", &[32, 4], 8, bytes(5, 136), q("Q8_0")),
        GgufTensor::new("output_norm.weight", &[7], 30, bytes(6, 14), Dtype::BF16),
        GgufTensor::new("i8", &[5], 24, bytes(7, 5), Dtype::I8),
        GgufTensor::new("f16", &[3], 1, bytes(8, 6), Dtype::F16),
        GgufTensor::new("iq2", &[256], 16, bytes(9, 66), q("IQ2_XXS")),
        GgufTensor::new("q5k", &[256, 1, 1, 2], 13, bytes(10, 352), q("Q5_K")),
        GgufTensor::new("scalar", &[], 0, bytes(11, 4), Dtype::F32),
    ]
}

fn gguf_kvs() -> Vec<(&'static str, Kv)> {
    vec![
        ("general.architecture", Kv::Str("llama".into())),
        ("u8", Kv::U8(1)),
        ("i8", Kv::I8(-1)),
        ("u16", Kv::U16(2)),
        ("i16", Kv::I16(-2)),
        ("u32", Kv::U32(3)),
        ("i32", Kv::I32(-3)),
        ("f32", Kv::F32(0.5)),
        ("bool", Kv::Bool(true)),
        ("u64", Kv::U64(4)),
        ("i64", Kv::I64(-4)),
        ("f64", Kv::F64(0.25)),
        (
            "tokens",
            Kv::Arr(
                8,
                vec![Kv::Str("a".into()), Kv::Str("\u{e9}t\u{e9}".into())],
            ),
        ),
        (
            "nested",
            Kv::Arr(
                9,
                vec![Kv::Arr(4, vec![Kv::U32(1), Kv::U32(2)]), Kv::Arr(8, vec![])],
            ),
        ),
    ]
}

fn gguf_file(version: u32, alignment: Option<u32>) -> (Vec<u8>, Vec<Tensor>) {
    gguf(version, alignment, &gguf_kvs(), &gguf_tensors())
}

#[test]
fn gguf_v3_with_alignment_key() {
    let (file, expected) = gguf_file(3, Some(64));
    let c = parse_file("m.gguf", &file);
    assert_eq!(c.format, Format::Gguf { version: 3 });
    assert_eq!(c.alignment, Some(64));
    assert_eq!(c.data_offset, Some(expected[0].offset));
    assert_eq!(c.data_offset.unwrap() % 64, 0);
    assert_eq!(c.tensors, expected);
    let data: Vec<(String, Vec<u8>)> = gguf_tensors()
        .into_iter()
        .map(|t| (String::from_utf8(t.name).unwrap(), t.data))
        .collect();
    let data: Vec<(&str, &[u8])> = data.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    assert_data(&file, &c, &data);
}

#[test]
fn gguf_v2_default_alignment() {
    let (file, expected) = gguf_file(2, None);
    let c = parse_file("m.bin", &file);
    assert_eq!(c.format, Format::Gguf { version: 2 });
    assert_eq!(c.alignment, Some(32));
    assert_eq!(c.tensors, expected);
    assert!(c
        .tensors
        .iter()
        .all(|t| (t.offset - c.data_offset.unwrap()) % 32 == 0));
}

/// The file, its expected tensors, and each tensor's data by name.
type Written = (Vec<u8>, Vec<Tensor>, Vec<(String, Vec<u8>)>);

fn safetensors_file() -> Written {
    let spec: [(&str, Dtype, &[u64], usize); 15] = [
        ("BOOL", Dtype::Bool, &[3], 1),
        ("U8", Dtype::U8, &[2, 2], 1),
        ("I8", Dtype::I8, &[1], 1),
        ("F8_E5M2", Dtype::F8E5M2, &[4], 1),
        ("F8_E4M3", Dtype::F8E4M3, &[4], 1),
        ("I16", Dtype::I16, &[3], 2),
        ("U16", Dtype::U16, &[3], 2),
        ("F16", Dtype::F16, &[2, 3], 2),
        ("BF16", Dtype::BF16, &[5], 2),
        ("I32", Dtype::I32, &[2], 4),
        ("U32", Dtype::U32, &[2], 4),
        ("F32", Dtype::F32, &[2, 2, 2], 4),
        ("F64", Dtype::F64, &[1], 8),
        ("I64", Dtype::I64, &[2], 8),
        ("U64", Dtype::U64, &[], 8),
    ];
    let tensors: Vec<SafeTensor> = spec
        .iter()
        .enumerate()
        .map(|(i, (name, dtype, shape, size))| {
            let n: u64 = shape.iter().product();
            SafeTensor {
                name: format!("layer.{i}.{}", name.to_lowercase()),
                dtype: (name, dtype.clone()),
                shape: shape.to_vec(),
                offset: None,
                data: bytes(i as u64, n as usize * size),
            }
        })
        .collect();
    let data = tensors
        .iter()
        .map(|t| (t.name.clone(), t.data.clone()))
        .collect();
    let (file, expected) = safetensors(&tensors, None);
    (file, expected, data)
}

#[test]
fn safetensors_every_dtype() {
    let (file, expected, data) = safetensors_file();
    let c = parse_file("weights", &file);
    assert_eq!(c.format, Format::Safetensors);
    assert_eq!(c.data_offset, Some(expected[0].offset));
    assert_eq!(c.tensors, expected);
    let data: Vec<(&str, &[u8])> = data.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    assert_data(&file, &c, &data);
}

#[test]
fn npy_v1_v2_v3() {
    let d1 = bytes(1, 48);
    let f = npy(1, "<f4", &[3, 4], &d1, 0);
    let c = parse_file("a.npy", &f);
    assert_eq!(c.format, Format::Npy { major: 1, minor: 0 });
    assert_eq!(c.data_offset, Some(128));
    assert_eq!(c.tensors[0].dtype, Dtype::F32);
    assert_eq!(c.tensors[0].shape, vec![3, 4]);
    assert_eq!((c.tensors[0].offset, c.tensors[0].len), (128, 48));
    assert_data(&f, &c, &[("array", &d1)]);

    // A header too long for format 1.0's u16 length is what makes NumPy write 2.0.
    let d2 = bytes(2, 10);
    let f = npy(2, "<i2", &[5], &d2, 70_000);
    let c = parse_file("b.npy", &f);
    assert_eq!(c.format, Format::Npy { major: 2, minor: 0 });
    let start = c.data_offset.unwrap();
    assert!(start > 65_535 && start % 64 == 0);
    assert_eq!((c.tensors[0].offset, c.tensors[0].len), (start, 10));
    assert_eq!(c.tensors[0].dtype, Dtype::I16);
    assert_data(&f, &c, &[("array", &d2)]);

    let d3 = bytes(3, 32);
    let f = npy(3, "<u8", &[2, 2], &d3, 0);
    let c = parse_file("c.npy", &f);
    assert_eq!(c.format, Format::Npy { major: 3, minor: 0 });
    assert_eq!(c.tensors[0].dtype, Dtype::U64);
    assert_data(&f, &c, &[("array", &d3)]);
}

fn npz_entries() -> Vec<ZipEntry> {
    vec![
        ZipEntry::stored("w.npy", npy(1, "<f2", &[4], &bytes(1, 8), 0)),
        ZipEntry::stored("dir/b.npy", npy(1, "<i8", &[2], &bytes(2, 16), 0)),
        ZipEntry {
            name: "deflated.npy".into(),
            data: npy(1, "|u1", &[3], &bytes(3, 3), 0),
            deflate: true,
            align: 1,
        },
    ]
}

#[test]
fn npz_stored_deflated_and_zip64() {
    for zip64 in [false, true] {
        let (f, offsets) = zip(&npz_entries(), zip64);
        let c = parse_file("x.npz", &f);
        assert_eq!(c.format, Format::Npz);
        let by = |n: &str| c.tensors.iter().find(|t| t.name == n).unwrap();
        assert_eq!(by("w").dtype, Dtype::F16);
        assert_eq!(by("w").shape, vec![4]);
        assert_eq!((by("w").offset, by("w").len), (offsets[0] + 128, 8));
        assert_eq!(by("dir/b").dtype, Dtype::I64);
        assert_eq!(
            (by("dir/b").offset, by("dir/b").len),
            (offsets[1] + 128, 16)
        );
        let d = by("deflated");
        assert_eq!(d.dtype, Dtype::Other("compressed".into()));
        assert!(d.shape.is_empty());
        // The deflated npy: 128 header + 3 data bytes in one stored deflate block.
        assert_eq!((d.offset, d.len), (offsets[2], 5 + 131));
        assert_data(
            &f,
            &c,
            &[
                ("w", &bytes(1, 8)),
                ("dir/b", &bytes(2, 16)),
                (
                    "deflated",
                    &f[offsets[2] as usize..offsets[2] as usize + 136],
                ),
            ],
        );
    }
}

fn python_numpy() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Cross-check with files NumPy itself writes, where python3 with numpy is installed
/// (the test installs nothing).
#[test]
fn npz_written_by_numpy() {
    if !python_numpy() {
        eprintln!("SKIPPED: python3 with numpy is not available; the pure-Rust npz tests ran");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "import numpy as np, sys\n\
        d = sys.argv[1]\n\
        x = np.arange(12, dtype='<f4').reshape(3, 4)\n\
        y = np.arange(5, dtype='<i8')\n\
        np.savez(d + '/m.npz', x=x, y=y)\n\
        np.save(d + '/m.npy', x)\n\
        open(d + '/x.bin', 'wb').write(x.tobytes())\n\
        open(d + '/y.bin', 'wb').write(y.tobytes())\n";
    let st = Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    let read = |n: &str| std::fs::read(dir.path().join(n)).unwrap();
    let (x, y) = (read("x.bin"), read("y.bin"));
    let npz = read("m.npz");
    let c = container::open(&dir.path().join("m.npz")).unwrap();
    assert_eq!(c.format, Format::Npz);
    assert_eq!(c.tensors[0].name, "x");
    assert_eq!(c.tensors[0].shape, vec![3, 4]);
    assert_eq!(c.tensors[1].dtype, Dtype::I64);
    assert_data(&npz, &c, &[("x", &x), ("y", &y)]);
    let c = container::open(&dir.path().join("m.npy")).unwrap();
    assert_data(&read("m.npy"), &c, &[("array", &x)]);
}

#[test]
fn torch_zip_storages() {
    let storages = vec![
        ("0", "FloatStorage", 6, bytes(1, 24)),
        ("1", "HalfStorage", 4, bytes(2, 8)),
        ("2", "LongStorage", 1, bytes(3, 8)),
        ("3", "BFloat16Storage", 300, bytes(4, 600)),
        // The pickle's numel disagrees with the entry: listed as raw storage bytes.
        ("4", "FloatStorage", 3, bytes(5, 10)),
    ];
    let (f, offsets) = torch("archive", &storages);
    let c = parse_file("model.pt", &f);
    assert_eq!(c.format, Format::Torch);
    let want = [
        (Dtype::F32, vec![6]),
        (Dtype::F16, vec![4]),
        (Dtype::I64, vec![1]),
        (Dtype::BF16, vec![300]),
        (Dtype::Other("storage".into()), vec![10]),
    ];
    for (i, ((key, _, _, data), (dtype, shape))) in storages.iter().zip(want).enumerate() {
        let t = &c.tensors[i];
        assert_eq!(t.name, *key);
        assert_eq!(t.dtype, dtype);
        assert_eq!(t.shape, shape);
        assert_eq!((t.offset, t.len), (offsets[i], data.len() as u64));
        assert_eq!(t.offset % 64, 0);
        assert_eq!(&f[t.offset as usize..][..data.len()], &data[..]);
    }
}

/// The walker reads what CPython's own pickler writes for a `torch.save`-like state dict
/// (fake `torch` classes; nothing is imported from PyTorch), and our writer matches it.
#[test]
fn torch_pickle_as_cpython_writes_it() {
    let script = r#"
import collections, io, pickle, sys, types
torch = types.ModuleType('torch'); sys.modules['torch'] = torch
utils = types.ModuleType('torch._utils'); sys.modules['torch._utils'] = utils
def _rebuild_tensor_v2(*a): pass
_rebuild_tensor_v2.__module__ = 'torch._utils'; utils._rebuild_tensor_v2 = _rebuild_tensor_v2
for n in ('FloatStorage', 'HalfStorage'):
    setattr(torch, n, type(n, (), {'__module__': 'torch'}))
class S:
    def __init__(s, cls, key, n): s.cls, s.key, s.n = cls, key, n
class T:
    def __init__(s, st): s.st = st
    def __reduce_ex__(s, proto):
        # Fresh tuples, as torch computes sizes and strides per tensor.
        return (_rebuild_tensor_v2, (s.st, 0, (s.st.n,), tuple([1]), False, collections.OrderedDict()))
class P(pickle.Pickler):
    def persistent_id(self, o):
        return ('storage', o.cls, o.key, 'cpu', o.n) if isinstance(o, S) else None
b = io.BytesIO()
P(b, protocol=2).dump({'a': T(S(torch.FloatStorage, '0', 6)), 'b': T(S(torch.HalfStorage, '1', 1 << 33))})
sys.stdout.buffer.write(b.getvalue())
"#;
    let Ok(out) = Command::new("python3").args(["-c", script]).output() else {
        eprintln!("SKIPPED: python3 is not available; the Rust-written pickles were tested");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refs = pickle::storages(&out.stdout).unwrap();
    assert_eq!(refs.len(), 2);
    assert_eq!(
        (refs[0].key.as_str(), refs[0].class.as_str(), refs[0].numel),
        ("0", "FloatStorage", 6)
    );
    assert_eq!(
        (refs[1].key.as_str(), refs[1].class.as_str(), refs[1].numel),
        ("1", "HalfStorage", 1 << 33)
    );
    let ours = torch_pickle(&[
        ("a", "FloatStorage", "0", 6),
        ("b", "HalfStorage", "1", 1 << 33),
    ]);
    assert_eq!(
        ours, out.stdout,
        "the test writer differs from CPython's pickler"
    );
}

/// An ONNX model with F32, F16, INT64 and BF16 raw initializers (one long enough for a
/// two-byte length), packed `float_data`, varint `int64_data`, and two external tensors.
fn onnx_file() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let raw = [
        ("w.f32", 1, vec![2i64, 3], bytes(1, 24)),
        ("w.f16", 10, vec![4], bytes(2, 8)),
        ("ids.i64", 7, vec![3], bytes(3, 24)),
        ("big.bf16", 16, vec![10, 20], bytes(4, 400)),
        ("scalar.f32", 1, vec![], bytes(5, 4)),
    ];
    let mut init: Vec<_> = raw
        .iter()
        .map(|(n, dt, dims, d)| onnx_raw(n, *dt, dims, d.clone()))
        .collect();
    init.push(onnx_proto::TensorProto {
        name: "typed.f32".into(),
        data_type: 1,
        dims: vec![3],
        float_data: vec![1.5, -2.25, 1e30],
        ..Default::default()
    });
    init.push(onnx_proto::TensorProto {
        name: "typed.i64".into(),
        data_type: 7,
        dims: vec![2],
        int64_data: vec![-1, 300],
        ..Default::default()
    });
    init.push(onnx_external(
        "ext.a",
        1,
        &[4, 4],
        "m.onnx.data",
        0,
        Some(64),
    ));
    init.push(onnx_external("ext.b", 10, &[8], "m.onnx.data", 4096, None));
    let mut data: Vec<(String, Vec<u8>)> = raw
        .iter()
        .map(|(n, _, _, d)| (n.to_string(), d.clone()))
        .collect();
    let typed: Vec<u8> = [1.5f32, -2.25, 1e30]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    data.push(("typed.f32".into(), typed));
    (onnx(init), data)
}

#[test]
fn onnx_initializers_at_their_raw_bytes() {
    let (file, data) = onnx_file();
    let c = parse_file("model.bin", &file);
    assert_eq!(c.format, Format::Onnx);
    assert_eq!((c.data_offset, c.alignment), (None, None));
    let data: Vec<(&str, &[u8])> = data.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    assert_data(&file, &c, &data);
    let by = |n: &str| c.tensors.iter().find(|t| t.name == n).unwrap();
    assert_eq!(
        (by("w.f32").dtype.clone(), by("w.f32").shape.clone()),
        (Dtype::F32, vec![2, 3])
    );
    assert_eq!(by("w.f16").dtype, Dtype::F16);
    assert_eq!(by("ids.i64").dtype, Dtype::I64);
    assert_eq!(
        (by("big.bf16").dtype.clone(), by("big.bf16").len),
        (Dtype::BF16, 400)
    );
    assert!(by("scalar.f32").shape.is_empty());
    assert_eq!(by("typed.f32").len, 12);
    assert!(c.tensors.windows(2).all(|w| w[0].offset < w[1].offset));
    // Varint int64_data has no byte range equal to the values: listed apart.
    assert_eq!(c.unmapped.len(), 1);
    assert_eq!(c.unmapped[0].name, "typed.i64");
    assert_eq!(c.unmapped[0].storage, "int64_data (varints)");
    let ext = |name: &str, dtype, shape: Vec<u64>, offset, len| ExternalTensor {
        name: name.into(),
        dtype,
        shape,
        location: "m.onnx.data".into(),
        offset,
        len,
    };
    assert_eq!(
        c.external,
        vec![
            ext("ext.a", Dtype::F32, vec![4, 4], 0, 64),
            ext("ext.b", Dtype::F16, vec![8], 4096, 16),
        ]
    );
    // The JSON of other formats has no `external` key; ONNX's round-trips.
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Container>(&json).unwrap(), c);
    let st = serde_json::to_string(&parse_file("s", &safetensors_file().0)).unwrap();
    assert!(!st.contains("external") && !st.contains("unmapped"));
}

/// Protobuf has no end marker: a prefix is opaque unless its top level is whole, which
/// for this model only happens where the graph ends (before `opset_import`). No prefix is
/// an error and none panics.
#[test]
fn onnx_truncations_are_opaque() {
    let (file, _) = onnx_file();
    let full = container::parse_bytes(&file).unwrap();
    let mut whole = 0;
    for cut in 0..file.len() {
        let c = container::parse_bytes(&file[..cut]).unwrap();
        if c.format == Format::Onnx {
            whole += 1;
            assert_eq!((&c.tensors, &c.external), (&full.tensors, &full.external));
        } else {
            assert_eq!(c.format, Format::Opaque, "prefix {cut}");
        }
        // Called directly, the parser says why.
        if c.format == Format::Opaque && cut > 0 {
            assert!(!onnx::parse(&&file[..cut])
                .unwrap_err()
                .to_string()
                .is_empty());
        }
    }
    assert_eq!(whole, 1);
}

/// A length-delimited field: key, length, payload.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![field << 3 | 2];
    let mut n = payload.len() as u64;
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        out.push(if n > 0 { b | 0x80 } else { b });
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(payload);
    out
}

/// A model whose graph payload is `graph`, then an `opset_import`, written by hand.
fn onnx_graph(graph: &[u8]) -> Vec<u8> {
    let mut f = vec![0x08, 0x08];
    f.extend(ld(7, graph));
    f.extend(ld(8, &[0x10, 17]));
    f
}

#[test]
fn onnx_lying_lengths() {
    // raw_data one byte longer than its tensor message.
    let (file, _) = onnx_file();
    let c = container::parse_bytes(&file).unwrap();
    let t = c.tensors.iter().find(|t| t.name == "w.f16").unwrap();
    let mut f = file.clone();
    f[t.offset as usize - 1] += 1;
    assert!(
        err(&f).contains("past the end of its message"),
        "{}",
        err(&f)
    );
    // An initializer longer than the graph.
    let mut tensor = ld(8, b"t");
    tensor.extend([0x10, 0x01]);
    tensor.extend(ld(9, &[0; 4]));
    let mut g = ld(5, &tensor);
    g[1] += 1;
    assert!(err(&onnx_graph(&g)).contains("past the end of its message"));
    // raw_data claiming 2^64 - 1 bytes; a name of 2 MiB; a 2^63 dimension.
    let mut tensor = ld(8, b"t");
    tensor.extend([0x10, 0x01, 0x4a]);
    tensor.extend([0xff; 9]);
    tensor.push(0x01);
    let e = err(&onnx_graph(&ld(5, &tensor)));
    assert!(e.starts_with("truncated onnx tensor field"), "{e}");
    let name = vec![b'n'; 2 << 20];
    let mut tensor = ld(8, &name);
    tensor.extend([0x10, 0x01]);
    assert!(err(&onnx_graph(&ld(5, &tensor))).contains("bytes of metadata"));
    let mut tensor = ld(8, b"t");
    tensor.extend([0x10, 0x01, 0x08]);
    tensor.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    assert!(err(&onnx_graph(&ld(5, &tensor))).contains("negative dimension"));
    // The graph's own length wrong, running into the next field or past the end of the
    // file: not a whole model, so opaque.
    let mut f = onnx_graph(&ld(5, &tensor));
    f[3] += 1;
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    f[3] += 10;
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    // An empty graph is a model with no tensors.
    let c = container::parse_bytes(&onnx_graph(&[])).unwrap();
    assert_eq!((c.format, c.tensors.len()), (Format::Onnx, 0));
}

#[test]
fn onnx_is_not_sniffed_from_other_files() {
    for f in [
        b"\x08\x08 some text".to_vec(),
        b"\x08".to_vec(),
        vec![0x08, 0x08, 0x3a, 0x00, 0xff],
        gguf_file(3, None).0,
        bytes(99, 4096),
    ] {
        assert_ne!(container::parse_bytes(&f).unwrap().format, Format::Onnx);
    }
    // Random files that happen to start with the ir_version tag.
    for seed in 0..200 {
        let mut f = bytes(seed, 256);
        f[0] = 0x08;
        f[1] = 0x07;
        assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    }
}

fn python_onnx() -> bool {
    Command::new("python3")
        .args(["-c", "import onnx, numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Cross-check with models the `onnx` package writes (numpy_helper.from_array puts the
/// data in raw_data; make_tensor with values uses float_data / int64_data; external data
/// via save_model), where python3 with onnx is installed (the test installs nothing).
#[test]
fn onnx_written_by_the_onnx_package() {
    if !python_onnx() {
        eprintln!("SKIPPED: python3 with onnx and numpy is not available; the prost-written models were tested");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
d = sys.argv[1]
arrs = {
    'w': np.arange(12, dtype='<f4').reshape(3, 4),
    'h': np.arange(5, dtype='<f2'),
    'i': np.arange(3, dtype='<i8'),
    'b': np.arange(300, dtype='<f4'),
}
inits = [numpy_helper.from_array(a, name=n) for n, a in arrs.items()]
inits.append(helper.make_tensor('fd', TensorProto.FLOAT, [2], [1.5, -3.0]))
inits.append(helper.make_tensor('id', TensorProto.INT64, [2], [7, 300]))
x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 3])
y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 4])
g = helper.make_graph([helper.make_node('MatMul', ['x', 'w'], ['y'])], 'g', [x], [y], inits)
m = helper.make_model(g, producer_name='twofold-test')
onnx.save_model(m, d + '/m.onnx')
for n, a in arrs.items():
    open(d + '/' + n + '.bin', 'wb').write(a.tobytes())
open(d + '/fd.bin', 'wb').write(np.array([1.5, -3.0], dtype='<f4').tobytes())
onnx.save_model(m, d + '/ext.onnx', save_as_external_data=True, all_tensors_to_one_file=True, location='ext.onnx.data', size_threshold=0)
"#;
    let out = Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |n: &str| std::fs::read(dir.path().join(n)).unwrap();
    let file = read("m.onnx");
    let c = container::open(&dir.path().join("m.onnx")).unwrap();
    assert_eq!(c.format, Format::Onnx);
    let data: Vec<(&str, Vec<u8>)> = ["w", "h", "i", "b", "fd"]
        .iter()
        .map(|n| (*n, read(&format!("{n}.bin"))))
        .collect();
    let data: Vec<(&str, &[u8])> = data.iter().map(|(n, d)| (*n, &d[..])).collect();
    assert_data(&file, &c, &data);
    let by = |n: &str| c.tensors.iter().find(|t| t.name == n).unwrap();
    assert_eq!(
        (by("w").dtype.clone(), by("w").shape.clone()),
        (Dtype::F32, vec![3, 4])
    );
    assert_eq!(by("h").dtype, Dtype::F16);
    assert_eq!(by("i").dtype, Dtype::I64);
    assert_eq!(c.unmapped.len(), 1);
    assert_eq!(c.unmapped[0].name, "id");

    // External data: every tensor is in ext.onnx.data at the offset the model gives.
    let c = container::open(&dir.path().join("ext.onnx")).unwrap();
    assert_eq!(c.format, Format::Onnx);
    let ext = read("ext.onnx.data");
    // Only raw_data tensors move out; float_data stays in the model.
    assert_eq!(c.tensors.len(), 1);
    assert_eq!(c.tensors[0].name, "fd");
    assert_eq!(c.external.len(), 4);
    for (name, want) in &data[..4] {
        let t = c.external.iter().find(|t| t.name == *name).unwrap();
        assert_eq!(t.location, "ext.onnx.data");
        assert_eq!(
            &ext[t.offset as usize..(t.offset + t.len) as usize],
            *want,
            "{name}"
        );
    }
}

// ---------------------------------------------------------------- malformed input

/// Every strict prefix of `file` at least `magic` bytes long is an error with a one-line
/// message; shorter ones are opaque; none panics.
fn assert_prefixes_fail(file: &[u8], magic: usize) {
    for cut in 0..file.len() {
        match container::parse_bytes(&file[..cut]) {
            Ok(c) => assert!(
                cut < magic && c.format == Format::Opaque,
                "prefix {cut} of {} parsed as {:?}",
                file.len(),
                c.format
            ),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty() && !msg.contains('\n'), "{msg}");
            }
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    assert_prefixes_fail(&gguf_file(3, Some(64)).0, 4);
    assert_prefixes_fail(&gguf_file(2, None).0, 4);
    assert_prefixes_fail(&safetensors_file().0, 9);
    assert_prefixes_fail(&npy(1, "<f4", &[3, 4], &bytes(1, 48), 0), 6);
    assert_prefixes_fail(&zip(&npz_entries(), false).0, 4);
    assert_prefixes_fail(&zip(&npz_entries(), true).0, 4);
    assert_prefixes_fail(
        &torch("archive", &[("0", "FloatStorage", 2, bytes(1, 8))]).0,
        4,
    );
}

fn err(bytes: &[u8]) -> String {
    container::parse_bytes(bytes).unwrap_err().to_string()
}

#[test]
fn lying_lengths_and_absurd_counts() {
    // safetensors header length past the end.
    let mut f = safetensors_file().0;
    f[..8].copy_from_slice(&999_999u64.to_le_bytes());
    f.truncate(1024);
    assert_eq!(
        err(&f),
        "header runs past the end of the file: it would end at byte '1000007' but the file ends at byte '1024'"
    );

    // GGUF: u64::MAX tensors, u64::MAX key-values, a string longer than the file,
    // a string array of u64::MAX items.
    let (g, _) = gguf_file(3, None);
    let mut f = g.clone();
    f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        err(&f),
        format!(
            "tensor count '{}' cannot fit in a file of '{}' bytes",
            u64::MAX,
            f.len()
        )
    );
    let mut f = g.clone();
    f[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&f).starts_with(&format!("key-value count '{}'", u64::MAX)));
    let mut f = g.clone();
    f[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    assert!(err(&f).starts_with("truncated gguf key: needs '18446744073709551612' bytes"));
    let (g, _) = gguf(
        3,
        None,
        &[("t", Kv::Arr(8, vec![Kv::Str("x".into())]))],
        &[],
    );
    let mut f = g.clone();
    let at = 24 + 8 + 1 + 4 + 4;
    f[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&f).starts_with(&format!("array length '{}' cannot fit", u64::MAX)));

    // A GGUF tensor whose element count overflows, and one past the end of the file.
    let t = |dims: &[u64], data| GgufTensor::new("t", dims, 0, data, Dtype::F32);
    let (mut f, _) = gguf(3, None, &[], &[t(&[1, 1], vec![0; 4])]);
    let dims_at = 24 + 8 + 1 + 4;
    f[dims_at..dims_at + 16].copy_from_slice(&[0xff; 16]);
    assert!(err(&f).contains("overflows"), "{}", err(&f));
    let (f, _) = gguf(3, None, &[], &[t(&[16], vec![0; 64])]);
    assert!(err(&f[..f.len() - 1]).contains("lies outside the data section"));

    // npy header length past the end.
    let mut f = npy(1, "<f4", &[1], &[0; 4], 0);
    f[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(
        err(&f),
        format!(
            "header runs past the end of the file: it would end at byte '{}' but the file ends at byte '{}'",
            10 + 65535,
            f.len()
        )
    );

    // zip: 65535 entries in a tiny directory; a zip64 record claiming u64::MAX entries.
    let (mut f, _) = zip(&npz_entries(), false);
    let n = f.len() - 28 - 22;
    f[n + 10..n + 12].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(
        err(&f).starts_with("zip entry count '65535' cannot fit"),
        "{}",
        err(&f)
    );
    let (mut f, _) = zip(&npz_entries(), true);
    let rec = f.len() - 28 - 22 - 20 - 56;
    f[rec + 32..rec + 40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        err(&f).starts_with(&format!("zip entry count '{}'", u64::MAX)),
        "{}",
        err(&f)
    );
}

#[test]
fn wrong_magic() {
    let (mut f, _) = gguf_file(3, None);
    f[3] = b'X';
    assert_eq!(
        gguf::parse(&f).unwrap_err().to_string(),
        "invalid gguf: no 'GGUF' magic"
    );
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    let mut f = npy(1, "<f4", &[1], &[0; 4], 0);
    f[1] = b'X';
    assert!(npy::parse(&f).unwrap_err().to_string().contains("magic"));
    assert_eq!(container::parse_bytes(&f).unwrap().format, Format::Opaque);
    assert!(safetensors::parse(&b"\x02\0\0\0\0\0\0\0[]".to_vec())
        .unwrap_err()
        .to_string()
        .contains("not a json object"));
}

#[test]
fn non_utf8_names() {
    let mut t = GgufTensor::new("x", &[1], 0, vec![0; 4], Dtype::F32);
    t.name = vec![b'a', 0xff, 0xfe];
    let (f, _) = gguf(3, None, &[], &[t]);
    assert_eq!(
        err(&f),
        "gguf tensor name at offset '24' is not valid utf-8"
    );

    let (mut f, _, _) = safetensors_file();
    let at = f.windows(7).position(|w| w == b"layer.0").unwrap();
    f[at] = 0xff;
    assert!(err(&f).contains("not a json object"), "{}", err(&f));

    let (mut f, _) = zip(&npz_entries(), false);
    let cd = f.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    f[cd + 46] = 0xff;
    assert!(
        err(&f).starts_with("zip entry name at offset"),
        "{}",
        err(&f)
    );
}

#[test]
fn other_zips_and_unknown_files_are_opaque() {
    let (f, _) = zip(&[ZipEntry::stored("readme.txt", b"hi".to_vec())], false);
    let c = parse_file("x.zip", &f);
    assert_eq!(c.format, Format::Opaque);
    assert_eq!((c.tensors[0].offset, c.tensors[0].len), (0, f.len() as u64));
    let c = parse_file("model.gguf", b"not a model at all");
    assert_eq!(c.format, Format::Opaque);
}
