//! Starting `twofold __child` reader processes and tearing them down.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Makes `cmd`'s process move itself into the cgroup whose `cgroup.procs` file is given,
/// between fork and exec, so that all its memory is charged there.
pub fn enter_cgroup(cmd: &mut Command, procs: &Path) -> anyhow::Result<()> {
    let c_path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes())
        .context("cgroup path contains a NUL byte")?;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (open, write, close, getppid, _exit) on memory prepared before the fork.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            // A parent SIGKILLed after the fork (its cgroup already swept): exit quietly,
            // as an error here would abort with "fatal runtime error" on a closed pipe.
            if libc::getppid() != parent {
                libc::_exit(crate::cleanup::ORPHAN_EXIT);
            }
            let fd = libc::open(c_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // "0" moves the writing process itself.
            let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != 2 {
                return Err(err);
            }
            Ok(())
        });
    }
    Ok(())
}

/// A running reader; killed and reaped on drop.
#[derive(Debug)]
pub struct Reader {
    child: Child,
}

impl Reader {
    /// Starts `exe __child MODE [FILE] [ARGS...]` and waits until it reports `ready`.
    pub fn start(
        exe: &Path,
        mode: &str,
        file: Option<&Path>,
        extra: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<Reader> {
        Self::start_in(exe, mode, file, extra, timeout, None)
    }

    /// Like [`Reader::start`], first moving the child into the cgroup whose
    /// `cgroup.procs` file is given, before it executes (so all its memory is charged
    /// there).
    pub fn start_in(
        exe: &Path,
        mode: &str,
        file: Option<&Path>,
        extra: &[&str],
        timeout: Duration,
        cgroup_procs: Option<&Path>,
    ) -> anyhow::Result<Reader> {
        let mut cmd = Command::new(exe);
        if let Some(procs) = cgroup_procs {
            enter_cgroup(&mut cmd, procs)?;
        }
        cmd.arg("__child").arg(mode);
        if let Some(f) = file {
            cmd.arg(f);
        }
        cmd.args(extra);
        let (reader, line) = Self::spawn(cmd, timeout)?;
        if line.trim() != "ready" {
            bail!(
                "reader pid {} said '{}' instead of 'ready'",
                reader.pid(),
                line.trim()
            );
        }
        Ok(reader)
    }

    /// Starts any command that prints one line once it is set up and then waits for its
    /// stdin to close; returns the reader and that line.
    pub fn spawn(mut cmd: Command, timeout: Duration) -> anyhow::Result<(Reader, String)> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = crate::cleanup::spawn(&mut cmd)
            .with_context(|| format!("cannot start '{:?}'", cmd.get_program()))?;
        let mut reader = Reader { child };
        let line = reader.first_line(timeout)?;
        Ok((reader, line))
    }

    fn first_line(&mut self, timeout: Duration) -> anyhow::Result<String> {
        let stdout = self.child.stdout.take().context("child has no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let ok = BufReader::new(stdout).read_line(&mut line).is_ok() && !line.is_empty();
            let _ = tx.send(ok.then_some(line));
        });
        let start = Instant::now();
        match rx.recv_timeout(timeout) {
            Ok(Some(line)) => Ok(line),
            Ok(None) => bail!("reader pid {} exited before it was ready", self.child.id()),
            Err(_) => bail!(
                "reader pid {} not ready after {:?}",
                self.child.id(),
                start.elapsed()
            ),
        }
    }

    /// Whether the process is still running (not killed, e.g. by the OOM killer).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Writes one line to the child's stdin (a `--drift` copier zeroes its copy on it).
    pub fn say(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the child's stdin is closed"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        if self.child.wait().is_ok() {
            // Reaped: its pid may be reused from now on.
            crate::cleanup::forget(self.pid());
        }
    }
}

/// Where one reader of a [`Barrier`] is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Starting,
    Armed,
    Released(Instant),
    Ready(Instant),
    Gone,
}

/// Readers started with `--go`: each sets itself up, says `armed` and waits; once all are
/// armed, [`Barrier::release`] lets them go back to back, and [`Barrier::wait_ready`]
/// times each from its release to its `ready`.
pub struct Barrier {
    readers: Vec<Reader>,
    stages: Vec<Stage>,
    lines: std::sync::mpsc::Receiver<(usize, Option<String>, Instant)>,
}

