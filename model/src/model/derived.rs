//! Numbers derived from a report's rows, defined once: every view (top, dump, the
//! exporter, the history of a session) asks the model type rather than doing the sums
//! itself. Pure.

use super::{FileModel, Report};

fn sum_known(values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.into_iter().try_fold(0u64, |acc, v| Some(acc + v?))
}

impl FileModel {
    /// Bytes of the file's copy-on-write pages over all its mappers (smaps `Anonymous:`
    /// inside their private mappings of it); `None` if one of them is unknown.
    pub fn cow_bytes(&self) -> Option<u64> {
        sum_known(self.mappers.iter().map(|m| m.cow_anon_bytes))
    }

    /// The CoW part of the count in bytes: `representations.cow` × size, rounded.
    pub fn counted_cow_bytes(&self) -> Option<u64> {
        Some((self.representations.cow? * self.size_bytes? as f64).round() as u64)
    }

    /// The device part of the count in bytes: `representations.device` × size, rounded.
    pub fn counted_device_bytes(&self) -> Option<u64> {
        Some((self.representations.device? * self.size_bytes? as f64).round() as u64)
    }

    /// Device bytes living processes uploaded from the file, as the upload tracer matched
    /// them (converted bytes count as the device holds them; clones made on the device are
    /// no uploads); `None` when no upload of it was traced (tracing off, or nothing
    /// uploaded).
    pub fn uploaded_bytes(&self) -> Option<u64> {
        let up = self.uploads.iter().filter(|u| !u.cloned);
        (!self.uploads.is_empty()).then(|| up.map(|u| u.device_bytes).sum())
    }

    /// Memory the proven private copies occupy, each physical page once (a copy shared
    /// after fork counts its share in each process), rounded per copy.
    pub fn private_copy_memory_bytes(&self) -> u64 {
        let total: f64 = self.proven_copies.iter().map(|c| c.physical_bytes()).sum();
        total.round() as u64
    }

    /// File bytes of the proven private copies, each its physical share
    /// ([`super::ProvenCopy::physical_bytes`]).
    pub fn proven_copy_bytes(&self) -> f64 {
        self.proven_copies.iter().map(|c| c.physical_bytes()).sum()
    }

    /// As [`FileModel::proven_copy_bytes`], each copy rounded to whole bytes first.
    pub fn proven_copy_whole_bytes(&self) -> u64 {
        // Shares summed before rounding: nine thirds of a 512 MiB copy are 512 MiB, not 4
        // bytes more.
        let total: f64 = self.proven_copies.iter().map(|c| c.physical_bytes()).sum();
        total.round() as u64
    }

    /// Private memory attributed to the suspected (unsearched) copies.
    pub fn suspected_copy_bytes(&self) -> u64 {
        self.suspected_copies
            .iter()
            .map(|c| c.attributed_bytes)
            .sum()
    }

    /// Distinct processes that map, hold open or hold a copy (proven or suspected) of
    /// the file.
    pub fn holder_count(&self) -> usize {
        let mut pids: Vec<i32> = self.mappers.iter().map(|m| m.pid).collect();
        pids.extend(self.holders.iter().map(|h| h.pid));
        pids.extend(self.proven_copies.iter().map(|c| c.pid));
        pids.extend(self.suspected_copies.iter().map(|c| c.pid));
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    }

    /// Whether a process `of` picks maps the file, holds it open or holds a copy (proven
    /// or suspected) of it.
    pub fn is_held_by(&self, of: impl Fn(&i32) -> bool) -> bool {
        self.mappers.iter().any(|m| of(&m.pid))
            || self.holders.iter().any(|h| of(&h.pid))
            || self.proven_copies.iter().any(|c| of(&c.pid))
            || self.suspected_copies.iter().any(|c| of(&c.pid))
    }

    /// Memory of the proven private copies held by the processes `of` picks, by their
    /// physical shares as the count takes them: one copy nine forked workers share counts
    /// once in their workload, not nine times.
    pub fn proven_copy_memory_of(&self, of: impl Fn(&i32) -> bool) -> u64 {
        self.proven_copies
            .iter()
            .filter(|c| of(&c.pid))
            .map(|c| c.physical_bytes())
            .sum::<f64>()
            .round() as u64
    }

    /// Bytes held beyond one copy of the file: (count − 1) × size, when both are known.
    pub fn excess_bytes(&self) -> Option<u64> {
        let count = self.representations.proven?;
        let size = self.size_bytes?;
        Some(((count - 1.0).max(0.0) * size as f64).round() as u64)
    }

    /// Page cache + CoW + the memory of the proven private copies; `None` when the page
    /// cache or the CoW part is unknown.
    pub fn held_bytes(&self) -> Option<u64> {
        Some(self.resident_bytes? + self.cow_bytes()? + self.private_copy_memory_bytes())
    }
}

impl Report {
    /// CoW (anonymous) bytes inside the process's private mappings of model files;
    /// `None` when one of them is unknown.
    pub fn process_cow_bytes(&self, pid: i32) -> Option<u64> {
        sum_known(
            self.files
                .iter()
                .flat_map(|f| f.mappers.iter())
                .filter(|m| m.pid == pid)
                .map(|m| m.cow_anon_bytes),
        )
    }

    /// `anon_bytes_per_sec` of the process, from the report's rates.
    pub fn anon_growth(&self, pid: i32) -> Option<f64> {
        self.rates
            .as_ref()?
            .processes
            .iter()
            .find(|r| r.pid == pid)?
            .anon_bytes_per_sec
    }

    /// The model bytes (Σ sizes of the files).
    pub fn model_bytes(&self) -> u64 {
        self.files.iter().filter_map(|f| f.size_bytes).sum()
    }

    /// The machine-wide excess: Σ over files of [`FileModel::excess_bytes`] (files whose
    /// count or size is unknown add nothing).
    pub fn excess_bytes(&self) -> u64 {
        self.files.iter().filter_map(FileModel::excess_bytes).sum()
    }
}
