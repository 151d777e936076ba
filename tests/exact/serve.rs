//! `twofold serve` end to end: a real exporter over real readers, a real Prometheus
//! scraping it (every dashboard panel's query must answer), promtool over the exposition
//! and the rules, 50 concurrent scrapers, and lints of the committed dashboards and
//! manifests.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{exe, free_port, have, model_file, reader, require, MIB};

mod limits;
mod load;
mod names;
mod prometheus;
mod web;

use prometheus::{
    check_openmetrics_with_promtool, check_openmetrics_with_python, panel_exprs, prometheus,
    promtool_lint,
};

/// The group of this file's tests (and of its submodules').
const GROUP: &str = module_path!();

/// A process the test started, killed (by its pid) and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The live tests run one at a time: the load test saturates this machine's cores on
/// purpose, and the others time their exporters' collections.
static LIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn live() -> std::sync::MutexGuard<'static, ()> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tiny HTTP/1.0 GET: (status, body).
/// An Accept header that asks for OpenMetrics (Prometheus's own asks for it first).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0";

fn get(port: u16, path: &str, accept: Option<&str>) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{accept}\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

fn serve(port: u16, extra: &[&str]) -> Proc {
    let child = Command::new(exe())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--interval",
            "1s",
            // The tests are about the export, not about proof speed: a busy host must not
            // leave the copy unproven (a count "at least 1").
            "--prove-budget",
            "30s",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc(child)
}

fn file_id(path: &Path) -> String {
    let m = std::fs::metadata(path).unwrap();
    let dev = m.dev();
    format!("{}:{}:{}", libc::major(dev), libc::minor(dev), m.ino())
}

/// The value of `name{labels…}` in an exposition (labels: every pair must be present).
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        if !labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        {
            return None;
        }
        l.rsplit(' ').next()?.parse().ok()
    })
}

