//! llama.cpp's CPU repack, end to end (issue #40): the real `llama-completion` (built by
//! `scripts/llama-cache.sh tools`) holds a small random-weight llama model, quantized by
//! the real `llama-quantize` to Q4_0 or Q4_K, mapped (its default). With repack (its
//! default too) every matmul weight is copied into a `CPU_REPACK` buffer in an interleaved
//! layout (q4_0_8x8, q4_K_8x8 on AVX2): a second copy of those tensors, in other bytes.
//! With `--no-repack` the weights are read in place: the file is in memory once.
//!
//! Truth is the test's own: the page cache by util-linux `fincore`, and the repacked copy
//! as the `RssAnon` of the holder with repack minus that of the holder without (both
//! holding the same file, after load, waiting for input), checked against the
//! `CPU_REPACK model buffer size` llama.cpp logs and against the bytes of the tensors it
//! logs as repacked (sizes from gguf-py's reader). truth = resident fraction + repacked
//! bytes / file size.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/tiny_llama.py")
}

/// The llama.cpp cache, built if needed (a failed build fails the test: llama.cpp can be
/// built wherever these tests run).
fn llama_cache() -> PathBuf {
    let sh = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/llama-cache.sh");
    let start = Instant::now();
    let (status, out, err) = bounded(
        Command::new("bash").arg(sh).arg("tools"),
        Duration::from_secs(3600),
    );
    assert!(
        status.success(),
        "scripts/llama-cache.sh tools failed ({status}): {err}"
    );
    let cache = PathBuf::from(out.lines().last().unwrap().trim());
    eprintln!(
        "llama.cpp cache {} ({:.1} s)",
        cache.display(),
        start.elapsed().as_secs_f64()
    );
    cache
}

/// One tensor of a GGUF, as gguf-py reads it (a JSON array: name, type, offset, bytes).
#[derive(serde::Deserialize, Debug)]
struct Tensor {
    name: String,
    kind: String,
    _offset: u64,
    bytes: u64,
}

/// Weights of matrix multiplies: what CPU repack may take. Never the norms; the embedding
/// (read by rows) only when it is the output too (tied: no `output.weight`), then under
/// its own name (llama.cpp's duplicate of it for the output is repacked, the embedding
/// stays mapped).
fn matmul(ts: &[Tensor]) -> Vec<&Tensor> {
    let tied = !ts.iter().any(|t| t.name == "output.weight");
    ts.iter()
        .filter(|t| !t.name.contains("norm") && (tied || t.name != "token_embd.weight"))
        .collect()
}

/// The random-weight F16 model of `seed` (`tied`: without `output.weight`), quantized to
/// `qtype` (`--pure`: every tensor of that type, no k-quant mixture); the F16 file is
/// removed.
fn model(cache: &Path, dir: &Path, seed: u32, tied: bool, qtype: &str) -> PathBuf {
    let f16 = dir.join("model-f16.gguf");
    let out = dir.join(format!("model-{qtype}.gguf"));
    run_ok(
        Command::new("python3")
            .env("TWOFOLD_LLAMA_CACHE", cache)
            .arg(script())
            .arg("write")
            .arg(&f16)
            .arg(seed.to_string())
            .args(if tied { &["tied"][..] } else { &[][..] }),
    );
    let (status, _, err) = bounded(
        Command::new(cache.join("bin/llama-quantize"))
            .arg("--pure")
            .arg(&f16)
            .arg(&out)
            .args([qtype, "2"]),
        Duration::from_secs(600),
    );
    assert!(status.success(), "llama-quantize failed: {err}");
    std::fs::remove_file(&f16).unwrap();
    // Written back: clean page cache, as a model downloaded a while ago.
    std::fs::File::open(&out).unwrap().sync_all().unwrap();
    out
}

fn tensors(cache: &Path, file: &Path) -> Vec<Tensor> {
    let out = run_ok(
        Command::new("python3")
            .env("TWOFOLD_LLAMA_CACHE", cache)
            .arg(script())
            .arg("tensors")
            .arg(file),
    );
    serde_json::from_slice(&out).unwrap()
}

/// `llama-completion` holding `model`: the prompt evaluated, waiting on its stdin (a pipe
/// this guard keeps open) for the next line, with one thread; killed and reaped on drop.
struct Held {
    child: Child,
    log: PathBuf,
}

