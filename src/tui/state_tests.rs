//! Key sequences → state, without a terminal.

use super::*;
use crate::tui::fixture;

fn press(st: &mut State, report: &Report, keys: &[Key]) -> Vec<Action> {
    st.clamp_to(report);
    keys.iter()
        .map(|k| {
            let a = st.handle(*k);
            if a == Action::Open {
                st.open_selected(report);
            }
            st.clamp_to(report);
            a
        })
        .collect()
}

fn chars(s: &str) -> Vec<Key> {
    s.chars().map(Key::Char).collect()
}

#[test]
fn views_switch_with_tab_and_digits() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    press(&mut st, &r, &[Key::Tab]);
    assert_eq!(st.view, View::Processes);
    press(&mut st, &r, &[Key::Tab, Key::Tab]);
    assert_eq!(st.view, View::Files);
    press(&mut st, &r, &[Key::BackTab]);
    assert_eq!(st.view, View::Cgroups);
    press(&mut st, &r, &chars("2"));
    assert_eq!(st.view, View::Processes);
    press(&mut st, &r, &chars("1"));
    assert_eq!(st.view, View::Files);
}

#[test]
fn selection_moves_and_stays_inside_the_rows() {
    let r = fixture::report();
    let mut st = State::new(View::Processes);
    press(
        &mut st,
        &r,
        &[Key::Down, Key::Char('j'), Key::Down, Key::Down],
    );
    assert_eq!(st.selected(View::Processes), 2, "three processes");
    press(&mut st, &r, &[Key::Up, Key::Char('k'), Key::Up]);
    assert_eq!(st.selected(View::Processes), 0);
    press(&mut st, &r, &[Key::End]);
    assert_eq!(st.selected(View::Processes), 2);
    // Each view keeps its own selection.
    assert_eq!(st.selected(View::Files), 0);
}

#[test]
fn enter_opens_the_selected_file_and_esc_goes_back_then_quits() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    press(&mut st, &r, &[Key::Down, Key::Enter]);
    assert_eq!(st.open, Some(r.files[1].key));
    assert_eq!(press(&mut st, &r, &[Key::Esc]), [Action::Redraw]);
    assert_eq!(st.open, None);
    assert_eq!(press(&mut st, &r, &[Key::Esc]), [Action::Quit]);
    // Enter on another view opens nothing.
    let mut st = State::new(View::Processes);
    assert_eq!(press(&mut st, &r, &[Key::Enter]), [Action::None]);
    assert_eq!(st.open, None);
}

#[test]
fn s_cycles_the_sort_and_capital_s_reverses_it() {
    let r = fixture::report();
    let mut st = State::new(View::Processes);
    assert_eq!(st.sort_column(View::Processes), "rss");
    let pids = |st: &State| {
        st.process_rows(&r)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>()
    };
    assert_eq!(pids(&st), [5151, 4242, 6161]);
    press(&mut st, &r, &chars("s"));
    assert_eq!(st.sort_column(View::Processes), "anon");
    press(&mut st, &r, &chars("sss"));
    assert_eq!(st.sort_column(View::Processes), "growth");
    // Unknown growth (no rate for 6161) sorts last, both ways.
    assert_eq!(pids(&st), [5151, 4242, 6161]);
    press(&mut st, &r, &chars("S"));
    assert!(st.is_reversed(View::Processes));
    assert_eq!(pids(&st), [4242, 5151, 6161]);
    let n = View::Processes.sort_columns().len();
    press(&mut st, &r, &chars(&"s".repeat(n)));
    assert_eq!(st.sort_column(View::Processes), "growth");
}

#[test]
fn filter_by_substring_and_by_field() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    let mut keys = vec![Key::Char('/')];
    keys.extend(chars("qwen"));
    keys.push(Key::Enter);
    press(&mut st, &r, &keys);
    assert!(!st.editing);
    assert_eq!(st.file_rows(&r).len(), 1);
    assert_eq!(st.file_rows(&r)[0].path, "/models/qwen2-7b.safetensors");
    // Esc clears the filter first, and only then quits.
    assert_eq!(press(&mut st, &r, &[Key::Esc]), [Action::Redraw]);
    assert!(st.filter.is_empty());

    let mut keys = vec![Key::Char('2'), Key::Char('/')];
    keys.extend(chars("anon>1G"));
    press(&mut st, &r, &keys);
    assert!(
        st.editing,
        "still editing: the filter applies as it is typed"
    );
    let pids: Vec<i32> = st.process_rows(&r).iter().map(|p| p.pid).collect();
    assert_eq!(pids, [5151]);
    press(&mut st, &r, &[Key::Backspace, Key::Backspace, Key::Enter]);
    assert_eq!(st.filter, "anon>");
    // A comparison without its value: not applied, and the state says why.
    assert_eq!(st.process_rows(&r).len(), 3);
    assert_eq!(st.filter_error().as_deref(), Some("'anon>' needs a value"));
    // q while editing is text, not quit.
    let mut st = State::new(View::Files);
    assert_eq!(
        press(&mut st, &r, &[Key::Char('/'), Key::Char('q')]),
        [Action::Redraw, Action::Redraw]
    );
    assert_eq!(st.filter, "q");
}

#[test]
fn an_unknown_value_never_passes_a_comparison() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    st.filter = "count>=1".into();
    let rows = st.file_rows(&r);
    assert_eq!(rows.len(), 1, "the qwen file's count is unknown");
    st.filter = "resident<50".into();
    assert!(st.file_rows(&r).is_empty());
    st.view = View::Processes;
    st.filter = "pss<3G".into();
    let pids: Vec<i32> = st.process_rows(&r).iter().map(|p| p.pid).collect();
    assert_eq!(pids, [4242]);
}

