//! `twofold top`: the live terminal view of model memory.
//!
//! - [`state`]: pure state (views, selection, sort, filter, pause) and `handle(key) -> Action`,
//!   in the words of [`keys`] (views, keys, actions); [`filter`] parses the filter line and
//!   [`rows`] picks each view's rows; sort keys, filters and columns are fields of the
//!   registry ([`crate::model::fields`]).
//! - [`view`]: widgets that draw a `&State` and a `&Report` into a ratatui `Frame`, with the
//!   tables of [`table`].
//! - here: the event loop, generic over a ratatui [`Backend`] (tests drive it with
//!   `TestBackend`), and the collector thread: it calls the [`Engine`] every interval and
//!   sends each boxed [`Update`] over a channel, so drawing never waits for a collection.
//!
//! Everything on screen comes from the engine's snapshots (memory pressure too: the system
//! sample's PSI). Outside inputs: `getrusage(RUSAGE_SELF)` and `/proc/self/status` `VmRSS`
//! for twofold's own CPU and RSS.

mod cgview;
pub mod collector;
pub mod filter;
#[cfg(test)]
mod fixture;
pub mod groups;
pub mod history;
pub mod keys;
mod mouse;
pub mod rows;
pub mod state;
pub mod table;
pub mod view;
mod widgets;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use ratatui::backend::Backend;
use ratatui::Terminal;

use crate::model::residency::MapModel;
use crate::model::Report;
use crate::sample::FileKey;
pub use collector::{collect_loop, Control};
pub use state::{Action, Key, Psi, State, View};

/// What a collection (or a replay step, or a finished proof) hands the screen.
#[derive(Debug, Default)]
pub struct Update {
    /// `None` when there is no new report (a collection failed: the warnings say why; or
    /// the update only carries a map or a proof's end); the last report stays.
    pub report: Option<Box<Report>>,
    /// The warnings of the collection; `None` keeps the last ones.
    pub warnings: Option<Vec<crate::sample::Warning>>,
    /// Replaces [`State::source`] when set (the replay position).
    pub source: Option<String>,
    /// The page-cache map of the open file (`Err`: why it is unknown).
    pub map: Option<(FileKey, Result<MapModel, String>)>,
    /// A line for the status bar (a proof's outcome, damage found in a recording).
    pub status: Option<String>,
    /// The proof of this pid (started with `p`) has ended.
    pub proof_done: Option<i32>,
    /// Whether eBPF tracing is on now (after `t`).
    pub tracing: Option<bool>,
}

impl Update {
    /// `self` then `newer`: what `newer` carries wins, what it lacks is kept.
    pub fn merge(self, newer: Update) -> Update {
        Update {
            report: newer.report.or(self.report),
            warnings: newer.warnings.or(self.warnings),
            source: newer.source.or(self.source),
            map: newer.map.or(self.map),
            status: newer.status.or(self.status),
            proof_done: newer.proof_done.or(self.proof_done),
            tracing: newer.tracing.or(self.tracing),
        }
    }
}

/// Keys from the terminal (crossterm), or from a script in tests.
pub trait Input {
    /// The next key, waiting at most `timeout`; `None` if none came.
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<Key>>;
}

/// Where updates come from: the collector's channel, or a recording.
pub trait Feed {
    /// The newest update ready now, if any (never blocks).
    fn poll(&mut self) -> Option<Update>;
    /// Replay only: the snapshot `delta` steps away.
    fn step(&mut self, _delta: i32) -> Option<Update> {
        None
    }
    /// Live only: a request to the collector; `false` where there is none (replay).
    fn control(&mut self, _c: Control) -> bool {
        false
    }
}

/// The live feed: the collector's updates, and the control channel to it.
pub struct Live {
    pub updates: Receiver<Box<Update>>,
    pub control: Sender<Control>,
}

impl Feed for Live {
    fn poll(&mut self) -> Option<Update> {
        let mut all: Option<Update> = None;
        while let Ok(u) = self.updates.try_recv() {
            all = Some(match all {
                Some(a) => a.merge(*u),
                None => *u,
            });
        }
        all
    }

    fn control(&mut self, c: Control) -> bool {
        self.control.send(c).is_ok()
    }
}

fn apply(state: &mut State, report: &mut Option<Box<Report>>, u: Update) {
    if let Some(r) = u.report {
        state.history.record(&r);
        state.psi = r.system.pressure;
        *report = Some(r);
    }
    if let Some(w) = u.warnings {
        state.warnings = w;
    }
    if let Some(s) = u.source {
        state.source = s;
    }
    if let Some(m) = u.map {
        state.map = Some(m);
    }
    if let Some(s) = u.status {
        state.status = Some(s);
    }
    if let Some(on) = u.tracing {
        state.tracing = on;
    }
    if let Some(pid) = u.proof_done {
        if state.proving.as_ref().is_some_and(|p| p.pid == pid) {
            state.proving = None;
        }
    }
}

/// Own CPU (percent of one core, since the last call) and RSS.
pub struct SelfUsage {
    last: Option<(Instant, Duration)>,
}

impl SelfUsage {
    pub fn new() -> SelfUsage {
        SelfUsage { last: None }
    }

