//! Where in a process's memory a copy lies, as `/proc/PID/maps` names the mapping
//! (<https://www.kernel.org/doc/html/latest/filesystems/proc.html>, §1.1).
//!
//! The kernel gives anonymous shared memory a name and an inode on an internal mount, so
//! it looks like a deleted file:
//! - `/dev/zero (deleted)`: `mmap(MAP_SHARED | MAP_ANONYMOUS)` (and `MAP_SHARED` of
//!   `/dev/zero`): the CUDA driver keeps several 64 MiB ones per process;
//! - `/SYSV0000abcd (deleted)`: a System V shared-memory segment (PostgreSQL's older
//!   shared buffers);
//! - `/anon_hugepage (deleted)`: `mmap(MAP_HUGETLB | MAP_ANONYMOUS)`, private or shared,
//!   backed by huge pages from the hugetlbfs pool (`HugetlbPages` in `/proc/PID/status`);
//! - `[anon_shmem:NAME]`: shared anonymous memory named with `PR_SET_VMA_ANON_NAME`.
//!
//! None of them is a file anyone could name: never a model file, never "replaced or
//! deleted"; they are searched as the process's memory. The NVIDIA driver's device files
//! are mapped too: `/dev/nvidiactl` maps host memory the driver allocated (pinned memory,
//! `cudaHostAlloc`, PyTorch's `pin_memory()`), `/dev/nvidia-uvm` managed memory (only its
//! pages resident on the CPU are present), and `/dev/nvidiaN` the GPU's registers and
//! memory through its PCI BARs: device memory, never read.

use serde::{Deserialize, Serialize};

use super::{is_zero, strip_deleted, DELETED};

/// Whether a mapping's name is anonymous shared memory the kernel names like a deleted
/// file (`/dev/zero`, `/SYSV…`, `/anon_hugepage`), or a named anonymous shared region.
pub fn anonymous_shared(path: &str) -> bool {
    if path.starts_with("[anon_shmem:") {
        return true;
    }
    let Some(name) = path.strip_suffix(DELETED) else {
        return false;
    };
    name == "/dev/zero" || name == HUGETLB_ANON || name.starts_with("/SYSV")
}

/// The name of anonymous memory from the hugetlbfs pool (`MAP_HUGETLB`).
pub const HUGETLB_ANON: &str = "/anon_hugepage";

/// Whether a mapping is anonymous memory from the hugetlbfs pool.
pub fn hugetlb_anon(path: &str) -> bool {
    strip_deleted(path) == HUGETLB_ANON && path.ends_with(DELETED)
}

/// What a mapping of an NVIDIA device file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvidia {
    /// `/dev/nvidiactl`: host memory the driver allocated and maps (pinned memory).
    HostMemory,
    /// `/dev/nvidia-uvm`: managed memory; its pages present in the page map are resident
    /// on the CPU, the others are on a GPU.
    Managed,
    /// `/dev/nvidiaN`, `/dev/nvidia-caps/…` and the rest: device memory or registers
    /// (PCI BARs), never read.
    Device,
}

/// The kind of NVIDIA device file mapped at `path`; `None` for any other mapping.
pub fn nvidia(path: &str) -> Option<Nvidia> {
    let rest = path.strip_prefix("/dev/nvidia")?;
    Some(match rest {
        "ctl" => Nvidia::HostMemory,
        "-uvm" => Nvidia::Managed,
        _ => Nvidia::Device,
    })
}

/// Memory the copies of one proof occupy, by the kind of place they lie in (the rest is
/// private anonymous memory or shmem files). Each is at most `copy_memory_bytes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Places {
    /// Anonymous shared memory (`/dev/zero`, System V segments, named shared anonymous).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_anon_bytes: u64,
    /// Huge pages from the hugetlbfs pool (`MAP_HUGETLB`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hugetlb_bytes: u64,
    /// Host memory the NVIDIA driver maps: pinned (`cudaHostAlloc`, `pin_memory()`), or
    /// managed memory resident on the CPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pinned_bytes: u64,
}

impl Places {
    pub fn is_empty(&self) -> bool {
        *self == Places::default()
    }

    pub fn add(&mut self, other: &Places) {
        self.shared_anon_bytes += other.shared_anon_bytes;
        self.hugetlb_bytes += other.hugetlb_bytes;
        self.pinned_bytes += other.pinned_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as this kernel (6.18) and NVIDIA hosts print them in `/proc/PID/maps`.
    #[test]
    fn anonymous_shared_memory_is_known_by_its_kernel_name() {
        for anon in [
            "/dev/zero (deleted)",
            "/SYSV00000000 (deleted)",
            "/SYSV0052e2c1 (deleted)",
            "/anon_hugepage (deleted)",
            "[anon_shmem:cuda]",
        ] {
            assert!(anonymous_shared(anon), "{anon}");
        }
        for file in [
            "/dev/zero",
            "/dev/shm/model.safetensors (deleted)",
            "/memfd:weights (deleted)",
            "/models/dev/zero (deleted)",
            "/anon_hugepage",
            "/models/m.gguf (deleted)",
            "[heap]",
            "",
        ] {
            assert!(!anonymous_shared(file), "{file}");
        }
        assert!(hugetlb_anon("/anon_hugepage (deleted)"));
        assert!(!hugetlb_anon("/dev/zero (deleted)"));
    }

    #[test]
    fn nvidia_device_files_by_name() {
        assert_eq!(nvidia("/dev/nvidiactl"), Some(Nvidia::HostMemory));
        assert_eq!(nvidia("/dev/nvidia-uvm"), Some(Nvidia::Managed));
        assert_eq!(nvidia("/dev/nvidia0"), Some(Nvidia::Device));
        assert_eq!(nvidia("/dev/nvidia12"), Some(Nvidia::Device));
        assert_eq!(nvidia("/dev/nvidia-uvm-tools"), Some(Nvidia::Device));
        assert_eq!(nvidia("/dev/zero (deleted)"), None);
        assert_eq!(nvidia("/models/nvidiactl"), None);
    }
}