#[test]
fn filter_parses_sizes_numbers_and_text() {
    assert_eq!(
        Filter::parse("anon>1G"),
        Ok(Filter::Compare {
            field: "anon".into(),
            cmp: Cmp::Gt,
            value: (1u64 << 30) as f64
        })
    );
    assert_eq!(
        Filter::parse(" count >= 2 "),
        Ok(Filter::Compare {
            field: "count".into(),
            cmp: Cmp::Ge,
            value: 2.0
        })
    );
    assert_eq!(
        Filter::parse("procs>1"),
        Ok(Filter::Compare {
            field: "procs".into(),
            cmp: Cmp::Gt,
            value: 1.0
        }),
        "a field of the workload rollup"
    );
    assert_eq!(
        Filter::parse("Llama"),
        Ok(Filter::Substring("llama".into()))
    );
    // A path with an operator in it is text to find.
    assert_eq!(
        Filter::parse("/models/a=b"),
        Ok(Filter::Substring("/models/a=b".into()))
    );
}

/// A comparison on no field, or with no number, is an error naming it; the filter is
/// then not applied (every row shows), never taken as text silently.
#[test]
fn a_bad_filter_is_an_error_and_filters_nothing() {
    let r = fixture::report();
    let bogus = Filter::parse("bogus>1x").unwrap_err();
    assert!(bogus.contains("no field 'bogus'"), "{bogus}");
    let value = Filter::parse("anon>1x").unwrap_err();
    assert!(value.contains("'1x' is not a number or a size"), "{value}");
    let mut st = State::new(View::Files);
    let mut keys = vec![Key::Char('/')];
    keys.extend(chars("bogus>1x"));
    keys.push(Key::Enter);
    press(&mut st, &r, &keys);
    assert_eq!(st.filter, "bogus>1x");
    assert_eq!(st.filter_error(), Some(bogus));
    assert_eq!(st.parsed_filter(), None);
    assert_eq!(st.file_rows(&r).len(), r.files.len());
    assert_eq!(st.findings(&r).len(), r.findings.len());
    st.filter = "count>=2".into();
    assert_eq!(st.filter_error(), None);
}

#[test]
fn pause_help_quit_and_replay_steps() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    press(&mut st, &r, &chars(" "));
    assert!(st.paused);
    press(&mut st, &r, &chars(" "));
    assert!(!st.paused);
    press(&mut st, &r, &chars("?"));
    assert!(st.help);
    // Any key closes the help without acting.
    assert_eq!(press(&mut st, &r, &chars("2")), [Action::Redraw]);
    assert!(!st.help);
    assert_eq!(st.view, View::Files);
    assert_eq!(
        press(&mut st, &r, &chars("[]")),
        [Action::Step(-1), Action::Step(1)]
    );
    assert_eq!(press(&mut st, &r, &chars("q")), [Action::Quit]);
    assert_eq!(press(&mut st, &r, &[Key::Interrupt]), [Action::Quit]);
}

#[test]
fn set_sort_finds_the_view_with_the_column() {
    let mut st = State::new(View::Files);
    assert!(st.set_sort("oom"));
    assert_eq!(st.sort_column(View::Cgroups), "oom");
    assert_eq!(st.sort_column(View::Files), "count");
    assert!(!st.set_sort("nonsense"));
}

#[test]
fn excess_is_held_beyond_one_copy() {
    let r = fixture::report();
    let (model, excess) = (r.model_bytes(), r.excess_bytes());
    assert_eq!(model, 4 * (1 << 30) + 512 * (1 << 20));
    // llama: (2.00 - 1) x 4 GiB; qwen: count unknown, adds nothing.
    assert_eq!(excess, 4 * (1 << 30));
}

#[test]
fn t_asks_to_toggle_tracing_in_every_view_but_not_while_filtering() {
    let r = fixture::report();
    for v in View::ALL {
        let mut st = State::new(v);
        assert_eq!(press(&mut st, &r, &chars("t")), vec![Action::ToggleTrace]);
    }
    let mut st = State::new(View::Files);
    let acts = press(&mut st, &r, &chars("/t"));
    assert!(!acts.contains(&Action::ToggleTrace), "{acts:?}");
    assert_eq!(st.filter, "t");
}

#[test]
fn p_on_a_file_without_a_suspect_names_the_file_that_has_one() {
    let r = fixture::report();
    let mut st = State::new(View::Files);
    st.clamp_to(&r);
    // The llama file (no suspected copy) selected; qwen has one.
    let llama = st
        .file_rows(&r)
        .iter()
        .position(|f| f.path.ends_with(".gguf"))
        .unwrap();
    while st.selected(View::Files) < llama {
        press(&mut st, &r, &[Key::Down]);
    }
    let qwen = r.files.iter().find(|f| f.path.contains("qwen")).unwrap();
    let why = st.prove_target(&r).unwrap_err();
    assert_eq!(
        why,
        format!(
            "no suspected copy of 'llama-3-8b.Q4_K_M.gguf' to prove; 'qwen2-7b.safetensors' has one (pid {}): select it",
            qwen.suspected_copies[0].pid
        )
    );
    // On qwen, `p` proves the process the screen shows as suspected.
    let at = st
        .file_rows(&r)
        .iter()
        .position(|f| f.key == qwen.key)
        .unwrap();
    while st.selected(View::Files) < at {
        press(&mut st, &r, &[Key::Down]);
    }
    while st.selected(View::Files) > at {
        press(&mut st, &r, &[Key::Up]);
    }
    assert_eq!(st.prove_target(&r).unwrap().0, qwen.suspected_copies[0].pid);
}
