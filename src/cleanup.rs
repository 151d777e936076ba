//! Undo on interruption: what a command created (temp dirs, child processes) is
//! registered here; on SIGINT, SIGTERM or SIGHUP a signal thread kills the children,
//! removes the directories and exits with 128 + the signal. The main thread, which may be
//! failing meanwhile because its children died, asks [`interrupted`] and waits for that
//! exit instead of reporting an error of its own.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// The signal that interrupted this process, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Called by `main` on error: if a signal is being handled, wait for the signal thread to
/// finish the cleanup and exit.
pub fn wait_if_interrupted() {
    if let Some(sig) = interrupted() {
        std::thread::sleep(Duration::from_secs(10));
        std::process::exit(128 + sig);
    }
}

#[derive(Default)]
struct State {
    dirs: Vec<PathBuf>,
    pids: Vec<i32>,
    cgroups: Vec<PathBuf>,
}

/// Kills every process in a cgroup and removes it (best effort, bounded in time).
pub fn remove_cgroup(dir: &std::path::Path) {
    // Up to 10 s: a large process can take a while to free its memory.
    for _ in 0..1000 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What to undo; cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    state: Arc<Mutex<State>>,
}

impl Registry {
    /// Installs the signal thread.
    pub fn install() -> anyhow::Result<Registry> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let reg = Registry::default();
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .context("cannot install signal handlers")?;
        let state = reg.state.clone();
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                INTERRUPTED.store(sig, Ordering::SeqCst);
                if let Ok(s) = state.lock() {
                    for pid in &s.pids {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(*pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    for d in &s.dirs {
                        let _ = std::fs::remove_dir_all(d);
                    }
                    for c in &s.cgroups {
                        remove_cgroup(c);
                    }
                }
                eprintln!("twofold: interrupted; removed what this run created");
                std::process::exit(128 + sig);
            }
        });
        Ok(reg)
    }

    pub fn add_dir(&self, dir: PathBuf) {
        if let Ok(mut s) = self.state.lock() {
            s.dirs.push(dir);
        }
    }

    pub fn add_cgroup(&self, dir: PathBuf) {
        if let Ok(mut s) = self.state.lock() {
            s.cgroups.push(dir);
        }
    }

    pub fn add_pid(&self, pid: i32) {
        if let Ok(mut s) = self.state.lock() {
            s.pids.push(pid);
        }
    }
}