    fn cpu_time() -> Option<Duration> {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct we pass; RUSAGE_SELF is always valid.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: zero-initialised and filled by the successful call above.
        let u = unsafe { u.assume_init() };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        Some(tv(u.ru_utime) + tv(u.ru_stime))
    }

    /// `(cpu percent, rss bytes)`; the percent is `None` on the first call.
    pub fn sample(&mut self, proc_root: &Path) -> (Option<f64>, Option<u64>) {
        let now = Instant::now();
        let cpu = Self::cpu_time();
        let pct = match (self.last, cpu) {
            (Some((t0, c0)), Some(c1)) => {
                let wall = now.duration_since(t0).as_secs_f64();
                (wall > 0.0).then(|| c1.saturating_sub(c0).as_secs_f64() / wall * 100.0)
            }
            _ => None,
        };
        if let Some(c) = cpu {
            self.last = Some((now, c));
        }
        let rss = std::fs::read_to_string(proc_root.join("self/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024);
        (pct, rss)
    }
}

impl Default for SelfUsage {
    fn default() -> Self {
        Self::new()
    }
}

/// The event loop: draws when something changed, takes keys, swaps in new reports (unless
/// paused) and returns on quit or when `stop` is set (a signal).
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    state: &mut State,
    input: &mut dyn Input,
    feed: &mut dyn Feed,
    stop: &AtomicBool,
) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut report: Option<Box<Report>> = None;
    let mut pending: Option<Update> = None;
    let mut usage = SelfUsage::new();
    let mut usage_at: Option<Instant> = None;
    let proc_root = Path::new("/proc");
    let mut dirty = true;
    let mut open_sent: Option<FileKey> = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some(u) = feed.poll() {
            pending = Some(u);
        }
        let mut applied = false;
        if !state.paused {
            if let Some(u) = pending.take() {
                apply(state, &mut report, u);
                dirty = true;
                applied = true;
            }
        }
        // twofold's own CPU and RSS are taken with each report, so that both show in one
        // draw (a draw is a fair part of `top`'s own cost), or every two seconds without
        // one (paused, or a collection that takes long).
        let usage_due = usage_at.map(|t| t.elapsed()).is_none_or(|e| {
            (applied && e >= Duration::from_millis(500)) || e >= Duration::from_secs(2)
        });
        if usage_due {
            let (cpu, rss) = usage.sample(proc_root);
            if cpu.is_some() || usage_at.is_none() {
                state.own_cpu_percent = cpu;
                state.own_rss_bytes = rss;
                dirty = true;
            }
            usage_at = Some(Instant::now());
        }
        // The gauge moves while a proof runs.
        dirty |= state.proving.is_some();
        if state.open != open_sent {
            open_sent = state.open;
            let path = open_sent.and_then(|k| {
                let r = report.as_ref()?;
                Some((k, r.files.iter().find(|f| f.key == k)?.path.clone()))
            });
            feed.control(Control::Open(path));
        }
        if dirty {
            if let Some(r) = &report {
                state.clamp_to(r);
            }
            let mut hits = state::Hits::default();
            terminal.draw(|f| hits = view::draw(f, state, report.as_deref()))?;
            state.hits = hits;
            dirty = false;
        }
        let Some(key) = input.next(Duration::from_millis(200))? else {
            continue;
        };
        match state.handle(key) {
            Action::Quit => break,
            Action::None => {}
            Action::Redraw => dirty = true,
            Action::Open => {
                if let Some(r) = &report {
                    state.open_selected(r);
                }
                dirty = true;
            }
            Action::Fold => {
                if let Some(r) = &report {
                    state.fold_selected(r);
                }
                dirty = true;
            }
            Action::Prove => {
                start_proof(state, report.as_deref(), feed);
                dirty = true;
            }
            Action::ToggleTrace => {
                let on = !state.tracing;
                state.status = Some(if feed.control(Control::Tracing(on)) {
                    format!("turning tracing {}…", if on { "on" } else { "off" })
                } else {
                    "tracing can only be turned on live, not in a replay".into()
                });
                dirty = true;
            }
            Action::CancelProve => {
                if let Some(p) = state.proving.take() {
                    p.progress.cancel();
                    state.status = Some(format!("cancelling the proof of pid {}", p.pid));
                }
                dirty = true;
            }
            Action::Step(d) => {
                if let Some(u) = feed.step(d) {
                    pending = None;
                    apply(state, &mut report, u);
                    dirty = true;
                }
            }
        }
    }
    if let Some(p) = state.proving.take() {
        p.progress.cancel();
    }
    Ok(())
}

/// `p`: asks the collector to prove the selected suspected copy's process.
fn start_proof(state: &mut State, report: Option<&Report>, feed: &mut dyn Feed) {
    let Some(r) = report else { return };
    match state.prove_target(r) {
        Err(why) => state.status = Some(why),
        Ok((pid, comm)) => {
            let progress = std::sync::Arc::new(crate::engine::Progress::default());
            let sent = feed.control(Control::Prove {
                pid,
                progress: progress.clone(),
            });
            if sent {
                state.status = Some(format!("proving pid {pid} ({comm})…"));
                state.proving = Some(state::Proving {
                    pid,
                    comm,
                    progress,
                });
            } else {
                state.status = Some("p proves live memory: not in a replay".into());
            }
        }
    }
}
