//! Vulkan: capabilities of every physical device, host-pointer import of a file mapping
//! (`VK_EXT_external_memory_host`) and the three endpoint arms.
//!
//! libvulkan is opened at run time (ash's `loaded` feature); where it or a driver is
//! missing the backend is "not available", never a panic. Spec:
//! <https://registry.khronos.org/vulkan/specs/latest/man/html/VK_EXT_external_memory_host.html>.

mod arms;
mod ctx;
mod shader;

use std::ffi::CStr;

use ash::vk;

use crate::backend::{ArmPlan, Backend, Observer};
use crate::types::{
    ArmsReport, BackendCaps, BackendKind, ImportMethod, Topology, VulkanDeviceCaps, VulkanHeap,
    VulkanMemoryType,
};

pub(crate) use ctx::Ctx;

/// An instance over the system's Vulkan loader.
pub struct Vulkan {
    // Field order matters: the instance is destroyed (in Drop) before the entry unloads.
    instance: ash::Instance,
    _entry: ash::Entry,
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: every object created from this instance (devices in `Ctx`) borrows it and
        // is gone by now.
        unsafe { self.instance.destroy_instance(None) };
    }
}

fn c_str(r: Result<&CStr, std::ffi::FromBytesUntilNulError>) -> String {
    r.map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn version(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

impl Vulkan {
    /// Opens libvulkan and creates an instance (Vulkan 1.1, no layers, no surfaces).
    pub fn new() -> Result<Vulkan, String> {
        // SAFETY: loading the system's libvulkan runs its initialisers; it is the library
        // the Vulkan API is meant to be used through.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| format!("cannot load the Vulkan loader (libvulkan.so.1): {e}"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"twofold")
            .api_version(vk::API_VERSION_1_1);
        let ci = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: the create info and what it points to outlive the call.
        let instance = unsafe { entry.create_instance(&ci, None) }
            .map_err(|e| format!("vkCreateInstance: {e}"))?;
        Ok(Vulkan {
            instance,
            _entry: entry,
        })
    }

    pub fn physical_devices(&self) -> Result<Vec<vk::PhysicalDevice>, String> {
        // SAFETY: the instance is alive.
        unsafe { self.instance.enumerate_physical_devices() }
            .map_err(|e| format!("vkEnumeratePhysicalDevices: {e}"))
    }

    fn extensions(&self, pd: vk::PhysicalDevice) -> Vec<String> {
        // SAFETY: `pd` came from this instance.
        unsafe { self.instance.enumerate_device_extension_properties(pd) }
            .unwrap_or_default()
            .iter()
            .map(|e| c_str(e.extension_name_as_c_str()))
            .collect()
    }

    /// Capabilities of one physical device.
    pub fn device_caps(&self, index: usize, pd: vk::PhysicalDevice) -> VulkanDeviceCaps {
        let exts = self.extensions(pd);
        let has = |n: &CStr| exts.iter().any(|e| e.as_bytes() == n.to_bytes());
        let host_ext = has(ash::ext::external_memory_host::NAME);
        let budget_ext = has(ash::ext::memory_budget::NAME);
        // SAFETY: `pd` came from this instance.
        let base = unsafe { self.instance.get_physical_device_properties(pd) };
        let api = base.api_version;
        let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut m4 = vk::PhysicalDeviceMaintenance4Properties::default();
        let mut drv = vk::PhysicalDeviceDriverProperties::default();
        let has_12 = api >= vk::API_VERSION_1_2;
        let has_13 = api >= vk::API_VERSION_1_3;
        {
            let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
            if host_ext {
                p2 = p2.push_next(&mut host);
            }
            if has_12 {
                p2 = p2.push_next(&mut drv);
            }
            if has_13 {
                p2 = p2.push_next(&mut m4);
            }
            // SAFETY: every structure chained is supported by the device (checked above)
            // and lives until the call returns.
            unsafe { self.instance.get_physical_device_properties2(pd, &mut p2) };
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mem = {
            let mut m2 = vk::PhysicalDeviceMemoryProperties2::default();
            if budget_ext {
                m2 = m2.push_next(&mut budget);
            }
            // SAFETY: as above.
            unsafe {
                self.instance
                    .get_physical_device_memory_properties2(pd, &mut m2)
            };
            m2.memory_properties
        };
        let heaps = (0..mem.memory_heap_count as usize)
            .map(|i| VulkanHeap {
                size_bytes: mem.memory_heaps[i].size,
                device_local: mem.memory_heaps[i]
                    .flags
                    .contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
                budget_bytes: budget_ext.then_some(budget.heap_budget[i]),
            })
            .collect();
        let memory_types = (0..mem.memory_type_count as usize)
            .map(|i| VulkanMemoryType {
                heap: mem.memory_types[i].heap_index,
                flags: flag_names(mem.memory_types[i].property_flags),
            })
            .collect();
        let device_type = match base.device_type {
            vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
            vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
            vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
            vk::PhysicalDeviceType::CPU => "cpu",
            _ => "other",
        };
        VulkanDeviceCaps {
            index,
            name: c_str(base.device_name_as_c_str()),
            device_type: device_type.into(),
            driver_name: has_12.then(|| c_str(drv.driver_name_as_c_str())),
            driver_info: has_12.then(|| c_str(drv.driver_info_as_c_str())),
            api_version: version(api),
            external_memory_host: host_ext,
            min_imported_host_pointer_alignment: host_ext
                .then_some(host.min_imported_host_pointer_alignment),
            max_memory_allocation_size: Some(m3.max_memory_allocation_size),
            max_storage_buffer_range: u64::from(base.limits.max_storage_buffer_range),
            max_buffer_size: has_13.then_some(m4.max_buffer_size),
            min_storage_buffer_offset_alignment: base.limits.min_storage_buffer_offset_alignment,
            heaps,
            memory_types,
            topology: topology(device_type),
        }
    }

    /// Every physical device's capabilities.
    pub fn caps(&self) -> Result<Vec<VulkanDeviceCaps>, String> {
        Ok(self
            .physical_devices()?
            .into_iter()
            .enumerate()
            .map(|(i, pd)| self.device_caps(i, pd))
            .collect())
    }
}

/// The topology class a Vulkan device type implies. Vulkan does not tell a coherent
/// link apart from PCIe, so every discrete device counts as PCIe.
pub fn topology(device_type: &str) -> Topology {
    match device_type {
        "integrated" | "cpu" => Topology::Unified,
        "discrete" => Topology::DiscretePcie,
        _ => Topology::Unknown,
    }
}

pub(crate) fn flag_names(f: vk::MemoryPropertyFlags) -> Vec<String> {
    [
        (vk::MemoryPropertyFlags::DEVICE_LOCAL, "device-local"),
        (vk::MemoryPropertyFlags::HOST_VISIBLE, "host-visible"),
        (vk::MemoryPropertyFlags::HOST_COHERENT, "host-coherent"),
        (vk::MemoryPropertyFlags::HOST_CACHED, "host-cached"),
        (
            vk::MemoryPropertyFlags::LAZILY_ALLOCATED,
            "lazily-allocated",
        ),
        (vk::MemoryPropertyFlags::PROTECTED, "protected"),
    ]
    .iter()
    .filter(|(b, _)| f.contains(*b))
    .map(|(_, n)| n.to_string())
    .collect()
}

/// Capabilities of every Vulkan device, or why there are none.
pub fn caps() -> BackendCaps<VulkanDeviceCaps> {
    match Vulkan::new().and_then(|v| v.caps()) {
        Ok(devices) if devices.is_empty() => BackendCaps::absent("no Vulkan device found"),
        Ok(devices) => BackendCaps {
            not_available: None,
            devices,
        },
        Err(e) => BackendCaps::absent(e),
    }
}

/// The device the probes use by default: the first GPU with host-pointer import, else
/// the first device with it (lavapipe), else device 0.
pub fn default_device(devices: &[VulkanDeviceCaps]) -> usize {
    devices
        .iter()
        .find(|d| d.external_memory_host && d.device_type != "cpu")
        .or_else(|| devices.iter().find(|d| d.external_memory_host))
        .map(|d| d.index)
        .unwrap_or(0)
}

/// The Vulkan [`Backend`].
pub struct VulkanBackend;

impl Backend for VulkanBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Vulkan
    }

    fn import_methods(&self) -> Vec<ImportMethod> {
        vec![ImportMethod::VulkanHostPointer]
    }

    fn try_import(&self, device: usize, data: &[u8], _m: ImportMethod) -> Result<(), String> {
        let vk = Vulkan::new()?;
        let ctx = Ctx::new(&vk, device)?;
        let imported = ctx.import(data)?;
        drop(imported);
        Ok(())
    }

    fn run_arms(
        &self,
        device: usize,
        data: &[u8],
        plan: &ArmPlan,
        observe: Observer<'_>,
    ) -> Result<ArmsReport, String> {
        let vk = Vulkan::new()?;
        let ctx = Ctx::new(&vk, device)?;
        arms::run(&ctx, data, plan, observe)
    }
}
