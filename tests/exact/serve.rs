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

mod names;
mod web;

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
        if let Ok((200, body)) = get(port, "/metrics", None) {
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

    // Both formats through promtool, and OpenMetrics through two OpenMetrics parsers.
    let (status, text) = get(port, "/metrics", Some("text/plain; version=0.0.4")).unwrap();
    assert_eq!(status, 200);
    assert!(!text.contains("# EOF"));
    if require(have("promtool"), "promtool") {
        let (ok, problems) = promtool_lint(&text);
        assert!(ok && problems.is_empty(), "0.0.4: {problems:?}\n{text}");
        check_openmetrics_with_promtool(&body);
    }
    check_openmetrics_with_python(&body);
    assert_eq!(get(port, "/healthz", None).unwrap().0, 200);
    assert_eq!(get(port, "/nothing", None).unwrap().0, 404);
}

/// `promtool check metrics` over `body`: (exit 0, the problems it printed).
fn promtool_lint(body: &str) -> (bool, Vec<String>) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    let problems = [out.stdout, out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    (out.status.success(), problems)
}

/// The OpenMetrics body through promtool:
/// - `check metrics` lints it, but with the 0.0.4 parser (promtool 2.42 has no other for
///   it): there a counter's `# TYPE` names its `_total` sample, while OpenMetrics names the
///   family without `_total` (`# TYPE twofold_collect_errors counter` over
///   `twofold_collect_errors_total 0`). promtool then sees each `_total` sample as a family
///   of its own, untyped and without HELP. Exactly those lines, one per counter, and
///   nothing else, may be reported.
/// - `tsdb create-blocks-from openmetrics` reads it with Prometheus' OpenMetrics parser
///   (which demands `# EOF`); backfilling needs timestamps, so each sample line gets one.
///   Every sample must become a series.
fn check_openmetrics_with_promtool(body: &str) {
    let limitation: std::collections::BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .map(|n| format!("{n}_total no help text"))
        .collect();
    assert!(!limitation.is_empty(), "the body has counters");
    let (_, problems) = promtool_lint(body);
    let problems: std::collections::BTreeSet<String> = problems.into_iter().collect();
    assert_eq!(
        problems, limitation,
        "promtool check metrics (OpenMetrics)\n{body}"
    );
    // docs/serve.md lists these lines: every one promtool printed is there.
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/serve.md"))
        .unwrap();
    let block = docs
        .split("```text\n")
        .find(|b| b.contains("no help text"))
        .and_then(|b| b.split("```").next())
        .unwrap();
    for p in &problems {
        assert!(
            block.lines().any(|l| l == p),
            "docs/serve.md does not list '{p}'"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stamped: String = body
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} {now}\n")
            }
        })
        .collect();
    let input = dir.path().join("om.txt");
    std::fs::write(&input, stamped).unwrap();
    let out = crate::common::run_ok(
        Command::new("promtool")
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&input)
            .arg(dir.path().join("blocks")),
    );
    let out = String::from_utf8_lossy(&out);
    // BLOCK ULID  MIN TIME  MAX TIME  DURATION  NUM SAMPLES  NUM CHUNKS  NUM SERIES  SIZE
    let series: usize = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(6)?.parse::<usize>().ok())
        .sum();
    let samples = body.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(series, samples, "promtool backfill:\n{out}");
}

/// The OpenMetrics body through the official Python client's OpenMetrics parser (strict
/// about counters' `_total`, clashing names and `# EOF`): every sample it reads has the
/// value our exposition shows for it.
fn check_openmetrics_with_python(body: &str) {
    let script = "import sys, json\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as p\n\
        out = [[s.name, s.labels, s.value] for f in p(sys.stdin.read()) for s in f.samples]\n\
        print(json.dumps(out))\n";
    let have_parser = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !require(
        have_parser,
        "python3 prometheus_client (pip install prometheus-client)",
    ) {
        return;
    }
    let mut p = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the body: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, std::collections::BTreeMap<String, String>, f64)> =
        serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        samples.len(),
        body.lines().filter(|l| !l.starts_with('#')).count()
    );
    for (name, labels, v) in samples {
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // Relative 1e-12: serde_json's float parsing is not always the nearest double.
        let ours = value(body, &name, &labels).unwrap_or(f64::NAN);
        assert!(
            (ours - v).abs() <= v.abs() * 1e-12,
            "{name} {labels:?}: ours {ours}, the parser's {v}"
        );
    }
}

