//! NumPy `.npz`: a zip of `.npy` files (`np.savez`, stored; `np.savez_compressed`,
//! deflated). Stored arrays are listed with the absolute offset of their data; a
//! compressed entry cannot be mapped, so it is one opaque region of dtype `compressed`
//! covering its compressed bytes.

use super::source::Source;
use super::zip::{self, Archive};
use super::{npy, sort_tensors, Container, ContainerError, Dtype, Format, Tensor};

/// `true` if every file in the archive is a `.npy` (and there is at least one).
pub fn detect(archive: &Archive) -> bool {
    let mut files = archive.entries.iter().filter(|e| !e.name.ends_with('/'));
    let mut any = false;
    files.all(|e| {
        any = true;
        e.name.ends_with(".npy")
    }) && any
}

/// The tensor table of an `.npz` whose central directory is `archive`.
pub fn parse(src: &dyn Source, archive: &Archive) -> Result<Container, ContainerError> {
    let mut tensors = Vec::with_capacity(archive.entries.len());
    for e in archive.entries.iter().filter(|e| !e.name.ends_with('/')) {
        let name = e.name.strip_suffix(".npy").unwrap_or(&e.name).to_string();
        let data = zip::data_offset(src, archive, e)?;
        if !e.is_stored() {
            tensors.push(Tensor {
                name,
                dtype: Dtype::Other("compressed".into()),
                shape: Vec::new(),
                offset: data,
                len: e.compressed_size,
            });
            continue;
        }
        let a = npy::array(src, data, data + e.compressed_size)
            .map_err(|err| ContainerError::invalid("npz", format!("entry '{}': {err}", e.name)))?;
        tensors.push(Tensor {
            name,
            dtype: a.dtype,
            shape: a.shape,
            offset: a.data_offset,
            len: a.len,
        });
    }
    sort_tensors(&mut tensors);
    Ok(Container {
        format: Format::Npz,
        file_size: src.size(),
        data_offset: None,
        alignment: None,
        external: Vec::new(),
        unmapped: Vec::new(),
        tensors,
    })
}
