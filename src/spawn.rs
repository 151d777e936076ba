//! Starting `twofold __child` reader processes and tearing them down.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

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
        let mut cmd = Command::new(exe);
        cmd.arg("__child").arg(mode);
        if let Some(f) = file {
            cmd.arg(f);
        }
        cmd.args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start '{}'", exe.display()))?;
        let mut reader = Reader { child };
        reader.wait_ready(timeout)?;
        Ok(reader)
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let stdout = self.child.stdout.take().context("child has no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let ok = BufReader::new(stdout).read_line(&mut line).is_ok();
            let _ = tx.send(ok && line.trim() == "ready");
        });
        let start = Instant::now();
        match rx.recv_timeout(timeout) {
            Ok(true) => Ok(()),
            Ok(false) => bail!(
                "reader pid {} exited before it was ready",
                self.child.id()
            ),
            Err(_) => bail!(
                "reader pid {} not ready after {:?}",
                self.child.id(),
                start.elapsed()
            ),
        }
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
