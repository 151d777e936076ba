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
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (open, write, close) on memory prepared before the fork.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
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
        let child = cmd
            .spawn()
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
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
