//! A logical device with one compute queue, the checksum pipeline, and RAII buffers
//! (created, bound and freed here; nothing else touches raw Vulkan handles).

use std::ffi::c_void;

use ash::vk;

use super::{shader, Vulkan};
use crate::types::VulkanDeviceCaps;

/// Bytes between two parameter slots (≥ any minUniformBufferOffsetAlignment).
pub const PARAM_STRIDE: u64 = 256;
/// Invocations per workgroup in the WGSL shader.
pub const WORKGROUP: u32 = 256;

pub(crate) struct Ctx<'a> {
    vk: &'a Vulkan,
    pub caps: VulkanDeviceCaps,
    pub device: ash::Device,
    queue: vk::Queue,
    mem: vk::PhysicalDeviceMemoryProperties,
    host_fn: Option<ash::ext::external_memory_host::Device>,
    pool: vk::CommandPool,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    pub pipeline: vk::Pipeline,
    shader: vk::ShaderModule,
    pub max_workgroups: u32,
}

/// A descriptor pool, destroyed on drop.
pub(crate) struct Pool<'c> {
    ctx: &'c Ctx<'c>,
    pool: vk::DescriptorPool,
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // SAFETY: no pending submission uses the pool's sets (command buffers are waited
        // for before their pools and buffers drop).
        unsafe { self.ctx.device.destroy_descriptor_pool(self.pool, None) };
    }
}

/// A command buffer and its fence; `busy` while submitted and not waited for.
pub(crate) struct Cmd<'c> {
    ctx: &'c Ctx<'c>,
    pub cb: vk::CommandBuffer,
    fence: vk::Fence,
    busy: bool,
}

impl Drop for Cmd<'_> {
    fn drop(&mut self) {
        let ctx = self.ctx;
        let _ = ctx.wait(self);
        // SAFETY: the fence is not in use by a pending submission any more.
        unsafe { ctx.device.destroy_fence(self.fence, None) };
    }
}

/// A buffer with its own memory; host-visible ones stay mapped.
pub(crate) struct Buffer<'c> {
    ctx: &'c Ctx<'c>,
    pub buf: vk::Buffer,
    mem: vk::DeviceMemory,
    pub size: u64,
    pub mapped: Option<*mut u8>,
    pub flags: vk::MemoryPropertyFlags,
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the buffer and memory were created by this device and no submitted work
        // uses them any more (every submission is waited for before buffers drop).
        unsafe {
            self.ctx.device.destroy_buffer(self.buf, None);
            self.ctx.device.free_memory(self.mem, None);
        }
    }
}

impl Buffer<'_> {
    /// Host view of a mapped buffer.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: the pointer maps `size` bytes of host-visible memory that this buffer
        // owns; the caller holds `&mut self`, and the device is idle on it (see Drop).
        self.mapped
            .map(|p| unsafe { std::slice::from_raw_parts_mut(p, self.size as usize) })
    }
}

