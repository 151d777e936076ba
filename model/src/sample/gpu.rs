//! GPUs and the device memory of processes on them, as NVML reports them, and the device
//! copies a twofold loader made and checked.

use serde::{Deserialize, Serialize};

use super::FileKey;

/// GPUs and the device memory of each process on them (NVML), read each snapshot.
/// `not_available` says why there is nothing (no libnvidia-ml, no NVIDIA GPU, NVML failed,
/// or not collected: the default, for samples and recordings made without it): then every
/// GPU field is unknown, never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_available: Option<String>,
    #[serde(default)]
    pub devices: Vec<GpuDeviceSample>,
    /// Device copies of a model file that twofold's own loaders made and checked byte
    /// for byte (`twofold __child cuda-load`): the only device copies that are proven,
    /// since no other process's device memory can be read.
    #[serde(default)]
    pub device_proofs: Vec<DeviceProofSample>,
    /// What the upload tracer saw (`--trace` with a CUDA driver library): uploads of
    /// model bytes matched by content. `None`: not traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads: Option<super::uploads::UploadsSample>,
}

impl Default for GpuSample {
    fn default() -> Self {
        GpuSample {
            not_available: Some("GPU memory was not collected".into()),
            devices: Vec::new(),
            device_proofs: Vec::new(),
            uploads: None,
        }
    }
}

/// What identifies a GPU and its memory, as NVML reports it (the sample and the report
/// both carry it, flattened into their JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    /// `0000:3b:00.0` (lower case, 4-digit domain, as sysfs names it).
    pub pci_bus_id: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    /// Current PCIe link generation and width; `None` where NVML has none (integrated).
    pub pcie_link_gen: Option<u32>,
    pub pcie_link_width: Option<u32>,
    /// The GPU shares the host's DRAM (CUDA's `CU_DEVICE_ATTRIBUTE_INTEGRATED`); `None`:
    /// not known (libcuda absent).
    pub integrated: Option<bool>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuDeviceSample {
    #[serde(flatten)]
    pub info: GpuInfo,
    /// Processes with memory on this GPU (compute and graphics).
    pub processes: Vec<GpuProcessSample>,
    /// Why the process list could not be read, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_unavailable: Option<String>,
}

/// How a process uses a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuProcessKind {
    Compute,
    Graphics,
}

/// One process on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcessSample {
    pub pid: i32,
    pub kind: GpuProcessKind,
    /// Device memory it holds; `None` where the driver does not say (WDDM, MIG without
    /// privilege).
    pub used_bytes: Option<u64>,
}

/// A device copy a twofold loader made of a model file and checked against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProofSample {
    pub pid: i32,
    pub file: FileKey,
    /// NVML UUID of the GPU holding the copy.
    pub gpu_uuid: Option<String>,
    /// File bytes copied to the device and read back identical (xxh3 of both).
    pub file_bytes: u64,
    /// Device memory the loader allocated for them (`cuMemGetInfo` before and after).
    pub device_bytes: u64,
    /// xxh3-64 of the file bytes and of the device bytes read back.
    pub file_xxh3: String,
    pub device_xxh3: String,
}
