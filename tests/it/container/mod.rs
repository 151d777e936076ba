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

mod malformed;
mod onnx_initializers;

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

/// The one-line error a malformed file gets.
fn err(bytes: &[u8]) -> String {
    container::parse_bytes(bytes).unwrap_err().to_string()
}
