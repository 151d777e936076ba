//! Upload tracing without a GPU: a stand-in `libcuda.so.1` (tests/trace/cuda/, built here
//! with gcc in a temp dir) exports the driver's upload, registration and allocation entry
//! points and does nothing; `uploader` (also built here) dlopens it and "uploads" a model
//! file's tensors from its heap, from one reused staging buffer, widened to F32, as random
//! bytes, or registers ranges of its file mapping. `scan --trace` and `record --trace` +
//! `replay` must say exactly which bytes of the file went where.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::serial;
use twofold::model::Report;

pub(crate) struct Standin {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) lib: PathBuf,
    pub(crate) uploader: PathBuf,
}

pub(crate) fn standin() -> Option<Standin> {
    if !require(is_root(), "root (to attach uprobes)")
        || !require(have("gcc"), "gcc (to build the stand-in libcuda)")
    {
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/trace/cuda");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libcuda.so.1");
    let uploader = dir.path().join("uploader");
    let gcc = |args: &[&std::ffi::OsStr]| {
        let o = Command::new("gcc").args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    gcc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O1".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        src.join("libcuda_standin.c").as_os_str(),
    ]);
    gcc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O1".as_ref(),
        "-o".as_ref(),
        dir.path().join("libcufile.so.0").as_os_str(),
        src.join("libcufile_standin.c").as_os_str(),
    ]);
    gcc(&[
        "-O1".as_ref(),
        "-o".as_ref(),
        uploader.as_os_str(),
        src.join("uploader.c").as_os_str(),
        "-ldl".as_ref(),
        "-lm".as_ref(),
    ]);
    Some(Standin { dir, lib, uploader })
}

/// A safetensors file of F16 tensors of random values; the tensors' (offset, len).
fn model(dir: &Path) -> (PathBuf, Vec<(u64, u64)>) {
    let lens: [u64; 4] = [1 << 20, 3 << 19, 300_000, 2 << 20];
    let mut header = String::from("{");
    let mut at = 0u64;
    for (i, n) in lens.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"w{i}\":{{\"dtype\":\"F16\",\"shape\":[{}],\"data_offsets\":[{at},{}]}}",
            n / 2,
            at + n
        ));
        at += n;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let base = 8 + header.len() as u64;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    // Finite F16 values (no NaN, which widening would not keep bit for bit).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..at / 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let h = (x as u16) & 0xbbff;
        bytes.extend_from_slice(&h.to_le_bytes());
    }
    let path = dir.join("up.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let mut ranges = Vec::new();
    let mut off = base;
    for n in lens {
        ranges.push((off, n));
        off += n;
    }
    (path, ranges)
}

/// An uploader process: says `armed` before it loads the library, works on a line.
pub(crate) struct Uploader {
    child: Child,
    out: BufReader<ChildStdout>,
    /// Where `dump` writes the stand-in's device memory (`UPLOADER_DUMP`).
    pub(crate) dump_to: Option<PathBuf>,
}

impl Uploader {
    fn start(s: &Standin, mode: &str, file: &Path, ranges: &[(u64, u64)]) -> Uploader {
        Uploader::start_with(s, mode, file, ranges, &[])
    }

