//! Probe children: `twofold probe __job JSON` runs one [`Job`] and prints one
//! [`JobResult`] line; the parent waits for it with a timeout and reports a child that
//! does not answer as a hang (a driver stuck pinning pages), one that dies as a crash.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use twofold_probes::job::{self, Job, JobResult};

use crate::cleanup::Registry;
use crate::collect::residency;

/// Why a child gave no result.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Killed after the timeout.
    Hang(Duration),
    /// Exited without a result line.
    Crashed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Hang(d) => write!(f, "no answer within {}s: killed (hang)", d.as_secs()),
            Failure::Crashed(why) => write!(f, "the probe process died: {why}"),
        }
    }
}

/// Fraction of the first `len` bytes of `path` in the page cache.
pub fn resident_fraction(path: &Path, len: u64) -> Option<f64> {
    let (file, ..) = residency::open(path).ok()?;
    let bytes = residency::resident_prefix(&file, path, len).ok()?;
    Some(if len == 0 {
        1.0
    } else {
        bytes as f64 / len as f64
    })
}

/// The child side: runs the job, prints its result.
pub fn child(json: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and changes only this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let job: Job = serde_json::from_str(json).context("cannot parse the probe job")?;
    let result = job::run(&job, &resident_fraction);
    serde_json::to_writer(&mut *out, &result)?;
    writeln!(out)?;
    Ok(())
}

/// Where NVRTC usually lives when it is not on the loader's path.
const CUDA_LIB_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
];

fn library_path() -> Option<String> {
    let mut parts: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .ok()
        .map(|v| v.split(':').map(String::from).collect())
        .unwrap_or_default();
    for d in CUDA_LIB_DIRS {
        if Path::new(d).is_dir() && !parts.iter().any(|p| p == d) {
            parts.push(d.to_string());
        }
    }
    (!parts.is_empty()).then(|| parts.join(":"))
}

/// Runs `job` in a child process of `exe`, killed after `timeout`.
pub fn spawn(
    exe: &PathBuf,
    job: &Job,
    timeout: Duration,
    cleanup: &Registry,
) -> anyhow::Result<Result<JobResult, Failure>> {
    let json = serde_json::to_string(job)?;
    let mut cmd = Command::new(exe);
    cmd.args(["probe", "__job", &json])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(lp) = library_path() {
        cmd.env("LD_LIBRARY_PATH", lp);
    }
    crate::cleanup::die_with_parent(&mut cmd);
    let mut child = cleanup
        .spawn(&mut cmd)
        .with_context(|| format!("cannot start '{}'", exe.display()))?;
    let mut stdout = child.stdout.take().context("child has no stdout")?;
    let mut stderr = child.stderr.take().context("child has no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let text = match rx.recv_timeout(timeout) {
        Ok(t) => t,
        Err(_) => {
            let _ = child.kill();
            // A child stuck in the kernel (pinning pages) may not die at once: give it a
            // moment, then leave it rather than hang ourselves.
            for _ in 0..50 {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            return Ok(Err(Failure::Hang(timeout)));
        }
    };
    let status = child.wait().context("cannot wait for the probe process")?;
    cleanup.forget(child.id() as i32);
    let err = err_thread.join().unwrap_or_default();
    let line = text.lines().rev().find(|l| l.starts_with('{'));
    match line.map(serde_json::from_str::<JobResult>) {
        Some(Ok(r)) => Ok(Ok(r)),
        _ => {
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Ok(Err(Failure::Crashed(format!(
                "{status}{}",
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(": {}", tail.join(" | "))
                }
            ))))
        }
    }
}
