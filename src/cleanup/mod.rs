//! Undo on interruption, and after a `kill -9`.
//!
//! What a command creates (temp dirs, cgroups, child processes) goes through a
//! [`Registry`]: a child is started, a cgroup or temp dir created, under its lock, so a
//! signal never falls between the creation and the registration. On SIGINT, SIGTERM or
//! SIGHUP the signal handler sets a flag (read by [`interrupted`]) and a signal thread
//! closes the registry (nothing new is created), SIGKILLs the children through pidfds
//! ([`pidfd`]: a reaped child's pid, reused by another process, is never signalled), reaps
//! them, kills what is left in each cgroup and removes it once it is empty, removes the
//! temp dirs, says in one line what it removed (or could not), and exits with 128 + the
//! signal. The main thread, which may meanwhile fail because its children died or finish
//! its report, asks [`interrupted`] and waits for that exit ([`wait_if_interrupted`]).
//!
//! Children get `PR_SET_PDEATHSIG` = SIGKILL between fork and exec, so they die with
//! twofold even after a `kill -9`; cgroups and temp dirs are named after their owner
//! ([`leftovers::owner_tag`]) and the next campaign removes them ([`leftovers::sweep`]).

pub mod leftovers;
pub mod pidfd;

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use anyhow::Context;

pub use leftovers::{owner_tag, remove_cgroup_within};
use pidfd::PidFd;

fn flag() -> &'static Arc<AtomicUsize> {
    static FLAG: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    FLAG.get_or_init(Default::default)
}

/// The registry the signal thread undoes, once [`Registry::install`] ran.
static GLOBAL: OnceLock<Registry> = OnceLock::new();

/// The signal that interrupted this process, if any (set in the signal handler itself).
pub fn interrupted() -> Option<i32> {
    match flag().load(Ordering::SeqCst) {
        0 => None,
        s => Some(s as i32),
    }
}

/// An error that says the run was interrupted, if it was.
pub fn check_interrupted() -> anyhow::Result<()> {
    match interrupted() {
        Some(sig) => anyhow::bail!("interrupted by {}", signal_name(sig)),
        None => Ok(()),
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        s => format!("signal {s}"),
    }
}

/// Called by `main` once the command returned: if a signal is being handled, wait for the
/// signal thread to finish the cleanup and exit with 128 + the signal (bounded: the
/// thread's waits are).
pub fn wait_if_interrupted() {
    if let Some(sig) = interrupted() {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(128 + sig);
    }
}

/// Makes `cmd`'s process get SIGKILL when the thread that starts it (or twofold) dies,
/// set between fork and exec; a process whose parent already died exits at once.
pub fn die_with_parent(cmd: &mut Command) {
    die_with(cmd, std::process::id() as libc::pid_t);
}

/// Exit status of a child that found its parent gone before it could run.
pub const ORPHAN_EXIT: i32 = 125;

/// [`die_with_parent`] of the given parent pid. A child that finds its parent gone exits
/// quietly with [`ORPHAN_EXIT`] before exec: returning an error from `pre_exec` would make
/// std write it to a pipe nobody reads and abort with `fatal runtime error` on stderr.
fn die_with(cmd: &mut Command, parent: libc::pid_t) {
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid) with plain integers.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died before the prctl: its signal will never come.
            if libc::getppid() != parent {
                libc::_exit(ORPHAN_EXIT);
            }
            Ok(())
        });
    }
}

/// Starts `cmd` as a child that dies with twofold and, once a registry is installed, is
/// killed on interruption. Fails with `ErrorKind::Interrupted` once a signal arrived.
pub fn spawn(cmd: &mut Command) -> io::Result<Child> {
    die_with_parent(cmd);
    match GLOBAL.get() {
        Some(r) => r.spawn(cmd),
        None => cmd.spawn(),
    }
}

/// Forgets a child that was reaped (its pidfd is closed).
pub fn forget(pid: i32) {
    if let Some(r) = GLOBAL.get() {
        r.forget(pid);
    }
}

/// Removes a cgroup (every process in it killed first), retrying for up to 10 s.
pub fn remove_cgroup(dir: &Path) -> io::Result<()> {
    remove_cgroup_within(dir, Duration::from_secs(10))
}

#[derive(Default)]
struct State {
    /// Set by the signal thread: nothing new may be created.
    closed: bool,
    dirs: Vec<PathBuf>,
    children: Vec<PidFd>,
    cgroups: Vec<PathBuf>,
}

/// What [`Registry::undo`] did.
#[derive(Debug, Default)]
pub struct Undone {
    /// Children that were still running when signalled.
    pub killed: usize,
    pub removed: Vec<PathBuf>,
    pub failed: Vec<String>,
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::Interrupted,
        "interrupted: nothing new is started",
    )
}

/// What to undo; cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    state: Arc<Mutex<State>>,
}

