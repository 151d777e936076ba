//! What reaches a terminal: `top` refusing bad input inside one and exiting when it hangs
//! up, and names with control bytes (stores, dumped rows) escaped for a terminal but exact
//! to a pipe.

use super::*;

fn wait_for_file(path: &Path, timeout: Duration) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn top_refuses_bad_input_in_a_terminal_with_exit_2() {
    let _group = crate::common::group(super::GROUP);
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let fifo = format!("{d}/fifo");
    mkfifo(Path::new(&fifo));
    let cases: &[(&str, &str)] = &[
        ("/nonexistent", "cannot access '/nonexistent'"),
        (&fifo, "is not a regular file or directory"),
        ("/dev/zero", "'/dev/zero' is a device"),
        ("--pid 99999999", "no process with pid '99999999'"),
        ("/proc/self/mem", "is on procfs"),
        // Refused, not shown as "not applied" on a screen that keeps running.
        (r#"--filter "anon>>>1Q""#, "--filter 'anon>>>1Q'"),
    ];
    for (i, (args, needle)) in cases.iter().enumerate() {
        let (exit, err) = (format!("{d}/exit{i}"), format!("{d}/err{i}"));
        let tmux = Tmux::new(&format!("bad{i}"));
        tmux.start(
            100,
            30,
            &format!(
                "sh -c '{} top {args} 2>{err}; echo EXIT=$? > {exit}'",
                exe().display()
            ),
        );
        let Some(code) = wait_for_file(Path::new(&exit), Duration::from_secs(10)) else {
            panic!("'top {args}' still running after 10 s: {}", tmux.screen());
        };
        let err = std::fs::read_to_string(&err).unwrap();
        assert_eq!(code.trim(), "EXIT=2", "top {args}: {err}");
        assert!(err.contains(needle), "top {args}: want '{needle}' in {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn top_exits_at_once_when_its_terminal_hangs_up() {
    let _group = crate::common::group(super::GROUP);
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    for how in ["kill-server", "kill-pane"] {
        let tmux = Tmux::new(&format!("hup-{how}"));
        tmux.start(
            100,
            30,
            &format!(
                "sh -c 'echo $$ > {}; exec {} top --interval 500ms'",
                pidfile.display(),
                exe().display()
            ),
        );
        let pid: i32 = wait_for_file(&pidfile, Duration::from_secs(10))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _kill = KillOnDrop(pid);
        tmux.wait_for("the first screen", Duration::from_secs(30), |s| {
            s.contains("twofold top")
        });
        let start = Instant::now();
        if how == "kill-server" {
            tmux.cmd(&["kill-server"]);
        } else {
            tmux.cmd(&["kill-pane", "-t", "top"]);
        }
        while !gone(pid) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = start.elapsed();
        assert!(gone(pid), "top still runs 5 s after {how}");
        assert!(
            took < Duration::from_secs(1),
            "top took {took:?} to exit after {how}"
        );
        std::fs::remove_file(&pidfile).unwrap();
    }
}

#[test]
fn store_names_with_control_bytes_are_escaped_in_messages() {
    let _group = crate::common::group(super::GROUP);
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "m.gguf", MIB);
    for name in [
        "evil\u{1b}]0;PWNED\u{7}\u{1b}[31mred\u{1b}[0m.store",
        "x\u{202e}erots.store",
    ] {
        let store = dir.path().join(name);
        let (code, out, err) = run_raw(&[
            "record".as_ref(),
            "--count".as_ref(),
            "1".as_ref(),
            "--no-prove".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
            model.as_os_str(),
        ]);
        assert_eq!(code, Some(0), "{err}");
        let out = String::from_utf8(out).unwrap();
        for text in [&out, &err] {
            assert!(
                !text.contains('\u{1b}') && !text.contains('\u{7}'),
                "{text:?}"
            );
            assert!(!text.contains('\u{202e}'), "{text:?}");
        }
        assert!(
            out.contains("\\e]0;PWNED\\a\\e[31mred") || out.contains("x\\u{202e}erots"),
            "{out}"
        );
        assert!(store.join("store.json").is_file());
    }
}

#[test]
fn dump_says_why_it_wrote_no_rows() {
    let _group = crate::common::group(super::GROUP);
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "m.gguf", MIB);
    let store = dir.path().join("S");
    let (code, _, err) = run_raw(&[
        "record".as_ref(),
        "--count".as_ref(),
        "1".as_ref(),
        "--no-prove".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        model.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    // The snapshot is in the range but has no trace rows (recorded without --trace): an
    // error that says so (exit 2), never an empty success.
    let (code, out, err) = run_raw(&[
        "dump".as_ref(),
        "--what".as_ref(),
        "trace".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("no trace rows: the 1 snapshot between")
            && err.contains("recorded without 'record --trace'"),
        "{err}"
    );
    // A range before the recording: no snapshot there, and what the store holds.
    let (code, out, err) = run_raw(&[
        "dump".as_ref(),
        "--from".as_ref(),
        "100d ago".as_ref(),
        "--to".as_ref(),
        "99d ago".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("no files rows: no snapshot between")
            && err.contains("the store holds 1 snapshot from"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn dump_csv_is_exact_to_a_pipe_and_escaped_to_a_terminal() {
    let _group = crate::common::group(super::GROUP);
    if !require(have("tmux"), "tmux (scripts/test.sh installs it)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "m.gguf", 4 * MIB);
    // A reader whose comm holds ESC and BEL: exec'd through a link of that name.
    let comm = "t\u{1b}]0;X\u{7}f";
    let link = dir.path().join(comm);
    std::os::unix::fs::symlink(exe(), &link).unwrap();
    let reader =
        twofold::spawn::Reader::start(&link, "map", Some(&model), &[], Duration::from_secs(60))
            .unwrap();
    let pid = reader.pid().to_string();
    let store = dir.path().join("S");
    let (code, _, err) = run_raw(&[
        "record".as_ref(),
        "--count".as_ref(),
        "1".as_ref(),
        "--no-prove".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        model.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let dump = [
        "dump",
        "--what",
        "processes",
        "--format",
        "csv",
        "--store",
        store.to_str().unwrap(),
    ];
    let (code, out, err) = run_raw(&dump.map(std::ffi::OsStr::new));
    assert_eq!(code, Some(0), "{err}");
    let out = String::from_utf8(out).unwrap();
    let row = out
        .lines()
        .find(|l| l.contains(&format!(",{pid},")))
        .unwrap_or_else(|| panic!("no row of pid {pid}: {out}"));
    assert!(row.contains(&format!(",{comm},")), "{row:?}");
    // To a terminal: the same row, its ESC and BEL shown as escapes.
    let exit = dir.path().join("exit");
    let tmux = Tmux::new("csv");
    tmux.start(
        200,
        20,
        &format!(
            "sh -c '{} {}; echo EXIT=$? > {}; sleep 30'",
            exe().display(),
            dump.join(" "),
            exit.display()
        ),
    );
    let code = wait_for_file(&exit, Duration::from_secs(20)).unwrap();
    assert_eq!(code.trim(), "EXIT=0");
    let screen = tmux.screen();
    assert!(screen.contains("t\\e]0;X\\af"), "{screen}");
}
