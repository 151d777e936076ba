//! Uploads to GPUs in `trace`'s view: per file and process, the model-file bytes a
//! process uploaded (matched by content, [`crate::sample::uploads`]), its calls, the rate
//! and the GPUs it holds memory on; per process, every host-to-device copy it made.
//!
//! An interval's rows hold what changed since the sample before (rows without a new copy
//! are left out) and rates over the interval; the summary holds the totals since attach
//! and rates over each row's own span, first to last copy (`None` for a single instant).

use serde::{Deserialize, Serialize};

use super::TraceContext;
use crate::sample::trace::TraceSample;
use crate::sample::uploads::{FileUpload, UploadProcess};
use crate::sample::FileKey;

/// One process's uploads of one model file (one form: as is, or widened to F32).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileUploadTrace {
    pub path: Option<String>,
    pub key: FileKey,
    pub pid: i32,
    pub comm: String,
    /// The device holds the F16/BF16 → F32 widening of the file's bytes.
    pub widened: bool,
    /// The dtype conversion the device holds (`None`: the file's bytes as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<crate::sample::converted::Conversion>,
    /// Bytes of the file uploaded since attach (merged file ranges).
    pub file_bytes: u64,
    /// Device bytes written: in the interval (the summary: since attach).
    pub device_bytes: u64,
    /// Copies: in the interval (the summary: since attach).
    pub calls: u64,
    /// `device_bytes` per second (see the module doc).
    pub bytes_per_sec: Option<f64>,
    /// GPUs the process holds memory on (NVML; empty: none, or NVML unavailable).
    pub gpus: Vec<u32>,
    /// The entry point of its last copy.
    pub entry: String,
}

/// One process's host-to-device copies, model bytes or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessUploadTrace {
    pub pid: i32,
    pub comm: String,
    /// Copies and their bytes: in the interval (the summary: since attach).
    pub calls: u64,
    pub bytes: u64,
    /// Of them, bytes matched to a model file.
    pub model_bytes: u64,
    pub bytes_per_sec: Option<f64>,
    pub gpus: Vec<u32>,
}

fn wanted(ctx: &TraceContext, pid: i32, file: Option<FileKey>) -> bool {
    (ctx.pids.is_empty() || ctx.pids.contains(&pid))
        && file.is_none_or(|f| ctx.files.is_empty() || ctx.files.contains(&f))
}

/// Bytes per second over `secs`; over the span first to last for the summary.
fn per_sec(bytes: u64, interval: Option<f64>, first_ns: u64, last_ns: u64) -> Option<f64> {
    let secs = match interval {
        Some(s) => s,
        None => last_ns.saturating_sub(first_ns) as f64 / 1e9,
    };
    (secs > 0.0).then(|| bytes as f64 / secs)
}

/// The per-file rows of `cur` (changes since `prev` when given, over `secs`).
pub fn file_uploads(
    cur: &TraceSample,
    prev: Option<&TraceSample>,
    ctx: &TraceContext,
    secs: f64,
) -> Vec<FileUploadTrace> {
    let Some(u) = cur.uploads.as_ref() else {
        return Vec::new();
    };
    let before = |f: &FileUpload| {
        prev.and_then(|p| p.uploads.as_ref())
            .and_then(|p| {
                p.uploads.iter().find(|b| {
                    (b.pid, b.file, b.widened, b.conversion)
                        == (f.pid, f.file, f.widened, f.conversion)
                })
            })
            .map_or((0, 0), |b| (b.device_bytes, b.copies))
    };
    let mut rows: Vec<FileUploadTrace> = u
        .uploads
        .iter()
        .filter(|f| wanted(ctx, f.pid, Some(f.file)))
        .filter_map(|f| {
            let (b0, c0) = before(f);
            let calls = f.copies.saturating_sub(c0);
            if prev.is_some() && calls == 0 {
                return None;
            }
            let device_bytes = f.device_bytes.saturating_sub(b0);
            let p = u.processes.iter().find(|p| p.pid == f.pid);
            Some(FileUploadTrace {
                path: ctx.paths.get(&f.file).cloned(),
                key: f.file,
                pid: f.pid,
                comm: p.map(|p| p.comm.clone()).unwrap_or_default(),
                widened: f.widened,
                conversion: f.conversion,
                file_bytes: f.file_bytes,
                device_bytes,
                calls,
                bytes_per_sec: per_sec(
                    device_bytes,
                    prev.map(|_| secs),
                    f.first_unix_ns,
                    f.last_unix_ns,
                ),
                gpus: p.map(|p| p.gpus.clone()).unwrap_or_default(),
                entry: f.entry.clone(),
            })
        })
        .collect();
    rows.sort_by(|a, b| b.device_bytes.cmp(&a.device_bytes).then(a.pid.cmp(&b.pid)));
    rows
}

