//! Whole screens rendered into `TestBackend` at 80x24 and 160x48, compared with insta
//! snapshots (`src/tui/snapshots/`).

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::*;
use crate::tui::fixture;
use crate::tui::state::{Action, Key};

fn screen(st: &mut State, report: Option<&Report>, w: u16, h: u16) -> String {
    if let Some(r) = report {
        st.clamp_to(r);
    }
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    let mut hits = Hits::default();
    term.draw(|f| hits = draw(f, st, report)).unwrap();
    st.hits = hits;
    format!("{}", term.backend())
}

fn state(view: View) -> State {
    let mut st = State::new(view);
    st.color = false;
    st.own_cpu_percent = Some(0.4);
    st.own_rss_bytes = Some(18 << 20);
    st.psi = Some(state::Psi {
        some_avg10: 0.12,
        full_avg10: None,
    });
    st
}

/// The fixture's report as four collections over the session: the llama file's page
/// cache grows from a quarter to all of it.
fn with_history(st: &mut State) -> Report {
    let mut r = fixture::report();
    for i in 1..=4u64 {
        r.at_unix_ns = Some(i);
        r.files[0].resident_bytes = Some(i << 30);
        r.files[0].resident_fraction = Some(i as f64 / 4.0);
        st.history.record(&r);
    }
    r
}

/// A page-cache map of the llama file: the first half cached, then some, then none.
fn map(
    r: &Report,
) -> (
    crate::sample::FileKey,
    Result<crate::model::residency::MapModel, String>,
) {
    let cells = format!("{}{}{}", "O".repeat(128), "o".repeat(64), " ".repeat(64));
    (
        r.files[0].key,
        Ok(crate::model::residency::MapModel {
            pages_per_cell: 4096,
            cells,
        }),
    )
}

