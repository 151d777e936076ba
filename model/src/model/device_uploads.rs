//! Proven device copies from the upload ledger: what each process uploaded of a file
//! (matched by content, as it is or converted), what it cloned on the device from those
//! bytes, and who reads a mapping of it in place. Pure.
//!
//! An upload or clone whose bytes are several files' is counted under one of them, the
//! file the process came to ([`super::relation`]); a converted one counts by the bytes
//! it takes on the device (F32 → BF16: 0.50 of the file), as a converted private copy does.

use std::collections::BTreeMap;

use super::device::{alive, fraction, only_gpu, DeviceCopy, InPlaceModel, UploadModel};
use super::relation::Relations;
use super::FileModel;
use crate::sample::converted::{words, Conversion};
use crate::sample::uploads::{DeviceClone, FileUpload, UploadsSample};
use crate::sample::{FileKey, Sample};

/// Device bytes of `file_bytes` in the form `conversion` (`widened` for recordings made
/// before conversions were named).
fn device_bytes(file_bytes: u64, conversion: Option<Conversion>, widened: bool) -> u64 {
    match conversion {
        Some(c) => {
            let (f, m) = c.elements();
            file_bytes / f.max(1) * m
        }
        None if widened => file_bytes * 2,
        None => file_bytes,
    }
}

/// One upload or clone of the ledger, as this module weighs it.
struct Entry<'a> {
    pid: i32,
    file: FileKey,
    conversion: Option<Conversion>,
    widened: bool,
    also: &'a [FileKey],
    held_at_upload: bool,
    ranges: &'a [(u64, u64)],
    file_bytes: u64,
    device_bytes: u64,
    copies: u64,
    first_unix_ns: u64,
    last_unix_ns: u64,
    entry: &'a str,
    cloned: bool,
}

