//! CUDA: device attributes, host registration of a file mapping
//! (`cuMemHostRegister`, default and read-only flags) and the three endpoint arms.
//!
//! libcuda and libnvrtc are opened at run time (cudarc's `dynamic-loading`); without
//! libcuda the backend is "not available" ([`cudarc::driver::sys::is_culib_present`] is
//! checked before anything else, because cudarc panics on a missing library). Attribute
//! meanings: <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html>; the PCIe
//! link comes from sysfs (`current_link_speed`, `current_link_width`, ...; see
//! <https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci>).

mod arms;
mod driver;
mod kernel;
pub mod loader;

use std::path::Path;

use cudarc::driver::sys::CUdevice_attribute as A;

use crate::backend::{ArmPlan, Backend, Observer};
use crate::types::{
    ArmsReport, BackendCaps, BackendKind, CudaDeviceCaps, ImportMethod, PcieLink, Topology,
};

pub(crate) use driver::Driver;

/// Where sysfs is mounted on a live system.
pub const SYSFS: &str = "/sys";

/// The topology class CUDA's attributes imply.
pub fn topology(integrated: bool, uses_host_page_tables: bool) -> Topology {
    if integrated {
        Topology::Unified
    } else if uses_host_page_tables {
        Topology::CoherentLink
    } else {
        Topology::DiscretePcie
    }
}

/// The PCIe link of `bus_id` (`0000:3B:00.0`) read under `sysfs` (normally `/sys`).
pub fn pcie_link(sysfs: &Path, bus_id: &str) -> Option<PcieLink> {
    let dir = sysfs
        .join("bus/pci/devices")
        .join(bus_id.to_ascii_lowercase());
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let width = |f: &str| read(f).and_then(|s| s.parse().ok());
    let link = PcieLink {
        current_speed: read("current_link_speed"),
        current_width: width("current_link_width"),
        max_speed: read("max_link_speed"),
        max_width: width("max_link_width"),
    };
    (link.current_speed.is_some() || link.max_speed.is_some()).then_some(link)
}

fn device_caps(d: &Driver, ordinal: i32, sysfs: &Path) -> Result<CudaDeviceCaps, String> {
    let dev = d.device(ordinal)?;
    let attr = |a: A| d.attribute(dev, a);
    let flag = |a: A| attr(a).map(|v| v != 0);
    let integrated = flag(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)?;
    let host_tables = flag(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)?;
    let bus = d.pci_bus_id(dev);
    Ok(CudaDeviceCaps {
        ordinal,
        name: d.name(dev)?,
        compute_capability: format!(
            "{}.{}",
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        ),
        driver_version: d.driver_version(),
        integrated,
        can_map_host_memory: flag(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?,
        pageable_memory_access: flag(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)?,
        pageable_memory_access_uses_host_page_tables: host_tables,
        host_register_supported: flag(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)?,
        host_register_read_only_supported: flag(
            A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
        )?,
        memory_bytes: d.total_mem(dev)?,
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        pcie_link: bus.as_deref().and_then(|b| pcie_link(sysfs, b)),
        pci_bus_id: bus,
        topology: topology(integrated, host_tables),
    })
}

/// Capabilities of every CUDA device (sysfs under `sysfs`), or why there are none.
pub fn caps(sysfs: &Path) -> BackendCaps<CudaDeviceCaps> {
    let d = match Driver::open() {
        Ok(d) => d,
        Err(e) => return BackendCaps::absent(e),
    };
    let n = match d.count() {
        Ok(n) => n,
        Err(e) => return BackendCaps::absent(e),
    };
    if n == 0 {
        return BackendCaps::absent("the CUDA driver reports no device");
    }
    let mut devices = Vec::new();
    for i in 0..n {
        match device_caps(&d, i, sysfs) {
            Ok(c) => devices.push(c),
            Err(e) => return BackendCaps::absent(format!("device {i}: {e}")),
        }
    }
    BackendCaps {
        not_available: None,
        devices,
    }
}

/// The CUDA [`Backend`].
pub struct CudaBackend;

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn import_methods(&self) -> Vec<ImportMethod> {
        vec![
            ImportMethod::CudaRegisterDefault,
            ImportMethod::CudaRegisterReadOnly,
        ]
    }

    fn try_import(&self, device: usize, data: &[u8], m: ImportMethod) -> Result<(), String> {
        let d = Driver::open()?;
        let _ctx = d.context(device as i32)?;
        let flags = match m {
            ImportMethod::CudaRegisterReadOnly => driver::READ_ONLY,
            _ => 0,
        };
        let reg = d.register(data, flags)?;
        drop(reg);
        Ok(())
    }

    fn run_arms(
        &self,
        device: usize,
        data: &[u8],
        plan: &ArmPlan,
        observe: Observer<'_>,
    ) -> Result<ArmsReport, String> {
        let d = Driver::open()?;
        let caps = device_caps(&d, device as i32, Path::new(SYSFS))?;
        let _ctx = d.context(device as i32)?;
        arms::run(&d, &caps, data, plan, observe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_from_attributes() {
        assert_eq!(topology(true, false), Topology::Unified);
        assert_eq!(topology(false, true), Topology::CoherentLink);
        assert_eq!(topology(false, false), Topology::DiscretePcie);
    }

    #[test]
    fn pcie_link_from_a_sysfs_tree() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("current_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(dev.join("current_link_width"), "16\n").unwrap();
        std::fs::write(dev.join("max_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(dev.join("max_link_width"), "16\n").unwrap();
        let l = pcie_link(dir.path(), "0000:3B:00.0").unwrap();
        assert_eq!(l.current_speed.as_deref(), Some("32.0 GT/s PCIe"));
        assert_eq!(l.current_width, Some(16));
        assert!(pcie_link(dir.path(), "0000:00:01.0").is_none());
    }

    #[test]
    fn absent_driver_is_not_available() {
        // SAFETY: only tries to open the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        let c = caps(Path::new(SYSFS));
        assert!(c.devices.is_empty());
        assert!(c.not_available.unwrap().contains("libcuda"));
    }
}
