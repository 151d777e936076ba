//! Small helpers the samples share: the kernel's mark of an unlinked file's name, and
//! the JSON rule for counts.

/// `skip_serializing_if`: a count of 0 is left out of the JSON (read back as 0).
pub(crate) fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// What `/proc/PID/maps` and `/proc/PID/fd` append to the name of an unlinked file.
pub const DELETED: &str = " (deleted)";

/// The path without the kernel's ` (deleted)` mark.
pub fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(DELETED).unwrap_or(path)
}
