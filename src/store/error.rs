//! Errors of the store. Damage (a torn tail, a flipped byte) is not an error: it is reported
//! as one-line strings and the damaged frames are absent.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to {what} '{}'", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{}' is not a twofold store: it has files but no store.json", path.display())]
    NotAStore { path: PathBuf },
    #[error("'{}' is not a twofold store header", path.display())]
    BadHeader {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("store '{}' has format '{format}' version {version}; this twofold reads 'twofold-store' version 1", path.display())]
    Version {
        path: PathBuf,
        format: String,
        version: u32,
    },
    #[error("store '{}' is being written by another process (its store.lock is held); open it read-only", path.display())]
    Locked { path: PathBuf },
    #[error("store '{}' was opened read-only", path.display())]
    ReadOnly { path: PathBuf },
    #[error("timestamp {at_ns} ns is before the store's last frame at {last_ns} ns; timestamps must not decrease")]
    OutOfOrder { at_ns: u64, last_ns: u64 },
    #[error("frame of {len} bytes is too large for the store (at most 256 MiB)")]
    TooLarge { len: usize },
    #[error("'{}' is not empty; export writes a new store", path.display())]
    DestNotEmpty { path: PathBuf },
    #[error("store '{}' failed an earlier write that could not be undone; open it again", path.display())]
    Poisoned { path: PathBuf },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// `map_err` helper: `.map_err(io("read", &path))`.
pub(crate) fn io<'a>(
    what: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}
