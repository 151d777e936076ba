//! `twofold top` in a real terminal: a detached tmux session (tmux answers crossterm's
//! queries, a bare PTY does not), driven with `send-keys` and read with `capture-pane`.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::tmux::Tmux;
use crate::common::*;

/// A table row of process `pid` (its first word is the pid: "123," of a wrapped list of
/// pids is not a row).
fn row_of(line: &str, pid: &str) -> bool {
    line.split_whitespace().next() == Some(pid)
}

fn wait_file(path: &Path, timeout: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            start.elapsed() < timeout,
            "'{}' never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn file_row<'a>(screen: &'a str, name: &str) -> Option<&'a str> {
    screen.lines().find(|l| l.contains(name))
}

#[test]
fn top_in_tmux_shows_the_count_and_the_copy_and_quits_cleanly() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)")
        || !require(is_root(), "root (to search the copying reader's memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "twin.gguf", 16 * MIB);
    let copy = reader("copy", Some(&file), &["--close"]);
    let map = reader("map", Some(&file), &[]);
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("live");
    // Only the two readers: this test binary (other tests' threads, tens of MiB that change
    // every snapshot, and gigabytes read) could hold a copy of a 16 MiB file, so with it the
    // count is rightly a lower bound in every snapshot but the one after its search, every
    // 5 to 20 s (its cadence), and a capture of the exact count was a matter of luck.
    tmux.start(
        100,
        30,
        &format!(
            "sh -c '{} top --interval 500ms --pid {} --pid {} {}; echo EXIT=$? > {}'",
            exe().display(),
            copy.pid(),
            map.pid(),
            file.display(),
            exit.display()
        ),
    );
    let long = Duration::from_secs(60);
    // The file row: the count of 2.00 and the 16 MiB private copy.
    let s = tmux.wait_for("the count of 2.00", long, |s| {
        file_row(s, "twin.gguf").is_some_and(|l| l.contains(" 2.00 "))
    });
    let row = file_row(&s, "twin.gguf").unwrap();
    assert!(row.contains("16.0 MiB"), "{row}");
    // At least this file's 16 MiB (other tests' files may add theirs).
    assert!(s.contains("held beyond one copy "), "{s}");

    // Processes view, sorted by pid then reversed.
    tmux.keys(&["2"]);
    tmux.wait_for("the processes view", long, |s| s.contains("sort rss"));
    tmux.keys(&["s", "s", "s", "s", "s", "s"]);
    tmux.wait_for("the pid sort", long, |s| s.contains("sort pid ↓"));
    tmux.keys(&["S"]);
    let unfiltered = tmux.wait_for("the reversed sort", long, |s| s.contains("sort pid ↑"));
    // Filter on the copying reader's pid: one row.
    let pid = copy.pid().to_string();
    tmux.keys(&["/"]);
    tmux.keys(&["-l", &pid]);
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("the filtered row", long, |s| {
        s.contains(&format!("filter /{pid}")) && s.lines().any(|l| row_of(l, &pid))
    });
    let rows = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("Processes"))
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.chars().all(|c| c.is_ascii_digit()))
            })
            .count()
    };
    // The copying reader's row, and not the mapping reader's (a status line may start
    // with a digit too, so the rows going down is what is asserted).
    assert!(
        rows(&s) >= 1 && rows(&s) < rows(&unfiltered),
        "{unfiltered}\n{s}"
    );
    assert!(!s.lines().any(|l| row_of(l, &map.pid().to_string())), "{s}");
    tmux.keys(&["Escape"]);
    tmux.wait_for("the filter cleared", long, |s| !s.contains("filter /"));

    // Cgroups, then back to files and into the file.
    tmux.keys(&["3"]);
    tmux.wait_for("the cgroups view", long, |s| s.contains("usage / max"));
    tmux.keys(&["1"]);
    tmux.wait_for("the files view", long, |s| {
        file_row(s, "twin.gguf").is_some()
    });
    tmux.keys(&["Enter"]);
    // Polled until the copier's row is drawn whole (a capture can land mid-repaint) with
    // the exact count.
    let s = tmux.wait_for("the file's page, the copier's row, the count", long, |s| {
        s.contains("Files › ")
            && s.contains("in memory 2.00 times")
            && s.lines()
                .any(|l| row_of(l, &pid) && l.contains("private copy"))
    });
    assert!(
        s.contains("page cache 1.00 + CoW 0.00 + private copies 1.00"),
        "{s}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_for("the files view again", long, |s| !s.contains("Files › "));
    tmux.keys(&["q"]);
    assert_eq!(wait_file(&exit, long).trim(), "EXIT=0");
}

