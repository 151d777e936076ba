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
use crate::engine::{self, Engine};
use crate::sample::{Warning, WarningKind};
use crate::store::Store;
use crate::tui::{self, Feed, Input, Key, State, Update, View};

use super::common;

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

/// Keys from the terminal. crossterm 0.29 spins at 100% CPU inside `event::poll` once
/// its tty hangs up (its read loop retries EOF and EIO forever), so the wait happens here,
/// in `poll(2)` on the terminal, and a hang-up (`POLLHUP`/`POLLERR`) ends `top` before
/// crossterm reads again.
#[derive(Default)]
struct Keys {
    hung_up: bool,
}

/// The terminal crossterm reads keys from: stdin when it is one, else `/dev/tty`, which
/// stdout (checked to be a terminal) stands for.
fn tty_fd() -> std::os::fd::RawFd {
    if std::io::stdin().is_terminal() {
        0
    } else {
        1
    }
}

impl Keys {
    /// Waits up to `timeout` for input: `Ok(true)` when some is there, `Ok(false)` on a
    /// timeout or a signal, an error once the terminal hung up.
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let mut fds = [libc::pollfd {
            fd: tty_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, its length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(e).context("cannot wait for the terminal");
        }
        if fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            self.hung_up = true;
            bail!("the terminal hung up");
        }
        Ok(n > 0 && fds[0].revents & libc::POLLIN != 0)
    }
}

impl Input for Keys {
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<Key>> {
        // Events crossterm already parsed (one read may hold several), then the terminal.
        self.wait(Duration::ZERO)?;
        let ready =
            event::poll(Duration::ZERO)? || (self.wait(timeout)? && event::poll(Duration::ZERO)?);
        if !ready {
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

/// What the store said of itself, as a warning of its own (each sentence its own subject).
fn store_warning(text: String) -> Warning {
    Warning::new(WarningKind::StoreDamaged, text.clone(), text)
}

impl Replay {
    fn load(&mut self, at_ns: u64) -> Update {
        let mut damage = std::mem::take(&mut self.damage);
        let loaded = common::replayed_quiet(&self.store, at_ns, &mut damage);
        let status = damage_line(&damage);
        match loaded {
            Ok(r) => {
                self.at_ns = r.at_unix_ns.unwrap_or(at_ns);
                Update {
                    report: Some(Box::new(r)),
                    warnings: Some(damage.into_iter().map(store_warning).collect()),
                    source: Some(format!("replay {}", crate::timespec::format(self.at_ns))),
                    status,
                    ..Update::default()
                }
            }
            Err(e) => Update {
                warnings: Some(vec![store_warning(format!("{e:#}"))]),
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

pub fn run(args: &TopArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    crate::engine::one_heap();
    // Bad paths and pids end here with exit 2, as in `scan`, not on a screen that waits
    // for a first snapshot that never comes.
    crate::input::check_targets(&args.selection.paths, &args.selection.pids)?;
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
        // Refused here, as a bad --sort is, not shown as "not applied" on a screen.
        crate::tui::filter::Filter::parse(f).map_err(|e| anyhow::anyhow!("--filter '{f}': {e}"))?;
        state.filter = f.clone();
    }
    if !std::io::stdout().is_terminal() {
        bail!("top needs a terminal on stdout (use 'twofold scan' or 'record' otherwise)");
    }
    crate::collect::stop::watch_signals(&[signal_hook::consts::SIGHUP]);
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
            let (store, damage) = common::open_read_quiet(&Some(dir.clone()))?;
            state.source = "replay".into();
            state.replay = true;
            Box::new(Replay {
                store,
                at_ns: at,
                first: true,
                damage,
            })
        }
        None => {
            let req = args.collect.request(&args.selection);
            let engine = Engine::new(req, args.collect.proof()).incremental(cache::MAX_AGE);
            let (tx, rx) = std::sync::mpsc::channel();
            // Dropping the control sender (with the feed) stops the collector at its next
            // wait; it also stops when the screen hangs up its channel.
            let (control, control_rx) = std::sync::mpsc::channel();
            let interval = args.interval;
            std::thread::Builder::new()
                .name("twofold-collect".into())
                .spawn(move || tui::collect_loop(engine, interval, tx, control_rx))
                .context("cannot start the collector thread")?;
            Box::new(tui::Live {
                updates: rx,
                control,
            })
        }
    };
    let guard = setup()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    // Cleared without `Terminal::clear`, which first asks the terminal where its cursor is
    // and fails where nothing answers (a pseudo-terminal of a script): the alternate screen
    // has no cursor to keep.
    crossterm::execute!(
        terminal.backend_mut(),
        terminal::Clear(terminal::ClearType::All)
    )?;
    let mut keys = Keys::default();
    let result = tui::run(&mut terminal, &mut state, &mut keys, feed.as_mut(), &stop);
    drop(guard);
    if stop.load(Ordering::Relaxed) || keys.hung_up {
        // A signal or a hang-up: the screen is restored (or gone); a clean stop.
        return Ok(());
    }
    result
}
