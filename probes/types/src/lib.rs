//! Plain values the probes report: capabilities, import outcomes and endpoint passes.
//! Sizes are bytes, times seconds, rates GB/s (10^9 bytes per second).

use serde::{Deserialize, Serialize};

/// Which driver stack a result comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Vulkan,
    Cuda,
    /// The test double: computes on the CPU, reports configured rates.
    Fake,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Vulkan => "vulkan",
            BackendKind::Cuda => "cuda",
            BackendKind::Fake => "fake",
        }
    }
}

/// Where a device sits relative to host memory (the seed paper's §7 classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Integrated GPU or CPU device: file pages and device allocations share one DRAM.
    Unified,
    /// The device reads host memory through host page tables (ATS, NVLink-C2C).
    CoherentLink,
    /// A discrete device: every read of host memory crosses PCIe.
    DiscretePcie,
    /// Neither the device type nor the attributes tell.
    Unknown,
}

impl Topology {
    pub fn describe(self) -> &'static str {
        match self {
            Topology::Unified => "unified",
            Topology::CoherentLink => "coherent link",
            Topology::DiscretePcie => "discrete over PCIe",
            Topology::Unknown => "unknown",
        }
    }
}

/// Capabilities of one backend: the devices, or why there are none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendCaps<D> {
    /// `None` when the driver is present; otherwise why the backend is not available.
    pub not_available: Option<String>,
    pub devices: Vec<D>,
}

impl<D> BackendCaps<D> {
    pub fn absent(reason: impl Into<String>) -> Self {
        BackendCaps {
            not_available: Some(reason.into()),
            devices: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VulkanHeap {
    pub size_bytes: u64,
    pub device_local: bool,
    /// From VK_EXT_memory_budget, where the driver has it.
    pub budget_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VulkanMemoryType {
    pub heap: u32,
    /// `device-local`, `host-visible`, `host-coherent`, `host-cached`, ...
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VulkanDeviceCaps {
    pub index: usize,
    pub name: String,
    /// `integrated`, `discrete`, `virtual`, `cpu` or `other`.
    pub device_type: String,
    pub driver_name: Option<String>,
    pub driver_info: Option<String>,
    /// `major.minor.patch`.
    pub api_version: String,
    pub external_memory_host: bool,
    pub min_imported_host_pointer_alignment: Option<u64>,
    pub max_memory_allocation_size: Option<u64>,
    pub max_storage_buffer_range: u64,
    pub max_buffer_size: Option<u64>,
    pub min_storage_buffer_offset_alignment: u64,
    pub heaps: Vec<VulkanHeap>,
    pub memory_types: Vec<VulkanMemoryType>,
    pub topology: Topology,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    pub current_speed: Option<String>,
    pub current_width: Option<u32>,
    pub max_speed: Option<String>,
    pub max_width: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaDeviceCaps {
    pub ordinal: i32,
    pub name: String,
    pub compute_capability: String,
    pub driver_version: Option<String>,
    pub integrated: bool,
    pub can_map_host_memory: bool,
    pub pageable_memory_access: bool,
    pub pageable_memory_access_uses_host_page_tables: bool,
    pub host_register_supported: bool,
    pub host_register_read_only_supported: bool,
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    /// `0000:3b:00.0`, from cuDeviceGetPCIBusId.
    pub pci_bus_id: Option<String>,
    /// From sysfs (`current_link_speed`, `current_link_width`, ...).
    pub pcie_link: Option<PcieLink>,
    pub topology: Topology,
}

/// Both backends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    pub vulkan: BackendCaps<VulkanDeviceCaps>,
    pub cuda: BackendCaps<CudaDeviceCaps>,
}

/// How a mapping is offered to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportMethod {
    /// `vkAllocateMemory` with `VkImportMemoryHostPointerInfoEXT`.
    VulkanHostPointer,
    /// `cuMemHostRegister(flags = 0)`.
    CudaRegisterDefault,
    /// `cuMemHostRegister(CU_MEMHOSTREGISTER_READ_ONLY)`.
    CudaRegisterReadOnly,
    /// The fake backend's import (succeeds up to its configured ceiling).
    Fake,
}

impl ImportMethod {
    pub fn backend(self) -> BackendKind {
        match self {
            ImportMethod::VulkanHostPointer => BackendKind::Vulkan,
            ImportMethod::CudaRegisterDefault | ImportMethod::CudaRegisterReadOnly => {
                BackendKind::Cuda
            }
            ImportMethod::Fake => BackendKind::Fake,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            ImportMethod::VulkanHostPointer => "host-pointer import",
            ImportMethod::CudaRegisterDefault => "host register, default flags",
            ImportMethod::CudaRegisterReadOnly => "host register, read-only flag",
            ImportMethod::Fake => "fake import",
        }
    }
}

/// What one import attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportStatus {
    Ok,
    Failed,
    /// The child did not answer before its timeout and was killed.
    Hang,
    /// The child died (signal, panic) without a result.
    Crashed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportOutcome {
    pub method: ImportMethod,
    /// `shared-read-only` (`mmap(PROT_READ, MAP_SHARED)` of the file), or a fallback
    /// view: `shared-read-write`, `private-copy-on-write`.
    pub mapping: String,
    pub bytes: u64,
    pub status: ImportStatus,
    /// The driver's exact error, or what happened to the child.
    pub error: Option<String>,
    pub seconds: f64,
    /// Growth of the child's RssAnon and RssFile (`/proc/self/status`) from before the
    /// import to after its release, the mapping still alive: anonymous growth means
    /// the driver's pinning made private copies of file pages.
    pub anon_bytes_delta: Option<i64>,
    pub file_bytes_delta: Option<i64>,
}

/// One endpoint of the seed paper's §8: how a pass reaches the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// The GPU reads the imported file pages in place.
    Map,
    /// A one-time copy into device-local memory, then the same kernel.
    Resident,
    /// Every pass stages the bytes into device memory, then reads them.
    PerUseCopy,
}

impl Arm {
    pub const ALL: [Arm; 3] = [Arm::Map, Arm::Resident, Arm::PerUseCopy];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Map => "map",
            Arm::Resident => "resident",
            Arm::PerUseCopy => "per-use copy",
        }
    }
}

/// A checksum of a byte range read as little-endian u32 words `w_i`, `i` counted from
/// the start of the working set: `sum = Σ w_i` and `weighted = Σ w_i·(2i+1)`, both
/// mod 2^32. The GPU kernels compute the same two sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Checksum {
    pub sum: u32,
    pub weighted: u32,
}

