//! PyTorch `torch.save` archives (the zip format, the default since PyTorch 1.6): entries
//! `<archive>/data.pkl` (the pickled object tree) and `<archive>/data/<key>` (one per
//! storage, stored uncompressed, 64-byte aligned by recent writers).
//!
//! Each storage is one tensor named by its key, with the absolute offset of its bytes.
//! The dtype and element count come from the storage's persistent id in `data.pkl`, read
//! by the restricted walker in [`super::pickle`], which executes nothing. Where the pickle
//! does not name a storage (or names it with a size that disagrees with the entry), the
//! storage is listed as dtype `storage`, shape `[bytes]`. The legacy non-zip format
//! (before PyTorch 1.6) is not recognised and reads as opaque.

use std::collections::HashMap;

use super::pickle::{self, StorageRef};
use super::source::Source;
use super::zip::{self, Archive, Entry};
use super::{sort_tensors, Container, ContainerError, Dtype, Format, Tensor};

/// The `data.pkl` entry of a torch archive: at the root or in one top-level folder.
fn pickle_entry(archive: &Archive) -> Option<&Entry> {
    archive
        .entries
        .iter()
        .find(|e| match e.name.strip_suffix("data.pkl") {
            Some("") => true,
            Some(dir) => dir.ends_with('/') && dir.matches('/').count() == 1,
            None => false,
        })
}

/// `true` if the archive holds a `data.pkl` as `torch.save` writes it.
pub fn detect(archive: &Archive) -> bool {
    pickle_entry(archive).is_some()
}

/// Our dtype and element size of a `torch.<X>Storage` class.
pub fn storage_dtype(class: &str) -> Option<(Dtype, u64)> {
    Some(match class {
        "DoubleStorage" => (Dtype::F64, 8),
        "FloatStorage" => (Dtype::F32, 4),
        "HalfStorage" => (Dtype::F16, 2),
        "BFloat16Storage" => (Dtype::BF16, 2),
        "Float8_e4m3fnStorage" => (Dtype::F8E4M3, 1),
        "Float8_e5m2Storage" => (Dtype::F8E5M2, 1),
        "LongStorage" => (Dtype::I64, 8),
        "IntStorage" => (Dtype::I32, 4),
        "ShortStorage" => (Dtype::I16, 2),
        "CharStorage" => (Dtype::I8, 1),
        "ByteStorage" | "UntypedStorage" => (Dtype::U8, 1),
        "UInt16Storage" => (Dtype::U16, 2),
        "UInt32Storage" => (Dtype::U32, 4),
        "UInt64Storage" => (Dtype::U64, 8),
        "BoolStorage" => (Dtype::Bool, 1),
        "ComplexFloatStorage" => (Dtype::Other("complex64".into()), 8),
        "ComplexDoubleStorage" => (Dtype::Other("complex128".into()), 16),
        "QInt8Storage" => (Dtype::Other("qint8".into()), 1),
        "QUInt8Storage" => (Dtype::Other("quint8".into()), 1),
        "QInt32Storage" => (Dtype::Other("qint32".into()), 4),
        _ => return None,
    })
}

/// Storage references of `data.pkl`, by key (empty if it is compressed).
fn references(
    src: &dyn Source,
    archive: &Archive,
    pkl: &Entry,
) -> Result<HashMap<String, StorageRef>, ContainerError> {
    if !pkl.is_stored() {
        return Ok(HashMap::new());
    }
    let at = zip::data_offset(src, archive, pkl)?;
    let bytes = src.read_at(at, pkl.compressed_size, "torch data.pkl")?;
    let refs = pickle::storages(&bytes)
        .map_err(|e| ContainerError::invalid("torch pickle", format!("'{}': {e}", pkl.name)))?;
    Ok(refs.into_iter().map(|r| (r.key.clone(), r)).collect())
}

/// The storages of a torch archive whose central directory is `archive`.
pub fn parse(src: &dyn Source, archive: &Archive) -> Result<Container, ContainerError> {
    let Some(pkl) = pickle_entry(archive) else {
        return Err(ContainerError::invalid("torch", "no 'data.pkl' entry"));
    };
    let prefix = pkl.name.strip_suffix("data.pkl").unwrap_or_default();
    let refs = references(src, archive, pkl)?;
    let mut tensors = Vec::new();
    for e in &archive.entries {
        let Some(key) = e
            .name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_prefix("data/"))
            .filter(|k| !k.is_empty() && !k.contains('/'))
        else {
            continue;
        };
        let offset = zip::data_offset(src, archive, e)?;
        let len = e.compressed_size;
        let typed = refs.get(key).and_then(|r| {
            let (dtype, size) = storage_dtype(&r.class)?;
            (r.numel.checked_mul(size) == Some(len)).then(|| (dtype, vec![r.numel]))
        });
        let (dtype, shape) = match typed {
            _ if !e.is_stored() => (Dtype::Other("compressed".into()), Vec::new()),
            Some(t) => t,
            None => (Dtype::Other("storage".into()), vec![len]),
        };
        tensors.push(Tensor {
            name: key.to_string(),
            dtype,
            shape,
            offset,
            len,
        });
    }
    sort_tensors(&mut tensors);
    Ok(Container {
        format: Format::Torch,
        file_size: src.size(),
        data_offset: None,
        alignment: None,
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors,
    })
}
