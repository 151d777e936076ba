//! The layering of `src/` (ARCHITECTURE.md), checked from the sources so that it cannot
//! rot silently: which layer may import which, no circle between layers or between the
//! files of one layer, and commands that never call commands. A layer is the first
//! component of a path under `src/` (`src/render/dump.rs` is `render`, `src/cli.rs` is
//! `cli`); an import is any `crate::NAME` (or, inside a layer, `super::NAME`) outside a
//! comment. The model crate (`model/`) is kept pure by the compiler: its Cargo.toml has no
//! I/O dependency.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Imports that break the layering: (from layer, to layer, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "render",
        "cli",
        "render takes its own types; cmd maps the cli enums",
    ),
    ("render", "engine", "render works from the report alone"),
    ("render", "cmd", "render is below the commands"),
    ("render", "tui", "render is below the views"),
    (
        "export",
        "cli",
        "the exporter is a pure function of the report",
    ),
    (
        "export",
        "engine",
        "the exporter is a pure function of the report",
    ),
    ("export", "cmd", "the exporter is below the commands"),
    ("export", "tui", "the exporter is below the views"),
    ("collect", "engine", "collect is the bottom layer"),
    ("collect", "render", "collect is the bottom layer"),
    ("collect", "export", "collect is the bottom layer"),
    ("collect", "tui", "collect is the bottom layer"),
    ("collect", "cmd", "collect is the bottom layer"),
    ("collect", "cli", "collect is the bottom layer"),
    (
        "dupes",
        "engine",
        "the engine calls the search, not the reverse",
    ),
    ("dupes", "cmd", "the search is below the commands"),
    ("dupes", "render", "the search returns data"),
    ("tui", "dupes", "the TUI proves through the engine"),
    ("tui", "cmd", "the TUI is below the commands"),
    ("engine", "cmd", "the engine is below the commands"),
    ("engine", "cli", "the engine takes a Request, not arguments"),
    ("engine", "render", "the engine returns data"),
    ("engine", "tui", "the engine is below the views"),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The names following `prefix` (`crate::`, `super::`) in the code of `text`, comments
/// left out.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Per source file: its layer, its module name within the layer and its text.
struct Source {
    layer: String,
    module: String,
    text: String,
}

fn tree() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap();
            let parts: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            let module = match parts.len() {
                1 => "mod".to_string(),
                _ => parts[1].clone(),
            };
            Source {
                layer: parts[0].clone(),
                module,
                text: std::fs::read_to_string(&p).unwrap(),
            }
        })
        .collect()
}

/// Layer → the layers it imports.
fn layer_graph(tree: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let layers: BTreeSet<&str> = tree.iter().map(|s| s.layer.as_str()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in tree {
        let e = g.entry(s.layer.clone()).or_default();
        for n in names_after(&s.text, "crate::") {
            if n != s.layer && layers.contains(n.as_str()) {
                e.insert(n);
            }
        }
    }
    g
}

/// Every circle of `g`, each as the path from its smallest node back to it.
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn reach(
        g: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        out: &mut Vec<Vec<String>>,
    ) {
        for next in g.get(at).into_iter().flatten() {
            if next == start {
                let mut c = path.clone();
                c.push(start.to_string());
                out.push(c);
            } else if next.as_str() > start && !path.contains(next) {
                path.push(next.clone());
                reach(g, start, next, path, out);
                path.pop();
            }
        }
    }
    let mut out = Vec::new();
    for start in g.keys() {
        reach(g, start, start, &mut vec![start.clone()], &mut out);
    }
    out
}

#[test]
fn no_layer_imports_what_it_must_not() {
    let g = layer_graph(&tree());
    let broken: Vec<String> = FORBIDDEN
        .iter()
        .filter(|(from, to, _)| g.get(*from).is_some_and(|t| t.contains(*to)))
        .map(|(from, to, why)| format!("{from} imports {to}: {why}"))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_layers_form_no_circle() {
    let c = circles(&layer_graph(&tree()));
    assert!(
        c.is_empty(),
        "{}",
        c.iter()
            .map(|c| c.join(" -> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Within one layer, the files import each other without a circle.
#[test]
fn the_files_of_a_layer_form_no_circle() {
    let tree = tree();
    let mut found = Vec::new();
    let layers: BTreeSet<&str> = tree.iter().map(|s| s.layer.as_str()).collect();
    for layer in layers {
        let files: Vec<&Source> = tree.iter().filter(|s| s.layer == layer).collect();
        let names: BTreeSet<&str> = files.iter().map(|s| s.module.as_str()).collect();
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in &files {
            if s.module == "mod" {
                continue; // the layer's root declares and re-exports its files
            }
            let e = g.entry(s.module.clone()).or_default();
            let own = format!("{layer}::");
            let mut used = names_after(&s.text, "super::");
            for n in names_after(&s.text, &format!("crate::{own}")) {
                used.insert(n);
            }
            for n in used {
                if n != s.module && n != "mod" && names.contains(n.as_str()) {
                    e.insert(n);
                }
            }
        }
        for c in circles(&g) {
            found.push(format!("{layer}: {}", c.join(" -> ")));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Commands never call commands: what two commands share lives in `cmd/common.rs`, the
/// engine, the store or below.
#[test]
fn commands_never_call_commands() {
    let tree = tree();
    let commands: BTreeSet<&str> = tree
        .iter()
        .filter(|s| s.layer == "cmd" && s.module != "mod" && s.module != "common")
        .map(|s| s.module.as_str())
        .collect();
    let mut found = Vec::new();
    for s in tree
        .iter()
        .filter(|s| s.layer == "cmd" && s.module != "mod")
    {
        let mut used = names_after(&s.text, "super::");
        used.extend(names_after(&s.text, "crate::cmd::"));
        for n in used {
            if n != s.module && commands.contains(n.as_str()) {
                found.push(format!("cmd/{}.rs uses cmd/{n}.rs", s.module));
            }
        }
    }
    // Other layers do not reach into a command either.
    for s in tree
        .iter()
        .filter(|s| s.layer != "cmd" && s.layer != "main")
    {
        for n in names_after(&s.text, "crate::cmd::") {
            if commands.contains(n.as_str()) {
                found.push(format!("{}/{}.rs uses cmd/{n}.rs", s.layer, s.module));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checker itself: a circle and an import after a comment are told apart.
#[test]
fn the_checker_sees_imports_and_circles() {
    let names = names_after(
        "use crate::render::x; // crate::tui\nlet a = crate::engine::f(); super::sweep::y",
        "crate::",
    );
    assert_eq!(
        names,
        ["engine", "render"].iter().map(|s| s.to_string()).collect()
    );
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    assert_eq!(circles(&g), vec![vec!["a", "b", "c", "a"]]);
}

/// No production source file (of the main crate, the model crate, the parsers and the
/// probes) is over 600 lines; tests are not production files.
#[test]
fn no_production_file_is_over_600_lines() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "model/src",
        "formats/src",
        "probes/src",
        "probes/types/src",
    ] {
        sources(&base.join(dir), &mut files);
    }
    assert!(files.len() > 100, "{} files", files.len());
    let mut over: Vec<String> = files
        .iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !name.contains("tests") && !p.components().any(|c| c.as_os_str() == "tests")
        })
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > 600).then(|| format!("{}: {n} lines", p.strip_prefix(base).unwrap().display()))
        })
        .collect();
    over.sort();
    assert!(over.is_empty(), "{}", over.join("\n"));
}
