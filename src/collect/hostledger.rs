//! One upload tracer per host: a resident tracer (`serve --trace-uploads`, `record
//! --trace-uploads`) keeps its upload ledger in [`ledger_dir`] (`/run/twofold/uploads` as
//! root), where every other twofold process of the host reads it ([`read_host`]): a plain
//! `scan`, `top` or `replay` hours after a model was loaded proves its device copies
//! without a tracing window of its own.
//!
//! The directory is root's alone (mode 0700, files 0600), as the attestations of
//! `gpu::attest_dir` are. A ledger file (`uploads-PID-sSTART.json`, at most
//! [`MAX_LEDGER_BYTES`]) is written whole and renamed into place, and removed when its
//! tracer stops ([`Publisher`]'s drop; one a killed tracer left is removed by the next
//! tracer that starts). It is valid only while its tracer runs with the
//! start time it names; each process row, upload and clone in it only while that process
//! runs with the start time the tracer saw (a pid used again is another process).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sample::uploads::{ResidentTracer, UploadsSample};

/// The largest ledger written or read.
pub const MAX_LEDGER_BYTES: u64 = 16 << 20;

/// Where resident tracers keep their ledgers: `TWOFOLD_UPLOADS_DIR`, else
/// `/run/twofold/uploads` as root, else `$XDG_RUNTIME_DIR/twofold/uploads`.
pub fn ledger_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TWOFOLD_UPLOADS_DIR") {
        return PathBuf::from(d);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/twofold/uploads");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("twofold/uploads"),
        None => std::env::temp_dir().join(format!("twofold-{}/uploads", nix::unistd::geteuid())),
    }
}

/// A ledger file: who wrote it, and what it traced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Published {
    pub pid: i32,
    /// Field 22 of its `/proc/PID/stat`.
    pub start_ticks: u64,
    pub command: String,
    pub written_unix_ns: u64,
    pub ledger: UploadsSample,
}

/// The ledger file of a resident tracer; removed when dropped.
pub struct Publisher {
    path: PathBuf,
    pid: i32,
    start_ticks: u64,
    command: String,
}

