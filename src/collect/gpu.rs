//! GPUs and per-process device memory through NVML (libnvidia-ml, opened at run time by
//! `nvml-wrapper`), and the device copies twofold's own loaders proved.
//!
//! NVML answers sizes only: how much device memory each process holds on each GPU. The
//! contents of another process's device memory cannot be read (there is no NVML or CUDA
//! call for it; CUDA IPC needs the owner to export a handle), so a foreign device copy is
//! at most *suspected* (by size, see `model::device`). A device copy is *proven* only when
//! a twofold loader made it and read it back identical to the file; such a loader leaves
//! an attestation in [`attest_dir`] while it holds the copy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use crate::sample::{
    DeviceProofSample, GpuDeviceSample, GpuInfo, GpuProcessKind, GpuProcessSample, GpuSample,
};

/// Where GPU answers come from: NVML on a live host, a fixture in tests.
pub trait GpuSource: Send {
    /// The GPUs with their processes, or why there are none.
    fn devices(&mut self) -> Result<Vec<GpuDeviceSample>, String>;

    /// Fills in what `devices` left for later because it was still being read (whether a
    /// GPU is integrated, which CUDA says after an initialisation of a fifth of a second
    /// that runs beside the collection and the proof).
    fn settle(&mut self, _devices: &mut [GpuDeviceSample]) {}
}

/// NVML, kept open across snapshots.
pub struct NvmlSource {
    nvml: Result<Nvml, String>,
    /// `integrated` per PCI bus id, from CUDA's device attributes (read once).
    integrated: Option<BTreeMap<String, bool>>,
    /// The thread reading them, started with NVML.
    reading: Option<std::thread::JoinHandle<BTreeMap<String, bool>>>,
}

/// `integrated` per PCI bus id, from CUDA's device attributes.
fn integrated_by_bus() -> BTreeMap<String, bool> {
    let caps = twofold_probes::cuda::caps(Path::new(twofold_probes::cuda::SYSFS));
    caps.devices
        .iter()
        .filter_map(|d| Some((normal_bus_id(d.pci_bus_id.as_deref()?), d.integrated)))
        .collect()
}

/// `00000000:3B:00.0` (NVML) or `0000:3b:00.0` (CUDA) as sysfs names it: `0000:3b:00.0`.
pub fn normal_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

impl NvmlSource {
    pub fn open() -> NvmlSource {
        let nvml = Nvml::init().map_err(|e| match e {
            nvml_wrapper::error::NvmlError::LibloadingError(_) => {
                "libnvidia-ml.so.1 not found (no NVIDIA driver)".to_string()
            }
            nvml_wrapper::error::NvmlError::DriverNotLoaded => {
                "the NVIDIA kernel driver is not loaded".to_string()
            }
            e => format!("NVML: {e}"),
        });
        // CUDA is initialised on a thread of its own only where NVML sees a GPU.
        let reading = nvml
            .as_ref()
            .ok()
            .filter(|n| n.device_count().is_ok_and(|c| c > 0))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("twofold-cuda-caps".into())
                    .spawn(integrated_by_bus)
                    .ok()
            });
        NvmlSource {
            nvml,
            integrated: None,
            reading,
        }
    }

    /// (PCI bus id, UUID) of every GPU NVML lists.
    pub fn devices_by_bus(&self) -> Result<Vec<(String, String)>, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        let n = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
        Ok((0..n)
            .filter_map(|i| {
                let d = nvml.device_by_index(i).ok()?;
                Some((normal_bus_id(&d.pci_info().ok()?.bus_id), d.uuid().ok()?))
            })
            .collect())
    }

    /// Whether the GPU at `bus` is integrated; `None` while the thread still reads it
    /// (unless `wait`), or when CUDA does not say.
    fn integrated(&mut self, bus: &str, wait: bool) -> Option<bool> {
        if self.integrated.is_none() {
            let map = match self.reading.take() {
                Some(h) if wait || h.is_finished() => h.join().unwrap_or_default(),
                Some(h) => {
                    self.reading = Some(h);
                    return None;
                }
                None => integrated_by_bus(),
            };
            self.integrated = Some(map);
        }
        self.integrated.as_ref()?.get(bus).copied()
    }
}

