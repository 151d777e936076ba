//! Private memory that is no known form of a model (issue #40): real processes hold an
//! unknown transform of a model (its bytes XOR-ed, or permuted), or memory that is no form
//! of it (random bytes, a KV-cache-like buffer rewritten every second, nothing but a
//! mapping), or an onnxruntime session with and without prepacking. The truth is what each
//! process says it holds (its own buffer sizes, its RssAnon growth); twofold must show the
//! unknown forms beside the count, about their size, never in the count, and nothing for
//! the rest.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use twofold::model::{FileModel, Report};

use crate::common::*;

/// An F16 safetensors of 16 tensors of 1 Mi normal weights (sigma 0.02), 32 MiB: what a
/// model's weights look like (a file of uniform random bytes has no byte distribution to
/// tell its forms by).
fn weights(dir: &Path) -> PathBuf {
    let path = dir.join("w.safetensors");
    run_ok(Command::new("python3").args([
        "-c",
        r#"
import json, struct, sys, numpy as np
rng = np.random.default_rng(1)
ts = {f"layer{i}.weight": (rng.standard_normal(1 << 20) * 0.02).astype(np.float16) for i in range(16)}
header, off = {}, 0
for k, v in ts.items():
    header[k] = {"dtype": "F16", "shape": [v.size], "data_offsets": [off, off + v.nbytes]}
    off += v.nbytes
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for v in ts.values():
        f.write(v.tobytes())
"#,
        path.to_str().unwrap(),
    ]));
    path
}

struct Held {
    reader: twofold::spawn::Reader,
    said: serde_json::Value,
}

fn hold(mode: &str, file: &Path) -> Held {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/unexplained.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(mode).arg(file);
    let (reader, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(120)).unwrap();
    Held {
        reader,
        said: serde_json::from_str(&line).unwrap(),
    }
}

/// `scan --json --pid PID... FILE` (every page of the candidates searched within 300 s).
fn scan(file: &Path, pids: &[i32]) -> (Report, FileModel) {
    let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "scan".as_ref(),
        "--json".as_ref(),
        "--prove-budget".as_ref(),
        "300s".as_ref(),
    ];
    for p in &pids {
        args.push("--pid".as_ref());
        args.push(p.as_ref());
    }
    args.push(file.as_os_str());
    let r: Report = twofold_json(&args);
    let f = r
        .files
        .iter()
        .find(|f| Path::new(&f.path) == file)
        .unwrap_or_else(|| panic!("{} not in {r:#?}", file.display()))
        .clone();
    (r, f)
}

fn unexplained_of(f: &FileModel, pid: i32) -> Option<u64> {
    f.unexplained
        .iter()
        .find(|u| u.pid == pid)
        .map(|u| u.estimated_bytes)
}

fn ready() -> bool {
    require(is_root(), "root") && python_has("numpy")
}

/// A process holds the model's bytes XOR-ed with a constant, or permuted within each
/// 64-byte block: no copy twofold can prove, but its private memory is distributed like the
/// model. The line appears beside the count with the bytes the process holds (within 5%),
/// the count stays page cache alone (nothing summed), and the finding says so.
#[test]
fn an_unknown_transform_is_shown_beside_the_count_never_in_it() {
    let _group = crate::common::group(module_path!());
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = weights(dir.path());
    for mode in ["xor", "permute"] {
        let h = hold(mode, &file);
        let pid = h.reader.pid();
        let held = h.said["held_bytes"].as_u64().unwrap();
        let (r, f) = scan(&file, &[pid]);
        let got = unexplained_of(&f, pid).unwrap_or_else(|| panic!("{mode}: no line: {f:#?}"));
        eprintln!("{mode}: holds {held} bytes, twofold estimates {got}");
        assert!(
            (got as f64 - held as f64).abs() <= 0.05 * held as f64,
            "{mode}: estimated {got}, held {held}"
        );
        assert!(
            f.proven_copies.iter().all(|c| c.pid != pid),
            "{mode}: {f:#?}"
        );
        let rep = &f.representations;
        assert_eq!(rep.private_copies, 0.0, "{mode}: {rep:?}");
        assert_eq!(rep.proven, rep.page_cache, "{mode}: not summed: {rep:?}");
        let finding = r
            .findings
            .iter()
            .find(|x| x.code.as_str() == "unexplained-memory")
            .unwrap_or_else(|| panic!("{mode}: {:#?}", r.findings));
        let m = finding.message();
        assert!(
            m.starts_with(&format!("pid {pid} (python3) holds "))
                && m.contains(
                    "of private memory that is no known form of 'w.safetensors' (not counted)"
                ),
            "{m}"
        );
        assert!(
            finding
                .remedy()
                .unwrap_or_default()
                .contains("compare RssAnon"),
            "{finding:?}"
        );
        // The human view shows it beside the count.
        let text = run_ok(
            Command::new(exe())
                .args(["scan", "--prove-budget", "300s", "--pid", &pid.to_string()])
                .arg(&file),
        );
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(&format!("beside it: pid {pid} (python3) holds "))
                && text
                    .contains("of private memory that is no known form of this model (not counted"),
            "{text}"
        );
    }
}