fn vk_err(what: &str) -> impl Fn(vk::Result) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl<'a> Ctx<'a> {
    pub fn new(vk: &'a Vulkan, index: usize) -> Result<Ctx<'a>, String> {
        let pds = vk.physical_devices()?;
        let pd = *pds
            .get(index)
            .ok_or_else(|| format!("no Vulkan device with index '{index}'"))?;
        let caps = vk.device_caps(index, pd);
        // SAFETY: `pd` came from this instance.
        let families = unsafe { vk.instance.get_physical_device_queue_family_properties(pd) };
        let qfi = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or("the device has no compute queue")? as u32;
        let prio = [1.0f32];
        let qci = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(qfi)
            .queue_priorities(&prio)];
        let mut exts = Vec::new();
        if caps.external_memory_host {
            exts.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let dci = vk::DeviceCreateInfo::default()
            .queue_create_infos(&qci)
            .enabled_extension_names(&exts);
        // SAFETY: the create info and its arrays outlive the call; the extension was
        // advertised by the device.
        let device = unsafe { vk.instance.create_device(pd, &dci, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        // SAFETY: queue 0 of a family we created.
        let queue = unsafe { device.get_device_queue(qfi, 0) };
        // SAFETY: `pd` came from this instance.
        let mem = unsafe { vk.instance.get_physical_device_memory_properties(pd) };
        let host_fn = caps
            .external_memory_host
            .then(|| ash::ext::external_memory_host::Device::new(&vk.instance, &device));
        // SAFETY: plain property query.
        let limits = unsafe { vk.instance.get_physical_device_properties(pd) }.limits;
        let caps_is_cpu = caps.device_type == "cpu";
        let mut ctx = Ctx {
            vk,
            caps,
            device,
            queue,
            mem,
            host_fn,
            pool: vk::CommandPool::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
            shader: vk::ShaderModule::null(),
            // A CPU device runs workgroups on a few threads: fewer, longer ones cost
            // less scheduling; a GPU wants enough to fill every multiprocessor.
            max_workgroups: if caps_is_cpu {
                64
            } else {
                limits.max_compute_work_group_count[0].clamp(1, 65535)
            },
        };
        ctx.init(qfi)?;
        Ok(ctx)
    }

    fn init(&mut self, qfi: u32) -> Result<(), String> {
        let d = &self.device;
        let pci = vk::CommandPoolCreateInfo::default()
            .queue_family_index(qfi)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create info; the pool is destroyed in Drop.
        self.pool =
            unsafe { d.create_command_pool(&pci, None) }.map_err(vk_err("vkCreateCommandPool"))?;
        let binding = |b: u32, ty: vk::DescriptorType| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(ty)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        };
        let bindings = [
            binding(0, vk::DescriptorType::STORAGE_BUFFER),
            binding(1, vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC),
            binding(2, vk::DescriptorType::STORAGE_BUFFER),
        ];
        let dsl = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: valid create info; destroyed in Drop.
        self.set_layout = unsafe { d.create_descriptor_set_layout(&dsl, None) }
            .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
        let layouts = [self.set_layout];
        let pli = vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts);
        // SAFETY: as above.
        self.layout = unsafe { d.create_pipeline_layout(&pli, None) }
            .map_err(vk_err("vkCreatePipelineLayout"))?;
        let words = shader::spirv()?;
        let smi = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: `words` is SPIR-V that naga validated.
        self.shader = unsafe { d.create_shader_module(&smi, None) }
            .map_err(vk_err("vkCreateShaderModule"))?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(self.shader)
            .name(c"main");
        let cpi = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(self.layout)];
        // SAFETY: the shader module and layout are alive.
        let pipes = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &cpi, None) }
            .map_err(|(_, e)| format!("vkCreateComputePipelines: {e}"))?;
        self.pipeline = pipes.first().copied().ok_or("no pipeline created")?;
        Ok(())
    }

    fn memory_type(
        &self,
        bits: u32,
        want: vk::MemoryPropertyFlags,
        avoid: vk::MemoryPropertyFlags,
    ) -> Option<(u32, vk::MemoryPropertyFlags)> {
        let types = &self.mem.memory_types[..self.mem.memory_type_count as usize];
        let ok = |i: usize, strict: bool| {
            bits & (1 << i) != 0
                && types[i].property_flags.contains(want)
                && (!strict || !types[i].property_flags.intersects(avoid))
        };
        (0..types.len())
            .find(|&i| ok(i, true))
            .or_else(|| (0..types.len()).find(|&i| ok(i, false)))
            .map(|i| (i as u32, types[i].property_flags))
    }

    /// A new buffer of `size` bytes in memory with `want` (preferring memory without
    /// `avoid`); host-visible memory is mapped.
    pub fn alloc(
        &self,
        size: u64,
        usage: vk::BufferUsageFlags,
        want: vk::MemoryPropertyFlags,
        avoid: vk::MemoryPropertyFlags,
    ) -> Result<Buffer<'_>, String> {
        let d = &self.device;
        let bci = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid create info.
        let buf = unsafe { d.create_buffer(&bci, None) }.map_err(vk_err("vkCreateBuffer"))?;
        // SAFETY: `buf` is alive.
        let req = unsafe { d.get_buffer_memory_requirements(buf) };
        let Some((ty, flags)) = self.memory_type(req.memory_type_bits, want, avoid) else {
            // SAFETY: unused buffer of this device.
            unsafe { d.destroy_buffer(buf, None) };
            return Err(format!(
                "no memory type with {}",
                super::flag_names(want).join(", ")
            ));
        };
        let ai = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty);
        // SAFETY: valid allocate info.
        let mem = match unsafe { d.allocate_memory(&ai, None) } {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unused buffer of this device.
                unsafe { d.destroy_buffer(buf, None) };
                return Err(format!("vkAllocateMemory ({size} bytes): {e}"));
            }
        };
        let mut b = Buffer {
            ctx: self,
            buf,
            mem,
            size,
            mapped: None,
            flags,
        };
        // SAFETY: fresh buffer and memory of matching requirements.
        unsafe { d.bind_buffer_memory(buf, mem, 0) }.map_err(vk_err("vkBindBufferMemory"))?;
        if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            // SAFETY: host-visible memory, mapped once for its whole size.
            let p = unsafe { d.map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                .map_err(vk_err("vkMapMemory"))?;
            b.mapped = Some(p.cast::<u8>());
        }
        Ok(b)
    }

    /// Imports `data` (page-aligned start, length a multiple of
    /// minImportedHostPointerAlignment) as device memory bound to a storage buffer.
    pub fn import(&self, data: &[u8]) -> Result<Buffer<'_>, String> {
        let host_fn = self
            .host_fn
            .as_ref()
            .ok_or("the device does not advertise VK_EXT_external_memory_host")?;
        let d = &self.device;
        let ht = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let ptr = data.as_ptr() as *mut c_void;
        let size = data.len() as u64;
        let mut hp = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: ash 0.38 has no wrapper for this command; the function pointer was loaded
        // for this device, `ptr` is a live mapping, and `hp` is a valid output struct.
        let r = unsafe {
            (host_fn.fp().get_memory_host_pointer_properties_ext)(d.handle(), ht, ptr, &mut hp)
        };
        r.result()
            .map_err(vk_err("vkGetMemoryHostPointerPropertiesEXT"))?;
        let mut ext = vk::ExternalMemoryBufferCreateInfo::default().handle_types(ht);
        let bci = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext);
        // SAFETY: valid create info chain.
        let buf = unsafe { d.create_buffer(&bci, None) }.map_err(vk_err("vkCreateBuffer"))?;
        // SAFETY: `buf` is alive.
        let req = unsafe { d.get_buffer_memory_requirements(buf) };
        let bits = req.memory_type_bits & hp.memory_type_bits;
        let Some((ty, flags)) =
            self.memory_type(bits, vk::MemoryPropertyFlags::empty(), Default::default())
        else {
            // SAFETY: unused buffer of this device.
            unsafe { d.destroy_buffer(buf, None) };
            return Err(format!(
                "no memory type fits both the buffer (bits {:#x}) and the host pointer (bits {:#x})",
                req.memory_type_bits, hp.memory_type_bits
            ));
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(ht)
            .host_pointer(ptr);
        let ai = vk::MemoryAllocateInfo::default()
            .allocation_size(size)
            .memory_type_index(ty)
            .push_next(&mut import);
        // SAFETY: the host pointer stays mapped for as long as the returned buffer lives
        // (it borrows the caller's mapping for the whole arm).
        let mem = match unsafe { d.allocate_memory(&ai, None) } {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unused buffer of this device.
                unsafe { d.destroy_buffer(buf, None) };
                return Err(format!(
                    "vkAllocateMemory (host-pointer import of {size} bytes, memory type {ty}): {e}"
                ));
            }
        };
        let b = Buffer {
            ctx: self,
            buf,
            mem,
            size,
            mapped: None,
            flags,
        };
        // SAFETY: fresh buffer and imported memory of matching type.
        unsafe { d.bind_buffer_memory(buf, mem, 0) }.map_err(vk_err("vkBindBufferMemory"))?;
        Ok(b)
    }

    /// A descriptor pool for `n` sets of the checksum layout.
    pub fn descriptor_pool(&self, n: u32) -> Result<Pool<'_>, String> {
        let sizes = [
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: 2 * n,
            },
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC,
                descriptor_count: n,
            },
        ];
        let ci = vk::DescriptorPoolCreateInfo::default()
            .max_sets(n)
            .pool_sizes(&sizes);
        // SAFETY: valid create info; the pool is destroyed by `Pool::drop`.
        let pool = unsafe { self.device.create_descriptor_pool(&ci, None) }
            .map_err(vk_err("vkCreateDescriptorPool"))?;
        Ok(Pool { ctx: self, pool })
    }

    /// A set reading `data[offset .. offset+range]`, with the params and result buffers.
    pub fn set(
        &self,
        pool: &Pool<'_>,
        data: (vk::Buffer, u64, u64),
        params: &Buffer<'_>,
        result: &Buffer<'_>,
    ) -> Result<vk::DescriptorSet, String> {
        let layouts = [self.set_layout];
        let ai = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool.pool)
            .set_layouts(&layouts);
        // SAFETY: the pool was sized for the sets allocated from it.
        let set = unsafe { self.device.allocate_descriptor_sets(&ai) }
            .map_err(vk_err("vkAllocateDescriptorSets"))?[0];
        let d = [vk::DescriptorBufferInfo::default()
            .buffer(data.0)
            .offset(data.1)
            .range(data.2)];
        let p = [vk::DescriptorBufferInfo::default()
            .buffer(params.buf)
            .offset(0)
            .range(16)];
        let r = [vk::DescriptorBufferInfo::default()
            .buffer(result.buf)
            .offset(0)
            .range(8)];
        let w = |b: u32, ty, info| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(b)
                .descriptor_type(ty)
                .buffer_info(info)
        };
        let writes = [
            w(0, vk::DescriptorType::STORAGE_BUFFER, &d),
            w(1, vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC, &p),
            w(2, vk::DescriptorType::STORAGE_BUFFER, &r),
        ];
        // SAFETY: the buffers are alive and the ranges lie inside them.
        unsafe { self.device.update_descriptor_sets(&writes, &[]) };
        Ok(set)
    }

    /// A command buffer with its fence.
    pub fn command_buffer(&self) -> Result<Cmd<'_>, String> {
        let ai = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is alive; buffers are freed with it.
        let cb = unsafe { self.device.allocate_command_buffers(&ai) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?[0];
        // SAFETY: valid create info; the fence is destroyed by `Cmd::drop`.
        let fence = unsafe {
            self.device
                .create_fence(&vk::FenceCreateInfo::default(), None)
        }
        .map_err(vk_err("vkCreateFence"))?;
        Ok(Cmd {
            ctx: self,
            cb,
            fence,
            busy: false,
        })
    }

    pub fn begin(&self, cb: vk::CommandBuffer) -> Result<(), String> {
        let bi = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: `cb` is not pending (its fence was waited for) and may be reset.
        unsafe {
            self.device
                .reset_command_buffer(cb, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            self.device
                .begin_command_buffer(cb, &bi)
                .map_err(vk_err("vkBeginCommandBuffer"))
        }
    }

    /// Records one checksum dispatch over `n_vec4` 16-byte elements.
    pub fn dispatch(&self, cb: vk::CommandBuffer, set: vk::DescriptorSet, slot: u32, n_vec4: u64) {
        let groups = n_vec4
            .div_ceil(u64::from(WORKGROUP) * 16)
            .clamp(1, u64::from(self.max_workgroups)) as u32;
        let offsets = [slot * PARAM_STRIDE as u32];
        // SAFETY: `cb` is recording; the set matches the pipeline layout and its buffers
        // are alive until the submission is waited for.
        unsafe {
            self.device
                .cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, self.pipeline);
            self.device.cmd_bind_descriptor_sets(
                cb,
                vk::PipelineBindPoint::COMPUTE,
                self.layout,
                0,
                &[set],
                &offsets,
            );
            self.device.cmd_dispatch(cb, groups, 1, 1);
        }
    }

    /// A pipeline barrier from `src` to `dst` (global memory).
    pub fn barrier(
        &self,
        cb: vk::CommandBuffer,
        src: (vk::PipelineStageFlags, vk::AccessFlags),
        dst: (vk::PipelineStageFlags, vk::AccessFlags),
    ) {
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(src.1)
            .dst_access_mask(dst.1)];
        // SAFETY: `cb` is recording.
        unsafe {
            self.device.cmd_pipeline_barrier(
                cb,
                src.0,
                dst.0,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    pub fn copy(&self, cb: vk::CommandBuffer, src: vk::Buffer, dst: vk::Buffer, r: vk::BufferCopy) {
        // SAFETY: `cb` is recording; both buffers are alive and the region is in bounds.
        unsafe { self.device.cmd_copy_buffer(cb, src, dst, &[r]) };
    }

    /// Ends and submits the command buffer, signalling its fence.
    pub fn submit(&self, cmd: &mut Cmd<'_>) -> Result<(), String> {
        let cbs = [cmd.cb];
        let si = [vk::SubmitInfo::default().command_buffers(&cbs)];
        // SAFETY: `cb` is recording and everything it references is alive; `fence` is
        // unsignalled.
        unsafe {
            self.device
                .end_command_buffer(cmd.cb)
                .map_err(vk_err("vkEndCommandBuffer"))?;
            self.device
                .queue_submit(self.queue, &si, cmd.fence)
                .map_err(vk_err("vkQueueSubmit"))?;
        }
        cmd.busy = true;
        Ok(())
    }

    /// Waits for the command buffer's submission, if any, and resets its fence.
    pub fn wait(&self, cmd: &mut Cmd<'_>) -> Result<(), String> {
        if !cmd.busy {
            return Ok(());
        }
        // SAFETY: the fence belongs to this device and was submitted.
        unsafe {
            self.device
                .wait_for_fences(&[cmd.fence], true, u64::MAX)
                .map_err(vk_err("vkWaitForFences"))?;
            self.device
                .reset_fences(&[cmd.fence])
                .map_err(vk_err("vkResetFences"))?;
        }
        cmd.busy = false;
        Ok(())
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // SAFETY: all buffers borrow `self` and are gone; waiting for idle makes sure no
        // submission still uses the pipeline or pool.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_pipeline(self.pipeline, None);
            self.device.destroy_shader_module(self.shader, None);
            self.device.destroy_pipeline_layout(self.layout, None);
            self.device
                .destroy_descriptor_set_layout(self.set_layout, None);
            self.device.destroy_command_pool(self.pool, None);
            self.device.destroy_device(None);
        }
        let _ = self.vk;
    }
}