fn sum(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls /metrics until `done` holds (or panics after `secs`).
fn poll_metrics(port: u16, secs: u64, done: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    while Instant::now() < until {
        if let Ok((200, body)) = get(port, "/metrics", Some(OPENMETRICS)) {
            if done(&body) {
                return body;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("the exporter never showed what was expected; last exposition:\n{last}");
}

/// Two readers of a 16 MiB model: one copies it into its heap and closes it, one maps it.
struct Scene {
    _dir: tempfile::TempDir,
    file: PathBuf,
    id: String,
    _readers: Vec<twofold::spawn::Reader>,
}

fn scene() -> Scene {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "model.safetensors", 16 * MIB);
    let readers = vec![
        reader("copy", Some(&file), &["--close"]),
        reader("map", Some(&file), &[]),
    ];
    let id = file_id(&file);
    Scene {
        _dir: dir,
        file,
        id,
        _readers: readers,
    }
}

fn glob_of(s: &Scene) -> String {
    s.file
        .parent()
        .unwrap()
        .join("*.safetensors")
        .display()
        .to_string()
}

/// The count less what processes other than the readers (`twofold __child`) hold: the
/// test binary itself may keep pages of the buffer it wrote the file from (freed heap is
/// not always returned), which the exporter rightly proves and shows under its workload.
fn readers_copies(b: &str, id: &str) -> Option<f64> {
    let c = value(b, "twofold_file_copies", &[("file_id", id)])?;
    let size = value(b, "twofold_file_size_bytes", &[("file_id", id)])?;
    let all = sum(
        b,
        "twofold_workload_file_held_bytes",
        &[("file_id", id), ("kind", "private_copy_proven")],
    );
    let readers = sum(
        b,
        "twofold_workload_file_held_bytes",
        &[
            ("workload", "twofold"),
            ("file_id", id),
            ("kind", "private_copy_proven"),
        ],
    );
    Some(c - (all - readers) / size)
}

fn copies_of(id: &str) -> impl Fn(&str) -> bool + '_ {
    move |b: &str| readers_copies(b, id).is_some_and(|c| (c - 2.0).abs() < 0.01)
}

#[test]
fn exporter_counts_the_two_representations() {
    let _group = crate::common::group(module_path!());
    if !require(
        crate::common::is_root(),
        "root (to prove another process's copy)",
    ) {
        return;
    }
    let _live = live();
    let s = scene();
    let port = free_port();
    let _serve = serve(port, &["--model-glob", &glob_of(&s)]);
    let body = poll_metrics(port, 180, copies_of(&s.id));
    assert!(body.ends_with("# EOF\n"));
    let id = s.id.as_str();
    let size = (16 * MIB) as f64;

    // The same count as `scan --json`.
    // A generous proof budget: the ground truth must not depend on how busy the host is.
    let scan: serde_json::Value = crate::common::twofold_json(&[
        "scan".as_ref(),
        "--json".as_ref(),
        "--prove-budget".as_ref(),
        "60s".as_ref(),
        s.file.as_os_str(),
    ]);
    let file = scan["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == s.file.display().to_string())
        .unwrap();
    let proven = file["representations"]["proven"].as_f64().unwrap();
    let copies = value(&body, "twofold_file_copies", &[("file_id", id)]).unwrap();
    let readers = readers_copies(&body, id).unwrap();
    assert!(
        (readers - 2.0).abs() < 0.01,
        "the readers' copies {readers}"
    );
    assert!(
        (copies - proven).abs() < 0.01,
        "exporter {copies}, scan {proven}"
    );

    // Held bytes by kind add up to the count.
    let held = |kind| {
        value(
            &body,
            "twofold_file_held_bytes",
            &[("file_id", id), ("kind", kind)],
        )
    };
    let page_cache = held("page_cache").unwrap();
    let proven_copy = held("private_copy_proven").unwrap();
    let cow = held("cow").unwrap_or(0.0);
    let tol = crate::common::tolerance(16 * MIB) as f64;
    assert!((page_cache - size).abs() <= tol, "page cache {page_cache}");
    let by_readers = sum(
        &body,
        "twofold_workload_file_held_bytes",
        &[
            ("workload", "twofold"),
            ("file_id", id),
            ("kind", "private_copy_proven"),
        ],
    );
    assert!((by_readers - size).abs() <= tol, "proven copy {by_readers}");
    assert!(((page_cache + proven_copy + cow) / size - copies).abs() < 0.01);
    assert_eq!(
        value(&body, "twofold_file_excess_bytes", &[("file_id", id)]),
        Some(((copies - 1.0) * size).round())
    );
    assert_eq!(
        value(&body, "twofold_file_size_bytes", &[("file_id", id)]),
        Some(size)
    );
    let by_workload = sum(
        &body,
        "twofold_workload_file_held_bytes",
        &[("file_id", id), ("kind", "private_copy_proven")],
    );
    let by_cgroup = sum(
        &body,
        "twofold_cgroup_file_held_bytes",
        &[("file_id", id), ("kind", "private_copy_proven")],
    );
    assert_eq!(by_workload, proven_copy);
    assert_eq!(by_cgroup, proven_copy);
    assert!(
        body.contains(&format!("path=\"{}\"", s.file.display())),
        "the path is in the _info series"
    );
    assert_eq!(
        body.matches(&format!("\"{}\"", s.file.display())).count(),
        1,
        "the path appears only in twofold_file_info"
    );
    assert!(!body.contains("pid=\""), "no pid label without --per-pid");

    // Both formats through promtool, and OpenMetrics through two OpenMetrics parsers. A
    // request without an Accept header (a plain `curl`) gets the 0.0.4 text, as from
    // node_exporter; so does one that refuses OpenMetrics.
    let (status, text) = get(port, "/metrics", Some("text/plain; version=0.0.4")).unwrap();
    assert_eq!(status, 200);
    assert!(!text.contains("# EOF"));
    for accept in [
        None,
        Some("*/*"),
        Some("application/openmetrics-text;q=0, text/plain"),
    ] {
        let (status, plain) = get(port, "/metrics", accept).unwrap();
        assert_eq!(status, 200);
        assert!(!plain.contains("# EOF"), "{accept:?}: {plain}");
    }
    if require(have("promtool"), "promtool") {
        let (plain_status, plain) = get(port, "/metrics", None).unwrap();
        assert_eq!(plain_status, 200);
        let (ok, problems) = promtool_lint(&plain);
        assert!(
            ok && problems.is_empty(),
            "no Accept: {problems:?}\n{plain}"
        );
        let (ok, problems) = promtool_lint(&text);
        assert!(ok && problems.is_empty(), "0.0.4: {problems:?}\n{text}");
        check_openmetrics_with_promtool(&body);
    }
    check_openmetrics_with_python(&body);
    assert_eq!(get(port, "/healthz", None).unwrap().0, 200);
    assert_eq!(get(port, "/nothing", None).unwrap().0, 404);
}

/// A well-formed exposition: every sample line `name[{labels}] value`, a number, `# EOF`
/// last.
fn well_formed(body: &str) -> bool {
    body.ends_with("\n# EOF\n")
        && body.lines().filter(|l| !l.starts_with('#')).all(|l| {
            let (series, v) = l.rsplit_once(' ').unwrap_or(("", ""));
            !series.is_empty() && v.parse::<f64>().is_ok()
        })
}

#[test]
fn daemonset_is_unprivileged_with_host_pids_and_read_only_mounts() {
    let _group = crate::common::group(module_path!());
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s/base/daemonset.yaml"),
    )
    .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim_end())
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let has = |s: &str| lines.iter().any(|l| l.trim() == s);
    assert!(has("hostPID: true"));
    assert!(has("privileged: false"));
    assert!(!has("privileged: true"));
    assert!(has("- operator: Exists"));
    assert!(has("prometheus.io/scrape: \"true\""));
    // Every volume mount is read-only, but the upload ledger's (/run/twofold: the one
    // tracer of the node keeps its ledger there for other twofolds to read).
    let mounts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim().starts_with("mountPath:"))
        .filter(|&i| lines[i].trim() != "mountPath: /run/twofold")
        .collect();
    assert!(!mounts.is_empty());
    for i in &mounts {
        assert!(
            lines[*i - 1..(*i + 2).min(lines.len())]
                .iter()
                .any(|l| l.trim() == "readOnly: true"),
            "{} is not read-only",
            lines[*i].trim()
        );
    }
    // The node's cgroups and sysfs; its processes come with hostPID (no /proc mount:
    // a hostPath /proc would be one more path twofold does not read).
    assert!(has("path: /sys"));
    assert!(!has("path: /proc"));
    // Capabilities: drop ALL, add exactly these.
    let caps = |key: &str| -> Vec<String> {
        let at = lines.iter().position(|l| l.trim() == key).unwrap();
        lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().starts_with("- "))
            .map(|l| l.trim().trim_start_matches("- ").to_string())
            .collect()
    };
    assert_eq!(caps("drop:"), ["ALL"]);
    assert_eq!(
        caps("add:"),
        ["SYS_PTRACE", "DAC_READ_SEARCH", "FOWNER", "BPF", "PERFMON"]
    );
}