#[test]
fn top_replays_a_recording_made_by_scan() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)")
        || !require(is_root(), "root (to search the copying reader's memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "rec.gguf", 8 * MIB);
    let store = dir.path().join("store");
    {
        let _copy = reader("copy", Some(&file), &["--close"]);
        let _map = reader("map", Some(&file), &[]);
        let out = Command::new(exe())
            .args(["scan", "--json", "--record"])
            .arg(&store)
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: twofold::model::Report = serde_json::from_slice(&out.stdout).unwrap();
        let count = r.files.iter().find(|f| Path::new(&f.path) == file).unwrap();
        assert!((count.representations.proven.unwrap() - 2.0).abs() < 0.01);
    }
    // The readers are gone: what top shows can only come from the recording.
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("replay");
    tmux.start(
        80,
        24,
        &format!(
            "sh -c '{} top --replay {} --at now; echo EXIT=$? > {}'",
            exe().display(),
            store.display(),
            exit.display()
        ),
    );
    let s = tmux.wait_for("the recorded count", Duration::from_secs(30), |s| {
        file_row(s, "rec.gguf").is_some_and(|l| l.contains(" 2.00 "))
    });
    assert!(s.contains("replay "), "{s}");
    // One snapshot only: stepping keeps it.
    tmux.keys(&["[", "]"]);
    // The drill-down says what the recording holds: no map read forever, nothing to prove.
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("the replayed file", Duration::from_secs(10), |s| {
        s.contains("page cache map: not in a recording")
    });
    assert!(
        s.contains("Files ›") && s.contains("recorded: the count"),
        "{s}"
    );
    assert!(!s.contains("reading…") && !s.contains("p: prove"), "{s}");
    tmux.keys(&["p"]);
    tmux.wait_for("why p does nothing", Duration::from_secs(10), |s| {
        s.contains("recordings hold no memory to prove")
    });
    tmux.keys(&["Escape", "q"]);
    assert_eq!(wait_file(&exit, Duration::from_secs(30)).trim(), "EXIT=0");
}

#[test]
fn p_proves_a_suspected_copy_in_the_background() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)")
        || !require(is_root(), "root (to search the copying reader's memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A size no other test uses: model_file's bytes depend on the size only, and another
    // test's copy of the same bytes would count here.
    let file = model_file(dir.path(), "suspect.gguf", 12 * MIB);
    let copy = reader("copy", Some(&file), &["--close"]);
    let pid = copy.pid().to_string();
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("prove");
    // --no-prove: the copy is only suspected until p proves it.
    tmux.start(
        120,
        40,
        &format!(
            "sh -c '{} top --no-prove --interval 500ms {}; echo EXIT=$? > {}'",
            exe().display(),
            file.display(),
            exit.display()
        ),
    );
    let long = Duration::from_secs(60);
    let copier = |s: &str| s.lines().find(|l| row_of(l, &pid)).map(str::to_string);
    tmux.wait_for("the file row", long, |s| {
        file_row(s, "suspect.gguf").is_some()
    });
    // Only this file (other tests' files come and go), then into it.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "suspect.gguf"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filter", long, |s| s.contains("filter /suspect.gguf"));
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("the suspected copy", long, |s| {
        copier(s).is_some_and(|l| l.contains("suspected copy"))
    });
    assert!(!s.contains("in memory 2.00 times"), "{s}");
    // Select the copier's row (other processes on the machine may be suspects too).
    let rows: Vec<&str> = s
        .lines()
        .skip_while(|l| !l.starts_with("pid     comm"))
        .skip(1)
        .collect();
    let at = rows.iter().position(|l| row_of(l, &pid)).unwrap();
    for _ in 0..at {
        tmux.keys(&["Down"]);
    }
    // p: proven byte by byte in the background; the row and the count follow.
    tmux.keys(&["p"]);
    let s = tmux.wait_for("the proven copy", long, |s| {
        copier(s).is_some_and(|l| l.contains("private copy") && l.contains("proven"))
    });
    // "≥" where other processes on the machine are suspects too.
    assert!(
        s.contains("2.00 times: page cache 1.00 + CoW 0.00 + private copies 1.00"),
        "{s}"
    );
    tmux.wait_for("the proof's end in the status line", long, |s| {
        s.contains(&format!("proof of pid {pid} done"))
    });
    // It stays proven at the next collections (--no-prove does not undo it).
    std::thread::sleep(Duration::from_millis(1500));
    let s = tmux.screen();
    assert!(copier(&s).is_some_and(|l| l.contains("proven")), "{s}");
    // The page-cache map of the open file is drawn (root may mincore any file).
    assert!(s.contains("page cache map (1 cell = "), "{s}");
    tmux.keys(&["q"]);
    assert_eq!(wait_file(&exit, long).trim(), "EXIT=0");
}

