//! Writes container files with the test writers (`tests/writers`):
//!
//! - `containers corpus DIR`: the fuzz seed corpus, tiny valid files under
//!   `DIR/<target>/` (what `fuzz/seeds` holds);
//! - `containers gguf N FILE`: a GGUF of `N` tensors (the `inspect` benchmark's input).
#![allow(clippy::unwrap_used)]

#[path = "../tests/writers/mod.rs"]
mod writers;

use std::path::Path;

use twofold::container::Dtype;
use writers::*;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
}

fn corpus(dir: &Path) {
    let q = |s: &str| Dtype::Quant(s.into());
    let tensors = [
        GgufTensor::new("f32", &[8], 0, bytes(1, 32), Dtype::F32),
        GgufTensor::new("q4_0", &[32, 2], 2, bytes(2, 36), q("Q4_0")),
        GgufTensor::new("q6_k", &[256], 14, bytes(3, 210), q("Q6_K")),
    ];
    let kvs = [
        ("general.architecture", Kv::Str("llama".into())),
        ("n", Kv::U64(7)),
        (
            "tokens",
            Kv::Arr(8, vec![Kv::Str("a".into()), Kv::Str("b".into())]),
        ),
        ("nested", Kv::Arr(9, vec![Kv::Arr(5, vec![Kv::I32(-1)])])),
    ];
    write(
        dir,
        "gguf",
        "v3-aligned.gguf",
        &gguf(3, Some(64), &kvs, &tensors).0,
    );
    write(
        dir,
        "gguf",
        "v2.gguf",
        &gguf(2, None, &kvs[..1], &tensors[..1]).0,
    );
    write(dir, "gguf", "empty.gguf", &gguf(3, None, &[], &[]).0);

    let st = |name: &str, dtype: (&'static str, Dtype), shape: &[u64], data| SafeTensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        offset: None,
        data,
    };
    let two = [
        st("w", ("F16", Dtype::F16), &[2, 2], bytes(4, 8)),
        st("b", ("BF16", Dtype::BF16), &[3], bytes(5, 6)),
    ];
    write(
        dir,
        "safetensors",
        "two.safetensors",
        &safetensors(&two, None).0,
    );
    let one = [st("x", ("F32", Dtype::F32), &[], bytes(6, 4))];
    write(
        dir,
        "safetensors",
        "scalar.safetensors",
        &safetensors(&one, None).0,
    );

    write(
        dir,
        "npy",
        "v1.npy",
        &npy(1, "<f4", &[2, 3], &bytes(7, 24), 0),
    );
    write(dir, "npy", "v2.npy", &npy(2, "<i8", &[2], &bytes(8, 16), 0));
    write(dir, "npy", "v3.npy", &npy(3, "|b1", &[3], &[1, 0, 1], 0));

    let npz = [
        ZipEntry::stored("a.npy", npy(1, "<f2", &[2], &bytes(9, 4), 0)),
        ZipEntry {
            name: "z.npy".into(),
            data: npy(1, "|u1", &[1], &[7], 0),
            deflate: true,
            align: 1,
        },
    ];
    write(dir, "zip", "stored.npz", &zip(&npz[..1], false).0);
    write(dir, "zip", "zip64.npz", &zip(&npz, true).0);
    let storages = [
        ("0", "FloatStorage", 2, bytes(10, 8)),
        ("1", "HalfStorage", 2, bytes(11, 4)),
    ];
    write(dir, "zip", "model.pt", &torch("archive", &storages).0);

    let refs = [
        ("a", "FloatStorage", "0", 6),
        ("b", "HalfStorage", "1", 1 << 33),
    ];
    write(dir, "pickle", "two.pkl", &torch_pickle(&refs));
    write(dir, "pickle", "one.pkl", &torch_pickle(&refs[..1]));

    let typed = onnx_proto::TensorProto {
        name: "typed".into(),
        data_type: 1,
        dims: vec![2],
        float_data: vec![1.0, -2.0],
        ..Default::default()
    };
    let ints = onnx_proto::TensorProto {
        name: "ints".into(),
        data_type: 7,
        dims: vec![2],
        int64_data: vec![3, 300],
        ..Default::default()
    };
    let model = vec![
        onnx_raw("w", 1, &[2, 3], bytes(12, 24)),
        onnx_raw("h", 10, &[4], bytes(13, 8)),
        onnx_raw("i", 7, &[2], bytes(14, 16)),
        typed,
        ints,
    ];
    write(dir, "onnx", "model.onnx", &onnx(model));
    let ext = vec![
        onnx_raw("w", 16, &[2], bytes(15, 4)),
        onnx_external("e", 1, &[4], "model.onnx.data", 64, Some(16)),
    ];
    write(dir, "onnx", "external.onnx", &onnx(ext));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["corpus", dir] => corpus(Path::new(dir)),
        ["gguf", n, file] => std::fs::write(file, gguf_many(n.parse().unwrap())).unwrap(),
        _ => {
            eprintln!("usage: containers corpus DIR | containers gguf N FILE");
            std::process::exit(2);
        }
    }
}