impl Barrier {
    /// Starts `n` readers `exe __child MODE [FILE] [ARGS...] --go` (inside the cgroup whose
    /// `cgroup.procs` file is given) and waits until each is armed or gone. Stops starting
    /// readers (and fails) as soon as a signal interrupts the run.
    pub fn arm(
        exe: &Path,
        mode: &str,
        file: Option<&Path>,
        extra: &[&str],
        n: usize,
        cgroup_procs: Option<&Path>,
        timeout: Duration,
    ) -> anyhow::Result<Barrier> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut readers = Vec::with_capacity(n);
        for i in 0..n {
            crate::cleanup::check_interrupted()?;
            let mut cmd = Command::new(exe);
            if let Some(procs) = cgroup_procs {
                enter_cgroup(&mut cmd, procs)?;
            }
            cmd.arg("__child").arg(mode);
            if let Some(f) = file {
                cmd.arg(f);
            }
            cmd.args(extra)
                .arg("--go")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = crate::cleanup::spawn(&mut cmd)
                .with_context(|| format!("cannot start '{}'", exe.display()))?;
            let stdout = child.stdout.take().context("child has no stdout")?;
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut out = BufReader::new(stdout);
                loop {
                    let mut line = String::new();
                    let got = out.read_line(&mut line).is_ok_and(|k| k > 0);
                    let msg = got.then(|| line.trim().to_string());
                    if tx.send((i, msg, Instant::now())).is_err() || !got {
                        return;
                    }
                }
            });
            readers.push(Reader { child });
        }
        let mut b = Barrier {
            stages: vec![Stage::Starting; n],
            readers,
            lines: rx,
        };
        b.wait_while(timeout, |s| s == Stage::Starting)?;
        Ok(b)
    }

    /// Takes lines until no reader is in a stage that `waiting` accepts, or `timeout`.
    fn wait_while(
        &mut self,
        timeout: Duration,
        waiting: impl Fn(Stage) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.stages.iter().any(|s| waiting(*s)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((i, line, at)) = self.lines.recv_timeout(left) else {
                let late = self.stages.iter().filter(|s| waiting(**s)).count();
                bail!("{late} reader(s) still not done after {timeout:?}");
            };
            self.stages[i] = match (self.stages[i], line.as_deref()) {
                (_, None) => Stage::Gone,
                (Stage::Starting, Some("armed")) => Stage::Armed,
                (Stage::Released(_), Some("ready")) => Stage::Ready(at),
                (_, Some(other)) => bail!(
                    "reader pid {} said '{other}' out of turn",
                    self.readers[i].pid()
                ),
            };
        }
        Ok(())
    }

    pub fn pids(&self) -> Vec<i32> {
        self.readers.iter().map(Reader::pid).collect()
    }

    /// Releases every armed reader, back to back; the instant of each release (`None` for
    /// one that never armed or died since).
    pub fn release(&mut self) -> Vec<Option<Instant>> {
        use std::io::Write;
        let mut out = vec![None; self.readers.len()];
        for (i, r) in self.readers.iter_mut().enumerate() {
            if self.stages[i] != Stage::Armed {
                continue;
            }
            let Some(stdin) = r.child.stdin.as_mut() else {
                continue;
            };
            let at = Instant::now();
            if stdin.write_all(b"\n").and_then(|()| stdin.flush()).is_ok() {
                self.stages[i] = Stage::Released(at);
                out[i] = Some(at);
            }
        }
        out
    }

    /// Waits until every released reader is ready or gone; the instant each said `ready`.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<Vec<Option<Instant>>> {
        self.wait_while(timeout, |s| matches!(s, Stage::Released(_)))?;
        Ok(self
            .stages
            .iter()
            .map(|s| match s {
                Stage::Ready(at) => Some(*at),
                _ => None,
            })
            .collect())
    }

    /// The readers (killed and reaped when dropped).
    pub fn into_readers(self) -> Vec<Reader> {
        self.readers
    }
}
