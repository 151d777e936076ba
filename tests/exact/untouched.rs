//! No command of twofold changes the residency of a model file it reads: an evicted file
//! held only as a `read()` copy stays evicted through `scan` (empty point cache), `scan
//! --exact`, `dupes --pid`, `inspect`, `top` and `serve` (20 s each), checked by
//! util-linux `fincore` before and after each.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::tmux::Tmux;
use crate::common::*;

/// At most this many pages more after a command: a page evicted between twofold's check
/// and its copy is read back (one page), and nothing reads ahead.
const SLACK: u64 = 16;

fn check(what: &str, file: &Path, run: impl FnOnce()) {
    // Written back first: dirty pages are not evicted.
    std::fs::File::open(file).unwrap().sync_all().unwrap();
    evict(file);
    let before = fincore_pages(file);
    run();
    let after = fincore_pages(file);
    eprintln!("{what}: fincore {before} pages before, {after} after");
    assert!(
        after <= before + SLACK,
        "{what} cached {} pages of an evicted file ({before} before, {after} after)",
        after - before.min(after)
    );
}

#[test]
fn no_command_caches_an_evicted_model() {
    let _group = crate::common::group(module_path!());
    if !require(
        have("fincore"),
        "util-linux fincore (scripts/test.sh installs it)",
    ) || !require(is_root(), "root (to search the copying reader's memory)")
        || !require(have("tmux"), "tmux (scripts/test.sh installs it)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 24 * MIB, Fill::Random(1)),
            ("b", 24 * MIB, Fill::Random(2)),
            ("c", 16 * MIB, Fill::Random(3)),
        ],
    );
    let copy = reader("copy", Some(&file), &["--close"]);
    let pid = copy.pid().to_string();
    let f = file.to_str().unwrap();
    let index = dir.path().join("index");
    let scan = |extra: &[&str]| -> String {
        let out = run_ok(
            Command::new(exe())
                .env("TWOFOLD_INDEX_CACHE", &index)
                .arg("scan")
                .args(extra)
                .args(["--prove-budget", "60s", f]),
        );
        String::from_utf8(out).unwrap()
    };
    // A first scan, with an empty point cache: the whole index is read from the file.
    check("scan FILE (empty point cache)", &file, || {
        let text = scan(&[]);
        assert!(
            text.contains("page cache 0.00") && text.contains("private copies 1.00"),
            "{text}"
        );
    });
    std::fs::remove_dir_all(&index).ok();
    check("scan --exact FILE", &file, || {
        let text = scan(&["--exact"]);
        assert!(text.contains("private copies 1.00"), "{text}");
    });
    check("dupes --pid", &file, || {
        let r = dupes_report(copy.pid(), &file, &[]);
        let found: u64 = r
            .processes
            .iter()
            .flat_map(|p| &p.files)
            .map(|f| f.identical.file_bytes)
            .sum();
        assert_eq!(found, 64 * MIB, "dupes found every byte of the copy");
    });
    check("inspect", &file, || {
        run_ok(Command::new(exe()).args(["inspect", f]));
    });
    check("serve for 20 s", &file, || {
        let port = free_port();
        let mut child = Command::new(exe())
            .env("TWOFOLD_INDEX_CACHE", &index)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--interval",
                "1s",
                "--prove-budget",
                "30s",
                "--model-glob",
                f,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // At least 20 s, and until a collection with the file is exported (a host under
        // load takes longer over its first).
        let start = std::time::Instant::now();
        let id = file_id(&file);
        let mut body = None;
        while start.elapsed() < Duration::from_secs(180) {
            std::thread::sleep(Duration::from_secs(1));
            body = metrics_text(port).filter(|b| b.contains(&id));
            if body.is_some() && start.elapsed() >= Duration::from_secs(20) {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(body.is_some(), "serve exported the file within 180 s");
    });
    check("top for 20 s", &file, || {
        let tmux = Tmux::new("untouched");
        tmux.start(
            120,
            30,
            &format!(
                "TWOFOLD_INDEX_CACHE='{}' '{}' top --interval 1s --pid {pid} '{f}'",
                index.display(),
                exe().display()
            ),
        );
        let screen = tmux.wait_for("the copy in top", Duration::from_secs(60), |s| {
            s.contains("m.safetensors") || s.contains(".safetensors")
        });
        std::thread::sleep(Duration::from_secs(20));
        tmux.keys(&["q"]);
        assert!(screen.contains(".safetensors"), "{screen}");
    });
}