/// What is no form of the model: random bytes held by a process that also maps it, a
/// KV-cache-like F16 buffer of activations rewritten every second (scanned twice, a
/// second apart), and a zero-copy mapping. Each is searched; none gets a line.
#[test]
fn random_memory_a_kv_cache_and_a_mapping_are_no_form_of_the_model() {
    let _group = crate::common::group(module_path!());
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = weights(dir.path());
    let size = std::fs::metadata(&file).unwrap().len();
    let held: Vec<(&str, Held)> = ["random", "kv", "mmap"]
        .into_iter()
        .map(|m| (m, hold(m, &file)))
        .collect();
    let pids: Vec<i32> = held.iter().map(|h| h.1.reader.pid()).collect();
    for round in 0..2 {
        if round == 1 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        let (r, f) = scan(&file, &pids);
        for (mode, h) in &held {
            let pid = h.reader.pid();
            assert!(unexplained_of(&f, pid).is_none(), "{mode}: {f:#?}");
            if *mode != "mmap" {
                // It held the memory, and it was searched: a candidate, not passed over.
                assert!(h.said["held_bytes"].as_u64().unwrap() >= size - 64);
            }
        }
        assert!(f.unexplained.is_empty(), "{:#?}", f.unexplained);
        assert!(
            !r.findings
                .iter()
                .any(|x| x.code.as_str() == "unexplained-memory"),
            "{:#?}",
            r.findings
        );
        assert_eq!(f.candidates.not_searched, 0, "{:?}", f.candidates);
        assert!(f.candidates.searched >= 2, "{:?}", f.candidates);
        assert_eq!(f.representations.private_copies, 0.0);
    }
}

/// onnxruntime prepacks the B initializers of MatMul (MLAS panels: the same floats in
/// another order) into buffers of its own; `session.disable_prepacking` is the control.
/// The prepacked bytes (RssAnon growth with prepacking, less the proven copies still there,
/// less what a session holds besides its copies: the control's growth less its proven
/// copies) are shown as unexplained memory within 10%; the control holds one proven copy
/// and no such line. The prepacking process is never a bare count: its proven copies and
/// the line beside them cover its growth.
#[test]
fn onnxruntime_prepacking_is_shown_beside_the_count() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy, onnx, onnxruntime") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("matmul.onnx");
    run_ok(Command::new("python3").args([
        "-c",
        r#"
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(1)
K = 1024
inits, nodes, cur = [], [], "x"
for i in range(8):
    w = (rng.standard_normal((K, K)) * 0.02).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"h{i}"]))
    cur = f"h{i}"
nodes.append(helper.make_node("Identity", [cur], ["y"]))
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, K])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
"#,
        path.to_str().unwrap(),
    ]));
    let size = std::fs::metadata(&path).unwrap().len();
    let off = hold("ort-noprepack", &path);
    let on = hold("ort-prepack", &path);
    let growth = |h: &Held| h.said["anon_growth_bytes"].as_i64().unwrap() as f64;
    let (g_off, g_on) = (growth(&off), growth(&on));
    eprintln!("onnxruntime RssAnon growth: prepacking off {g_off}, on {g_on} (file {size})");
    if !require(
        g_on - g_off > 0.2 * size as f64,
        "onnxruntime prepacking MatMul weights on this CPU",
    ) {
        return;
    }
    let (_, f) = scan(&path, &[off.reader.pid(), on.reader.pid()]);
    let proven = |pid: i32| {
        f.proven_copies
            .iter()
            .filter(|c| c.pid == pid)
            .map(|c| c.memory_bytes as f64)
            .sum::<f64>()
    };
    let (p_off, p_on) = (proven(off.reader.pid()), proven(on.reader.pid()));
    let session = g_off - p_off;
    let prepacked = g_on - p_on - session;
    let shown = unexplained_of(&f, on.reader.pid()).unwrap_or(0) as f64;
    eprintln!(
        "proven copies: off {p_off}, on {p_on}; prepacked (truth) {prepacked}; twofold beside the count {shown}"
    );
    assert!(
        (p_off - size as f64).abs() <= 0.02 * size as f64,
        "the control holds one copy: {p_off}"
    );
    assert!(unexplained_of(&f, off.reader.pid()).is_none(), "{f:#?}");
    assert!(
        (shown - prepacked).abs() <= 0.10 * prepacked,
        "twofold {shown}, prepacked {prepacked}"
    );
    assert!(
        p_on + shown >= 0.9 * (g_on - session),
        "a bare count: {f:#?}"
    );
    let c = f.representations.private_copies;
    assert!(
        (c - (p_off + p_on) / size as f64).abs() < 1e-6,
        "the line is not in the count: {c}"
    );
}