#[test]
fn a_bad_listen_address_is_one_line_and_exit_2() {
    let _group = crate::common::group(module_path!());
    // An address another socket holds: the bind fails, the same way.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = taken.local_addr().unwrap().to_string();
    for bad in ["nonsense", "127.0.0.1:99999", in_use.as_str()] {
        let out = Command::new(exe())
            .args(["serve", "--listen", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{bad}: {err}");
        assert!(err.contains(bad), "{err}");
    }
}

/// `/healthz` is 200 while collections succeed, 503 once the last good one is older than 3
/// intervals (a FIFO among the files named makes every collection fail), and 200 again
/// after the next good one; the exposition says the same meanwhile (errors by kind, the
/// last good collection's age), and the process series match the exporter's
/// `/proc/PID/status` and `/proc/PID/stat`.
#[test]
fn healthz_fails_when_the_last_good_collection_is_older_than_3_intervals() {
    let _group = crate::common::group(module_path!());
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    model_file(dir.path(), "model.safetensors", MIB);
    let glob = dir.path().join("*.safetensors").display().to_string();
    let port = free_port();
    let serve = Proc(
        Command::new(exe())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--interval", "1s", "--no-prove", "--model-glob", &glob])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let body = poll_metrics(port, 60, |b| {
        value(b, "twofold_collect_last_success_age_seconds", &[]).is_some()
    });
    assert_eq!(get(port, "/healthz", None).unwrap().0, 200);
    let age = value(&body, "twofold_collect_last_success_age_seconds", &[]).unwrap();
    assert!((0.0..3.0).contains(&age), "age {age}");
    // The process series, against the kernel's.
    let pid = serve.0.id() as i32;
    let rss = value(&body, "process_resident_memory_bytes", &[]).unwrap();
    let status_rss = crate::common::status_bytes(pid, "VmRSS") as f64;
    assert!(
        (rss - status_rss).abs() <= 8.0 * MIB as f64,
        "rss {rss} vs VmRSS {status_rss}"
    );
    // No transparent huge page in its own memory: khugepaged collapsing its heap would
    // move the host counter it reads to know no page moved silently.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("THP_enabled:\t0"), "{status}");
    // Its CPU once it has used a clock tick (a collection of one small file can take less
    // than the 10 ms the kernel counts in).
    let cpu_body = poll_metrics(port, 60, |b| {
        value(b, "process_cpu_seconds_total", &[]).is_some_and(|c| c > 0.0)
    });
    let cpu = value(&cpu_body, "process_cpu_seconds_total", &[]).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0;
    assert!(
        cpu <= ticks + 0.01 && cpu > 0.0,
        "cpu {cpu} vs stat {ticks}"
    );
    let count = |b: &str| value(b, "twofold_collect_duration_seconds_count", &[]).unwrap();
    assert!(count(&body) >= 1.0);

    // Every collection fails from now on: a FIFO is neither a file nor a directory.
    let fifo = dir.path().join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let broke = Instant::now();
    let errors = |b: &str| value(b, "twofold_collect_errors_total", &[("kind", "collection")]);
    let until = Instant::now() + Duration::from_secs(30);
    let mut seen_200_late = None;
    loop {
        let (code, why) = get(port, "/healthz", None).unwrap();
        if code == 503 {
            assert!(why.contains("stale"), "{why}");
            break;
        }
        assert_eq!(code, 200);
        seen_200_late = Some(broke.elapsed());
        assert!(Instant::now() < until, "/healthz never failed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = broke.elapsed();
    // Not before 3 intervals after the last good collection (at most one interval before
    // the FIFO appeared), and soon after.
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(10),
        "503 after {took:?} (last 200 at {seen_200_late:?})"
    );
    let (code, b) = get(port, "/metrics", Some(OPENMETRICS)).unwrap();
    assert_eq!(code, 200, "the last good numbers are still served");
    assert!(errors(&b).unwrap() >= 2.0, "{b}");
    assert!(value(&b, "twofold_collect_last_success_age_seconds", &[]).unwrap() > 3.0);
    assert!(
        count(&b) > count(&body),
        "failed collections are observed too"
    );

    std::fs::remove_file(&fifo).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while get(port, "/healthz", None).unwrap().0 != 200 {
        assert!(Instant::now() < until, "/healthz never recovered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let b = poll_metrics(port, 10, |b| {
        value(b, "twofold_collect_last_success_age_seconds", &[]).is_some_and(|a| a < 3.0)
    });
    assert!(errors(&b).unwrap() >= 2.0);
}

/// With `NODE_NAME` set, every sample carries `node="$NODE_NAME"` (the DaemonSet sets it
/// from `spec.nodeName`), the scrape-time series too; without it, none does.
#[test]
fn node_name_labels_every_series() {
    let _group = crate::common::group(module_path!());
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    model_file(dir.path(), "model.safetensors", MIB);
    let glob = dir.path().join("*.safetensors").display().to_string();
    let port = free_port();
    let _serve = Proc(
        Command::new(exe())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--interval", "1s", "--no-prove", "--model-glob", &glob])
            .env("NODE_NAME", "node-7")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let body = poll_metrics(port, 60, |b| b.contains("twofold_file_info{"));
    let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(samples.len() > 10, "{body}");
    for l in &samples {
        assert!(l.contains("node=\"node-7\""), "no node label: {l}");
    }
    assert!(samples
        .iter()
        .any(|l| l.starts_with("process_resident_memory_bytes{")));
    check_openmetrics_with_python(&body);
    let (_, text) = get(port, "/metrics", Some("text/plain; version=0.0.4")).unwrap();
    if require(have("promtool"), "promtool") {
        let (ok, problems) = promtool_lint(&text);
        assert!(ok && problems.is_empty(), "0.0.4: {problems:?}\n{text}");
    }
}
