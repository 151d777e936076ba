//! Collectors: read the kernel's files into raw [`crate::sample`] types.
//!
//! Every reader takes a root path; the live roots are named once, in [`Roots::live`].

pub mod cgroup;
pub mod error;
pub mod gather;
pub mod kv;
pub mod maps;
pub mod memory;
pub mod process;
pub mod residency;
pub mod system;

use std::path::PathBuf;

/// Where the kernel's file systems are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc: PathBuf,
    pub cgroup: PathBuf,
}

impl Roots {
    /// The live system.
    pub fn live() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            cgroup: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// File extensions of model containers.
pub const MODEL_EXTENSIONS: &[&str] = &[
    "gguf",
    "safetensors",
    "bin",
    "pt",
    "pth",
    "ckpt",
    "onnx",
    "npy",
    "npz",
    "tflite",
    "mlmodel",
    "h5",
];

/// Whether a path names a model container by its extension (a `" (deleted)"` suffix of
/// `/proc/PID/maps` is ignored).
pub fn has_model_extension(path: &str) -> bool {
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    std::path::Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| MODEL_EXTENSIONS.iter().any(|m| m.eq_ignore_ascii_case(e)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_extensions() {
        assert!(super::has_model_extension("/m/llama.Q4_K_M.gguf"));
        assert!(super::has_model_extension("/m/x.SAFETENSORS"));
        assert!(super::has_model_extension("/m/x.npy (deleted)"));
        assert!(!super::has_model_extension("/usr/lib/libc.so.6"));
        assert!(!super::has_model_extension("/m/gguf"));
    }
}
