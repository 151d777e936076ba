//! Repacked copies (llama.cpp's CPU `CPU_REPACK` buffer) found by the proof: a GGUF file
//! mapped by a process that also holds its matrix weights in the layouts ggml's AVX2
//! build writes (`q4_0_8x8`, `q4_K_8x8`). The bytes are laid out by the test with
//! `twofold_formats::repack` (checked byte for byte against ggml's own output in
//! `formats/tests/fixtures/repack/`); the real runtime's copy is `tests/exact/llama.rs`.
//!
//! Truth is the test's own: the file's page cache by `mincore(2)`, and the repacked
//! bytes it had the holder read (each tensor keeps its size when repacked).

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::writers::{gguf, GgufTensor};
use twofold::container::repack::amx::{pack, AmxLayout};
use twofold::container::repack::{repack, Layout};
use twofold::container::{Dtype, Tensor};
use twofold::model::CopyHow;

/// ggml type ids (`ggml.h`).
const Q4_0: u32 = 2;
const Q4_1: u32 = 3;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

/// A small llama-like GGUF: two repacked weights of each kind, a `token_embd` that is
/// never repacked (llama.cpp reads it with `GET_ROWS`), and a norm.
fn model(dir: &Path, seed: u64) -> (std::path::PathBuf, Vec<Tensor>) {
    let quant = |name: &str, ty: u32, cols: u64, rows: u64, s: u64| {
        let (per, block) = if ty == Q4_K { (256, 144) } else { (32, 18) };
        let len = (cols / per * block * rows) as usize;
        let dtype = Dtype::Quant(if ty == Q4_K { "Q4_K" } else { "Q4_0" }.into());
        GgufTensor::new(
            name,
            &[cols, rows],
            ty,
            crate::writers::bytes(seed + s, len),
            dtype,
        )
    };
    let tensors = vec![
        quant("token_embd.weight", Q4_0, 2048, 512, 1),
        quant("blk.0.ffn_up.weight", Q4_0, 2048, 1024, 2),
        quant("blk.0.ffn_down.weight", Q4_0, 4096, 512, 3),
        quant("blk.0.attn_q.weight", Q4_K, 2048, 1024, 4),
        quant("blk.0.attn_output.weight", Q4_K, 4096, 512, 5),
        GgufTensor::new(
            "blk.0.attn_norm.weight",
            &[2048],
            0,
            crate::writers::bytes(seed + 6, 8192),
            Dtype::F32,
        ),
    ];
    let (bytes, table) = gguf(3, None, &[], &tensors);
    let mut tensors = tensors;
    tensors.iter_mut().for_each(|t| t.data.fill(0));
    let path = dir.join("model-q4.gguf");
    std::fs::write(&path, bytes).unwrap();
    (path, table)
}

