//! Errors of the collectors: every variant names the file it concerns.

use std::io;
use std::path::{Path, PathBuf};

/// An error reading or parsing one kernel file.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The file could not be opened or read.
    #[error("failed to read '{path}'")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A line did not have the expected shape.
    #[error("malformed line {line} of '{path}': '{text}'")]
    Parse {
        path: PathBuf,
        line: usize,
        text: String,
    },
}

impl CollectError {
    pub fn io(path: &Path, source: io::Error) -> Self {
        CollectError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn parse(path: &Path, line: usize, text: &str) -> Self {
        let mut text = text.to_string();
        if text.len() > 120 {
            let mut cut = 120;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        CollectError::Parse {
            path: path.to_path_buf(),
            line,
            text,
        }
    }

    /// The process (or cgroup) went away between listing and reading: ENOENT or ESRCH.
    pub fn is_gone(&self) -> bool {
        match self {
            CollectError::Io { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ESRCH)
                ) || source.kind() == io::ErrorKind::NotFound
            }
            CollectError::Parse { .. } => false,
        }
    }

    /// The kernel refused: EACCES or EPERM.
    pub fn is_denied(&self) -> bool {
        match self {
            CollectError::Io { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EPERM)
                ) || source.kind() == io::ErrorKind::PermissionDenied
            }
            CollectError::Parse { .. } => false,
        }
    }
}

/// Result of a collector.
pub type Result<T> = std::result::Result<T, CollectError>;

/// Converts a `procfs` error into ours, keeping the path and the errno.
pub fn from_procfs(err: procfs::ProcError, fallback: &Path) -> CollectError {
    use procfs::ProcError;
    let (path, source) = match err {
        ProcError::PermissionDenied(p) => (p, io::Error::from_raw_os_error(libc::EACCES)),
        ProcError::NotFound(p) => (p, io::Error::from_raw_os_error(libc::ENOENT)),
        ProcError::Incomplete(p) => (p, io::Error::from_raw_os_error(libc::ESRCH)),
        ProcError::Io(e, p) => (p, e),
        other => (None, io::Error::other(other.to_string())),
    };
    CollectError::io(path.as_deref().unwrap_or(fallback), source)
}
