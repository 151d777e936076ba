//! `twofold top`: the terminal set up (raw mode, alternate screen) and restored on every
//! way out (return, panic, SIGTERM/SIGINT/SIGHUP), the collector thread or the replayed
//! store, and [`crate::tui::run`] over crossterm.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event, KeyCode, KeyEventKind, KeyModifiers,
    MouseButton, MouseEventKind,
};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use crate::cli::{TopArgs, TopView};
use crate::collect::cache;
use crate::collect::gather::Request;
use crate::dupes::prove::ProveOptions;
use crate::engine::{self, Engine};
use crate::store::Store;
use crate::tui::{self, Feed, Input, Key, State, Update, View};

/// Puts the terminal back as it was (idempotent: Drop and the panic hook both call it).
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = crossterm::execute!(
        std::io::stdout(),
        DisableMouseCapture,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

/// Restores the terminal when dropped.
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

fn setup() -> anyhow::Result<Guard> {
    terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
    let guard = Guard;
    crossterm::execute!(
        std::io::stdout(),
        EnterAlternateScreen,
        EnableMouseCapture,
        crossterm::cursor::Hide
    )?;
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    Ok(guard)
}

struct Keys;

impl Input for Keys {
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<Key>> {
        if !event::poll(timeout)? {
            return Ok(None);
        }
        Ok(match event::read()? {
            Event::Resize(..) => Some(Key::Resize),
            Event::Mouse(m) => match m.kind {
                MouseEventKind::Down(MouseButton::Left) => Some(Key::Click(m.column, m.row)),
                MouseEventKind::ScrollUp => Some(Key::WheelUp),
                MouseEventKind::ScrollDown => Some(Key::WheelDown),
                _ => None,
            },
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
                match k.code {
                    KeyCode::Char('c') if ctrl => Some(Key::Interrupt),
                    KeyCode::Char(c) => Some(Key::Char(c)),
                    KeyCode::Enter => Some(Key::Enter),
                    KeyCode::Esc => Some(Key::Esc),
                    KeyCode::Tab => Some(Key::Tab),
                    KeyCode::BackTab => Some(Key::BackTab),
                    KeyCode::Up => Some(Key::Up),
                    KeyCode::Down => Some(Key::Down),
                    KeyCode::Left => Some(Key::Left),
                    KeyCode::Right => Some(Key::Right),
                    KeyCode::PageUp => Some(Key::PageUp),
                    KeyCode::PageDown => Some(Key::PageDown),
                    KeyCode::Home => Some(Key::Home),
                    KeyCode::End => Some(Key::End),
                    KeyCode::Backspace => Some(Key::Backspace),
                    _ => None,
                }
            }
            _ => None,
        })
    }
}

/// A recording stepped through with `[` and `]`. Damage the store finds (a torn tail, a
/// bad frame) goes to the status line, never to stderr over the screen.
struct Replay {
    store: Store,
    at_ns: u64,
    first: bool,
    /// Damage found when the store was opened.
    damage: Vec<String>,
}

/// `N problem(s) in the recording: FIRST`, or `None`.
fn damage_line(lines: &[String]) -> Option<String> {
    let first = lines.first()?;
    Some(format!(
        "{} problem(s) in the recording: {first}",
        lines.len()
    ))
}

impl Replay {
    fn load(&mut self, at_ns: u64) -> Update {
        let mut damage = std::mem::take(&mut self.damage);
        let loaded = super::record::replayed_quiet(&self.store, at_ns, &mut damage);
        let status = damage_line(&damage);
        match loaded {
            Ok(r) => {
                self.at_ns = r.at_unix_ns.unwrap_or(at_ns);
                Update {
                    report: Some(Box::new(r)),
                    warnings: Some(damage),
                    source: Some(format!("replay {}", crate::timespec::format(self.at_ns))),
                    status,
                    ..Update::default()
                }
            }
            Err(e) => Update {
                warnings: Some(vec![format!("{e:#}")]),
                status: Some(format!("{e:#}")),
                ..Update::default()
            },
        }
    }
}

impl Feed for Replay {
    fn poll(&mut self) -> Option<Update> {
        if !std::mem::take(&mut self.first) {
            return None;
        }
        Some(self.load(self.at_ns))
    }

    fn step(&mut self, delta: i32) -> Option<Update> {
        let frame = if delta < 0 {
            self.store.before(self.at_ns).ok()??
        } else {
            self.store
                .range(self.at_ns.saturating_add(1), u64::MAX)
                .next()?
                .ok()?
        };
        Some(self.load(frame.at_ns))
    }
}

fn request(args: &TopArgs) -> Request {
    Request {
        paths: args.paths.clone(),
        pids: args.pids.clone(),
        min_size: args.min_size,
        stores: args.paths.is_empty(),
        candidates: true,
        ..Request::default()
    }
}

pub fn run(args: &TopArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("top needs a terminal on stdout (use 'twofold scan' or 'record' otherwise)");
    }
    let mut state = State::new(match args.view {
        TopView::Files => View::Files,
        TopView::Processes => View::Processes,
        TopView::Cgroups => View::Cgroups,
    });
    state.interval_secs = args.interval.as_secs_f64();
    state.color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    if let Some(s) = &args.sort {
        if !state.set_sort(s) {
            bail!("no view has a column '{s}' to sort by (see docs/top.md)");
        }
    }
    if let Some(f) = &args.filter {
        state.filter = f.clone();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())
            .context("cannot install the signal handlers")?;
    }
    // A signal must end the process even when the screen cannot be restored (a hung-up
    // terminal whose writes block): 3 s after it, exit regardless.
    {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("twofold-stop-watchdog".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                std::thread::sleep(Duration::from_secs(3));
                std::process::exit(0);
            })
            .context("cannot start the stop watchdog")?;
    }
    // Open the recording before the screen changes: its errors read as any other.
    let mut feed: Box<dyn Feed> = match &args.replay {
        Some(dir) => {
            let at =
                crate::timespec::parse(&args.at, engine::now().0).map_err(anyhow::Error::msg)?;
            let (store, damage) = super::record::open_read_quiet(&Some(dir.clone()))?;
            state.source = "replay".into();
            Box::new(Replay {
                store,
                at_ns: at,
                first: true,
                damage,
            })
        }
        None => {
            let prove = (!args.no_prove).then_some(ProveOptions {
                budget: Some(args.prove_budget),
                exact: false,
            });
            let engine = Engine::new(request(args), prove).incremental(cache::MAX_AGE);
            let (tx, rx) = std::sync::mpsc::channel();
            // Dropping the control sender (with the feed) stops the collector at its next
            // wait; it also stops when the screen hangs up its channel.
            let (control, control_rx) = std::sync::mpsc::channel();
            let interval = args.interval;
            std::thread::Builder::new()
                .name("twofold-collect".into())
                .spawn(move || tui::collect_loop(engine, interval, "/proc".into(), tx, control_rx))
                .context("cannot start the collector thread")?;
            Box::new(tui::Live {
                updates: rx,
                control,
            })
        }
    };
    let guard = setup()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    terminal.clear()?;
    let result = tui::run(&mut terminal, &mut state, &mut Keys, feed.as_mut(), &stop);
    drop(guard);
    if stop.load(Ordering::Relaxed) {
        // A signal: the screen is restored; a clean stop.
        return Ok(());
    }
    result
}