impl<'a> Entry<'a> {
    /// What the upload still holds on the device (all of it, in recordings that did not
    /// keep it).
    fn upload(u: &'a FileUpload) -> Entry<'a> {
        let ranges = u.held_ranges.as_deref().unwrap_or(&u.ranges);
        let file_bytes = ranges.iter().map(|(a, b)| b - a).sum();
        Entry {
            pid: u.pid,
            file: u.file,
            conversion: u.conversion,
            widened: u.widened,
            also: &u.also,
            held_at_upload: u.held_at_upload,
            ranges,
            file_bytes,
            device_bytes: device_bytes(file_bytes, u.conversion, u.widened),
            copies: u.copies,
            first_unix_ns: u.first_unix_ns,
            last_unix_ns: u.last_unix_ns,
            entry: &u.entry,
            cloned: false,
        }
    }

    fn clone_of(c: &'a DeviceClone) -> Entry<'a> {
        Entry {
            pid: c.pid,
            file: c.file,
            conversion: c.conversion,
            widened: false,
            also: &c.also,
            held_at_upload: false,
            ranges: &c.ranges,
            file_bytes: c.file_bytes,
            device_bytes: c.device_bytes,
            copies: c.copies,
            first_unix_ns: c.first_unix_ns,
            last_unix_ns: c.last_unix_ns,
            entry: &c.entry,
            cloned: true,
        }
    }
}

/// Whether `pid` held `file` when an upload of it was matched.
fn held(u: &UploadsSample, pid: i32, file: FileKey) -> bool {
    u.uploads
        .iter()
        .any(|x| x.pid == pid && x.file == file && x.held_at_upload)
}

/// The traced uploads and clones of `f` and registrations of its mappings; an upload or a
/// clone of a live process that holds at least its bytes of device memory (NVML) is a
/// proven device copy.
pub(super) fn uploads_of(
    sample: &Sample,
    relations: &Relations,
    f: &mut FileModel,
    left: &mut BTreeMap<(i32, u32), u64>,
) {
    let Some(u) = sample.gpu.uploads.as_ref() else {
        return;
    };
    let size = f.size_bytes.unwrap_or(0);
    let comm = |pid: i32| {
        sample
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.comm.clone())
            .or_else(|| {
                u.processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .map(|p| p.comm.clone())
            })
            .unwrap_or_default()
    };
    for r in u.registrations.iter().filter(|r| r.file == f.key) {
        if alive(sample, r.pid) {
            f.in_place.push(InPlaceModel {
                pid: r.pid,
                comm: comm(r.pid),
                file_offset: r.file_offset,
                bytes: r.bytes,
                at_unix_ns: r.at_unix_ns,
            });
        }
    }
    f.uploads_retired = u
        .retired
        .iter()
        .filter(|r| r.file == f.key)
        .cloned()
        .collect();
    // Uploads first: a clone is proven from what device memory is left after them.
    let entries = u
        .uploads
        .iter()
        .filter(|x| x.file == f.key)
        .map(Entry::upload)
        .chain(
            u.clones
                .iter()
                .filter(|c| c.file == f.key)
                .map(Entry::clone_of),
        );
    for e in entries {
        // Counted under one file of those whose bytes these are.
        let attribution = if e.also.is_empty() {
            None
        } else {
            let mut options = vec![(e.file, e.held_at_upload || held(u, e.pid, e.file))];
            options.extend(e.also.iter().map(|o| (*o, held(u, e.pid, *o))));
            let choice = relations.choose(e.pid, &options);
            if choice.file != f.key {
                continue;
            }
            relations.words(&choice)
        };
        let gpu = only_gpu(sample, e.pid);
        let held_bytes = gpu.and_then(|g| left.get(&(e.pid, g)).copied());
        let device_bytes = e.device_bytes;
        let not_proven = if e.file_bytes == 0 {
            Some(format!(
                "overwritten or freed on the device since ({} {})",
                e.copies,
                if e.copies == 1 { "copy" } else { "copies" }
            ))
        } else if !alive(sample, e.pid) {
            Some("the process exited".to_string())
        } else if sample.gpu.not_available.is_some() {
            Some("its device memory is unknown (no NVML)".to_string())
        } else if gpu.is_none() {
            Some(
                "it holds device memory on no GPU, or on several (the GPU is not known)"
                    .to_string(),
            )
        } else if held_bytes.unwrap_or(0) < device_bytes {
            Some(format!(
                "it holds {} B of device memory left to attribute, less than the {device_bytes} B {} (freed since)",
                held_bytes.unwrap_or(0),
                if e.cloned { "cloned" } else { "uploaded" }
            ))
        } else {
            None
        };
        let proven = not_proven.is_none();
        if let (true, Some(g)) = (proven, gpu) {
            if let Some(l) = left.get_mut(&(e.pid, g)) {
                *l = l.saturating_sub(device_bytes);
            }
            let d = sample.gpu.devices.iter().find(|d| d.info.index == g);
            let mut notes: Vec<String> = Vec::new();
            if e.cloned {
                notes.push("cloned on the device".into());
            }
            match e.conversion {
                Some(c) => notes.push(words(c)),
                None if e.widened => notes.push("widened F16/BF16 to F32".into()),
                None => {}
            }
            notes.extend(attribution.clone());
            // By the bytes it takes on the device: a narrowed copy is part of the file.
            f.device_copies.push(DeviceCopy {
                pid: e.pid,
                comm: comm(e.pid),
                gpu: Some(g),
                gpu_name: d.and_then(|d| d.info.name.clone()),
                integrated: d.and_then(|d| d.info.integrated),
                device_bytes,
                attributed_bytes: device_bytes,
                fraction: fraction(device_bytes, size),
                proven: true,
                via: if e.cloned { "clone" } else { "upload" }.into(),
                proven_at_unix_ns: Some(e.last_unix_ns),
                note: (!notes.is_empty()).then(|| notes.join("; ")),
            });
        }
        f.uploads.push(UploadModel {
            pid: e.pid,
            comm: comm(e.pid),
            gpu,
            widened: e.widened,
            conversion: e.conversion,
            cloned: e.cloned,
            attribution,
            ranges: e.ranges.to_vec(),
            file_bytes: e.file_bytes,
            device_bytes,
            copies: e.copies,
            first_unix_ns: e.first_unix_ns,
            last_unix_ns: e.last_unix_ns,
            entry: e.entry.to_string(),
            proven,
            not_proven,
        });
    }
}