/// A holder that maps `file` and reads `copy` (the repacked weights, one after another)
/// into its heap; the copy's file is deleted once read. Returns it once ready.
fn hold(file: &Path, copy: &Path) -> twofold::spawn::Reader {
    let script = r#"
import mmap, os, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
s = 0
for i in range(0, len(m), 4096):
    s += m[i]
with open(sys.argv[2], "rb") as c:
    held = bytearray(c.read())
os.unlink(sys.argv[2])
print("ready", flush=True)
sys.stdin.read()
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script]).arg(file).arg(copy);
    let (child, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

/// A GGUF held mapped beside its weights repacked as an AVX2 build lays them out: the
/// holder, the file, the truth, and the repacked bytes by layout (`q4_0_8x8`, `q4_K_8x8`).
struct Repacked {
    held: twofold::spawn::Reader,
    file: std::path::PathBuf,
    truth: f64,
    bytes: Vec<(Layout, u64)>,
    _dir: tempfile::TempDir,
}

fn repacked_holder(seed: u64) -> Option<Repacked> {
    if !require(is_root(), "root")
        || !require(
            std::arch::is_x86_feature_detected!("avx2"),
            "an x86 CPU with AVX2 (the layouts llama.cpp's AVX2 build picks)",
        )
        || !python_has("mmap")
    {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, table) = model(dir.path(), seed);
    let data = std::fs::read(&file).unwrap();
    // The weights ggml repacks, each in the layout it picks on an AVX2 build.
    let mut copy = Vec::new();
    let mut bytes: Vec<(Layout, u64)> = Vec::new();
    for t in &table {
        let layout = match (t.name.as_str(), &t.dtype) {
            ("token_embd.weight", _) | (_, Dtype::F32) => continue,
            (_, Dtype::Quant(q)) if q == "Q4_K" => Layout::Q4_K_8x8,
            _ => Layout::Q4_0_8x8,
        };
        let rows = t.shape[1] as usize;
        let src = &data[t.offset as usize..(t.offset + t.len) as usize];
        let mut out = repack(layout, rows, t.len as usize / rows, src).unwrap();
        copy.extend_from_slice(&out);
        // ggml aligns each tensor of a buffer to 32 bytes; the sizes here are multiples.
        match bytes.iter_mut().find(|(l, _)| *l == layout) {
            Some(e) => e.1 += out.len() as u64,
            None => bytes.push((layout, out.len() as u64)),
        }
        // Freed as it is, a tensor's repack would stay in this process's heap (glibc
        // serves such sizes from the heap once its mmap threshold has grown): a copy.
        out.fill(0);
    }
    let copy_path = dir.path().join("repacked.bin");
    std::fs::File::create(&copy_path)
        .unwrap()
        .write_all(&copy)
        .unwrap();
    // Nothing of the file, repacked or not, stays in this process's heap while twofold scans.
    copy.fill(0);
    drop(copy);
    let mut data = data;
    data.fill(0);
    drop(data);
    let held = hold(&file, &copy_path);
    let size = std::fs::metadata(&file).unwrap().len();
    let cached = fincore_pages(&file) as f64 * 4096.0 / size.next_multiple_of(4096) as f64;
    let all: u64 = bytes.iter().map(|b| b.1).sum();
    let truth = cached + all as f64 / size as f64;
    eprintln!(
        "repack: truth {truth:.3} (cached {cached:.3} + repacked {:.3})",
        all as f64 / size as f64
    );
    Some(Repacked {
        held,
        file,
        truth,
        bytes,
        _dir: dir,
    })
}

#[test]
fn repacked_weights_count_by_their_bytes_and_name_the_layout() {
    let _group = crate::common::group(module_path!());
    let Some(Repacked {
        held,
        file,
        truth,
        bytes,
        _dir,
    }) = repacked_holder(7100)
    else {
        return;
    };
    let size = std::fs::metadata(&file).unwrap().len();
    let repacked_bytes: u64 = bytes.iter().map(|b| b.1).sum();
    let (r, m) = scan_file(&file);
    let count = m.representations.proven.unwrap();
    let pid = held.pid();
    let copy = m
        .proven_copies
        .iter()
        .find(|c| c.pid == pid)
        .unwrap_or_else(|| panic!("no copy found: {m:#?}"));
    eprintln!(
        "repack: twofold {count:.3} (copy {:.3}, {:?})",
        copy.fraction, copy.how,
    );
    assert!(
        (count - truth).abs() <= 0.02,
        "twofold {count}, truth {truth}"
    );
    assert!(
        (copy.fraction - repacked_bytes as f64 / size as f64).abs() <= 0.01,
        "{copy:?}"
    );
    assert_eq!(copy.how, CopyHow::Converted, "{copy:?}");
    let json = serde_json::to_value(&r).unwrap().to_string();
    for layout in ["q4_0_8x8", "q4_K_8x8"] {
        assert!(
            json.contains(&format!("{{\"repack\":\"{layout}\"}}")),
            "{json}"
        );
    }
    let finding = r
        .findings
        .iter()
        .find(|x| {
            x.code.as_str() == "proven-private-copy" && x.message().contains(&format!("pid {pid}"))
        })
        .unwrap_or_else(|| panic!("no finding: {:#?}", r.findings));
    let msg = finding.message();
    assert!(msg.contains("repacked by llama.cpp"), "{msg}");
    assert!(
        finding.remedy().unwrap_or_default().contains("--no-repack"),
        "{:?}",
        finding.remedy()
    );
    let human = run_ok(Command::new(exe()).arg("scan").arg(&file));
    let human = String::from_utf8_lossy(&human);
    let row = human
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains("repacked"), "{row}");
}

