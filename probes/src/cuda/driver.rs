//! A thin, checked layer over the CUDA driver API (cudarc's `sys` and `result`):
//! every call's failure becomes `"cuCall(args): CUDA_ERROR_NAME (description)"`.

use std::ffi::{c_void, CStr};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

/// `CU_MEMHOSTREGISTER_READ_ONLY`.
pub const READ_ONLY: u32 = sys::CU_MEMHOSTREGISTER_READ_ONLY;

/// `CUDA_ERROR_INVALID_VALUE (invalid argument)`.
pub fn driver_error(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

pub fn check(what: &str, r: sys::CUresult) -> Result<(), String> {
    r.result()
        .map_err(|e| format!("{what}: {}", driver_error(e)))
}

/// The initialised driver.
pub struct Driver(());

/// The device's primary context, current on this thread while alive.
pub struct Context {
    dev: sys::CUdevice,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: releases the retain made in `Driver::context`.
        unsafe {
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}

/// A host range registered with `cuMemHostRegister`; unregistered on drop.
pub struct Registered {
    ptr: *mut c_void,
    pub len: usize,
    pub flags: u32,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: `ptr` was registered by `Driver::register` and not unregistered since.
        unsafe {
            let _ = sys::cuMemHostUnregister(self.ptr);
        }
    }
}

impl Registered {
    /// The device address of the registered range.
    pub fn device_ptr(&self) -> Result<sys::CUdeviceptr, String> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is registered (and mapped: all registrations are under unified
        // addressing); `d` is a valid output.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr, 0)
        })?;
        Ok(d)
    }
}

impl Driver {
    /// Opens libcuda and calls `cuInit`; "not available" when the library is absent.
    pub fn open() -> Result<Driver, String> {
        // SAFETY: only tries to dlopen the library; cudarc panics later if it is absent,
        // which is why this check comes first.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcuda.so not found (no NVIDIA driver)".into());
        }
        result::init().map_err(|e| format!("cuInit: {}", driver_error(e)))?;
        Ok(Driver(()))
    }

    pub fn count(&self) -> Result<i32, String> {
        result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {}", driver_error(e)))
    }

    pub fn device(&self, ordinal: i32) -> Result<sys::CUdevice, String> {
        result::device::get(ordinal)
            .map_err(|e| format!("cuDeviceGet({ordinal}): {}", driver_error(e)))
    }

    pub fn attribute(&self, dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, String> {
        // SAFETY: `dev` came from cuDeviceGet.
        unsafe { result::device::get_attribute(dev, a) }
            .map_err(|e| format!("cuDeviceGetAttribute({a:?}): {}", driver_error(e)))
    }

    pub fn name(&self, dev: sys::CUdevice) -> Result<String, String> {
        result::device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {}", driver_error(e)))
    }

    pub fn total_mem(&self, dev: sys::CUdevice) -> Result<u64, String> {
        // SAFETY: `dev` came from cuDeviceGet.
        unsafe { result::device::total_mem(dev) }
            .map(|v| v as u64)
            .map_err(|e| format!("cuDeviceTotalMem: {}", driver_error(e)))
    }

    pub fn pci_bus_id(&self, dev: sys::CUdevice) -> Option<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer is as long as we say.
        let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
        r.result().ok()?;
        // SAFETY: the driver wrote a NUL-terminated string into `buf`.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(s.to_string_lossy().into_owned())
    }

    pub fn driver_version(&self) -> Option<String> {
        let mut v = 0;
        // SAFETY: `v` is a valid output.
        unsafe { sys::cuDriverGetVersion(&mut v) }.result().ok()?;
        Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    /// Retains the primary context of `ordinal` and makes it current.
    pub fn context(&self, ordinal: i32) -> Result<Context, String> {
        let dev = self.device(ordinal)?;
        // SAFETY: `dev` is valid; the retain is released by `Context::drop`.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| format!("cuDevicePrimaryCtxRetain: {}", driver_error(e)))?;
        let c = Context { dev };
        // SAFETY: `ctx` is the retained primary context.
        unsafe { result::ctx::set_current(ctx) }
            .map_err(|e| format!("cuCtxSetCurrent: {}", driver_error(e)))?;
        Ok(c)
    }

    /// Registers `data` with `flags` (0 or [`READ_ONLY`]).
    pub fn register(&self, data: &[u8], flags: u32) -> Result<Registered, String> {
        let ptr = data.as_ptr() as *mut c_void;
        // SAFETY: `data` is a live mapping for as long as the caller keeps the returned
        // registration (it borrows the mapping for the whole job); with the read-only
        // flag the device never writes to it, and nothing here writes either.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr, data.len(), flags) };
        check(
            &format!("cuMemHostRegister({} bytes, flags {flags:#x})", data.len()),
            r,
        )?;
        Ok(Registered {
            ptr,
            len: data.len(),
            flags,
        })
    }

    /// Free and total device memory of the current context.
    pub fn mem_info(&self) -> Result<(u64, u64), String> {
        result::mem_get_info()
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(|e| format!("cuMemGetInfo: {}", driver_error(e)))
    }
}