impl Checksum {
    pub fn combine(self, o: Checksum) -> Checksum {
        Checksum {
            sum: self.sum.wrapping_add(o.sum),
            weighted: self.weighted.wrapping_add(o.weighted),
        }
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}:{:08x}", self.sum, self.weighted)
    }
}

/// The passes of one arm in one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmRun {
    pub arm: Arm,
    /// Bytes read per pass (the working set).
    pub bytes: u64,
    /// Timed passes (warm-up passes are not included).
    pub pass_seconds: Vec<f64>,
    /// The checksum every pass computed on the device (the first that differed, if any).
    pub device_checksum: Option<Checksum>,
    /// Every pass (warm-up included) matched the CPU's checksum.
    pub checksums_ok: bool,
    /// Why the arm could not run, or why it is invalid.
    pub error: Option<String>,
    /// One-time setup (the resident copy), seconds.
    pub setup_seconds: Option<f64>,
    /// Largest bytes bound to one descriptor or kernel argument.
    pub max_range_bytes: u64,
    /// Number of ranges a pass reads.
    pub ranges: u32,
    /// How the bytes got there: `imported`, `registered`, `pageable`, `staged` ...
    pub detail: Option<String>,
    /// Fraction of the working set in the page cache right after this arm ran (its
    /// allocations still alive).
    pub resident_fraction_after: Option<f64>,
}

impl ArmRun {
    pub fn failed(arm: Arm, bytes: u64, error: impl Into<String>) -> ArmRun {
        ArmRun {
            arm,
            bytes,
            pass_seconds: Vec::new(),
            device_checksum: None,
            checksums_ok: false,
            error: Some(error.into()),
            setup_seconds: None,
            max_range_bytes: 0,
            ranges: 0,
            detail: None,
            resident_fraction_after: None,
        }
    }
}

/// A copy rate measured next to the arms: the ceilings the kernels are judged against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceRate {
    /// `device-to-device copy`, `pinned host-to-device copy`, ...
    pub what: String,
    pub bytes: u64,
    /// Bytes copied per second (each byte once), median of the passes.
    pub gbps: f64,
}

/// Everything one probe process measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmsReport {
    pub backend: BackendKind,
    pub device: String,
    pub topology: Topology,
    pub runs: Vec<ArmRun>,
    pub references: Vec<ReferenceRate>,
    /// Device memory free before the resident copy was allocated.
    pub device_free_bytes: Option<u64>,
    /// Where the pass kernel came from (`WGSL via naga`, `nvrtc compute_90`, a PTX file).
    pub kernel: String,
}
