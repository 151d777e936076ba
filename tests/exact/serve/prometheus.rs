//! The Prometheus side of `twofold serve`: promtool and the official Python client over
//! the exposition, a real Prometheus scraping an exporter (every dashboard panel's query
//! must answer), a fleet of two agents remote-writing to one Prometheus, the dashboards'
//! lint and promtool over the rules.

use super::*;

/// `promtool check metrics` over `body`: (exit 0, the problems it printed).
pub(super) fn promtool_lint(body: &str) -> (bool, Vec<String>) {
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
pub(super) fn check_openmetrics_with_promtool(body: &str) {
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
pub(super) fn check_openmetrics_with_python(body: &str) {
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
pub(super) fn panel_exprs() -> Vec<(String, String, String)> {
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
pub(super) fn prometheus(dir: &Path, args: &[String], env: &[(&str, &str)]) -> (Proc, u16) {
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
