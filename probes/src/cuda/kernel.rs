//! The pass kernel in CUDA C, compiled to PTX by NVRTC at run time for the device's
//! compute capability (or read from the PTX file named by `TWOFOLD_CUDA_PTX`).
//!
//! Each thread keeps four independent 16-byte streaming loads (`__ldcs`) in flight per
//! iteration of a grid-stride loop, so a grid of a few blocks per multiprocessor covers
//! the latency of HBM or of PCIe reads of host memory; partial sums are reduced per warp
//! and added with one atomic per warp.

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys};

use super::driver::driver_error;

pub const SOURCE: &str = r#"
#define ACC(v, jj) { \
    unsigned int k = 2u * (base_word + 4u * (unsigned int)(jj)) + 1u; \
    s += v.x + v.y + v.z + v.w; \
    w += v.x * k + v.y * (k + 2u) + v.z * (k + 4u) + v.w * (k + 6u); }

extern "C" __global__ void __launch_bounds__(512)
checksum(const uint4* __restrict__ data, unsigned long long n, unsigned int base_word,
         unsigned int* out)
{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int s = 0, w = 0;
    for (; j + 3 * stride < n; j += 4 * stride) {
        uint4 a = __ldcs(data + j);
        uint4 b = __ldcs(data + j + stride);
        uint4 c = __ldcs(data + j + 2 * stride);
        uint4 d = __ldcs(data + j + 3 * stride);
        ACC(a, j);
        ACC(b, j + stride);
        ACC(c, j + 2 * stride);
        ACC(d, j + 3 * stride);
    }
    for (; j < n; j += stride) {
        uint4 a = __ldcs(data + j);
        ACC(a, j);
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        w += __shfl_xor_sync(0xffffffffu, w, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(out, s);
        atomicAdd(out + 1, w);
    }
}
"#;

/// Threads per block.
pub const BLOCK: u32 = 512;

pub struct Kernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
    /// `nvrtc compute_90` or the PTX file's path.
    pub origin: String,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load` and no launch is pending (every pass is
        // synchronised before the kernel drops).
        unsafe {
            let _ = result::module::unload(self.module);
        }
    }
}

fn ptx(cc: &str) -> Result<(String, String), String> {
    if let Some(path) = std::env::var_os("TWOFOLD_CUDA_PTX") {
        let p = std::path::PathBuf::from(path);
        let text = std::fs::read_to_string(&p)
            .map_err(|e| format!("cannot read TWOFOLD_CUDA_PTX '{}': {e}", p.display()))?;
        return Ok((text, p.display().to_string()));
    }
    // SAFETY: only tries to dlopen the library (cudarc panics later if it is absent).
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "NVRTC (libnvrtc.so) not found: add CUDA's lib64 to LD_LIBRARY_PATH, or name a PTX file in TWOFOLD_CUDA_PTX"
                .into(),
        );
    }
    let arch = format!("compute_{}", cc.replace('.', ""));
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        ..Default::default()
    };
    let p = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| format!("NVRTC could not compile the pass kernel: {e:?}"))?;
    Ok((p.to_src(), format!("nvrtc {arch}")))
}

impl Kernel {
    /// Compiles (or reads) and loads the kernel for compute capability `cc` (`9.0`).
    pub fn load(cc: &str) -> Result<Kernel, String> {
        let (text, origin) = ptx(cc)?;
        let image = CString::new(text).map_err(|_| "PTX contains a NUL byte".to_string())?;
        // SAFETY: `image` is NUL-terminated PTX text, alive during the call.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(|e| format!("cuModuleLoadData: {}", driver_error(e)))?;
        let name = CString::new("checksum").map_err(|_| "bad name".to_string())?;
        // SAFETY: `module` was just loaded.
        let func = unsafe { result::module::get_function(module, name) }
            .map_err(|e| format!("cuModuleGetFunction('checksum'): {}", driver_error(e)))?;
        Ok(Kernel {
            module,
            func,
            origin,
        })
    }

    /// Enqueues one launch over `n_vec4` 16-byte elements at `data`, whose first word is
    /// word `base_word` (mod 2^32) of the working set.
    pub fn launch(
        &self,
        stream: sys::CUstream,
        grid: u32,
        data: sys::CUdeviceptr,
        n_vec4: u64,
        base_word: u32,
        out: sys::CUdeviceptr,
    ) -> Result<(), String> {
        let (mut a, mut b, mut c, mut d) = (data, n_vec4, base_word, out);
        let mut params: [*mut c_void; 4] = [
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u32).cast(),
            (&mut d as *mut u64).cast(),
        ];
        // SAFETY: the parameters match the kernel's signature and are read by the driver
        // during the call; `data` and `out` are device-accessible for the launch's life
        // (callers synchronise before freeing them).
        unsafe {
            result::launch_kernel(
                self.func,
                (grid.max(1), 1, 1),
                (BLOCK, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(|e| format!("cuLaunchKernel: {}", driver_error(e)))
    }
}
