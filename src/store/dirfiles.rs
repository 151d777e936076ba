//! The store directory's own files: the `store.json` header (written atomically) and the
//! writer's `store.lock`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::error::{io, open_regular, Result, StoreError};

/// Longest `store.json` read (the header is a few hundred bytes).
const MAX_HEADER_BYTES: u64 = 1 << 20;
use super::format::{self, Header};

/// Takes `store.lock` with `arg`; `None` when another process holds it.
pub(super) fn lock(dir: &Path, arg: FlockArg) -> Result<Option<Flock<File>>> {
    let path = dir.join("store.lock");
    let file = open_regular(
        &path,
        OpenOptions::new().create(true).truncate(false).write(true),
    )
    .or_else(|e| match e {
        // A read-only user may not create it, nor open it to write.
        StoreError::Io { .. } => open_regular(&path, OpenOptions::new().read(true)),
        e => Err(e),
    })?;
    match Flock::lock(file, arg) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(io("lock", &path)(errno.into())),
    }
}

/// `Err` unless this process may write in `dir` and to each day shard in it (`access(2)`): a read-only store fails when opened, not at the first append.
pub(super) fn check_writable(dir: &Path) -> Result<()> {
    let can = |p: &Path| {
        nix::unistd::access(p, nix::unistd::AccessFlags::W_OK)
            .map_err(|e| io("write to", p)(e.into()))
    };
    can(dir)?;
    for ent in std::fs::read_dir(dir).map_err(io("read", dir))? {
        let path = ent.map_err(io("read", dir))?.path();
        let shard = path
            .extension()
            .is_some_and(|e| e == "frames" || e == "index");
        if shard {
            can(&path)?;
        }
    }
    Ok(())
}

pub(super) fn write_header(dir: &Path) -> Result<()> {
    let path = dir.join("store.json");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut text = serde_json::to_string_pretty(&Header::new(now)).map_err(|source| {
        StoreError::BadHeader {
            path: path.clone(),
            source,
        }
    })?;
    text.push('\n');
    let tmp = dir.join(".store.json.tmp");
    let written = write_new(&tmp, text.as_bytes())
        .and_then(|()| std::fs::rename(&tmp, &path).map_err(io("rename", &tmp)));
    if written.is_err() {
        // A full disk or a failed rename leaves no `.store.json.tmp` behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// Creates `path` with `bytes`, synced.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = open_regular(
        path,
        OpenOptions::new().write(true).create(true).truncate(true),
    )?;
    f.write_all(bytes).map_err(io("write", path))?;
    f.sync_all().map_err(io("sync", path))
}

pub(super) fn read_header(dir: &Path) -> Result<Header> {
    let path = dir.join("store.json");
    let mut text = Vec::new();
    open_regular(&path, OpenOptions::new().read(true))?
        .take(MAX_HEADER_BYTES)
        .read_to_end(&mut text)
        .map_err(io("read", &path))?;
    let h: Header = serde_json::from_slice(&text).map_err(|source| StoreError::BadHeader {
        path: path.clone(),
        source,
    })?;
    if h.format != format::FORMAT_NAME || h.version != format::FORMAT_VERSION {
        return Err(StoreError::Version {
            path,
            format: h.format,
            version: h.version,
        });
    }
    Ok(h)
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn a_failed_header_write_leaves_no_temp_file() {
        // The rename fails (store.json is a non-empty directory), as a write on a full
        // disk would: the temp file must go with the error.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("store.json/x")).unwrap();
        assert!(super::write_header(dir.path()).is_err());
        assert!(!dir.path().join(".store.json.tmp").exists());
    }
}