#[test]
fn esc_cancels_a_running_proof_and_the_copy_stays_suspected() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)")
        || !require(is_root(), "root (to search the copying reader's memory)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Large enough that the search is still running when Esc arrives.
    let file = model_file(dir.path(), "cancel.gguf", 512 * MIB);
    let copy = reader("copy", Some(&file), &["--close"]);
    let pid = copy.pid().to_string();
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("cancel");
    tmux.start(
        120,
        40,
        &format!(
            "sh -c '{} top --no-prove --interval 500ms {}; echo EXIT=$? > {}'",
            exe().display(),
            file.display(),
            exit.display()
        ),
    );
    let long = Duration::from_secs(60);
    tmux.wait_for("the file row", long, |s| {
        file_row(s, "cancel.gguf").is_some()
    });
    // Only this file (other tests' files come and go), then into it.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "cancel.gguf"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filter", long, |s| s.contains("filter /cancel.gguf"));
    tmux.keys(&["Enter"]);
    tmux.wait_for("the suspected copy", long, |s| s.contains("suspected copy"));
    tmux.keys(&["p"]);
    tmux.wait_for("the gauge", long, |s| {
        s.contains(&format!("proving pid {pid}")) && s.contains("Esc cancels")
    });
    tmux.keys(&["Escape"]);
    let s = tmux.wait_for("the cancelled proof", long, |s| {
        s.contains(&format!("proof of pid {pid} cancelled"))
    });
    assert!(!s.contains("Esc cancels"), "{s}");
    assert!(s.contains("suspected copy"), "{s}");
    assert!(!s.contains("in memory 2.00 times"), "{s}");
    // Esc again leaves the file; q quits: the terminal comes back with exit 0.
    tmux.keys(&["Escape"]);
    tmux.wait_for("the files view", long, |s| !s.contains("Files › "));
    tmux.keys(&["q"]);
    assert_eq!(wait_file(&exit, long).trim(), "EXIT=0");
}

#[test]
fn t_turns_ebpf_tracing_on_and_the_file_page_shows_its_reads() {
    let _group = crate::common::group(module_path!());
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)")
        || !require(is_root(), "root (to attach the eBPF programs)")
    {
        return;
    }
    let _ = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "traced.gguf", 10 * MIB);
    let map = reader("map", Some(&file), &[]);
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("trace");
    tmux.start(
        140,
        40,
        &format!(
            "sh -c '{} top --no-prove --interval 500ms {}; echo EXIT=$? > {}'",
            exe().display(),
            file.display(),
            exit.display()
        ),
    );
    let long = Duration::from_secs(60);
    tmux.wait_for("the file row", long, |s| {
        file_row(s, "traced.gguf").is_some()
    });
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "traced.gguf"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filter", long, |s| s.contains("filter /traced.gguf"));
    tmux.keys(&["Enter"]);
    tmux.wait_for("the file's page, untraced", long, |s| {
        s.contains("trace: off (t turns eBPF tracing on)")
    });
    tmux.keys(&["t"]);
    tmux.wait_for("tracing on", long, |s| {
        s.contains("TRACING") && s.contains("trace, pages/s:")
    });
    // A reader of the whole file while traced: its read() bytes show as a rate, for the
    // snapshot (0.5 s) its read fell in. Under load the screen's polling can miss that one
    // snapshot, so a new reader reads it again every 2 s until the rate is seen (the last
    // two kept).
    let rate_shown = |s: &str| {
        s.lines()
            .find(|l| l.contains("trace, pages/s:"))
            .and_then(|l| l.split("read() ").nth(1))
            .is_some_and(|r| !r.starts_with("0 B/s") && !r.starts_with("n/a"))
    };
    let started = std::time::Instant::now();
    let mut copies = std::collections::VecDeque::new();
    let s = 'seen: loop {
        copies.push_back(reader("copy", Some(&file), &["--close"]));
        if copies.len() > 2 {
            copies.pop_front();
        }
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < until {
            let s = tmux.screen();
            if rate_shown(&s) {
                break 'seen s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            started.elapsed() < long,
            "timed out waiting for a read() rate; the screen:\n{}",
            tmux.screen()
        );
    };
    assert!(s.contains("TRACING"), "{s}");
    drop(copies);
    tmux.keys(&["t"]);
    tmux.wait_for("tracing off", long, |s| {
        !s.contains("TRACING") && s.contains("tracing off")
    });
    tmux.keys(&["q"]);
    assert_eq!(wait_file(&exit, long).trim(), "EXIT=0");
    drop(map);
}
