//! Device copies: GPU memory per process (NVML) in scan's JSON and text. This machine has
//! no NVIDIA GPU, so the real NVML answer is "not available" (checked as such), and a
//! fixture NVML answer (`TWOFOLD_GPU_FIXTURE`, the `collect::gpu::GpuSource` seam) names
//! real child processes the test started; the H200 run (scripts/device-h200.sh,
//! docs/device-h200.md) checks the real NVML path against nvidia-smi.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use crate::common::*;
use serde_json::{json, Value};
use twofold::spawn::Reader;

fn has_nvidia() -> bool {
    Command::new("sh")
        .args(["-c", "ldconfig -p | grep -q 'libnvidia-ml.so.1 '"])
        .status()
        .is_ok_and(|s| s.success())
}

fn start(mode: &str, file: &Path, extra: &[&str]) -> Reader {
    reader(mode, Some(file), extra)
}

fn scan(file: &Path, pids: &[i32], env: &[(&str, &Path)], json: bool) -> Vec<u8> {
    let mut c = Command::new(exe());
    c.arg("scan").arg(file);
    for p in pids {
        c.args(["--pid", &p.to_string()]);
    }
    if json {
        c.arg("--json");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    run_ok(&mut c)
}

fn file_of<'a>(r: &'a Value, path: &Path) -> &'a Value {
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path.to_str().unwrap())
        .unwrap()
}

fn fixture(dir: &Path, integrated: bool, procs: &[(i32, u64)]) -> std::path::PathBuf {
    let path = dir.join(format!("nvml-{integrated}.json"));
    let processes: Vec<Value> = procs
        .iter()
        .map(|(pid, b)| json!({"pid": pid, "kind": "compute", "used_bytes": b}))
        .collect();
    let doc = json!({"devices": [{
        "index": 0, "name": "Fixture GPU", "uuid": "GPU-fixture-0",
        "pci_bus_id": "0000:3b:00.0",
        "memory_total_bytes": 80u64 << 30, "memory_used_bytes": 3u64 << 30,
        "memory_free_bytes": 77u64 << 30,
        "pcie_link_gen": if integrated { Value::Null } else { json!(5) },
        "pcie_link_width": if integrated { Value::Null } else { json!(16) },
        "integrated": integrated, "processes": processes
    }]});
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    path
}