impl Registry {
    /// Installs the signal handlers and thread (once per process; later calls return the
    /// same registry), then removes leftovers of earlier runs whose process is gone and says
    /// so in one line on stderr.
    pub fn install() -> anyhow::Result<Registry> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        if let Some(r) = GLOBAL.get() {
            return Ok(r.clone());
        }
        let reg = Registry::default();
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            signal_hook::flag::register_usize(sig, flag().clone(), sig as usize)
                .context("cannot install signal handlers")?;
        }
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .context("cannot install signal handlers")?;
        let undo = reg.clone();
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                flag().store(sig as usize, Ordering::SeqCst);
                let u = undo.undo();
                eprintln!("twofold: {}", describe_interrupt(sig, &u));
                std::process::exit(128 + sig);
            }
        });
        let _ = GLOBAL.set(reg.clone());
        sweep_leftovers(&[]);
        Ok(reg)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `cmd` and tracks it by pidfd, under the lock (see [`spawn`], which also sets
    /// the parent-death signal).
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Child> {
        let mut s = self.lock();
        if s.closed || interrupted().is_some() {
            return Err(closed_error());
        }
        let child = cmd.spawn()?;
        // Not reaped before we return it, so the pid is still this child's.
        if let Ok(fd) = PidFd::open(child.id() as i32) {
            s.children.push(fd);
        }
        Ok(child)
    }

    /// Stops tracking a child (once it is reaped).
    pub fn forget(&self, pid: i32) {
        self.lock().children.retain(|c| c.pid() != pid);
    }

    /// Creates the cgroup directory `dir` and registers it, under the lock.
    pub fn create_cgroup(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.closed || interrupted().is_some() {
            return Err(closed_error());
        }
        std::fs::create_dir(dir)?;
        s.cgroups.push(dir.to_path_buf());
        Ok(())
    }

    /// Creates a temp dir `twofold-OWNER-KIND-XXXXXX` in `parent` (default: the system's
    /// temp dir) and registers it, under the lock.
    pub fn temp_dir(&self, kind: &str, parent: Option<&Path>) -> io::Result<tempfile::TempDir> {
        let mut s = self.lock();
        if s.closed || interrupted().is_some() {
            return Err(closed_error());
        }
        let prefix = format!("twofold-{}-{kind}-", owner_tag());
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        let dir = match parent {
            Some(p) => b.tempdir_in(p)?,
            None => b.tempdir()?,
        };
        s.dirs.push(dir.path().to_path_buf());
        Ok(dir)
    }

    /// Stops tracking a cgroup or dir that was removed.
    pub fn forget_path(&self, path: &Path) {
        let mut s = self.lock();
        s.cgroups.retain(|c| c != path);
        s.dirs.retain(|c| c != path);
    }

    /// Pids of the children tracked now.
    pub fn pids(&self) -> Vec<i32> {
        self.lock().children.iter().map(PidFd::pid).collect()
    }

    /// Closes the registry and undoes everything in it: children SIGKILLed through their
    /// pidfds and reaped, cgroups emptied and removed, dirs removed.
    pub fn undo(&self) -> Undone {
        let mut s = self.lock();
        s.closed = true;
        let mut u = Undone::default();
        for c in &s.children {
            if c.signal(libc::SIGKILL).is_ok() {
                u.killed += 1;
            }
        }
        for c in s.children.drain(..) {
            if c.wait_exited(Duration::from_secs(2)) {
                c.reap();
            }
        }
        for c in std::mem::take(&mut s.cgroups) {
            match remove_cgroup(&c) {
                Ok(()) => u.removed.push(c),
                Err(e) => u.failed.push(format!("cgroup '{}': {e}", c.display())),
            }
        }
        for d in std::mem::take(&mut s.dirs) {
            match std::fs::remove_dir_all(&d) {
                Ok(()) => u.removed.push(d),
                Err(e) if e.kind() == io::ErrorKind::NotFound => u.removed.push(d),
                Err(e) => u.failed.push(format!("'{}': {e}", d.display())),
            }
        }
        u
    }
}

/// The line the signal thread prints.
fn describe_interrupt(sig: i32, u: &Undone) -> String {
    let mut s = format!("interrupted by {}", signal_name(sig));
    if u.failed.is_empty() {
        s.push_str("; removed what this run created");
        if u.killed > 0 || !u.removed.is_empty() {
            s.push_str(&format!(
                " ({} process(es) killed, {} cgroup(s) and dir(s) removed)",
                u.killed,
                u.removed.len()
            ));
        }
    } else {
        s.push_str(&format!("; could not remove {}", u.failed.join(", ")));
    }
    s
}

/// Removes leftovers of earlier runs (cgroups under the live cgroup roots, temp dirs in the
/// system's temp dir and in `extra_temp`) and says so in one line on stderr.
pub fn sweep_leftovers(extra_temp: &[PathBuf]) {
    let roots = crate::collect::Roots::live();
    let cg = [
        roots.cgroup.clone(),
        roots.cgroup.join("memory"),
        roots.cgroup.join("unified"),
    ];
    let mut temp = vec![std::env::temp_dir()];
    temp.extend(extra_temp.iter().cloned());
    let s = leftovers::sweep(&roots.proc, &cg, &temp);
    if let Some(line) = s.describe() {
        eprintln!("{line}");
    }
}

#[cfg(test)]
mod tests;
