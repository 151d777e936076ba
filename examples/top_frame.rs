//! Frame time of `twofold top` (draw only): one live report of FILE (the bench
//! workload's processes and files), drawn over and over into ratatui's `TestBackend` for
//! each view at 160x48 and 80x24; prints the median and p99 per view in microseconds.
//! `cargo run --release --example top_frame -- FILE [FRAMES]`

use std::time::Instant;

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use twofold::collect::gather::Request;
use twofold::engine::{self, Engine};
use twofold::tui::{view, State, View};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 2, "usage: top_frame FILE [FRAMES]");
    let frames: usize = args.get(2).map_or(Ok(500), |s| s.parse())?;
    let req = Request {
        paths: vec![args[1].clone().into()],
        stores: false,
        candidates: true,
        ..Request::default()
    };
    let mut engine = Engine::new(req, None);
    let mut w = Vec::new();
    let first = engine.snapshot(&mut w)?;
    let snap = engine.snapshot(&mut w)?;
    let report = engine::report(&snap, Some(&first));
    println!(
        "report: {} processes, {} files, {} cgroups",
        report.processes.len(),
        report.files.len(),
        report.cgroups.len()
    );
    println!("| screen | view | median µs | p99 µs |\n|---|---|---|---|");
    for (wd, ht) in [(160u16, 48u16), (80, 24)] {
        for (name, view, open) in [
            ("files", View::Files, false),
            ("file drill-down", View::Files, true),
            ("processes", View::Processes, false),
            ("cgroups", View::Cgroups, false),
        ] {
            let mut st = State::new(view);
            // A full session of sparkline points.
            let mut r = report.clone();
            for i in 0..twofold::tui::history::RING as u64 {
                r.at_unix_ns = Some(i);
                st.history.record(&r);
            }
            st.clamp_to(&report);
            if open {
                st.open_selected(&report);
            }
            let mut term = Terminal::new(TestBackend::new(wd, ht))?;
            let mut times = Vec::with_capacity(frames);
            for _ in 0..frames {
                let t = Instant::now();
                term.draw(|f| {
                    view::draw(f, &st, Some(&report));
                })?;
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "| {wd}x{ht} | {name} | {:.0} | {:.0} |",
                times[frames / 2],
                times[frames * 99 / 100]
            );
        }
    }
    Ok(())
}
