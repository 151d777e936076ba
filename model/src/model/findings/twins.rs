//! The same-bytes finding: files of interest with the same bytes (twins), each with its own
//! page cache, so what is cached of two of them is in memory twice.

use super::{finding, Code, Finding, Severity};
use crate::model::FileModel;
use crate::sample::FileKey;

/// One finding per group of files of the same bytes of which two or more are cached.
pub(super) fn same_bytes_findings(files: &[FileModel], out: &mut Vec<Finding>) {
    for f in files.iter().filter(|f| !f.same_bytes.is_empty()) {
        // Said once, by the group's least key.
        if f.same_bytes.iter().any(|o| o.key < f.key) {
            continue;
        }
        let mut cached: Vec<(FileKey, String, u64)> = std::iter::once(f)
            .chain(
                files
                    .iter()
                    .filter(|o| f.same_bytes.iter().any(|t| t.key == o.key)),
            )
            .filter_map(|o| Some((o.key, o.path.clone(), o.resident_bytes.filter(|b| *b > 0)?)))
            .collect();
        if cached.len() < 2 {
            continue;
        }
        cached.sort_by(|x, y| (&x.1, x.0).cmp(&(&y.1, y.0)));
        let total: u64 = cached.iter().map(|c| c.2).sum();
        let largest = cached.iter().map(|c| c.2).max().unwrap_or(0);
        out.push(finding(
            Severity::Notice,
            Code::SameBytesCached {
                files: cached,
                extra_bytes: total - largest,
            },
        ));
    }
}