/// llama.cpp's AMX buffer (ggml-cpu's `sapphirerapids` variant, on a kernel that grants AMX
/// state): it takes `MUL_MAT` weights of rows a multiple of 32 before `CPU_REPACK` does, and
/// packs them into 16-row tiles; `Q8_0` grows to 38/34 of its size. These machines grant no
/// AMX state, so no llama.cpp here uses that buffer: the tiles are laid out by the test with
/// `formats::repack::amx` (byte-exact against ggml's own packing, see
/// `formats/tests/fixtures/repack/amx/`), and twofold is told the build's variant with
/// `TWOFOLD_LLAMA_CPU=sapphirerapids`.
#[test]
fn amx_packed_weights_count_by_the_bytes_they_occupy() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("mmap") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let quant = |name: &str, ty: u32, cols: u64, rows: u64, s: u64| {
        let (block, dtype) = if ty == Q8_0 {
            (34, "Q8_0")
        } else {
            (20, "Q4_1")
        };
        let len = (cols / 32 * block * rows) as usize;
        GgufTensor::new(
            name,
            &[cols, rows],
            ty,
            crate::writers::bytes(7200 + s, len),
            Dtype::Quant(dtype.into()),
        )
    };
    let tensors = vec![
        quant("token_embd.weight", Q4_1, 2048, 256, 1),
        quant("blk.0.ffn_up.weight", Q4_1, 2048, 1024, 2),
        quant("blk.0.attn_q.weight", Q8_0, 2048, 512, 3),
        quant("output.weight", Q4_1, 2048, 512, 4),
    ];
    let (bytes, table) = gguf(3, None, &[], &tensors);
    let mut tensors = tensors;
    tensors.iter_mut().for_each(|t| t.data.fill(0));
    let file = dir.path().join("model-amx.gguf");
    std::fs::write(&file, &bytes).unwrap();
    let mut copy = Vec::new();
    let mut packed = 0u64;
    for t in table.iter().filter(|t| t.name != "token_embd.weight") {
        let layout = if t.dtype == Dtype::Quant("Q8_0".into()) {
            AmxLayout::Q8_0
        } else {
            AmxLayout::Q4_1
        };
        let rows = t.shape[1] as usize;
        let src = &bytes[t.offset as usize..(t.offset + t.len) as usize];
        let mut out = pack(layout, rows, t.len as usize / rows, src).unwrap();
        packed += out.len() as u64;
        copy.extend_from_slice(&out);
        // Zeroed before it is freed, as the others below.
        out.fill(0);
    }
    let copy_path = dir.path().join("packed.bin");
    std::fs::write(&copy_path, &copy).unwrap();
    // Freed, a buffer's bytes stay in this process's heap: a copy twofold would rightly find.
    copy.fill(0);
    drop(copy);
    let mut bytes = bytes;
    bytes.fill(0);
    drop(bytes);
    let held = hold(&file, &copy_path);
    let size = std::fs::metadata(&file).unwrap().len();
    let cached = fincore_pages(&file) as f64 * 4096.0 / size.next_multiple_of(4096) as f64;
    let truth = cached + packed as f64 / size as f64;
    // The holder alone is searched (`--pid`): this test process's heap keeps what the
    // writers freed (fragments of the file image, the same bytes) in a place no test
    // controls, and twofold would rightly count them.
    let holder = held.pid().to_string();
    let scan = |variant: Option<&str>| -> twofold::model::Report {
        let mut cmd = Command::new(exe());
        cmd.args(["scan", "--json", "--prove-budget", "300s", "--pid", &holder])
            .arg(&file);
        match variant {
            Some(v) => cmd.env("TWOFOLD_LLAMA_CPU", v),
            None => cmd.env_remove("TWOFOLD_LLAMA_CPU"),
        };
        serde_json::from_slice(&run_ok(&mut cmd)).unwrap()
    };
    let r = scan(Some("sapphirerapids"));
    let m = r.files.iter().find(|f| Path::new(&f.path) == file).unwrap();
    let count = m.representations.proven.unwrap();
    eprintln!(
        "amx: truth {truth:.3} (cached {cached:.3} + packed {:.3}), twofold {count:.3}",
        packed as f64 / size as f64
    );
    assert!(
        (count - truth).abs() <= 0.02,
        "twofold {count}, truth {truth}: {:#?}",
        m.proven_copies
    );
    let json = serde_json::to_string(&r).unwrap();
    for layout in ["amx_q4_1", "amx_q8_0"] {
        assert!(
            json.contains(&format!("{{\"amx\":\"{layout}\"}}")),
            "{json}"
        );
    }
    let finding = r
        .findings
        .iter()
        .find(|x| x.code.as_str() == "proven-private-copy")
        .unwrap_or_else(|| panic!("no finding: {:#?}", r.findings));
    assert!(
        finding.message().contains("llama.cpp's AMX backend"),
        "{}",
        finding.message()
    );
    // An AVX2 build (no AMX buffer) would not make these tiles: no copy is claimed for them
    // (Q4_1 and Q8_0 are not repacked on x86 by CPU_REPACK either).
    let r = scan(Some("haswell"));
    let m = r.files.iter().find(|f| Path::new(&f.path) == file).unwrap();
    let plain = m.representations.proven.unwrap();
    assert!(
        (plain - cached).abs() <= 0.02,
        "haswell: {plain}, cached {cached}"
    );
    drop(held);
}

