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
    #[error("store file '{}' is {kind}, not a regular file", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
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

/// What a file that is not a regular one is, for [`StoreError::NotRegular`].
pub(crate) fn kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a pipe"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// `Err(NotRegular)` unless `meta` (of `path`) is a regular file.
pub(crate) fn regular(path: &std::path::Path, meta: &std::fs::Metadata) -> Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(StoreError::NotRegular {
        path: path.to_path_buf(),
        kind: kind(meta.file_type()),
    })
}

/// Opens the store file `path` with `opts` without blocking (`O_NONBLOCK`: a FIFO put in
/// a store opens at once, and a FIFO opened to write with no reader fails) and refuses
/// anything but a regular file, checked on the descriptor opened (no race).
pub(crate) fn open_regular(
    path: &std::path::Path,
    opts: &mut std::fs::OpenOptions,
) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = opts
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io("open", path))?;
    let meta = file.metadata().map_err(io("stat", path))?;
    regular(path, &meta)?;
    Ok(file)
}
