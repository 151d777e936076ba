//! Whole screens rendered into `TestBackend` at 80x24 and 160x48, compared with insta
//! snapshots (`src/tui/snapshots/`).

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::*;
use crate::tui::fixture;
use crate::tui::state::Key;

fn screen(st: &mut State, report: Option<&Report>, w: u16, h: u16) -> String {
    if let Some(r) = report {
        st.clamp_to(r);
    }
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| draw(f, st, report)).unwrap();
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

#[test]
fn screens() {
    let r = fixture::report();
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        let mut st = state(View::Files);
        insta::assert_snapshot!(format!("files_{w}x{h}"), screen(&mut st, Some(&r), w, h));
        st.handle(Key::Enter);
        st.open_selected(&r);
        insta::assert_snapshot!(
            format!("file_open_{w}x{h}"),
            screen(&mut st, Some(&r), w, h)
        );
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
    // PSS and the growth rate of vllm are unknown.
    assert_eq!(vllm.matches("n/a").count(), 2, "{vllm}");
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