fn used(m: UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    }
}

impl GpuSource for NvmlSource {
    fn devices(&mut self) -> Result<Vec<GpuDeviceSample>, String> {
        let mut out = Vec::new();
        let n = {
            let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
            nvml.device_count().map_err(|e| format!("NVML: {e}"))?
        };
        if n == 0 {
            return Err("NVML reports no NVIDIA GPU".into());
        }
        for i in 0..n {
            let mut s = {
                let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
                let d = nvml
                    .device_by_index(i)
                    .map_err(|e| format!("NVML device {i}: {e}"))?;
                let mem = d.memory_info().ok();
                let mut s = GpuDeviceSample {
                    info: GpuInfo {
                        index: i,
                        name: d.name().ok(),
                        uuid: d.uuid().ok(),
                        pci_bus_id: d.pci_info().ok().map(|p| normal_bus_id(&p.bus_id)),
                        memory_total_bytes: mem.as_ref().map(|m| m.total),
                        memory_used_bytes: mem.as_ref().map(|m| m.used),
                        memory_free_bytes: mem.as_ref().map(|m| m.free),
                        pcie_link_gen: d.current_pcie_link_gen().ok(),
                        pcie_link_width: d.current_pcie_link_width().ok(),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let mut why = Vec::new();
                for (kind, list) in [
                    (GpuProcessKind::Compute, d.running_compute_processes()),
                    (GpuProcessKind::Graphics, d.running_graphics_processes()),
                ] {
                    match list {
                        Ok(list) => {
                            s.processes
                                .extend(list.into_iter().map(|p| GpuProcessSample {
                                    pid: p.pid as i32,
                                    kind,
                                    used_bytes: used(p.used_gpu_memory),
                                }))
                        }
                        Err(e) => why.push(format!("{kind:?} processes: {e}").to_lowercase()),
                    }
                }
                if !why.is_empty() {
                    s.processes_unavailable = Some(why.join("; "));
                }
                s
            };
            s.info.integrated = s
                .info
                .pci_bus_id
                .clone()
                .and_then(|b| self.integrated(&b, false));
            s.processes.sort_by_key(|p| (p.pid, p.kind));
            out.push(s);
        }
        Ok(out)
    }

    fn settle(&mut self, devices: &mut [GpuDeviceSample]) {
        for d in devices.iter_mut().filter(|d| d.info.integrated.is_none()) {
            d.info.integrated = d
                .info
                .pci_bus_id
                .clone()
                .and_then(|b| self.integrated(&b, true));
        }
    }
}

/// A fixed NVML answer read from JSON (`{"devices": [...]}` or `{"not_available": "..."}`,
/// the [`GpuSample`] shape): the tests' stand-in for a GPU this machine does not have.
pub struct FixtureSource(pub GpuSample);

impl FixtureSource {
    pub fn load(path: &Path) -> anyhow::Result<FixtureSource> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let s: GpuSample = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a GPU fixture: {e}", path.display()))?;
        Ok(FixtureSource(s))
    }
}

impl GpuSource for FixtureSource {
    fn devices(&mut self) -> Result<Vec<GpuDeviceSample>, String> {
        match &self.0.not_available {
            Some(why) => Err(why.clone()),
            None => Ok(self.0.devices.clone()),
        }
    }
}

/// The source the engine uses: `TWOFOLD_GPU_FIXTURE` (tests; a fixture that cannot be
/// read answers with why) or NVML.
pub fn source() -> Box<dyn GpuSource> {
    match std::env::var_os("TWOFOLD_GPU_FIXTURE") {
        Some(p) => Box::new(FixtureSource::load(Path::new(&p)).unwrap_or_else(|e| {
            FixtureSource(GpuSample {
                not_available: Some(e.to_string()),
                ..Default::default()
            })
        })),
        None => {
            let began = std::time::Instant::now();
            let nvml = NvmlSource::open();
            if std::env::var_os("TWOFOLD_PROFILE").is_some() {
                eprintln!(
                    "gpu: NVML opened in {:.1} ms",
                    began.elapsed().as_secs_f64() * 1e3
                );
            }
            Box::new(nvml)
        }
    }
}

/// Where twofold's loaders leave attestations of the device copies they hold:
/// `/run/twofold/device` as root, else `$XDG_RUNTIME_DIR/twofold/device`.
pub fn attest_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TWOFOLD_ATTEST_DIR") {
        return PathBuf::from(d);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/twofold/device");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("twofold/device"),
        None => std::env::temp_dir().join(format!("twofold-{}/device", nix::unistd::geteuid())),
    }
}