/// Every panel query of the committed dashboards, with the variables expanded.
fn panel_exprs() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for path in dashboards() {
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                let expanded = expr
                    .replace("$node", ".*")
                    .replace("$file", ".*")
                    .replace("$__rate_interval", "1m");
                out.push((
                    d["uid"].as_str().unwrap().to_string(),
                    p["title"].as_str().unwrap().to_string(),
                    expanded,
                ));
            }
        }
        // Query variables: `label_values(EXPR, LABEL)` has values when
        // `count by (LABEL) (EXPR)` has a result.
        for v in d["templating"]["list"].as_array().unwrap() {
            let Some(def) = v["definition"].as_str() else {
                continue;
            };
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap();
            let (expr, label) = inner.rsplit_once(',').unwrap();
            out.push((
                d["uid"].as_str().unwrap().to_string(),
                format!("variable {}", v["name"].as_str().unwrap()),
                format!(
                    "count by ({}) ({})",
                    label.trim(),
                    expr.replace("$node", ".*")
                ),
            ));
        }
    }
    out
}

/// Panels that answer only under a condition the test cannot create without privileges
/// it should not need: a cgroup with a memory limit.
const CONDITIONAL: &[(&str, &str)] = &[(
    "twofold_cgroup_memory_limit_bytes",
    "a cgroup with a memory limit (memory.max) holding a reader",
)];

fn dashboards() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
    v.sort();
    v
}

fn query(port: u16, expr: &str) -> Option<serde_json::Value> {
    let mut enc = String::new();
    for b in expr.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    let (status, body) = get(port, &format!("/api/v1/query?query={enc}"), None).ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(v["data"]["result"].clone())
}

/// A Prometheus on a free loopback port with its data under `dir`, ready to answer.
fn prometheus(dir: &Path, args: &[String], env: &[(&str, &str)]) -> (Proc, u16) {
    let port = free_port();
    let mut cmd = Command::new("prometheus");
    cmd.args(args)
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let proc = Proc(cmd.spawn().unwrap());
    let until = Instant::now() + Duration::from_secs(60);
    while !matches!(get(port, "/-/ready", None), Ok((200, _))) {
        assert!(
            Instant::now() < until,
            "prometheus {args:?} never became ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (proc, port)
}

#[test]
fn prometheus_scrapes_it_and_every_panel_answers() {
    let _group = crate::common::group(module_path!());
    if !require(
        crate::common::is_root(),
        "root (to prove another process's copy)",
    ) || !require(have("prometheus"), "prometheus")
    {
        return;
    }
    let _live = live();
    let s = scene();
    let port = free_port();
    let _serve = serve(port, &["--model-glob", &glob_of(&s)]);
    poll_metrics(port, 180, copies_of(&s.id));

    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: twofold\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n        labels:\n          node: test-node\n"
        ),
    )
    .unwrap();
    let (_prom, prom_port) = prometheus(
        tmp.path(),
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", tmp.path().join("data").display()),
        ],
        &[],
    );
    let until = Instant::now() + Duration::from_secs(60);
    let nonempty =
        |e: &str| query(prom_port, e).is_some_and(|r| r.as_array().is_some_and(|a| !a.is_empty()));
    let ready = format!(
        "up{{job=\"twofold\"}} == 1 and on () twofold_file_copies{{file_id=\"{}\"}} == 2",
        s.id
    );
    while !nonempty(&ready) {
        assert!(
            Instant::now() < until,
            "prometheus never saw the exporter's series"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Rates need two samples in their window: poll each query until it answers.
    let exprs = panel_exprs();
    let until = Instant::now() + Duration::from_secs(30);
    let mut missing: Vec<&(String, String, String)> = Vec::new();
    let mut skipped = Vec::new();
    for e in &exprs {
        if let Some((_, why)) = CONDITIONAL.iter().find(|(m, _)| e.2.contains(m)) {
            skipped.push(format!("{} / {}: needs {why}", e.0, e.1));
            continue;
        }
        while !nonempty(&e.2) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(250));
        }
        if !nonempty(&e.2) {
            missing.push(e);
        }
    }
    eprintln!(
        "{} panel queries answered; conditional ones: {skipped:?}",
        exprs.len() - skipped.len()
    );
    assert!(missing.is_empty(), "panels without a result: {missing:#?}");
}