#[test]
fn without_an_nvidia_gpu_every_gpu_value_is_unknown_with_the_reason() {
    if has_nvidia() {
        println!("SKIPPED: this machine has libnvidia-ml: the no-GPU answer cannot be seen here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 8 * MIB);
    let map = start("map", &file, &[]);
    let r: Value = serde_json::from_slice(&scan(&file, &[map.pid()], &[], true)).unwrap();
    let why = r["gpus"]["not_available"].as_str().expect("a reason");
    assert!(why.contains("libnvidia-ml"), "{why}");
    assert_eq!(r["gpus"]["devices"], json!([]));
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == map.pid())
        .unwrap();
    assert_eq!(p["gpu_memory_bytes"], Value::Null, "unknown, never 0");
    let f = file_of(&r, &file);
    assert_eq!(f["representations"]["device"], Value::Null);
    let text = String::from_utf8(scan(&file, &[map.pid()], &[], false)).unwrap();
    assert!(text.contains("GPUS: n/a (libnvidia-ml"), "{text}");
    let gpu_col = text
        .lines()
        .skip_while(|l| !l.starts_with("PROCESSES"))
        .find(|l| l.trim_start().starts_with(&map.pid().to_string()))
        .unwrap();
    assert!(gpu_col.contains("n/a"), "{gpu_col}");
}

#[test]
fn device_memory_of_a_mapper_and_a_copier_is_suspected_beside_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let map = start("map", &file, &[]);
    let copy = start("copy", &file, &["--close"]);
    let bystander = start("anon", &file, &["--bytes", "0"]);
    let procs = [
        (map.pid(), size + 3 * MIB),
        (copy.pid(), 2 * size),
        (bystander.pid(), 4 * MIB),
    ];
    let pids = [map.pid(), copy.pid(), bystander.pid()];
    for integrated in [false, true] {
        let fx = fixture(dir.path(), integrated, &procs);
        let env = [("TWOFOLD_GPU_FIXTURE", fx.as_path())];
        let r: Value = serde_json::from_slice(&scan(&file, &pids, &env, true)).unwrap();
        let f = file_of(&r, &file);
        let dev = f["device_copies"].as_array().unwrap();
        let of = |pid: i32| dev.iter().find(|d| d["pid"] == pid);
        let m = of(map.pid()).expect("the mapper's device copy");
        assert_eq!(m["proven"], false);
        assert_eq!(m["via"], "mapped");
        assert_eq!(m["device_bytes"], size + 3 * MIB);
        assert_eq!(m["attributed_bytes"], size);
        let c = of(copy.pid()).expect("the copier's device copy");
        assert_eq!(
            c["via"], "copied",
            "its private copy is proven, so it read the file"
        );
        // The bystander holds the file open (`anon FILE`) but too little device memory.
        assert!(of(bystander.pid()).is_none(), "{dev:?}");
        let rep = &f["representations"];
        assert_eq!(rep["device"], 0.0);
        assert_eq!(rep["suspected_device"], 2.0);
        // Page cache 1.00 + the copier's private copy: suspicions are not in the count.
        let proven = rep["proven"].as_f64().unwrap();
        assert!((proven - 2.0).abs() < 0.01, "{rep}");
        let by_pid = |pid: i32| {
            r["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == pid)
                .unwrap()["gpu_memory_bytes"]
                .clone()
        };
        assert_eq!(by_pid(map.pid()), size + 3 * MIB);
        assert_eq!(by_pid(bystander.pid()), 4 * MIB);
        let text = String::from_utf8(scan(&file, &pids, &env, false)).unwrap();
        assert!(
            text.contains("up to 4.00 if the suspected device copies in pid"),
            "{text}"
        );
        let verdict = if integrated {
            "could read the page cache in place"
        } else {
            "the device copy is the right one"
        };
        assert!(text.contains(verdict), "{text}");
        let kind = if integrated { "integrated" } else { "discrete" };
        assert!(
            text.contains(&format!("on GPU 0 (Fixture GPU, {kind})")),
            "{text}"
        );
    }
}

#[test]
fn an_attested_device_copy_of_a_live_loader_is_proven_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let attest = tempfile::tempdir().unwrap();
    let size = 8 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let map = start("map", &file, &[]);
    let fx = fixture(dir.path(), false, &[(map.pid(), size + 2 * MIB)]);
    let meta = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::MetadataExt;
    let start_ticks =
        twofold::cleanup::leftovers::start_time(Path::new("/proc"), map.pid()).unwrap();
    let att = json!({
        "proof": {
            "pid": map.pid(),
            "file": {"major": libc::major(meta.dev()), "minor": libc::minor(meta.dev()), "inode": meta.ino()},
            "gpu_uuid": "GPU-fixture-0",
            "file_bytes": size, "device_bytes": size,
            "file_xxh3": "00ff", "device_xxh3": "00ff"
        },
        "start_ticks": start_ticks
    });
    std::fs::write(
        attest
            .path()
            .join(format!("twofold-{}-s{start_ticks}.json", map.pid())),
        serde_json::to_vec(&att).unwrap(),
    )
    .unwrap();
    let env = [
        ("TWOFOLD_GPU_FIXTURE", fx.as_path()),
        ("TWOFOLD_ATTEST_DIR", attest.path()),
    ];
    let r: Value = serde_json::from_slice(&scan(&file, &[map.pid()], &env, true)).unwrap();
    let f = file_of(&r, &file);
    let rep = &f["representations"];
    assert_eq!(rep["device"], 1.0);
    assert_eq!(
        rep["suspected_device"], 0.0,
        "its memory is the proven copy"
    );
    assert!(
        (rep["proven"].as_f64().unwrap() - 2.0).abs() < 0.01,
        "{rep}"
    );
    let text = String::from_utf8(scan(&file, &[map.pid()], &env, false)).unwrap();
    assert!(text.contains("+ device 1.00"), "{text}");
    assert!(text.contains("proven device copy: pid"), "{text}");
    // The loader is gone: its attestation proves nothing any more.
    drop(map);
    let r: Value = serde_json::from_slice(&scan(&file, &[], &env, true)).unwrap();
    let gone = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == file.to_str().unwrap());
    assert!(gone.is_none_or(|f| f["device_copies"] == json!([])), "{r}");
}

#[test]
fn serve_exports_device_memory_and_suspected_device_copies() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let map = start("map", &file, &[]);
    let fx = fixture(dir.path(), false, &[(map.pid(), size + 3 * MIB)]);
    let port = free_port();
    let glob = dir.path().join("*.safetensors");
    let mut child = Command::new(exe())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--interval", "1s", "--model-glob", glob.to_str().unwrap()])
        .env("TWOFOLD_GPU_FIXTURE", &fx)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let id = file_id(&file);
    let want = format!("twofold_file_device_copy_suspected_bytes{{file_id=\"{id}\"}}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut body = String::new();
    while std::time::Instant::now() < until {
        if let Some(b) = metrics_text(port) {
            body = b;
            let ready = body
                .lines()
                .any(|l| l.starts_with(&want) && !l.ends_with(" 0"));
            if ready {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = |prefix: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(line("twofold_gpus_known "), 1.0);
    assert_eq!(
        line("twofold_gpu_process_memory_bytes{gpu=\"0\",workload=\"twofold\"}"),
        (size + 3 * MIB) as f64
    );
    assert_eq!(line(&want), size as f64, "{body}");
    assert!(body.contains("type=\"discrete\""), "{body}");
    assert!(!body.contains("pid=\""), "pids only with --per-pid");
    if have("promtool") {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .output_with_stdin(body.as_bytes());
        assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
        p.stdout.clear();
    } else {
        println!("SKIPPED: promtool is not installed (scripts/test.sh installs it as root)");
    }
}

trait OutputWithStdin {
    fn output_with_stdin(&mut self, input: &[u8]) -> std::process::Output;
}

impl OutputWithStdin for Command {
    fn output_with_stdin(&mut self, input: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut c = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        c.wait_with_output().unwrap()
    }
}
