//! One inode under three names (the real path, a symlink to it, a hard link), opened by
//! processes that come and go, scraped by a real Prometheus that also evaluates the rules:
//! the exporter keeps one `path` per `file_id` (the others in `twofold_file_alias_info`),
//! and every dashboard expression and rule answers without an error or a duplicate series.

use super::*;

/// `GET` of a Prometheus API path: the JSON, which must say `"status": "success"`.
fn api(port: u16, path_and_query: &str) -> serde_json::Value {
    let (code, body) = get(port, path_and_query, None).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{path_and_query}: {code} {e}: {body}"));
    assert_eq!(v["status"], "success", "{path_and_query}: {body}");
    v
}

fn enc(expr: &str) -> String {
    let mut out = String::new();
    for b in expr.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The label sets of a result, each once: a duplicate fails.
fn assert_unique(what: &str, result: &serde_json::Value) {
    let mut seen = std::collections::BTreeSet::new();
    for r in result.as_array().unwrap() {
        let labels = r["metric"].to_string();
        assert!(
            seen.insert(labels.clone()),
            "{what}: duplicate series {labels}"
        );
    }
}

/// The alert and recording rules' expressions of `dashboards/rules.yml`.
fn rule_exprs() -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/rules.yml"))
            .unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.trim().strip_prefix("expr:") else {
            continue;
        };
        if rest.trim() == "|" {
            let mut e = String::new();
            while let Some(n) = lines.peek() {
                if n.trim().is_empty() || !n.starts_with("          ") {
                    break;
                }
                e.push_str(n.trim());
                e.push(' ');
                lines.next();
            }
            out.push(e.trim().to_string());
        } else {
            out.push(rest.trim().to_string());
        }
    }
    out
}

#[test]
fn one_inode_under_three_names_has_one_path_and_every_join_answers() {
    let _group = crate::common::group(super::GROUP);
    if !require(have("prometheus"), "prometheus") {
        return;
    }
    let _live = live();
    let dir = tempfile::tempdir().unwrap();
    let real = model_file(dir.path(), "real.safetensors", 4 * MIB);
    let hard = dir.path().join("hard.safetensors");
    std::fs::hard_link(&real, &hard).unwrap();
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let id = file_id(&real);
    // The first reader (the lowest pid) opens it by the hard link: the report names the
    // file by it until that reader exits.
    let by_hard = reader("map", Some(&hard), &[]);
    let by_link = reader("map", Some(&link), &[]);
    let by_real = reader("map", Some(&real), &[]);

    let port = free_port();
    let _serve = serve(port, &["--no-prove"]);
    let ours = |b: &str| value(b, "twofold_file_info", &[("file_id", id.as_str())]).is_some();
    let body = poll_metrics(port, 60, ours);
    let info: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("twofold_file_info{") && l.contains(&format!("\"{id}\"")))
        .collect();
    assert_eq!(info.len(), 1, "{info:?}");

    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("prometheus.yml");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/rules.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: twofold\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n        labels:\n          node: test-node\n",
            rules.display()
        ),
    )
    .unwrap();
    let (_prom, prom) = prometheus(
        tmp.path(),
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", tmp.path().join("data").display()),
        ],
        &[],
    );
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let seen = |e: &str| {
        api(prom, &format!("/api/v1/query?query={}", enc(e)))["data"]["result"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    };
    let until = Instant::now() + Duration::from_secs(60);
    while !seen(&format!("twofold_file_info{{file_id=\"{id}\"}}")) {
        assert!(Instant::now() < until, "prometheus never scraped the file");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(3));
    // The hard link's reader exits; another opens it by the real path, then the symlink's
    // exits: three sets of names within a few scrapes.
    drop(by_hard);
    std::thread::sleep(Duration::from_secs(4));
    let again = reader("map", Some(&real), &[]);
    drop(by_link);
    std::thread::sleep(Duration::from_secs(4));

    // One path for the file over the whole test.
    let paths = api(
        prom,
        &format!(
            "/api/v1/query?query={}",
            enc(&format!(
                "count by (path) (last_over_time(twofold_file_info{{file_id=\"{id}\"}}[10m]))"
            ))
        ),
    );
    let paths = paths["data"]["result"].as_array().unwrap().clone();
    assert_eq!(
        paths.len(),
        1,
        "one path for {id} over the test: {paths:#?}"
    );

    // Every dashboard expression and every rule, now and over the test's window.
    let now = started + 60;
    let mut exprs: Vec<(String, String)> = panel_exprs()
        .into_iter()
        .map(|(uid, title, e)| (format!("{uid} / {title}"), e))
        .collect();
    exprs.extend(rule_exprs().into_iter().map(|e| ("rule".to_string(), e)));
    assert!(
        exprs.iter().filter(|e| e.0 == "rule").count() >= 6,
        "{exprs:?}"
    );
    for (what, e) in &exprs {
        let instant = api(prom, &format!("/api/v1/query?query={}", enc(e)));
        assert_unique(what, &instant["data"]["result"]);
        let range = api(
            prom,
            &format!(
                "/api/v1/query_range?query={}&start={started}&end={now}&step=1",
                enc(e)
            ),
        );
        assert_unique(what, &range["data"]["result"]);
    }
    // The rules as Prometheus evaluated them all along: healthy.
    let rules = api(prom, "/api/v1/rules");
    let mut n = 0;
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            n += 1;
            assert_eq!(r["health"], "ok", "{r}");
        }
    }
    assert!(n >= 6, "{rules}");
    // The other names are aliases: the real path (the readers' maps name it), beside
    // the hard link's, whichever is the path.
    let body = get(port, "/metrics", Some(OPENMETRICS)).unwrap().1;
    let aliases: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("twofold_file_alias_info{") && l.contains(&format!("\"{id}\"")))
        .collect();
    assert!(!aliases.is_empty(), "the other name is an alias: {body}");
    drop((by_real, again));
    eprintln!(
        "{} expressions answered without an error or a duplicate; one path: {paths:?}",
        exprs.len()
    );
}
