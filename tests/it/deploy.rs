//! The Kubernetes manifests, offline: every file of `deploy/k8s` and the kustomize base
//! and overlay as `kubectl kustomize` renders them pass `kubernetes-validate --strict`
//! (the Kubernetes OpenAPI schemas, unknown fields refused), and the rendered DaemonSet
//! has the security settings the docs promise.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{have, require};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn validator() -> bool {
    require(
        have("kubernetes-validate"),
        "kubernetes-validate (pip install kubernetes-validate)",
    )
}

/// `kubernetes-validate --strict` over `files`: (exit 0, what it printed).
fn validate(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .args(files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Only the Prometheus Operator's CRD has no schema in the validator: nothing else may
/// be left unchecked.
fn assert_checked(text: &str) {
    for l in text.lines().filter(|l| l.contains("Couldn't find schema")) {
        assert!(l.contains("kind ServiceMonitor"), "not validated: {l}");
    }
    assert!(!text.contains("ERROR"), "{text}");
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml")
            && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        {
            out.push(p);
        }
    }
}

fn kustomize(dir: &str, into: &Path) -> PathBuf {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(root().join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = into.join(format!("{}.yaml", dir.replace('/', "_")));
    std::fs::write(&p, out.stdout).unwrap();
    p
}

/// The documents of a YAML file as JSON (PyYAML, which kubernetes-validate brings).
fn documents(p: &Path) -> Vec<serde_json::Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_manifest_passes_the_kubernetes_schemas() {
    if !validator() {
        return;
    }
    let mut files = Vec::new();
    yaml_files(&root().join("deploy/k8s"), &mut files);
    assert!(files.len() >= 3, "{files:?}");
    let (ok, text) = validate(&files);
    assert!(ok, "{text}");
    assert_checked(&text);

    // The validator refuses what it should: a field the schema does not have.
    let tmp = tempfile::tempdir().unwrap();
    let ds = std::fs::read_to_string(root().join("deploy/k8s/base/daemonset.yaml")).unwrap();
    let broken = tmp.path().join("broken.yaml");
    std::fs::write(&broken, ds.replace("hostPID: true", "hostPid: true")).unwrap();
    let (ok, text) = validate(&[broken]);
    assert!(!ok, "a misspelt field passed: {text}");
}

#[test]
fn the_kustomize_base_and_overlay_render_valid_manifests() {
    if !validator() || !require(have("kubectl"), "kubectl (kubectl kustomize)") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = kustomize("deploy/k8s/base", tmp.path());
    let operator = kustomize("deploy/k8s/prometheus-operator", tmp.path());
    let (ok, text) = validate(&[base.clone(), operator.clone()]);
    assert!(ok, "{text}");
    assert_checked(&text);

    let kinds = |p: &Path| -> Vec<String> {
        documents(p)
            .iter()
            .map(|d| d["kind"].as_str().unwrap().to_string())
            .collect()
    };
    let mut k = kinds(&base);
    k.sort();
    assert_eq!(k, ["DaemonSet", "PriorityClass"]);
    let mut k = kinds(&operator);
    k.sort();
    assert_eq!(
        k,
        ["DaemonSet", "PriorityClass", "Service", "ServiceMonitor"]
    );

    let docs = documents(&base);
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pc = docs.iter().find(|d| d["kind"] == "PriorityClass").unwrap();
    assert_eq!(ds["metadata"]["namespace"], "monitoring");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["priorityClassName"], pc["metadata"]["name"]);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "ghcr.io/twofold/twofold:0.1.0");
    let sc = &c["securityContext"];
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{probe}");
    }
    let env = c["env"].as_array().unwrap();
    let node = env.iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // Read-only, but the upload ledger's directory (#44: one upload tracer per node).
    for m in c["volumeMounts"].as_array().unwrap() {
        if m["mountPath"] == "/run/twofold" {
            continue;
        }
        assert_eq!(m["readOnly"], true, "{m}");
    }
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&"--trace-uploads"), "{args:?}");
    let run = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["hostPath"]["path"] == "/run/twofold")
        .unwrap();
    assert_eq!(run["hostPath"]["type"], "DirectoryOrCreate");
    let sm = documents(&operator)
        .into_iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .unwrap();
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
}