/// An attestation as a loader writes it: the proof plus the process's start time, so that
/// a reused pid never inherits it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Attestation {
    pub proof: DeviceProofSample,
    /// Field 22 of `/proc/PID/stat` (clock ticks since boot).
    pub start_ticks: u64,
}

/// Attestations in `dir` of live processes (same pid, same start time) whose device bytes
/// hashed the same as the file's. Others (stale, unreadable, mismatched) are ignored.
pub fn device_proofs(dir: &Path, proc_root: &Path) -> Vec<DeviceProofSample> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<DeviceProofSample> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text = crate::input::read_bounded(&e.path(), "attestation", 64 * 1024).ok()?;
            serde_json::from_slice::<Attestation>(&text).ok()
        })
        .filter(|a| {
            a.proof.file_xxh3 == a.proof.device_xxh3
                && super::process::start_time(proc_root, a.proof.pid) == Some(a.start_ticks)
        })
        .map(|a| a.proof)
        .collect();
    out.sort_by_key(|a| (a.file, a.pid));
    out
}

/// The GPU part of a sample.
/// What [`GpuSource::settle`] fills in, once the collection and the proof are done.
pub fn settle(src: &mut dyn GpuSource, sample: &mut GpuSample) {
    let began = std::time::Instant::now();
    src.settle(&mut sample.devices);
    if std::env::var_os("TWOFOLD_PROFILE").is_some() {
        eprintln!(
            "gpu: settled in {:.1} ms",
            began.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// The GPUs now; some device facts may wait for [`settle`].
pub fn sample(src: &mut dyn GpuSource, proc_root: &Path) -> GpuSample {
    let began = std::time::Instant::now();
    let (devices, not_available) = match src.devices() {
        Ok(d) => (d, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    if std::env::var_os("TWOFOLD_PROFILE").is_some() {
        eprintln!(
            "gpu: devices read in {:.1} ms",
            began.elapsed().as_secs_f64() * 1e3
        );
    }
    GpuSample {
        not_available,
        devices,
        device_proofs: device_proofs(&attest_dir(), proc_root),
        uploads: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_from_nvml_and_cuda_meet() {
        assert_eq!(normal_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normal_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn a_stale_or_mismatched_attestation_proves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let ticks = crate::collect::process::start_time(Path::new("/proc"), me).unwrap();
        let proof = |h: &str| DeviceProofSample {
            pid: me,
            file: Default::default(),
            gpu_uuid: None,
            file_bytes: 10,
            device_bytes: 2 << 20,
            file_xxh3: "ab".into(),
            device_xxh3: h.into(),
        };
        let write = |name: &str, a: &Attestation| {
            std::fs::write(dir.path().join(name), serde_json::to_vec(a).unwrap()).unwrap()
        };
        write(
            "good.json",
            &Attestation {
                proof: proof("ab"),
                start_ticks: ticks,
            },
        );
        write(
            "bad-hash.json",
            &Attestation {
                proof: proof("cd"),
                start_ticks: ticks,
            },
        );
        write(
            "reused-pid.json",
            &Attestation {
                proof: proof("ab"),
                start_ticks: ticks + 1,
            },
        );
        let found = device_proofs(dir.path(), Path::new("/proc"));
        assert_eq!(found, vec![proof("ab")]);
    }
}
