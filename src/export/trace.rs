//! `serve --trace`: per-file eBPF counters since the exporter attached its programs
//! (monotonic for the exporter's life: it attaches once). Only for files exported one by
//! one; a file folded into `other` has none.

use super::{l, Acc, Kind};
use crate::model::{FileModel, Report};

pub(super) fn file_series(acc: &mut Acc, r: &Report, f: &FileModel, id: &str) {
    let Some(tr) = &r.trace else { return };
    let Some(t) = tr.files.iter().find(|t| t.key == f.key) else {
        return;
    };
    let page = r.system.page_size_bytes as f64;
    let tot = &t.total;
    for (name, help, v) in [
        (
            "twofold_file_page_faults",
            "Page faults on the file's pages (filemap:mm_filemap_fault) since the exporter attached its eBPF programs",
            tot.file_faults.map(|v| v as f64),
        ),
        (
            "twofold_file_page_cache_added_bytes",
            "Bytes of the file added to the page cache since the exporter attached its eBPF programs",
            tot.added_pages.map(|v| v as f64 * page),
        ),
        (
            "twofold_file_page_cache_evicted_bytes",
            "Bytes of the file evicted from the page cache since the exporter attached its eBPF programs",
            tot.evicted_pages.map(|v| v as f64 * page),
        ),
        (
            "twofold_file_refaults",
            "Pages of the file read back soon after eviction (refaults) since the exporter attached its eBPF programs",
            tot.refault_pages.map(|v| v as f64),
        ),
        (
            "twofold_file_read_bytes",
            "Bytes read from the file with read(), pread64(), readv() and preadv() since the exporter attached its eBPF programs",
            tot.read_bytes.map(|v| v as f64),
        ),
    ] {
        if let Some(v) = v {
            acc.add(name, help, Kind::Counter, l(&[("file_id", id)]), v);
        }
    }
}