#[test]
fn screens() {
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        let mut st = state(View::Files);
        let r = with_history(&mut st);
        insta::assert_snapshot!(format!("files_{w}x{h}"), screen(&mut st, Some(&r), w, h));
        st.handle(Key::Enter);
        st.open_selected(&r);
        st.map = Some(map(&r));
        insta::assert_snapshot!(
            format!("file_open_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        // The qwen file: residency unknown, so its map and sparklines say n/a.
        st.handle(Key::Esc);
        st.handle(Key::Down);
        st.open_selected(&r);
        st.map = Some((
            r.files[1].key,
            Err("mincore: not revealed to this user".into()),
        ));
        insta::assert_snapshot!(
            format!("file_open_unknown_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        // p on it: the gauge of the proof running in the background.
        st.clamp_to(&r);
        assert_eq!(st.handle(Key::Char('p')), Action::Prove);
        let progress = std::sync::Arc::new(crate::engine::Progress::default());
        progress.add_total(600 << 20);
        progress.add_done(150 << 20);
        st.proving = Some(state::Proving {
            pid: 6161,
            comm: "vllm".into(),
            progress,
        });
        st.status = Some("proving pid 6161 (vllm)…".into());
        insta::assert_snapshot!(format!("proving_{w}x{h}"), screen(&mut st, Some(&r), w, h));
        let mut st = state(View::Cgroups);
        st.clamp_to(&r);
        st.handle(Key::Down);
        st.handle(Key::Right);
        st.open_selected(&r);
        insta::assert_snapshot!(
            format!("cgroups_expanded_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        st.handle(Key::Char('w'));
        insta::assert_snapshot!(
            format!("workload_comm_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        st.handle(Key::Char('w'));
        insta::assert_snapshot!(
            format!("workload_cgroup_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        let r = fixture::report();
        let mut st = state(View::Processes);
        insta::assert_snapshot!(
            format!("processes_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
        let mut st = state(View::Cgroups);
        insta::assert_snapshot!(format!("cgroups_{w}x{h}"), screen(&mut st, Some(&r), w, h));
        let mut st = state(View::Files);
        st.handle(Key::Char('?'));
        insta::assert_snapshot!(format!("help_{w}x{h}"), screen(&mut st, Some(&r), w, h));
    }
}

#[test]
fn filter_line_pause_and_no_report_yet() {
    let r = fixture::report();
    let mut st = state(View::Processes);
    st.paused = true;
    for k in "/anon>1G".chars() {
        st.handle(Key::Char(k));
    }
    insta::assert_snapshot!(
        "processes_filtered_paused_80x24",
        screen(&mut st, Some(&r), 80, 24)
    );
    let mut st = state(View::Files);
    st.psi = None;
    st.own_cpu_percent = None;
    insta::assert_snapshot!("collecting_80x24", screen(&mut st, None, 80, 24));
}

#[test]
fn unknown_values_show_na_never_zero() {
    let r = fixture::report();
    let mut st = state(View::Files);
    let text = screen(&mut st, Some(&r), 160, 48);
    let qwen = text.lines().find(|l| l.contains("qwen2-7b")).unwrap();
    // Count, page cache and resident % of the qwen file are unknown.
    assert_eq!(qwen.matches("n/a").count(), 3, "{qwen}");
    let mut st = state(View::Processes);
    let text = screen(&mut st, Some(&r), 160, 48);
    let vllm = text.lines().find(|l| l.contains("vllm")).unwrap();
    // PSS, USS, private dirty and the growth rate of vllm are unknown.
    assert_eq!(vllm.matches("n/a").count(), 4, "{vllm}");
}

/// Byte values are up to 10 characters (`1023.9 MiB`): a column widens for them, at 80
/// and at 160 columns, rather than cut a digit off.
#[test]
fn a_wide_value_is_never_cut() {
    let mut r = fixture::report();
    r.files[0].resident_bytes = Some(1_066_113_433); // 1016.7 MiB
    for (w, h) in [(80, 24), (160, 48)] {
        let mut st = state(View::Files);
        let text = screen(&mut st, Some(&r), w, h);
        let row = text.lines().find(|l| l.contains("llama-3-8b")).unwrap();
        assert!(row.contains(" 1016.7 MiB "), "{w}x{h}: {row}");
    }
}

#[test]
fn outside_text_is_escaped() {
    let mut r = fixture::report();
    r.files[0].path = "/models/evil\u{1b}]0;pwned\u{7}.gguf".into();
    let mut st = state(View::Files);
    let text = screen(&mut st, Some(&r), 160, 48);
    assert!(text.contains("evil\\e]0;pwned\\a.gguf"), "{text}");
    assert!(!text.contains('\u{1b}'));
}

#[test]
fn mouse_selects_sorts_opens_and_scrolls() {
    let r = fixture::report();
    let mut st = state(View::Processes);
    screen(&mut st, Some(&r), 160, 48);
    let (hy, cols) = st.hits.header.clone().unwrap();
    let (by, _, offset) = st.hits.body.unwrap();
    assert_eq!((hy + 1, offset), (by, 0));
    // A click on the third row selects it.
    assert_eq!(st.handle(Key::Click(3, by + 2)), Action::Redraw);
    assert_eq!(st.selected(View::Processes), 2);
    // Below the last row: nothing.
    assert_eq!(st.handle(Key::Click(3, by + 5)), Action::None);
    assert_eq!(st.selected(View::Processes), 2);
    // The "pss" header sorts by PSS; a second click reverses it.
    let pss = cols.iter().find(|c| c.2 == "pss").unwrap();
    assert_eq!(st.handle(Key::Click(pss.0 + 1, hy)), Action::Redraw);
    assert_eq!(st.sort_column(View::Processes), "pss");
    assert!(!st.is_reversed(View::Processes));
    let pids = |st: &State| {
        st.process_rows(&r)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>()
    };
    assert_eq!(pids(&st), [5151, 4242, 6161], "unknown PSS last");
    screen(&mut st, Some(&r), 160, 48);
    st.handle(Key::Click(pss.0 + 1, hy));
    assert!(st.is_reversed(View::Processes));
    assert_eq!(pids(&st), [4242, 5151, 6161]);
    // The wheel moves the selection, inside the rows.
    st.handle(Key::WheelUp);
    assert_eq!(st.selected(View::Processes), 0);
    st.handle(Key::WheelDown);
    assert_eq!(st.selected(View::Processes), 2);
    // A click on a tab switches view; on the selected file row, opens it.
    let (ty, tabs) = st.hits.tabs.clone().unwrap();
    let files = tabs.iter().find(|t| t.2 == View::Files).unwrap();
    st.handle(Key::Click(files.0, ty));
    assert_eq!(st.view, View::Files);
    screen(&mut st, Some(&r), 80, 24);
    let (by, _, _) = st.hits.body.unwrap();
    assert_eq!(st.handle(Key::Click(2, by + 1)), Action::Redraw);
    assert_eq!(st.selected(View::Files), 1);
    assert_eq!(st.handle(Key::Click(2, by + 1)), Action::Open);
    assert!(st.open_selected(&r));
    assert_eq!(st.open, Some(r.files[1].key));
    // The path header (the flexible first column) sorts by path.
    st.open = None;
    screen(&mut st, Some(&r), 80, 24);
    let (hy, _) = st.hits.header.clone().unwrap();
    st.handle(Key::Click(1, hy));
    assert_eq!(st.sort_column(View::Files), "path");
}

#[test]
fn the_status_line_shows_what_a_replay_found_wrong() {
    let r = fixture::report();
    let mut st = state(View::Files);
    st.status =
        Some("1 problem(s) in the recording: torn tail in 'seg-0' at byte 4096\u{1b}".into());
    let text = screen(&mut st, Some(&r), 80, 24);
    let last = text.lines().next_back().unwrap();
    assert!(
        last.contains("1 problem(s) in the recording: torn tail"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'));
}

/// The processes view drops columns by their priority (`PROC_COLS`), never `holds
/// (how)`: at every width the header has it, the pid column is as wide as a pid, and a
/// column is shown only when every column kept before it is.
#[test]
fn process_columns_are_dropped_by_priority_and_holds_stays() {
    let r = fixture::report();
    let mut seen_at: Vec<usize> = Vec::new();
    for w in [80u16, 100, 120, 160] {
        let mut st = state(View::Processes);
        let text = screen(&mut st, Some(&r), w, 24);
        let header = text
            .lines()
            .find(|l| l.contains("comm"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(header.contains("holds (how)"), "{w}: {header}");
        assert!(header.starts_with("\"    pid comm"), "{w}: {header}");
        let row = text.lines().find(|l| l.contains("llama-server")).unwrap();
        assert!(row.starts_with("\"   4242 llama-server"), "{w}: {row}");
        assert!(row.contains("map llama-3-8b"), "{w}: {row}");
        // Every column but `holds (how)` sorts by its field: the header's hits list them.
        let (_, sortable) = st.hits.header.clone().unwrap();
        let shown: Vec<bool> = PROC_COLS
            .iter()
            .map(|c| {
                sortable
                    .iter()
                    .any(|s| Some(s.2) == c.field.map(|f| f.name()))
            })
            .collect();
        for (i, c) in PROC_COLS.iter().enumerate() {
            for (j, d) in PROC_COLS.iter().enumerate() {
                if d.prio < c.prio && shown[i] {
                    assert!(
                        shown[j],
                        "{w}: {} shown without {}: {header}",
                        c.title, d.title
                    );
                }
            }
        }
        let n = shown.iter().filter(|s| **s).count();
        // Wider screens keep at least as many columns.
        assert!(seen_at.last().is_none_or(|&m| n >= m), "{w}: {header}");
        seen_at.push(n);
    }
    assert!(seen_at[0] < seen_at[3], "{seen_at:?}");
    assert_eq!(seen_at[3], PROC_COLS.len(), "160 columns show them all");
}

/// The findings pane shows what the filter keeps (text in a finding's subject or
/// sentence; a comparison its file or process passes); a bad filter filters nothing and
/// the status line says why.
#[test]
fn the_filter_applies_to_the_findings_and_a_bad_one_says_why() {
    use crate::model::{Code, Finding, Severity};
    let mut r = fixture::report();
    r.findings.push(Finding {
        severity: Severity::Info,
        code: Code::DirectReclaim {
            pid: 5151,
            comm: Some("python3".into()),
            reclaim_ns: 2_000_000,
            reclaims: 4,
            longest_ns: 1_000_000,
            secs: 2.0,
        },
    });
    let pane = |text: &str| -> Vec<String> {
        let lines: Vec<&str> = text.lines().collect();
        let top = lines.iter().position(|l| l.contains("┌Findings")).unwrap();
        lines[top..lines.len() - 1]
            .iter()
            .map(|l| l.to_string())
            .collect()
    };
    let mut st = state(View::Files);
    let all = pane(&screen(&mut st, Some(&r), 120, 30));
    assert!(all[0].contains("Findings (3)"), "{all:?}");

    st.filter = "qwen".into();
    let p = pane(&screen(&mut st, Some(&r), 120, 30));
    assert!(p[0].contains("Findings (1 of 3, filtered)"), "{p:?}");
    assert!(p.iter().any(|l| l.contains("could hold a copy of 'qwen2")));
    assert!(!p.iter().any(|l| l.contains("llama-3-8b")), "{p:?}");

    st.filter = "count>=2".into();
    let p = pane(&screen(&mut st, Some(&r), 120, 30));
    assert!(p[0].contains("Findings (1 of 3, filtered)"), "{p:?}");
    assert!(
        p.iter().any(|l| l.contains("in memory 2.00 times")),
        "{p:?}"
    );

    let mut st = state(View::Processes);
    st.filter = "anon>1G".into();
    let p = pane(&screen(&mut st, Some(&r), 120, 30));
    assert!(p[0].contains("Findings (1 of 3, filtered)"), "{p:?}");
    assert!(p.iter().any(|l| l.contains("5151")), "{p:?}");

    st.filter = "bogus>1x".into();
    let text = screen(&mut st, Some(&r), 120, 30);
    let p = pane(&text);
    assert!(p[0].contains("Findings (3)"), "not applied: {p:?}");
    let status = text.lines().next_back().unwrap();
    assert!(
        status.contains("filter /bogus>1x") && status.contains("not applied: no field 'bogus'"),
        "{status}"
    );
    assert_eq!(st.process_rows(&r).len(), r.processes.len());
}

/// In a replay the open file says what the recording holds and what it does not: no
/// page-cache map that is "reading…" forever, no `p: prove`; `p` says why not.
#[test]
fn the_replayed_file_says_what_a_recording_has_and_has_not() {
    let r = fixture::report();
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        let mut st = state(View::Files);
        st.replay = true;
        st.source = "replay 2024-05-01T12:00:00Z".into();
        let keys = screen(&mut st, Some(&r), w, h);
        let keys = keys.lines().next_back().unwrap();
        assert!(
            keys.contains("[ ] step") && !keys.contains("p prove"),
            "{keys}"
        );
        st.handle(Key::Enter);
        st.open_selected(&r);
        let text = screen(&mut st, Some(&r), w, h);
        assert!(!text.contains("reading…"), "{text}");
        assert!(!text.contains("p: prove"), "{text}");
        assert!(
            text.contains("page cache map: not in a recording"),
            "{text}"
        );
        assert!(text.contains("recorded: the count, residency"), "{text}");
        assert!(text.contains("trace: not in this recording"), "{text}");
        assert_eq!(st.handle(Key::Char('p')), Action::Redraw);
        let text = screen(&mut st, Some(&r), w, h);
        let status = text.lines().next_back().unwrap();
        assert!(
            status.contains("recordings hold no memory to prove"),
            "{w}: {status}"
        );
        if w == 160 {
            insta::assert_snapshot!("file_open_replay_160x48", text);
        }
    }
}

/// The help overlay lists every line of the key table the handler reads (`t` too), whole,
/// at 80x24 and at 160x48; and every key of the table does what its line says it does
/// (it reaches the handler: none is dead).
#[test]
fn the_help_lists_every_key_of_the_key_table() {
    use crate::tui::keys::{command_of, BINDINGS};
    let r = fixture::report();
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        let mut st = state(View::Files);
        st.handle(Key::Char('?'));
        let text = screen(&mut st, Some(&r), w, h);
        for b in BINDINGS {
            let row = text
                .lines()
                .find(|l| l.contains(b.help))
                .unwrap_or_else(|| panic!("{w}x{h}: no line for {:?}\n{text}", b.help));
            assert!(row.contains(&format!("│{} ", b.label())), "{w}x{h}: {row}");
            for (k, c) in b.keys {
                assert_eq!(command_of(*k), Some(*c), "{k:?}");
            }
        }
        assert!(text.contains("│t "), "{text}");
        assert!(
            text.contains("docs/top.md"),
            "the whole overlay fits: {text}"
        );
    }
}

/// The status line is cut after a whole word, with `…`, at every width (the warning of
/// the issue was cut to `… and their PSS, are u` at 160 columns); what fits is whole.
#[test]
fn the_status_line_is_never_cut_inside_a_word() {
    use crate::sample::{Warning, WarningKind};
    let r = fixture::report();
    let text = "1 process could not be read fully (pid 4242: smaps_rollup: permission denied): \
                its mappings of model files, and their PSS, are unknown until it can be read \
                (run as root, or give twofold CAP_SYS_PTRACE)";
    let full = format!("1 warning(s): {text}");
    for w in [60u16, 80, 100, 120, 160, 200, 240] {
        let mut st = state(View::Files);
        st.warnings = vec![Warning::new(WarningKind::ProcessUnreadable, "4242", text)];
        let screen_text = screen(&mut st, Some(&r), w, 24);
        let last = screen_text.lines().next_back().unwrap();
        let shown = last.trim_matches('"').trim_end();
        if (w as usize) >= crate::render::safe::width(&full) {
            assert_eq!(shown, full, "{w}");
            continue;
        }
        let kept = shown
            .strip_suffix('…')
            .unwrap_or_else(|| panic!("{w}: {shown}"));
        assert!(full.starts_with(kept), "{w}: {shown}");
        // What follows the kept part is a space: the cut is between words.
        assert_eq!(full[kept.len()..].chars().next(), Some(' '), "{w}: {shown}");
        assert!(
            crate::render::safe::width(shown) <= w as usize,
            "{w}: {shown}"
        );
    }
    // The keys line and a filter with its error, at 80 columns, also end between words.
    let mut st = state(View::Files);
    st.filter = "bogus>1x".into();
    st.status = Some("proved pid 6161 (vllm) in 1.2 s: a private copy of qwen2-7b".into());
    let s = screen(&mut st, Some(&r), 80, 24);
    let last = s.lines().next_back().unwrap().trim_matches('"').trim_end();
    assert!(last.ends_with('…') && !last.ends_with(" …"), "{last}");
    assert!(last.contains("not applied"), "{last}");
}

#[test]
fn cut_words_keeps_whole_words() {
    use crate::tui::table::cut_words;
    assert_eq!(
        cut_words("and their PSS, are unknown", 22),
        "and their PSS, are…"
    );
    assert_eq!(cut_words("short", 10), "short");
    assert_eq!(cut_words("averyveryverylongword", 8), "averyve…");
}

#[test]
fn uploads_show_on_the_file_row_and_the_device_part_in_the_drill_down() {
    use crate::model::device::{DeviceCopy, UploadModel};
    let mut r = fixture::report();
    let size = r.files[1].size_bytes.unwrap();
    let f = &mut r.files[1];
    // 21:10:39 UTC.
    let at = (21 * 3600 + 10 * 60 + 39) * 1_000_000_000u64;
    f.uploads = vec![UploadModel {
        pid: 839,
        comm: "python3".into(),
        gpu: Some(0),
        widened: false,
        conversion: None,
        cloned: false,
        attribution: None,
        ranges: vec![(320, 320 + size - 320)],
        file_bytes: size - 320,
        device_bytes: size - 320,
        copies: 4,
        first_unix_ns: at,
        last_unix_ns: at,
        entry: "cuMemcpyHtoDAsync_v2".into(),
        proven: true,
        not_proven: None,
    }];
    f.device_copies = vec![DeviceCopy {
        pid: 839,
        comm: "python3".into(),
        gpu: Some(0),
        gpu_name: Some("NVIDIA H200".into()),
        integrated: Some(false),
        device_bytes: size - 320,
        attributed_bytes: size - 320,
        fraction: 1.0,
        proven: true,
        via: "upload".into(),
        proven_at_unix_ns: Some(at),
        note: None,
    }];
    f.representations.device = Some(1.0);
    let mut st = state(View::Files);
    let text = screen(&mut st, Some(&r), 160, 48);
    assert!(text.contains("uploaded"), "{text}");
    let row = text.lines().find(|l| l.contains("qwen2-7b")).unwrap();
    assert!(
        row.trim_end()
            .trim_end_matches('"')
            .trim_end()
            .ends_with("512.0 MiB"),
        "{row}"
    );
    let llama = text.lines().find(|l| l.contains("llama-3-8b")).unwrap();
    assert!(
        !llama.contains("n/a"),
        "a file never uploaded is blank: {llama}"
    );
    let key = r.files[1].key;
    st.open = Some(key);
    let text = screen(&mut st, Some(&r), 160, 48);
    assert!(
        text.contains("device part of the count 1.00 (512.0 MiB): pid 839 GPU 0 proven at upload 21:10:39 UTC"),
        "{text}"
    );
    assert!(
        text.contains("uploads: 512.0 MiB in 4 copies by 1 process(es), last 21:10:39 UTC"),
        "{text}"
    );
}