/// `serve`, `record`/`replay` and `top` show the same count as `scan`, and the cause:
/// serve's `twofold_file_transformed_bytes` by layout, the recording's JSON, top's row.
#[test]
fn every_view_shows_the_repacked_copy() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (to drive top)") {
        return;
    }
    let Some(r) = repacked_holder(7300) else {
        return;
    };
    let pid = r.held.pid().to_string();
    let id = file_id(&r.file);
    // serve: the layouts' bytes, exactly, and the count.
    let port = free_port();
    let mut serve = Command::new(exe())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--interval", "1s", "--prove-budget", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let value = |body: &str, series: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let body = loop {
        match metrics_text(port) {
            Some(b) if b.contains("twofold_file_transformed_bytes") => break b,
            _ => {
                if start.elapsed() > Duration::from_secs(120) {
                    let _ = serve.kill();
                    let _ = serve.wait();
                    panic!("no transformed bytes from serve");
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    };
    let _ = serve.kill();
    let _ = serve.wait();
    for (layout, bytes) in &r.bytes {
        let series = format!(
            "twofold_file_transformed_bytes{{file_id=\"{id}\",transform=\"repack_{}\"}} ",
            layout.spec().name
        );
        assert_eq!(
            value(&body, &series),
            Some(*bytes as f64),
            "{series}: {body}"
        );
    }
    let count = value(&body, &format!("twofold_file_copies{{file_id=\"{id}\"}} ")).unwrap();
    assert!(
        (count - r.truth).abs() <= 0.02,
        "serve {count}, truth {}",
        r.truth
    );

    // record / replay: the count and the layouts in the recorded snapshot.
    let store = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(exe())
            .args(["record", "--count", "1", "--prove-budget", "60s", "--store"])
            .arg(store.path())
            .arg(&r.file),
    );
    let out = run_ok(
        Command::new(exe())
            .args(["replay", "--json", "--store"])
            .arg(store.path()),
    );
    let rep: twofold::model::Report = serde_json::from_slice(&out).unwrap();
    let f = rep
        .files
        .iter()
        .find(|f| Path::new(&f.path) == r.file)
        .unwrap();
    let count = f.representations.proven.unwrap();
    assert!(
        (count - r.truth).abs() <= 0.02,
        "replay {count}, truth {}",
        r.truth
    );
    let text = serde_json::to_string(&rep).unwrap();
    assert!(text.contains("{\"repack\":\"q4_0_8x8\"}"), "{text}");

    // top: the file's row has the count; the holder's row says how it holds the copy.
    let tmux = crate::common::tmux::Tmux::new("repack");
    let exit = store.path().join("exit");
    tmux.start(
        160,
        40,
        &format!(
            "sh -c '{} top --interval 1s --prove-budget 60s --pid {pid} {}; echo EXIT=$? > {}'",
            exe().display(),
            r.file.display(),
            exit.display()
        ),
    );
    let shown = format!(" {:.2} ", r.truth);
    let s = tmux.wait_for("the repacked count", Duration::from_secs(90), |s| {
        s.lines()
            .any(|l| l.contains("model-q4.gguf") && l.contains(&shown))
    });
    assert!(s.contains(&shown), "{s}");
    tmux.keys(&["q"]);
}