/// The committed agent config with only the scrape target's and the receiver's ports
/// changed (each must appear exactly once, so a drift of the committed file fails here).
fn agent_config(exporter: u16, receiver: u16) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus-agent.yml"),
    )
    .unwrap();
    let mut out = text;
    for (from, to) in [
        ("127.0.0.1:9464", format!("127.0.0.1:{exporter}")),
        (
            "http://prometheus.monitoring.svc:9090/api/v1/write",
            format!("http://127.0.0.1:{receiver}/api/v1/write"),
        ),
    ] {
        assert_eq!(
            out.matches(from).count(),
            1,
            "deploy/prometheus-agent.yml: {from}"
        );
        out = out.replace(from, &to);
    }
    assert!(
        out.contains("node: ${NODE_NAME}"),
        "the agent labels its node"
    );
    out
}

/// Fleet on loopback: two exporters ("nodes"), each scraped by a Prometheus agent running
/// the committed `deploy/prometheus-agent.yml` with its own `NODE_NAME`, both
/// remote-writing to one Prometheus. Every fleet-overview panel answers there for each
/// node, and the copy count arrives intact through the whole path.
#[test]
fn fleet_of_two_agents_remote_writing_to_one_prometheus() {
    let _group = crate::common::group(module_path!());
    if !require(
        crate::common::is_root(),
        "root (to prove another process's copy)",
    ) || !require(have("prometheus"), "prometheus")
    {
        return;
    }
    let _live = live();
    let s = scene();
    let tmp = tempfile::tempdir().unwrap();
    let (_central, central) = prometheus(
        tmp.path(),
        &[
            "--web.enable-remote-write-receiver".to_string(),
            format!("--config.file={}", {
                let c = tmp.path().join("central.yml");
                std::fs::write(&c, "global:\n  evaluation_interval: 1s\n").unwrap();
                c.display().to_string()
            }),
            format!(
                "--storage.tsdb.path={}",
                tmp.path().join("central").display()
            ),
        ],
        &[],
    );
    let nodes = ["node-a", "node-b"];
    let mut keep = Vec::new();
    for node in nodes {
        let port = free_port();
        keep.push(serve(port, &["--model-glob", &glob_of(&s)]));
        poll_metrics(port, 180, copies_of(&s.id));
        let config = tmp.path().join(format!("{node}.yml"));
        std::fs::write(&config, agent_config(port, central)).unwrap();
        let (agent, _) = prometheus(
            tmp.path(),
            &[
                "--enable-feature=agent,expand-external-labels".to_string(),
                format!("--config.file={}", config.display()),
                format!(
                    "--storage.agent.path={}",
                    tmp.path().join(format!("{node}-wal")).display()
                ),
            ],
            &[("NODE_NAME", node)],
        );
        keep.push(agent);
    }
    let answers = |e: &str| -> Vec<serde_json::Value> {
        query(central, e)
            .and_then(|r| r.as_array().cloned())
            .unwrap_or_default()
    };
    // The committed agent scrapes every 15 s: wait for two samples of each node (rates).
    let until = Instant::now() + Duration::from_secs(120);
    let copies = format!("twofold_file_copies{{file_id=\"{}\"}}", s.id);
    loop {
        let got = answers(&format!("count_over_time({copies}[5m]) >= 2"));
        let mut seen: Vec<&str> = got
            .iter()
            .filter_map(|r| r["metric"]["node"].as_str())
            .collect();
        seen.sort();
        if seen == nodes {
            break;
        }
        assert!(
            Instant::now() < until,
            "the central Prometheus never had two samples of each node: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The count crossed exporter → agent → remote write intact, for each node.
    for r in answers(&copies) {
        assert_eq!(r["value"][1], "2", "{r}");
        assert_eq!(r["metric"]["job"], "twofold", "{r}");
    }
    // Every panel of every dashboard (and every query variable) answers for each node
    // on its own, but those that need a condition this test does not create.
    let fleet: Vec<_> = panel_exprs()
        .into_iter()
        .filter(|e| !CONDITIONAL.iter().any(|(m, _)| e.2.contains(m)))
        .collect();
    assert!(
        fleet.iter().filter(|e| e.0 == "twofold-fleet").count() >= 5,
        "fleet panels: {fleet:?}"
    );
    let mut missing = Vec::new();
    for node in nodes {
        for (uid, title, expr) in &fleet {
            let title = format!("{uid} / {title}");
            let e = expr.replace("node=~\".*\"", &format!("node=~\"{node}\""));
            if !title.ends_with("variable node") {
                assert_ne!(&e, expr, "{title}: no node filter");
            }
            if answers(&e).is_empty() {
                missing.push(format!("{node} / {title}: {e}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fleet panels without a result: {missing:#?}"
    );
    let by_node = answers("sum by (node) (twofold_file_excess_bytes)");
    assert_eq!(by_node.len(), 2, "{by_node:?}");
    eprintln!("fleet: {} panels answered for {nodes:?}", fleet.len());
}

#[test]
fn dashboards_pass_the_lint() {
    let _group = crate::common::group(module_path!());
    let mut uids = std::collections::BTreeSet::new();
    let files = dashboards();
    assert_eq!(files.len(), 3, "fleet, node and file dashboards");
    for path in files {
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = path.display().to_string();
        assert!(
            uids.insert(d["uid"].as_str().unwrap().to_string()),
            "{name}: duplicate uid"
        );
        let vars = d["templating"]["list"].as_array().unwrap();
        let var = |n: &str| vars.iter().find(|v| v["name"] == n);
        assert_eq!(var("datasource").unwrap()["type"], "datasource", "{name}");
        assert_eq!(var("datasource").unwrap()["query"], "prometheus", "{name}");
        assert!(var("node").is_some(), "{name}: $node");
        // Every `$var` (or `${var}`) a query or a variable uses is defined here (Grafana's
        // own `$__…` variables aside): an undefined one matches nothing.
        let mut exprs: Vec<String> = vars
            .iter()
            .filter_map(|v| v["definition"].as_str().map(str::to_string))
            .collect();
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                exprs.push(t["expr"].as_str().unwrap().to_string());
            }
        }
        for e in &exprs {
            for used in variables_used(e) {
                assert!(
                    var(&used).is_some(),
                    "{name}: ${used} is used in {e} but not defined in templating"
                );
            }
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"]["uid"], "${datasource}",
                "{name}: variable {}",
                v["name"]
            );
        }
        let mut panel_ids = std::collections::BTreeSet::new();
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            assert!(
                panel_ids.insert(p["id"].as_u64().unwrap()),
                "{name}/{title}: duplicate id"
            );
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}/{title}");
            let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("");
            assert!(!unit.is_empty(), "{name}/{title}: no unit");
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}/{title}");
                let expr = t["expr"].as_str().unwrap();
                assert!(
                    expr.contains("node=~\"$node\""),
                    "{name}/{title}: not filtered by $node"
                );
                for f in ["rate(", "increase(", "irate("] {
                    for (i, _) in expr.match_indices(f) {
                        let rest = &expr[i..];
                        let window = rest.split('[').nth(1).and_then(|w| w.split(']').next());
                        assert_eq!(
                            window,
                            Some("$__rate_interval"),
                            "{name}/{title}: {f} without $__rate_interval"
                        );
                    }
                }
                if d["uid"] == "twofold-file" {
                    assert!(
                        expr.contains("file_id=~\"$file\""),
                        "{name}/{title}: not by $file"
                    );
                }
            }
        }
    }
}

