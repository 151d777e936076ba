//! Help, man pages and docs say the same as the binary: generated from one definition
//! where they can be, checked against each other where they are written by hand.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use crate::common::exe;
use twofold::model::fields::sort;

fn stdout(args: &[&str]) -> String {
    let out = Command::new(exe()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn repo(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

/// Every `name(1)` a page refers to is a page `man --dir` wrote, and every page has the
/// EXIT STATUS and ENVIRONMENT sections.
#[test]
fn every_man_page_named_exists_with_exit_status_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    stdout(&["man", "--dir", d]);
    let pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(pages.contains(&"twofold.1".to_string()));
    assert!(pages.contains(&"twofold-scan.1".to_string()), "{pages:?}");
    let mut named = 0;
    for p in &pages {
        let text = std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert!(text.contains(".SH \"EXIT STATUS\""), "{p}");
        assert!(text.contains(".SH \"ENVIRONMENT\""), "{p}");
        for (i, _) in text.match_indices("(1)") {
            let start = text[..i]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '\\'))
                .map_or(0, |s| s + 1);
            let name = text[start..i].replace("\\-", "-");
            assert!(pages.contains(&format!("{name}.1")), "{p} names {name}(1)");
            named += 1;
        }
    }
    assert!(named > 18, "twofold(1) names every command's page");
    // `twofold man` prints twofold(1); `twofold man scan` the page written for scan.
    assert_eq!(
        stdout(&["man", "scan"]),
        std::fs::read_to_string(dir.path().join("twofold-scan.1")).unwrap()
    );
}

/// Every variable the code reads from the environment is in the ENVIRONMENT section.
#[test]
fn the_environment_section_lists_every_variable_read() {
    let man = stdout(&["man"]).replace("\\-", "-");
    let env = &man[man.find(".SH \"ENVIRONMENT\"").unwrap()..];
    let env = &env[..env.find(".SH \"SEE ALSO\"").unwrap()];
    // Test hooks, not for users.
    let hooks = ["TWOFOLD_GPU_FIXTURE", "TWOFOLD_PROBE_FAKE"];
    let mut seen = 0;
    for entry in walkdir::WalkDir::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        let entry = entry.unwrap();
        if entry.path().extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for pat in ["var_os(\"", "var(\"", "env(\""] {
            for (i, _) in text.match_indices(pat) {
                let rest = &text[i + pat.len()..];
                let name = &rest[..rest.find('"').unwrap()];
                if hooks.contains(&name) {
                    continue;
                }
                assert!(
                    env.contains(name),
                    "{} reads {name}: not in ENVIRONMENT",
                    entry.path().display()
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 8, "{seen}");
}

/// The backticked names of docs/top.md's "Sort columns:" paragraph after `after`.
fn doc_sort_columns(doc: &str, after: &str) -> Vec<String> {
    let from = doc.find(after).unwrap();
    let at = from + doc[from..].find("Sort columns:").unwrap();
    let para = &doc[at..at + doc[at..].find("\n\n").unwrap()];
    // Up to the end of the list: its first full stop, or a remark in parentheses.
    let end = [para.find(". "), para.find(".\n"), para.find(" (filters")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(para.len());
    para[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `top --sort`'s help and docs/top.md list the same columns as the registry `top`
/// sorts by.
#[test]
fn top_sort_help_and_docs_list_every_sort_column() {
    let doc = repo("docs/top.md");
    let help = stdout(&["top", "--help"]);
    let help: String = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for (after, fields) in [
        ("## Files view", &sort::FILES[..]),
        ("## Processes view", &sort::PROCESSES[..]),
        ("## Cgroups view", &sort::CGROUPS[..]),
    ] {
        let names = sort::names(fields);
        assert_eq!(doc_sort_columns(&doc, after), names, "docs/top.md {after}");
        assert!(
            help.contains(&names.join(", ")),
            "top --help: {names:?}\n{help}"
        );
    }
}

/// `inspect --help` names every container format the parsers read; `trace --help` says
/// JSON Lines as the top-level help does.
#[test]
fn inspect_and_trace_help_agree_with_what_they_do() {
    let inspect = stdout(&["inspect", "--help"]);
    for format in ["safetensors", "GGUF", "NumPy", "PyTorch", "ONNX"] {
        assert!(inspect.contains(format), "inspect --help omits {format}");
    }
    let top = stdout(&["--help"]);
    assert!(
        top.contains("--json prints\nJSON Lines")
            || top.replace('\n', " ").contains("--json prints JSON Lines")
    );
    let trace = stdout(&["trace", "--help"]).replace('\n', " ");
    assert!(trace.contains("Print JSON Lines"), "{trace}");
    assert!(!trace.contains("one JSON document"), "{trace}");
}
