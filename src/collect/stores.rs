//! Well-known model stores: where runtimes keep downloaded models, so that a copy made by
//! a loader that closed the file (`np.load`, `torch.load`) can be searched for even when
//! no process names the file any more.
//!
//! - Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//!   `~/.cache/huggingface/hub` (snapshots are symlinks into `blobs/`).
//! - ollama: `$OLLAMA_MODELS/blobs`, `~/.ollama/models/blobs`,
//!   `/usr/share/ollama/.ollama/models/blobs` (GGUF blobs named by digest).
//! - torch hub: `$TORCH_HOME/hub/checkpoints`, else `~/.cache/torch/hub/checkpoints`.
//! - `TWOFOLD_MODEL_PATH`: a `:`-separated list of directories.
//!
//! Files are recognised by a model extension or the GGUF magic, at least 1 MiB, and
//! deduplicated by (device, inode).

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::has_model_extension;
use crate::sample::FileKey;

/// Smallest store file of interest.
pub const MIN_STORE_FILE: u64 = 1 << 20;
/// How deep a store is walked.
const MAX_DEPTH: usize = 8;

/// The store directories named by `env` (a lookup such as `std::env::var_os`).
pub fn dirs(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<PathBuf> {
    let home = env("HOME").map(PathBuf::from);
    let mut out = Vec::new();
    let under_home = |rel: &str| home.as_ref().map(|h| h.join(rel));
    match (env("HF_HUB_CACHE"), env("HF_HOME")) {
        (Some(c), _) => out.push(PathBuf::from(c)),
        (None, Some(h)) => out.push(PathBuf::from(h).join("hub")),
        (None, None) => out.extend(under_home(".cache/huggingface/hub")),
    }
    match env("OLLAMA_MODELS") {
        Some(m) => out.push(PathBuf::from(m).join("blobs")),
        None => out.extend(under_home(".ollama/models/blobs")),
    }
    out.push(PathBuf::from("/usr/share/ollama/.ollama/models/blobs"));
    match env("TORCH_HOME") {
        Some(t) => out.push(PathBuf::from(t).join("hub/checkpoints")),
        None => out.extend(under_home(".cache/torch/hub/checkpoints")),
    }
    if let Some(list) = env("TWOFOLD_MODEL_PATH") {
        out.extend(std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty()));
    }
    // Under the deadline: a store on a mount that does not answer is walked (and said)
    // by [`model_files`].
    out.retain(|d| {
        let p = d.clone();
        super::answer::within(super::answer::Place::of(d), d, move || p.is_dir()) != Ok(false)
    });
    out.sort();
    out.dedup();
    out
}

fn gguf_magic(path: &Path) -> bool {
    let mut m = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && &m == b"GGUF"
}

/// A store's model files: (path, identity, size).
pub type StoreFiles = Vec<(PathBuf, FileKey, u64)>;

/// Model files under `dirs` (symlinks followed), with their size; and the stores whose
/// filesystem did not answer (each walked on a helper thread under the deadline of
/// [`super::answer`]).
pub fn model_files(dirs: &[PathBuf]) -> (StoreFiles, Vec<super::answer::NotAnswering>) {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut hung = Vec::new();
    for d in dirs {
        let dir = d.clone();
        match super::answer::within(super::answer::Place::of(d), d, move || walk_store(&dir)) {
            Ok(found) => out.extend(found.into_iter().filter(|f| seen.insert(f.1))),
            Err(e) => hung.push(e),
        }
    }
    out.sort();
    (out, hung)
}

/// The model files of one store.
fn walk_store(d: &Path) -> StoreFiles {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    {
        let mut stack = vec![(d.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let Ok(meta) = std::fs::metadata(&p) else {
                    continue;
                };
                if meta.is_dir() {
                    // Real directories only: a symlinked directory could loop.
                    if depth < MAX_DEPTH && e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push((p, depth + 1));
                    }
                    continue;
                }
                if !meta.is_file() || meta.len() < MIN_STORE_FILE {
                    continue;
                }
                let key = FileKey::from_dev(meta.dev(), meta.ino());
                if seen.contains(&key) {
                    continue;
                }
                if has_model_extension(&p.to_string_lossy()) || gguf_magic(&p) {
                    seen.insert(key);
                    out.push((p, key, meta.len()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_models_by_extension_or_magic_once() {
        let d = tempfile::tempdir().unwrap();
        let blobs = d.path().join("hub/models--x/blobs");
        let snap = d.path().join("hub/models--x/snapshots/abc");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(blobs.join("f00d"), vec![7u8; 2 << 20]).unwrap();
        std::os::unix::fs::symlink(blobs.join("f00d"), snap.join("model.safetensors")).unwrap();
        let mut gguf = b"GGUF".to_vec();
        gguf.resize(2 << 20, 1);
        std::fs::write(d.path().join("sha256-1"), gguf).unwrap();
        std::fs::write(d.path().join("notes.txt"), vec![0u8; 2 << 20]).unwrap();
        std::fs::write(d.path().join("tiny.gguf"), b"GGUF").unwrap();
        let (found, hung) = model_files(&[d.path().to_path_buf()]);
        assert!(hung.is_empty());
        let names: Vec<String> = found
            .iter()
            .map(|(p, _, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["model.safetensors", "sha256-1"]);
        let env = |k: &str| match k {
            "HF_HOME" => Some(d.path().as_os_str().to_owned()),
            "TWOFOLD_MODEL_PATH" => Some(std::ffi::OsString::from(format!(
                "{}:/nonexistent",
                blobs.display()
            ))),
            _ => None,
        };
        let ds = dirs(env);
        assert!(ds.contains(&d.path().join("hub")));
        assert!(ds.contains(&blobs));
        assert!(!ds.iter().any(|p| p == Path::new("/nonexistent")));
    }
}