    /// [`Uploader::start`] with environment variables (`UPLOADER_CLONE`, ...).
    pub(crate) fn start_with(
        s: &Standin,
        mode: &str,
        file: &Path,
        ranges: &[(u64, u64)],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Uploader {
        let list: Vec<String> = ranges.iter().map(|(o, n)| format!("{o}:{n}")).collect();
        let mut child = Command::new(&s.uploader)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .arg(&s.lib)
            .arg(mode)
            .arg(file)
            .arg(list.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "armed");
        Uploader {
            child,
            out,
            dump_to: None,
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `line`, returns the answer.
    pub(crate) fn say(&mut self, line: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        self.out.read_line(&mut answer).unwrap();
        answer.trim().to_string()
    }

    pub(crate) fn go(&mut self) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GPU fixture: each (pid, bytes) on GPU 0.
pub(crate) fn fixture(dir: &Path, procs: &[(i32, u64)]) -> PathBuf {
    let ps: Vec<String> = procs
        .iter()
        .map(|(p, b)| format!("{{\"pid\":{p},\"kind\":\"compute\",\"used_bytes\":{b}}}"))
        .collect();
    let path = dir.join("gpu.json");
    std::fs::write(
        &path,
        format!(
            "{{\"devices\":[{{\"index\":0,\"name\":\"Stand-in GPU\",\"uuid\":\"GPU-0\",\"memory_total_bytes\":85899345920,\"integrated\":false,\"processes\":[{}]}}]}}",
            ps.join(",")
        ),
    )
    .unwrap();
    path
}

/// `twofold ARGS` with the stand-in library named; `during` runs once the tracer said it
/// started (`tracing for` on stderr, or the store's first frame for `record`).
pub(crate) fn traced(
    s: &Standin,
    args: &[&std::ffi::OsStr],
    gpu: Option<&Path>,
    during: impl FnOnce(),
) -> (String, String) {
    traced_with(s, args, gpu, &[], during)
}

/// [`traced`] with more environment variables (`TWOFOLD_LIBCUFILE`).
pub(crate) fn traced_with(
    s: &Standin,
    args: &[&std::ffi::OsStr],
    gpu: Option<&Path>,
    env: &[(&str, &std::ffi::OsStr)],
    during: impl FnOnce(),
) -> (String, String) {
    let mut cmd = Command::new(exe());
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .env("TWOFOLD_LIBCUDA", &s.lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match gpu {
        Some(g) => cmd.env("TWOFOLD_GPU_FIXTURE", g),
        None => cmd.env_remove("TWOFOLD_GPU_FIXTURE"),
    };
    let mut child = cmd.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let t0 = Instant::now();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 || t0.elapsed() > Duration::from_secs(60) {
            panic!("twofold never started tracing: {seen}");
        }
        seen.push_str(&line);
        if line.contains("tracing for") || line.contains("tracing on") {
            break;
        }
    }
    during();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    err.read_to_string(&mut seen).unwrap();
    assert!(child.wait().unwrap().success(), "{seen}");
    (out, seen)
}

pub(crate) fn file<'a>(r: &'a Report, path: &Path) -> &'a twofold::model::FileModel {
    r.files
        .iter()
        .find(|f| Path::new(&f.path) == path)
        .unwrap_or_else(|| panic!("{} not in the report", path.display()))
}

pub(crate) fn tensor_bytes(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|r| r.1).sum()
}

fn data_range(ranges: &[(u64, u64)]) -> (u64, u64) {
    (ranges[0].0, ranges.last().map(|(o, n)| o + n).unwrap())
}

#[test]
fn scan_trace_matches_uploads_to_the_files_tensors_and_reads_in_place() {
    scan_traced_matches_uploads("--trace");
}

/// The same with the upload probes alone (no tracepoints).
#[test]
fn scan_trace_uploads_matches_uploads_to_the_files_tensors_and_reads_in_place() {
    scan_traced_matches_uploads("--trace-uploads");
}

fn scan_traced_matches_uploads(flag: &str) {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let (m, ranges) = model(s.dir.path());
    let total = tensor_bytes(&ranges);
    let mut heap = Uploader::start(&s, "heap", &m, &ranges);
    let mut staging = Uploader::start(&s, "staging", &m, &ranges[1..3]);
    let mut widen = Uploader::start(&s, "widen", &m, &ranges[..1]);
    let mut random = Uploader::start(&s, "random", &m, &ranges);
    let mut register = Uploader::start(&s, "register", &m, &[(ranges[3].0, 1 << 20)]);
    let (out, err) = traced(
        &s,
        &[
            "scan".as_ref(),
            m.as_os_str(),
            flag.as_ref(),
            "4s".as_ref(),
            "--json".as_ref(),
        ],
        None,
        || {
            for u in [
                &mut heap,
                &mut staging,
                &mut widen,
                &mut random,
                &mut register,
            ] {
                u.go();
            }
        },
    );
    let r: Report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    let f = file(&r, &m);
    let up = |pid: i32| f.uploads.iter().find(|u| u.pid == pid);
    // The heap loader uploaded every tensor: the merged range is the file's data.
    let h = up(heap.pid()).unwrap_or_else(|| panic!("no upload of the heap loader: {f:?}"));
    assert_eq!((h.file_bytes, h.copies, h.widened), (total, 4, false));
    assert_eq!(h.ranges, [data_range(&ranges)]);
    assert_eq!(h.entry, "cuMemcpyHtoD_v2");
    // The staging loader: tensors 1 and 2 through one reused buffer.
    let st = up(staging.pid()).unwrap();
    assert_eq!(st.ranges, [(ranges[1].0, ranges[2].0 + ranges[2].1)]);
    assert_eq!(st.entry, "cuMemcpyHtoDAsync_v2");
    // Widened F16 -> F32: the file range of tensor 0, twice its bytes on the device.
    let w = up(widen.pid()).unwrap();
    assert!(w.widened);
    assert_eq!(
        (w.ranges.clone(), w.device_bytes),
        (
            vec![(ranges[0].0, ranges[0].0 + ranges[0].1)],
            2 * ranges[0].1
        )
    );
    // Random bytes of the same sizes: no upload of the file.
    assert!(up(random.pid()).is_none(), "{:?}", up(random.pid()));
    let tr = r.gpus.uploads.as_ref().unwrap();
    let rp = tr
        .processes
        .iter()
        .find(|p| p.seen.pid == random.pid())
        .unwrap();
    assert_eq!(
        (rp.seen.copies, rp.seen.model_bytes, rp.seen.other_bytes),
        (4, 0, total)
    );
    assert!(rp.seen.traced_from_start);
    assert_eq!(rp.verdict, "not model bytes");
    let hp = tr
        .processes
        .iter()
        .find(|p| p.seen.pid == heap.pid())
        .unwrap();
    assert_eq!(
        (hp.seen.model_bytes, hp.seen.device_alloc_bytes),
        (total, total)
    );
    // The registered range of the mapping: read in place.
    let ip = f.in_place.iter().find(|p| p.pid == register.pid()).unwrap();
    assert_eq!((ip.file_offset, ip.bytes), (ranges[3].0, 1 << 20));
    // No NVML here: nothing is counted as a device copy, and the device part is n/a.
    assert!(r.gpus.not_available.is_some());
    assert!(f.device_copies.is_empty(), "{:?}", f.device_copies);
    assert_eq!(f.representations.device, None);
    assert!(f
        .uploads
        .iter()
        .all(|u| !u.proven
            && u.not_proven.as_deref() == Some("its device memory is unknown (no NVML)")));
    // The text says the same (a new registration in a new window).
    drop(register);
    let mut register = Uploader::start(&s, "register", &m, &[(ranges[3].0, 1 << 20)]);
    let (text, _) = traced(
        &s,
        &["scan".as_ref(), m.as_os_str(), flag.as_ref(), "2s".as_ref()],
        None,
        || register.go(),
    );
    assert!(text.contains("GPUS: n/a"), "{text}");
    assert!(
        text.contains(&format!(
            "pid {} (uploader) registered its mapping of up.safetensors (1.0 MiB from offset {}) for device access (read in place, no device copy)",
            register.pid(),
            ranges[3].0
        )),
        "{text}"
    );
}

#[test]
fn record_trace_and_replay_prove_device_copies_and_clear_the_random_uploader() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let (m, ranges) = model(s.dir.path());
    let total = tensor_bytes(&ranges);
    let mut heap = Uploader::start(&s, "heap", &m, &ranges);
    let mut random = Uploader::start(&s, "random", &m, &ranges);
    // NVML (a fixture): each holds its uploads plus a context's 64 MiB on GPU 0; the
    // random uploader's memory is more than the file (the old rule suspected it).
    let ctx = 64 << 20;
    let gpu = fixture(
        s.dir.path(),
        &[(heap.pid(), total + ctx), (random.pid(), total + ctx)],
    );
    let store = s.dir.path().join("store");
    let store_arg = store.clone();
    let (_, err) = {
        let mut cmd = Command::new(exe());
        cmd.args([
            "record",
            "--trace",
            "--interval",
            "1s",
            "--count",
            "4",
            "--no-prove",
            "--store",
        ])
        .arg(&store_arg)
        .arg(&m)
        .env("TWOFOLD_LIBCUDA", &s.lib)
        .env("TWOFOLD_GPU_FIXTURE", &gpu)
        .env("TWOFOLD_UPLOADS_DIR", s.dir.path().join("ledgers"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // The first frame is written after the tracer attached.
        let t0 = Instant::now();
        while !walk_has_file(&store) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "record wrote no frame"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        heap.go();
        random.go();
        let mut e = String::new();
        child.stderr.take().unwrap().read_to_string(&mut e).unwrap();
        assert!(child.wait().unwrap().success(), "{e}");
        ((), e)
    };
    let out = Command::new(exe())
        .args(["replay", "--json", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{err}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r: Report = serde_json::from_value(v.get("report").cloned().unwrap_or(v)).unwrap();
    let f = file(&r, &m);
    let proven: Vec<_> = f.device_copies.iter().filter(|d| d.proven).collect();
    assert_eq!(proven.len(), 1, "{:?}", f.device_copies);
    let d = proven[0];
    assert_eq!(
        (
            d.pid,
            d.via.as_str(),
            d.gpu,
            d.attributed_bytes,
            d.device_bytes
        ),
        (heap.pid(), "upload", Some(0), total, total)
    );
    assert!(d.proven_at_unix_ns.is_some());
    // The random uploader holds more device memory than the file and has the file open,
    // but its traced uploads were not model bytes: not suspected.
    assert!(
        f.device_copies.iter().all(|d| d.pid != random.pid()),
        "{:?}",
        f.device_copies
    );
    let size = f.size_bytes.unwrap();
    assert_eq!(f.representations.device, Some(total as f64 / size as f64));
    assert_eq!(f.representations.suspected_device, 0.0);
}

#[test]
fn trace_shows_uploads_per_file_and_process_and_small_copies_all_arrive() {
    let _serial = serial();
    let Some(s) = standin() else { return };
    let (m, ranges) = model(s.dir.path());
    let total = tensor_bytes(&ranges);
    let mut heap = Uploader::start(&s, "heap", &m, &ranges);
    // 300,000 bytes in copies of 200: each continues the one before, so each is sent
    // whole (the first too, once the second continues it).
    let mut chunks = Uploader::start(&s, "chunks", &m, &ranges[2..3]);
    // A serving loop: 20,000 copies of 200 bytes from one buffer to one place: counted in
    // the kernel, not sent.
    let mut tiny = Uploader::start(&s, "tiny", &m, &ranges[..1]);
    let gpu = fixture(s.dir.path(), &[(heap.pid(), total + (64 << 20))]);
    let mut child = Command::new(exe())
        .args([
            "trace",
            "--duration",
            "4s",
            "--interval",
            "1s",
            "--json",
            "--file",
        ])
        .arg(&m)
        .env("TWOFOLD_LIBCUDA", &s.lib)
        .env("TWOFOLD_GPU_FIXTURE", &gpu)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains(r#""type":"attached""#), "{line}");
    heap.go();
    chunks.go();
    tiny.go();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    let summary: serde_json::Value = rest
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["type"] == "summary")
        .unwrap_or_else(|| panic!("no summary: {rest}{err}"));
    let d = &summary["data"];
    let row = d["uploads"]
        .as_array()
        .and_then(|a| a.iter().find(|u| u["pid"] == heap.pid()))
        .unwrap_or_else(|| panic!("no upload row of the heap loader: {d}"));
    assert_eq!(row["path"], m.display().to_string());
    assert_eq!(
        (&row["file_bytes"], &row["device_bytes"], &row["calls"]),
        (&total.into(), &total.into(), &4.into())
    );
    assert_eq!(row["gpus"], serde_json::json!([0]));
    assert_eq!(row["entry"], "cuMemcpyHtoD_v2");
    let procs = d["upload_processes"].as_array().unwrap();
    let p = |pid: i32| procs.iter().find(|p| p["pid"] == pid).unwrap();
    assert_eq!(
        (&p(heap.pid())["calls"], &p(heap.pid())["model_bytes"]),
        (&4.into(), &total.into())
    );
    // Every small copy arrived (the reader drains without a wakeup per record).
    let c = p(chunks.pid());
    let n = ranges[2].1.div_ceil(200);
    assert_eq!((&c["calls"], &c["bytes"]), (&n.into(), &ranges[2].1.into()));
    assert_eq!(c["gpus"], serde_json::json!([]));
    // The first chunk holds the tensor's first grid point; each later one (most hold no
    // point) continues the one before, at the source and the destination: the whole
    // tensor is matched, chunk by chunk.
    assert_eq!(c["model_bytes"], ranges[2].1, "{c}");
    let r = d["uploads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["pid"] == chunks.pid())
        .unwrap_or_else(|| panic!("no upload row of the chunked loader: {d}"));
    assert_eq!(
        (&r["calls"], &r["file_bytes"]),
        (&n.into(), &ranges[2].1.into())
    );
    // Every tiny copy is counted (the uploader made 20,000), none examined as model bytes.
    let t = p(tiny.pid());
    assert_eq!(
        (&t["calls"], &t["bytes"], &t["model_bytes"]),
        (&20_000.into(), &4_000_000.into(), &0.into()),
        "{t}"
    );
    // The text: one UPLOADS block.
    let mut heap2 = Uploader::start(&s, "heap", &m, &ranges);
    let mut child = Command::new(exe())
        .args(["trace", "--duration", "2s", "--interval", "1s", "--file"])
        .arg(&m)
        .env("TWOFOLD_LIBCUDA", &s.lib)
        .env("TWOFOLD_GPU_FIXTURE", &gpu)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("attached"), "{line}");
    heap2.go();
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(text.contains("UPLOADS to GPUs"), "{text}");
    let want = format!("{} ", heap2.pid());
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&want) && l.contains("up.safetensors")),
        "{text}"
    );
}

/// Whether the store holds a frame (written after the tracer attached).
pub(crate) fn walk_has_file(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let p = e.path();
        p.extension().is_some_and(|x| x == "frames")
            && std::fs::metadata(&p).map(|m| m.len() > 0).unwrap_or(false)
    })
}
