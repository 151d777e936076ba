//! The collector thread of `twofold top`: an [`Engine`] snapshot every interval, boxed
//! and sent to the screen, and the requests the screen sends back over a [`Control`]
//! channel, which the engine serves: the page-cache map of the file drilled into
//! ([`Engine::residency_map`]) and the byte-level proof of one process (`p`,
//! [`Engine::prove_now`]), run on a thread of its own with a [`Progress`] the screen draws
//! as a gauge and can cancel. The engine keeps a proof asked for with `p` and merges it
//! into later snapshots ([`Engine::keep_proved`]); nothing is collected or proved here.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Update;
use crate::engine::{self, Engine, Progress, Proved, Snapshot};
use crate::model::residency::MapModel;
use crate::sample::FileKey;

/// What the screen asks of the collector.
#[derive(Debug)]
pub enum Control {
    /// The file drilled into (its page-cache map is sent with every collection), or none.
    Open(Option<(FileKey, String)>),
    /// Search this process's memory for copies of the files it is a candidate for.
    Prove { pid: i32, progress: Arc<Progress> },
    /// `t`: eBPF tracing on or off (the engine attaches or detaches its programs).
    Tracing(bool),
}

/// A proof's end, from its thread to the collector.
struct Done {
    progress: Arc<Progress>,
    proved: Proved,
}

struct Collector {
    engine: Engine,
    tx: Sender<Box<Update>>,
    prev: Option<Snapshot>,
    open: Option<(FileKey, String)>,
    done_tx: Sender<Done>,
}

impl Collector {
    fn send(&self, u: Update) -> bool {
        self.tx.send(Box::new(u)).is_ok()
    }

    fn map_update(&self) -> Option<(FileKey, Result<MapModel, String>)> {
        let (key, path) = self.open.as_ref()?;
        Some((*key, self.engine.residency_map(path, *key)))
    }

    fn collect(&mut self) -> bool {
        let mut warnings = Vec::new();
        let report = match self.engine.snapshot(&mut warnings) {
            Ok(snap) => {
                let t0 = crate::collect::thread_cpu();
                let r = engine::report(&snap, self.prev.as_ref());
                if std::env::var_os("TWOFOLD_PROFILE").is_some() {
                    let used = crate::collect::thread_cpu().saturating_sub(t0);
                    eprintln!("cpu: report {:.1} ms", used.as_secs_f64() * 1e3);
                }
                self.prev = Some(snap);
                Some(Box::new(r))
            }
            Err(e) => {
                warnings.insert(
                    0,
                    crate::sample::Warning::host(
                        crate::sample::WarningKind::CollectionFailed,
                        format!("collection failed: {e:#}"),
                    ),
                );
                None
            }
        };
        self.send(Update {
            report,
            warnings: Some(warnings),
            map: self.map_update(),
            ..Update::default()
        })
    }

    fn start_proof(&mut self, pid: i32, progress: Arc<Progress>) -> bool {
        let Some(snap) = &self.prev else {
            return self.send(Update {
                status: Some("no snapshot yet to prove from".into()),
                proof_done: Some(pid),
                ..Update::default()
            });
        };
        let job = match self.engine.prove_now(pid, snap) {
            Ok(job) => job,
            Err(why) => {
                progress.cancel();
                return self.send(Update {
                    status: Some(why),
                    proof_done: Some(pid),
                    ..Update::default()
                });
            }
        };
        let done = self.done_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("twofold-prove".into())
            .spawn(move || {
                let proved = job.run(&progress);
                let _ = done.send(Done { progress, proved });
            });
        match spawned {
            Ok(_) => true,
            Err(e) => self.send(Update {
                status: Some(format!("cannot start the proof: {e}")),
                proof_done: Some(pid),
                ..Update::default()
            }),
        }
    }

    fn finish_proof(&mut self, d: Done) -> bool {
        let p = d.proved;
        if d.progress.cancelled() {
            return self.send(Update {
                status: Some(format!("proof of pid {} cancelled", p.pid)),
                proof_done: Some(p.pid),
                ..Update::default()
            });
        }
        if let Some(snap) = &self.prev {
            self.engine.keep_proved(&p, snap);
        }
        let (complete, files) = p.complete();
        let mut status = format!(
            "proof of pid {} done in {:.1} s: {complete} of {files} file(s) searched",
            p.pid, p.secs,
        );
        if let Some(w) = p.warnings.first() {
            status.push_str(&format!(" ({w})"));
        }
        // The fresh report (with the proof merged) first, then the end of the proof.
        self.collect()
            && self.send(Update {
                status: Some(status),
                proof_done: Some(p.pid),
                ..Update::default()
            })
    }
}

/// The collector thread's body: a snapshot every `interval` until `control` hangs up
/// (or the screen does). Each one is boxed and sent; the report has rates from the one
/// before.
pub fn collect_loop(
    engine: Engine,
    interval: Duration,
    tx: Sender<Box<Update>>,
    control: Receiver<Control>,
) {
    let (done_tx, done_rx) = mpsc::channel();
    let mut c = Collector {
        engine,
        tx,
        prev: None,
        open: None,
        done_tx,
    };
    // A finished proof is noticed within this long.
    let slice = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        if !c.collect() {
            return;
        }
        // At least one pass over the requests and finished proofs, even when the
        // collection took longer than the interval.
        loop {
            let left = interval.saturating_sub(started.elapsed());
            let got = if left.is_zero() {
                match control.try_recv() {
                    Ok(c) => Ok(c),
                    Err(mpsc::TryRecvError::Empty) => Err(RecvTimeoutError::Timeout),
                    Err(mpsc::TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                }
            } else {
                control.recv_timeout(left.min(slice))
            };
            let alive = match got {
                Ok(Control::Open(o)) => {
                    c.open = o;
                    let map = c.map_update();
                    map.is_none()
                        || c.send(Update {
                            map,
                            ..Update::default()
                        })
                }
                Ok(Control::Prove { pid, progress }) => c.start_proof(pid, progress),
                Ok(Control::Tracing(on)) => {
                    let status = match c.engine.set_tracing(on) {
                        Ok(()) if on => "tracing on: rates appear from the next collection".into(),
                        Ok(()) => "tracing off".into(),
                        Err(why) => format!("tracing unavailable: {why}"),
                    };
                    c.send(Update {
                        status: Some(status),
                        tracing: Some(c.engine.tracing()),
                        ..Update::default()
                    })
                }
                Err(RecvTimeoutError::Timeout) => true,
                Err(RecvTimeoutError::Disconnected) => false,
            };
            if !alive {
                return;
            }
            if let Ok(p) = done_rx.try_recv() {
                if !c.finish_proof(p) {
                    return;
                }
            }
            if left.is_zero() {
                break;
            }
        }
    }
}
