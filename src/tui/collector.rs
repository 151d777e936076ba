//! The collector thread of `twofold top`: an [`Engine`] snapshot every interval, boxed
//! and sent to the screen, and the requests the screen sends back over a [`Control`]
//! channel: the page-cache map of the file drilled into (`mincore`, see
//! [`crate::collect::residency`]) and the byte-level proof of one process (`p`), run on a
//! thread of its own with a [`Progress`] the screen draws as a gauge and can cancel.
//!
//! A proof asked for with `p` is kept (and merged into every later snapshot, so the row
//! stays proven under `--no-prove`) while the process's `RssAnon` and `rchar` and the
//! file's size are unchanged, as the engine keeps its own proofs.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{read_psi, Update};
use crate::collect::residency;
use crate::dupes::physical::{self, CopyRanges};
use crate::dupes::prove::{self, Progress, ProveOptions};
use crate::engine::{self, Engine, Snapshot};
use crate::model::residency::MapModel;
use crate::sample::{FileKey, ProofSample, Sample};

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
struct Proved {
    pid: i32,
    progress: Arc<Progress>,
    proofs: Vec<(ProofSample, CopyRanges)>,
    warnings: Vec<String>,
    secs: f64,
}

type Fingerprint = (Option<u64>, Option<u64>, Option<u64>);

fn fingerprint(sample: &Sample, pid: i32, file: FileKey) -> Fingerprint {
    let p = sample.processes.iter().find(|p| p.pid == pid);
    (
        p.and_then(|p| p.status.rss_anon_bytes),
        p.and_then(|p| p.rchar_bytes),
        sample
            .files
            .iter()
            .find(|f| f.key == file)
            .and_then(|f| f.size_bytes),
    )
}

/// The page-cache map of `path` (which must still be the file `key`), drawn as `scan
/// --map` draws it.
pub fn residency_map(path: &str, key: FileKey) -> Result<MapModel, String> {
    let p = Path::new(path.strip_suffix(" (deleted)").unwrap_or(path));
    let (file, size) = residency::open(p).map_err(|e| e.to_string())?;
    let same = file
        .metadata()
        .is_ok_and(|m| FileKey::from_dev(m.dev(), m.ino()) == key);
    if !same {
        return Err(format!("'{}' now names another file", p.display()));
    }
    residency::mincore_map(&file, p, size)
        .map(|m| crate::model::residency::draw(&m))
        .map_err(|e| e.to_string())
}

struct Collector {
    engine: Engine,
    proc_root: PathBuf,
    tx: Sender<Box<Update>>,
    prev: Option<Snapshot>,
    open: Option<(FileKey, String)>,
    /// Proofs asked for with `p`, with what they depend on.
    manual: BTreeMap<(i32, FileKey), (Fingerprint, ProofSample, CopyRanges)>,
    done_tx: Sender<Proved>,
}

impl Collector {
    fn send(&self, u: Update) -> bool {
        self.tx.send(Box::new(u)).is_ok()
    }

    fn map_update(&self) -> Option<(FileKey, Result<MapModel, String>)> {
        let (key, path) = self.open.as_ref()?;
        Some((*key, residency_map(path, *key)))
    }

    /// Adds the kept `p` proofs to a fresh sample (where the engine has no complete one).
    fn merge_manual(&mut self, sample: &mut Sample) {
        self.manual.retain(|(pid, file), (fp, _, _)| {
            sample
                .candidates
                .iter()
                .any(|c| c.pid == *pid && c.file == *file)
                && fingerprint(sample, *pid, *file) == *fp
        });
        let mut merged = false;
        for ((pid, file), (_, proof, _)) in &self.manual {
            let have = sample
                .proofs
                .iter()
                .position(|p| p.pid == *pid && p.file == *file);
            match have {
                Some(i) if sample.proofs[i].unsearched.is_none() => continue,
                Some(i) => sample.proofs[i] = proof.clone(),
                None => sample.proofs.push(proof.clone()),
            }
            merged = true;
        }
        // One physical copy once, the merged proofs included: weighed again together.
        if merged {
            let ranges: Vec<CopyRanges> = sample
                .proofs
                .iter()
                .map(|p| match self.manual.get(&(p.pid, p.file)) {
                    Some((_, m, r)) if m == p => r.clone(),
                    _ => self.engine.copy_ranges(p.pid, p.file),
                })
                .collect();
            physical::weigh(&self.engine.roots.proc, &mut sample.proofs, &ranges);
        }
    }

    fn collect(&mut self) -> bool {
        let mut warnings = Vec::new();
        let report = match self.engine.snapshot(&mut warnings) {
            Ok(mut snap) => {
                self.merge_manual(&mut snap.sample);
                let r = engine::report(&snap, self.prev.as_ref());
                self.prev = Some(snap);
                Some(Box::new(r))
            }
            Err(e) => {
                warnings.insert(0, format!("collection failed: {e:#}"));
                None
            }
        };
        self.send(Update {
            report,
            warnings: Some(warnings),
            psi: read_psi(&self.proc_root),
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
        let pending = Sample {
            candidates: snap
                .sample
                .candidates
                .iter()
                .filter(|c| c.pid == pid)
                .cloned()
                .collect(),
            ..snap.sample.clone()
        };
        if pending.candidates.is_empty() {
            progress.cancel();
            return self.send(Update {
                status: Some(format!(
                    "pid {pid} is not a candidate for a copy: nothing to prove"
                )),
                proof_done: Some(pid),
                ..Update::default()
            });
        }
        let roots = self.engine.roots.clone();
        let done = self.done_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("twofold-prove".into())
            .spawn(move || {
                let started = Instant::now();
                let mut warnings = Vec::new();
                let opts = ProveOptions {
                    budget: None,
                    exact: false,
                };
                let proofs =
                    prove::prove_found(&roots, &pending, opts, Some(&progress), &mut warnings)
                        .into_iter()
                        .map(|p| {
                            let r = CopyRanges::of(p.sample.file, &p.found);
                            (p.sample, r)
                        })
                        .collect();
                let _ = done.send(Proved {
                    pid,
                    progress,
                    proofs,
                    warnings,
                    secs: started.elapsed().as_secs_f64(),
                });
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

    fn finish_proof(&mut self, p: Proved) -> bool {
        if p.progress.cancelled() {
            return self.send(Update {
                status: Some(format!("proof of pid {} cancelled", p.pid)),
                proof_done: Some(p.pid),
                ..Update::default()
            });
        }
        let complete = p.proofs.iter().filter(|q| q.0.unsearched.is_none()).count();
        if let Some(snap) = &self.prev {
            for (q, r) in p.proofs.iter().filter(|q| q.0.unsearched.is_none()) {
                let fp = fingerprint(&snap.sample, q.pid, q.file);
                self.manual
                    .insert((q.pid, q.file), (fp, q.clone(), r.clone()));
            }
        }
        let mut status = format!(
            "proof of pid {} done in {:.1} s: {complete} of {} file(s) searched",
            p.pid,
            p.secs,
            p.proofs.len()
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
    proc_root: PathBuf,
    tx: Sender<Box<Update>>,
    control: Receiver<Control>,
) {
    let (done_tx, done_rx) = mpsc::channel();
    let mut c = Collector {
        engine,
        proc_root,
        tx,
        prev: None,
        open: None,
        manual: BTreeMap::new(),
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
