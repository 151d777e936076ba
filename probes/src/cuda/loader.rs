//! A device copy of a file's bytes made the way inference runtimes make one
//! (`cuMemAlloc` + `cuMemcpyHtoD`), held until dropped, and read back on request so that
//! the copy can be checked byte for byte against the file. This is the only kind of device
//! copy twofold can prove: the device memory of another process cannot be read (NVML
//! gives its size only, and CUDA IPC needs the owner's cooperation).

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::arms::DevBuf;
use super::driver::{check, driver_error, Context, Driver};

/// The bytes held on the device, with what they cost there.
pub struct DeviceCopy {
    // Field order is drop order: the buffer goes before the context that owns it.
    buf: DevBuf,
    _ctx: Context,
    /// Bytes copied.
    pub bytes: u64,
    /// Device memory the copy took: free memory before the allocation less free memory
    /// after it (`cuMemGetInfo`), so the allocator's rounding is included.
    pub device_bytes: u64,
    /// `0000:3b:00.0`.
    pub pci_bus_id: Option<String>,
}

/// The device's primary context, current on this thread: what a runtime has before it
/// uploads any weight (its own device memory is already charged to the process).
pub struct Loader {
    driver: Driver,
    ctx: Context,
    pci_bus_id: Option<String>,
}

impl Loader {
    pub fn open(ordinal: i32) -> Result<Loader, String> {
        let driver = Driver::open()?;
        let dev = driver.device(ordinal)?;
        let pci_bus_id = driver.pci_bus_id(dev);
        let ctx = driver.context(ordinal)?;
        Ok(Loader {
            driver,
            ctx,
            pci_bus_id,
        })
    }

    /// Copies `data` to the device in chunks of `chunk` bytes.
    pub fn upload(self, data: &[u8], chunk: usize) -> Result<DeviceCopy, String> {
        let d = &self.driver;
        let (free_before, _) = d.mem_info()?;
        let buf = DevBuf::new(data.len().max(1) as u64)?;
        let (free_after, _) = d.mem_info()?;
        let chunk = chunk.max(1);
        for (i, part) in data.chunks(chunk).enumerate() {
            let dst = buf.0 + (i * chunk) as u64;
            // SAFETY: `dst..dst+part.len()` lies inside the allocation of `data.len()`
            // bytes; the copy is synchronous, so `part` outlives it.
            check("cuMemcpyHtoD", unsafe {
                sys::cuMemcpyHtoD_v2(dst, part.as_ptr() as *const c_void, part.len())
            })?;
        }
        Ok(DeviceCopy {
            buf,
            _ctx: self.ctx,
            bytes: data.len() as u64,
            device_bytes: free_before.saturating_sub(free_after),
            pci_bus_id: self.pci_bus_id,
        })
    }
}

impl DeviceCopy {
    /// Reads the device bytes back in chunks of `chunk` bytes, in order, into `sink`.
    pub fn read_back(&self, chunk: usize, mut sink: impl FnMut(&[u8])) -> Result<(), String> {
        let chunk = chunk.max(1);
        let mut host = vec![0u8; chunk.min(self.bytes as usize).max(1)];
        let mut off = 0u64;
        while off < self.bytes {
            let n = (self.bytes - off).min(chunk as u64) as usize;
            // SAFETY: the source range lies inside the allocation; `host` holds `n` bytes.
            unsafe { result::memcpy_dtoh_sync(&mut host[..n], self.buf.0 + off) }
                .map_err(|e| format!("cuMemcpyDtoH: {}", driver_error(e)))?;
            sink(&host[..n]);
            off += n as u64;
        }
        Ok(())
    }
}