/// The per-process rows of `cur` (changes since `prev` when given, over `secs`).
pub fn process_uploads(
    cur: &TraceSample,
    prev: Option<&TraceSample>,
    ctx: &TraceContext,
    secs: f64,
) -> Vec<ProcessUploadTrace> {
    let Some(u) = cur.uploads.as_ref() else {
        return Vec::new();
    };
    let before = |p: &UploadProcess| {
        prev.and_then(|s| s.uploads.as_ref())
            .and_then(|s| s.processes.iter().find(|b| b.pid == p.pid))
            .map_or((0, 0, 0), |b| (b.copies, b.copy_bytes, b.model_bytes))
    };
    let mut rows: Vec<ProcessUploadTrace> = u
        .processes
        .iter()
        .filter(|p| wanted(ctx, p.pid, None) && p.copies > 0)
        .filter_map(|p| {
            let (c0, b0, m0) = before(p);
            let calls = p.copies.saturating_sub(c0);
            if prev.is_some() && calls == 0 {
                return None;
            }
            let bytes = p.copy_bytes.saturating_sub(b0);
            Some(ProcessUploadTrace {
                pid: p.pid,
                comm: p.comm.clone(),
                calls,
                bytes,
                model_bytes: p.model_bytes.saturating_sub(m0),
                bytes_per_sec: per_sec(
                    bytes,
                    prev.map(|_| secs),
                    p.first_copy_unix_ns,
                    p.last_copy_unix_ns,
                ),
                gpus: p.gpus.clone(),
            })
        })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::uploads::UploadsSample;

    fn at(secs: f64, copies: u64, bytes: u64) -> TraceSample {
        let file = FileKey::from_dev(1, 2);
        TraceSample {
            at_secs: secs,
            uploads: Some(UploadsSample {
                processes: vec![UploadProcess {
                    pid: 7,
                    comm: "python3".into(),
                    copies: copies + 1,
                    copy_bytes: bytes + 100,
                    model_bytes: bytes,
                    first_copy_unix_ns: 1_000_000_000,
                    last_copy_unix_ns: 3_000_000_000,
                    gpus: vec![0],
                    ..UploadProcess::default()
                }],
                uploads: vec![FileUpload {
                    pid: 7,
                    file,
                    ranges: vec![(8, 8 + bytes)],
                    file_bytes: bytes,
                    device_bytes: bytes,
                    copies,
                    first_unix_ns: 1_000_000_000,
                    last_unix_ns: 3_000_000_000,
                    entry: "cuMemcpyHtoDAsync_v2".into(),
                    ..FileUpload::default()
                }],
                ..UploadsSample::default()
            }),
            ..TraceSample::default()
        }
    }

    #[test]
    fn intervals_hold_what_changed_and_the_summary_the_totals() {
        let ctx = TraceContext::default();
        let (a, b) = (at(1.0, 2, 4 << 20), at(3.0, 6, 12 << 20));
        let i = file_uploads(&b, Some(&a), &ctx, 2.0);
        assert_eq!((i[0].calls, i[0].device_bytes), (4, 8 << 20));
        assert_eq!(i[0].bytes_per_sec, Some((4 << 20) as f64));
        assert_eq!((i[0].file_bytes, i[0].gpus.clone()), (12 << 20, vec![0]));
        let s = file_uploads(&b, None, &ctx, 3.0);
        // Since attach, over the span first to last copy (2 s).
        assert_eq!((s[0].calls, s[0].device_bytes), (6, 12 << 20));
        assert_eq!(s[0].bytes_per_sec, Some((6 << 20) as f64));
        let p = process_uploads(&b, Some(&a), &ctx, 2.0);
        assert_eq!(
            (p[0].calls, p[0].bytes, p[0].model_bytes),
            (4, 8 << 20, 8 << 20)
        );
        // Nothing new: no row in the interval.
        assert!(file_uploads(&b, Some(&b), &ctx, 2.0).is_empty());
        assert!(process_uploads(&b, Some(&b), &ctx, 2.0).is_empty());
        // Another process asked for: none.
        let only = TraceContext {
            pids: vec![8],
            ..TraceContext::default()
        };
        assert!(file_uploads(&b, None, &only, 3.0).is_empty());
    }
}