impl Publisher {
    /// Makes `dir` (root's alone) and names this process's ledger file in it.
    pub fn create(dir: &Path, proc_root: &Path, command: &str) -> std::io::Result<Publisher> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let pid = std::process::id() as i32;
        let start_ticks = super::process::start_time(proc_root, pid).unwrap_or(0);
        remove_stale(dir, proc_root);
        Ok(Publisher {
            path: dir.join(format!("uploads-{pid}-s{start_ticks}.json")),
            pid,
            start_ticks,
            command: command.to_string(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `ledger` whole (to a temporary file renamed over the last one). A ledger
    /// over [`MAX_LEDGER_BYTES`] is written without its file ranges (the bytes stay); one
    /// still over it is not written (`Err` says so).
    pub fn write(&self, ledger: &UploadsSample) -> std::io::Result<()> {
        let mut p = Published {
            pid: self.pid,
            start_ticks: self.start_ticks,
            command: self.command.clone(),
            written_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64,
            ledger: ledger.clone(),
        };
        let mut body = serde_json::to_vec(&p).map_err(std::io::Error::other)?;
        if body.len() as u64 > MAX_LEDGER_BYTES {
            p.ledger.uploads.iter_mut().for_each(|u| u.ranges.clear());
            p.ledger.clones.iter_mut().for_each(|c| c.ranges.clear());
            body = serde_json::to_vec(&p).map_err(std::io::Error::other)?;
        }
        if body.len() as u64 > MAX_LEDGER_BYTES {
            return Err(std::io::Error::other(format!(
                "the upload ledger is {} bytes, more than the {MAX_LEDGER_BYTES} other twofold processes read",
                body.len()
            )));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&body)?;
        drop(f);
        std::fs::rename(&tmp, &self.path)
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("tmp"));
        // The directory too, when no other tracer's ledger is in it.
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes the ledgers of tracers that no longer run (killed with SIGKILL: nothing removed
/// theirs); named `uploads-PID-sSTART.json`.
fn remove_stale(dir: &Path, proc_root: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("uploads-"))
            .and_then(|n| n.strip_suffix(".json").or_else(|| n.strip_suffix(".tmp")))
        else {
            continue;
        };
        let Some((pid, ticks)) = rest.split_once("-s") else {
            continue;
        };
        if let (Ok(pid), Ok(ticks)) = (pid.parse::<i32>(), ticks.parse::<u64>()) {
            if !lives(proc_root, pid, Some(ticks)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Whether `pid` runs with start time `ticks` (`None`: not known, only that it runs).
fn lives(proc_root: &Path, pid: i32, ticks: Option<u64>) -> bool {
    match (ticks, super::process::start_time(proc_root, pid)) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(a), Some(b)) => a == b,
    }
}

/// The ledger of a resident tracer of this host, if one runs (the one tracing since the
/// earliest time; `own` is left out), holding only processes that still run as the
/// tracer saw them, and naming its tracer.
pub fn read_host(dir: &Path, proc_root: &Path, own: i32) -> Option<UploadsSample> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut found: Vec<Published> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text =
                crate::input::read_bounded(&e.path(), "upload ledger", MAX_LEDGER_BYTES).ok()?;
            serde_json::from_slice::<Published>(&text).ok()
        })
        .filter(|p| p.pid != own && lives(proc_root, p.pid, Some(p.start_ticks)))
        .collect();
    found.sort_by_key(|p| (p.ledger.since_unix_ns, p.pid));
    let p = found.into_iter().next()?;
    let mut l = p.ledger;
    let alive: std::collections::BTreeSet<i32> = l
        .processes
        .iter()
        .filter(|r| lives(proc_root, r.pid, r.start_ticks))
        .map(|r| r.pid)
        .collect();
    l.processes.retain(|r| alive.contains(&r.pid));
    l.uploads.retain(|u| alive.contains(&u.pid));
    l.clones.retain(|c| alive.contains(&c.pid));
    l.registrations.retain(|r| alive.contains(&r.pid));
    l.tracer = Some(ResidentTracer {
        pid: p.pid,
        command: p.command,
        written_unix_ns: p.written_unix_ns,
    });
    Some(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::uploads::{FileUpload, UploadProcess};

    /// A ledger is read while its writer runs; rows of processes that exited (or whose pid
    /// another process took) are left out; the file goes when its writer drops it.
    #[test]
    fn a_ledger_holds_the_living_and_goes_with_its_tracer() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = Path::new("/proc");
        let me = std::process::id() as i32;
        let ticks = super::super::process::start_time(proc_root, me);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let other = child.id() as i32;
        let row = |pid, start_ticks| UploadProcess {
            pid,
            start_ticks,
            ..UploadProcess::default()
        };
        let up = |pid| FileUpload {
            pid,
            file_bytes: 10,
            ..FileUpload::default()
        };
        let ledger = UploadsSample {
            since_unix_ns: 5,
            processes: vec![row(me, ticks), row(other, Some(1)), row(999_999_999, None)],
            uploads: vec![up(me), up(other), up(999_999_999)],
            ..UploadsSample::default()
        };
        // A ledger its tracer left (killed: nothing removed it) goes when a tracer starts.
        std::fs::create_dir(dir.path().join("u")).unwrap();
        let stale = dir.path().join("u/uploads-999999999-s5.json");
        std::fs::write(&stale, b"{}").unwrap();
        let p = Publisher::create(&dir.path().join("u"), proc_root, "record").unwrap();
        assert!(!stale.exists());
        p.write(&ledger).unwrap();
        // This process wrote it: another one reads it (here: as if it were another).
        assert!(read_host(&dir.path().join("u"), proc_root, me).is_none());
        let l = read_host(&dir.path().join("u"), proc_root, 0).unwrap();
        assert_eq!(l.processes.iter().map(|r| r.pid).collect::<Vec<_>>(), [me]);
        assert_eq!(l.uploads.len(), 1);
        let t = l.tracer.unwrap();
        assert_eq!((t.pid, t.command.as_str()), (me, "record"));
        let path = p.path().to_path_buf();
        assert!(path.exists());
        drop(p);
        assert!(!path.exists());
        assert!(
            !dir.path().join("u").exists(),
            "an empty ledger directory goes too"
        );
        assert!(read_host(&dir.path().join("u"), proc_root, 0).is_none());
        let _ = child.kill();
        let _ = child.wait();
    }
}