/// The dashboard variables an expression uses (`$name`, `${name}`), Grafana's built-in
/// `$__…` ones left out.
fn variables_used(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in expr.match_indices('$') {
        let rest = expr[i + 1..].trim_start_matches('{');
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !name.starts_with("__") {
            out.push(name);
        }
    }
    out
}

#[test]
fn promtool_tests_the_rules() {
    let _group = crate::common::group(module_path!());
    if !require(have("promtool"), "promtool") {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    for args in [
        &["check", "rules", "rules.yml"][..],
        &["test", "rules", "rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn rss_bytes(pid: u32) -> u64 {
    crate::common::status_bytes(pid as i32, "VmRSS")
}

/// `tests/helpers/churn.c`, built into `dir`: forks RATE processes a second, each living
/// 20 ms, for SECONDS seconds, and prints how many it forked.
fn churner(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/churn.c");
    let bin = dir.join("churn");
    crate::common::run_ok(Command::new("cc").arg("-O2").arg("-o").arg(&bin).arg(src));
    bin
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

/// 50 scrapers for 30 s while processes come and go at 500/s: every response 200,
/// complete, well formed and still true to the scene (the mapped file's page cache and the
/// copy reader's private memory, each the file's size), no panic, the exporter's RSS
/// reported and bounded, and collections keep their 1 s cadence (gaps between the
/// `twofold_collect_last_success_timestamp_seconds` the scrapers saw). `--no-prove`: the
/// proof's cost depends on what else the host runs (it reads other processes' memory), the
/// cadence is about the collector not waiting on the HTTP side.
#[test]
fn fifty_concurrent_scrapers_while_processes_churn() {
    let _group = crate::common::group(module_path!());
    if !require(have("cc"), "cc (to build the churn helper)") {
        return;
    }
    let _live = live();
    let s = scene();
    let tmp = tempfile::tempdir().unwrap();
    let churn_bin = churner(tmp.path());
    let port = free_port();
    let log = tmp.path().join("stderr");
    let mut serve = Proc(
        Command::new(exe())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--interval",
                "1s",
                "--no-prove",
                "--model-glob",
                &glob_of(&s),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    let size = (16 * MIB) as f64;
    let tol = crate::common::tolerance(16 * MIB) as f64;
    let id = s.id.as_str();
    let true_to_the_scene = move |b: &str| {
        let held = |kind| {
            value(
                b,
                "twofold_file_held_bytes",
                &[("file_id", id), ("kind", kind)],
            )
        };
        held("page_cache").is_some_and(|v| (v - size).abs() <= tol)
            && held("private_copy_suspected").is_some_and(|v| v >= size - tol)
    };
    poll_metrics(port, 60, true_to_the_scene);
    let pid = serve.0.id();
    let secs = 30u64;
    let rate = 500u64;
    let churn = Proc(
        Command::new(&churn_bin)
            .args([rate.to_string(), secs.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(secs);
    type Run = (u64, Vec<String>, Vec<f64>, Vec<(f64, f64)>);
    let results: Vec<Run> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..50)
            .map(|_| {
                sc.spawn(move || {
                    let (mut ok, mut bad, mut lat, mut stamps) = (0u64, vec![], vec![], vec![]);
                    while Instant::now() < until {
                        let t0 = Instant::now();
                        match get(port, "/metrics", None) {
                            Ok((200, body)) if well_formed(&body) && true_to_the_scene(&body) => {
                                ok += 1;
                                let at = value(
                                    &body,
                                    "twofold_collect_last_success_timestamp_seconds",
                                    &[],
                                );
                                let took =
                                    value(&body, "twofold_collect_last_duration_seconds", &[]);
                                stamps.extend(at.zip(took));
                            }
                            Ok((code, body)) => bad.push(format!("{code}: {body}")),
                            Err(e) => bad.push(e.to_string()),
                        }
                        lat.push(t0.elapsed().as_secs_f64());
                    }
                    (ok, bad, lat, stamps)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let forked: u64 = {
        let mut c = churn;
        let mut out = String::new();
        c.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(c.0.wait().unwrap().success());
        out.trim().parse().unwrap()
    };
    let ok: u64 = results.iter().map(|r| r.0).sum();
    let bad: Vec<&String> = results.iter().flat_map(|r| &r.1).collect();
    let mut lat: Vec<f64> = results.iter().flat_map(|r| r.2.iter().copied()).collect();
    lat.sort_by(f64::total_cmp);
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize] * 1e3;
    let mut stamps: Vec<(f64, f64)> = results.iter().flat_map(|r| r.3.iter().copied()).collect();
    stamps.sort_by(|a, b| a.0.total_cmp(&b.0));
    stamps.dedup_by(|a, b| a.0 == b.0);
    let mut gaps: Vec<f64> = stamps.windows(2).map(|w| w[1].0 - w[0].0).collect();
    gaps.sort_by(f64::total_cmp);
    let longest = stamps.iter().map(|s| s.1).fold(0.0, f64::max);
    let rss = rss_bytes(pid);
    let alive = serve.0.try_wait().unwrap().is_none();
    let stderr = std::fs::read_to_string(&log).unwrap();
    eprintln!(
        "50 scrapers, {secs} s, {forked} processes forked ({:.0}/s): {ok} complete responses, {} failed; latency p50 {:.2} ms, p99 {:.2} ms; {} collections (longest {longest:.2} s), gaps median {:.2} s, max {:.2} s; exporter RSS {:.1} MiB",
        forked as f64 / secs as f64,
        bad.len(),
        pct(0.5),
        pct(0.99),
        stamps.len(),
        gaps.get(gaps.len() / 2).copied().unwrap_or(f64::NAN),
        gaps.last().copied().unwrap_or(f64::NAN),
        rss as f64 / MIB as f64
    );
    assert!(
        bad.is_empty(),
        "failed responses: {:?}",
        &bad[..bad.len().min(3)]
    );
    assert!(ok >= 50);
    assert!(alive, "the exporter died: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if forked < rate * secs * 9 / 10 {
        // Not silent: the assertions held, but at a lower churn than asked.
        println!(
            "SKIPPED: 500 processes/s (the churn helper reached {:.0}/s on this loaded host; the other checks held at that rate)",
            forked as f64 / secs as f64
        );
    }
    assert!(rss < 200 * MIB, "exporter RSS {rss} bytes");
    // Cadence: the collector never waits on the HTTP side. Each collection starts at the
    // later of its slot (1 s after the previous start) and the end of the previous one, so
    // a gap between two start timestamps is at most max(1 s, the previous collection's
    // duration), plus encoding and wake-up (0.5 s on this shared machine). A collection's
    // own duration is the host's load, not the scrapes'; it is reported above.
    assert!(
        stamps.len() >= 5,
        "{} collections in {secs} s",
        stamps.len()
    );
    let late: Vec<(f64, f64)> = stamps
        .windows(2)
        .map(|w| (w[1].0 - w[0].0, w[0].1.max(1.0) + 0.5))
        .filter(|(gap, allowed)| gap > allowed)
        .collect();
    assert!(
        late.len() * 10 <= stamps.len(),
        "collections started late (gap, allowed): {late:?}"
    );
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
    // Every volume mount is read-only.
    let mounts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim().starts_with("mountPath:"))
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
    let cpu = value(&body, "process_cpu_seconds_total", &[]).unwrap();
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
    let (code, b) = get(port, "/metrics", None).unwrap();
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
