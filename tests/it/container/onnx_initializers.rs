//! ONNX initializers: raw bytes, packed fields, external tensors, lying lengths, and
//! models written by the onnx package.

use super::*;

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
