//! What a probe child process does: one import attempt or one set of arms, described by
//! a [`Job`] the parent serialises, answered by one [`JobResult`] line. Children exist so
//! that a driver that hangs or crashes takes only the child with it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{ArmPlan, Backend, Fake};
use crate::mapping::MappingKind;
use crate::types::{ArmsReport, BackendKind, ImportMethod, ImportOutcome, ImportStatus};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Job {
    /// Map the first `bytes` of `file` and import them once.
    Import {
        backend: BackendKind,
        device: usize,
        file: PathBuf,
        bytes: u64,
        method: ImportMethod,
        #[serde(default)]
        mapping: MappingKind,
        fake: Option<Fake>,
    },
    /// Map the first `bytes` of `file` and run the arms of `plan` over them.
    Arms {
        backend: BackendKind,
        device: usize,
        file: PathBuf,
        bytes: u64,
        plan: ArmPlan,
        fake: Option<Fake>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "kebab-case")]
pub enum JobResult {
    Import(ImportOutcome),
    Arms(ArmsReport),
    Error(String),
}

/// The backend of that kind (the fake with its configuration, or the default fake).
pub fn backend(kind: BackendKind, fake: Option<Fake>) -> Box<dyn Backend> {
    match kind {
        BackendKind::Vulkan => Box::new(crate::vulkan::VulkanBackend),
        BackendKind::Cuda => Box::new(crate::cuda::CudaBackend),
        BackendKind::Fake => Box::new(fake.unwrap_or_default()),
    }
}

/// The mapping every job reads unless told otherwise.
pub const MAPPING: &str = "shared-read-only";

/// Where a child reads its own memory counters.
const SELF_STATUS: &str = "/proc/self/status";

/// RssAnon and RssFile of this process, bytes.
fn rss() -> Option<(i64, i64)> {
    let text = std::fs::read_to_string(SELF_STATUS).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("RssAnon:")?, field("RssFile:")?))
}

/// Runs `job`. `residency(file, bytes)` returns the fraction of the first `bytes` of
/// `file` in the page cache (the caller's cachestat).
pub fn run(job: &Job, residency: &dyn Fn(&Path, u64) -> Option<f64>) -> JobResult {
    match job {
        Job::Import {
            backend: kind,
            device,
            file,
            bytes,
            method,
            mapping,
            fake,
        } => {
            let map = match crate::mapping::map(file, *bytes, *mapping) {
                Ok(m) => m,
                Err(e) => return JobResult::Error(format!("cannot map '{}': {e}", file.display())),
            };
            let before = rss();
            let t = Instant::now();
            let r = backend(*kind, fake.clone()).try_import(*device, &map, *method);
            let seconds = t.elapsed().as_secs_f64();
            let after = rss();
            let delta = |f: fn((i64, i64)) -> i64| Some(f(after?) - f(before?));
            JobResult::Import(ImportOutcome {
                method: *method,
                mapping: mapping.name().into(),
                anon_bytes_delta: delta(|r| r.0),
                file_bytes_delta: delta(|r| r.1),
                bytes: *bytes,
                status: if r.is_ok() {
                    ImportStatus::Ok
                } else {
                    ImportStatus::Failed
                },
                error: r.err(),
                seconds,
            })
        }
        Job::Arms {
            backend: kind,
            device,
            file,
            bytes,
            plan,
            fake,
        } => {
            let map = match crate::mapping::map_shared_read_only(file, *bytes) {
                Ok(m) => m,
                Err(e) => return JobResult::Error(format!("cannot map '{}': {e}", file.display())),
            };
            let mut observe = |_| residency(file, *bytes);
            match backend(*kind, fake.clone()).run_arms(*device, &map, plan, &mut observe) {
                Ok(r) => JobResult::Arms(r),
                Err(e) => JobResult::Error(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Arm;

    #[test]
    fn fake_jobs_round_trip_through_json() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, vec![3u8; 1 << 16]).unwrap();
        let data = std::fs::read(&file).unwrap();
        let job = Job::Arms {
            backend: BackendKind::Fake,
            device: 0,
            file: file.clone(),
            bytes: 1 << 16,
            plan: ArmPlan {
                order: Arm::ALL.to_vec(),
                warmup: 0,
                passes: 2,
                expected: crate::checksum::of(&data, 0),
                range_limit: None,
                import_limit: None,
                chunk_bytes: 4096,
                references: false,
            },
            fake: None,
        };
        let text = serde_json::to_string(&job).unwrap();
        let back: Job = serde_json::from_str(&text).unwrap();
        assert_eq!(back, job);
        let JobResult::Arms(r) = run(&back, &|_, _| Some(1.0)) else {
            panic!("not arms");
        };
        assert!(r.runs.iter().all(|a| a.checksums_ok));
        let imp = Job::Import {
            backend: BackendKind::Fake,
            device: 0,
            file,
            bytes: 1 << 17,
            method: ImportMethod::Fake,
            mapping: MappingKind::SharedReadOnly,
            fake: None,
        };
        assert!(matches!(run(&imp, &|_, _| None), JobResult::Error(e) if e.contains("fewer")));
    }
}