impl Held {
    fn start(cache: &Path, model: &Path, repack: bool) -> Held {
        let tag = if repack { "repack" } else { "no-repack" };
        let log = model.with_extension(format!("{tag}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(cache.join("bin/llama-completion"));
        cmd.arg("-m")
            .arg(model)
            .args([
                "-t",
                "1",
                "-c",
                "256",
                "-n",
                "4",
                "-p",
                "The quick brown fox",
            ])
            // interactive, waiting for input once the prompt is evaluated; stdin read as
            // plain lines (it is a pipe); -v: the debug lines that name repacked tensors
            .args(["-if", "-no-cnv", "--simple-io", "--no-display-prompt", "-v"])
            .args(if repack {
                &[][..]
            } else {
                &["--no-repack"][..]
            })
            .stdin(Stdio::piped())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        let child = twofold::cleanup::spawn(&mut cmd).unwrap();
        let mut held = Held { child, log };
        let start = Instant::now();
        loop {
            if held.log_text().contains("waiting for user input") {
                break;
            }
            if let Some(status) = held.child.try_wait().unwrap() {
                panic!(
                    "llama-completion ({tag}) exited ({status}) before it waited for input:\n{}",
                    held.log_text()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "llama-completion ({tag}) not waiting for input after 300 s:\n{}",
                held.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "llama-completion ({tag}) pid {} waiting for input after {:.1} s",
            held.pid(),
            start.elapsed().as_secs_f64()
        );
        held
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap()).into_owned()
    }

    /// `CPU_REPACK model buffer size = N MiB`, in bytes (±0.005 MiB: two decimals). The
    /// last such line: llama.cpp first sizes the model's buffers without loading it (to fit
    /// it to the devices) and logs 0.00 MiB for each.
    fn repack_buffer(&self) -> Option<f64> {
        let text = self.log_text();
        let line = text
            .lines()
            .rfind(|l| l.contains("CPU_REPACK model buffer size"))?;
        let mib: f64 = line
            .split('=')
            .nth(1)?
            .trim()
            .trim_end_matches("MiB")
            .trim()
            .parse()
            .unwrap();
        Some(mib * MIB as f64)
    }

    /// Tensors logged as repacked (`repack tensor NAME with LAYOUT`), with the layout.
    fn repacked(&self) -> BTreeSet<(String, String)> {
        self.log_text()
            .lines()
            .filter_map(|l| l.split_once("repack tensor ")?.1.split_once(" with "))
            .map(|(t, l)| (t.trim().to_string(), l.trim().to_string()))
            .collect()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        if self.child.wait().is_ok() {
            twofold::cleanup::forget(self.pid());
        }
    }
}

/// Resident fraction of `file` by util-linux `fincore`.
fn resident(file: &Path) -> f64 {
    let size = std::fs::metadata(file).unwrap().len();
    (fincore_pages(file) * 4096) as f64 / size.next_multiple_of(4096) as f64
}

/// Scans `file`: the count and the report's JSON text, with the truth's page-cache part
/// measured just before and just after (their mean; both printed).
fn scan(file: &Path) -> (f64, f64, String) {
    let before = resident(file);
    let start = Instant::now();
    let (r, m) = scan_file(file);
    let took = start.elapsed().as_secs_f64();
    let after = resident(file);
    eprintln!("  resident {before:.4} before the scan, {after:.4} after; scan {took:.1} s");
    let count = m.representations.proven.unwrap();
    (
        (before + after) / 2.0,
        count,
        serde_json::to_string(&r).unwrap(),
    )
}

/// Only one model at a time (each test holds two llama.cpp processes; 2-core machines).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn repack_end_to_end(seed: u32, tied: bool, qtype: &str, layout: &str) {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require(is_root(), "root (to read llama.cpp's memory)")
        || !require(have("fincore"), "util-linux fincore")
        || !python_has("numpy, yaml")
    {
        return;
    }
    let test_start = Instant::now();
    let what = if tied {
        format!("{qtype} tied")
    } else {
        qtype.to_string()
    };
    let cache = llama_cache();
    let dir = tempfile::tempdir().unwrap();
    let file = model(&cache, dir.path(), seed, tied, qtype);
    let size = std::fs::metadata(&file).unwrap().len();

    let ts = tensors(&cache, &file);
    let wanted = qtype.trim_end_matches("_M").to_uppercase();
    let weights = matmul(&ts);
    for t in &weights {
        assert_eq!(t.kind.to_uppercase(), wanted, "{t:?}");
    }
    let matmul: BTreeSet<&str> = weights.iter().map(|t| t.name.as_str()).collect();
    let tensor_sum: u64 = weights.iter().map(|t| t.bytes).sum();
    eprintln!(
        "{what}: {} tensors, {} matmul weights of {qtype} ({:.2} MiB), file {:.2} MiB",
        ts.len(),
        matmul.len(),
        tensor_sum as f64 / MIB as f64,
        size as f64 / MIB as f64
    );

    // Without repack: the weights are read in place, the file is in memory once.
    let plain = Held::start(&cache, &file, false);
    assert!(plain.repack_buffer().is_none(), "{}", plain.log_text());
    assert!(plain.repacked().is_empty(), "{:?}", plain.repacked());
    let anon_plain = status_bytes(plain.pid(), "RssAnon");
    let (cached, count, _) = scan(&file);
    eprintln!(
        "{what} --no-repack: RssAnon {:.2} MiB; truth {cached:.4} (page cache), twofold {count:.4}",
        anon_plain as f64 / MIB as f64
    );
    assert!(
        (count - cached).abs() <= 0.02,
        "{what} --no-repack: twofold {count}, truth {cached}"
    );

    // With repack, beside it: every matmul weight copied into the CPU_REPACK buffer.
    let packed = Held::start(&cache, &file, true);
    let repacked = packed.repacked();
    let names: BTreeSet<&str> = repacked.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(names, matmul, "tensors repacked");
    assert!(
        repacked.iter().all(|(_, l)| l == layout),
        "layouts: {repacked:?}"
    );
    let logged = packed
        .repack_buffer()
        .unwrap_or_else(|| panic!("no CPU_REPACK buffer:\n{}", packed.log_text()));
    let anon_packed = status_bytes(packed.pid(), "RssAnon");
    let anon_plain_now = status_bytes(plain.pid(), "RssAnon");
    let extra = anon_packed as f64 - anon_plain_now as f64;
    eprintln!(
        "{what} repack: RssAnon {:.2} MiB vs {:.2} MiB without (was {:.2}): extra {:.2} MiB; \
         CPU_REPACK log {:.2} MiB; {layout} tensors {:.2} MiB",
        anon_packed as f64 / MIB as f64,
        anon_plain_now as f64 / MIB as f64,
        anon_plain as f64 / MIB as f64,
        extra / MIB as f64,
        logged / MIB as f64,
        tensor_sum as f64 / MIB as f64
    );
    // The log's size has two decimals of MiB; the tensors lie back to back, aligned.
    assert!(
        (logged - tensor_sum as f64).abs() <= 0.006 * MIB as f64 + 64.0 * names.len() as f64,
        "CPU_REPACK buffer {logged} B, repacked tensors {tensor_sum} B"
    );
    // RssAnon holds more than the buffer (heap pages touched differently): 2% of the file.
    assert!(
        (extra - tensor_sum as f64).abs() <= 0.02 * size as f64,
        "RssAnon difference {extra} B, repacked tensors {tensor_sum} B"
    );
    let (cached, count, json) = scan(&file);
    let truth = cached + extra / size as f64;
    eprintln!(
        "{what} repack: truth {truth:.4} = page cache {cached:.4} + repacked {:.4}; twofold {count:.4}",
        extra / size as f64
    );
    eprintln!(
        "{what}: test took {:.1} s",
        test_start.elapsed().as_secs_f64()
    );
    assert!(
        (count - truth).abs() <= 0.02,
        "{what} repack: twofold {count}, truth {truth}"
    );
    assert!(
        json.contains(layout),
        "{what}: the report does not name {layout}"
    );
    drop(packed);
    drop(plain);
}

#[test]
fn llama_cpp_repack_q4_0_is_a_second_copy() {
    repack_end_to_end(4000, false, "Q4_0", "q4_0_8x8");
}

/// Tied embeddings: the embedding is repacked for the output and stays mapped for the
/// rows it is read by.
#[test]
fn llama_cpp_repack_of_a_tied_embedding_is_a_second_copy() {
    repack_end_to_end(4002, true, "Q4_0", "q4_0_8x8");
}

#[test]
fn llama_cpp_repack_q4_k_is_a_second_copy() {
    repack_end_to_end(4001, false, "Q4_K", "q4_K_8x8");
}
