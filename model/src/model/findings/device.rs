//! Findings about device copies of a file.

use super::*;

/// Device copies: proven ones (twofold's loaders) and suspected ones (NVML sizes), with the
/// facts the placement verdict is written from (discrete or integrated GPU).
pub(super) fn device_findings(f: &FileModel, out: &mut Vec<Finding>) {
    for d in &f.device_copies {
        out.push(finding(
            if d.proven {
                Severity::Info
            } else {
                Severity::Notice
            },
            Code::DeviceCopy {
                file: f.key,
                path: f.path.clone(),
                pid: d.pid,
                comm: d.comm.clone(),
                gpu: d.gpu,
                gpu_name: d.gpu_name.clone(),
                integrated: d.integrated,
                device_bytes: d.device_bytes,
                proven: d.proven,
                via: d.via.clone(),
            },
        ));
    }
}
