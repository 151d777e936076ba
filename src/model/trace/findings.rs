//! Findings from traced counters: who copies a model with read(), which files thrash,
//! who stalls in direct reclaim, who was OOM-killed. Small rules over a [`TraceModel`].

use super::{TraceContext, TraceModel};
use crate::model::findings::{Finding, Severity};
use crate::units::iec;

/// A process that read at least this much of a file with read() is copying it...
pub const COPY_MIN_BYTES: u64 = 64 << 20;
/// ...or at least this fraction of the file, if its size is known.
pub const COPY_MIN_FRACTION: f64 = 0.5;
/// Refaulted pages worth a notice.
pub const REFAULT_MIN_PAGES: u64 = 256;
/// Direct-reclaim time worth a notice.
pub const RECLAIM_MIN_NS: u64 = 10_000_000;

fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn finding(
    sev: Severity,
    code: &str,
    subject: String,
    message: String,
    remedy: Option<&str>,
) -> Finding {
    Finding {
        severity: sev,
        code: code.to_string(),
        subject,
        message,
        remedy: remedy.map(str::to_string),
    }
}

/// Findings over the totals since attach (whatever interval the model's rates cover).
pub fn evaluate(m: &TraceModel, ctx: &TraceContext) -> Vec<Finding> {
    let mut out = Vec::new();
    // The rules read totals since attach: they are stated over that time.
    let secs = m.at_secs;
    for p in &m.processes {
        let comm = p.comm.as_deref().unwrap_or("?");
        for f in &p.files {
            let key = f.key;
            let size = ctx.sizes.get(&key).copied();
            let big = f.read_bytes >= COPY_MIN_BYTES
                || size.is_some_and(|s| {
                    s > 0
                        && f.read_bytes as f64 >= COPY_MIN_FRACTION * s as f64
                        && ctx.interest.contains(&key)
                });
            let Some(path) = &f.path else { continue };
            if big {
                out.push(finding(
                    Severity::Warning,
                    "read-copy",
                    path.clone(),
                    format!(
                        "pid {} ({comm}) read {} of '{}' with read() in {secs:.1} s: a copying loader",
                        p.pid,
                        iec(f.read_bytes),
                        name(path)
                    ),
                    Some("map the file instead (mmap, np.load(mmap_mode='r'), torch.load(mmap=True)): read() copies it into anonymous memory beside the page cache"),
                ));
            }
        }
        let ns = p.total.reclaim_ns.unwrap_or(0);
        if ns >= RECLAIM_MIN_NS {
            let n = p
                .total
                .direct_reclaims
                .unwrap_or(0)
                .saturating_add(p.total.memcg_reclaims.unwrap_or(0));
            out.push(finding(
                Severity::Notice,
                "direct-reclaim",
                format!("pid {}", p.pid),
                format!(
                    "pid {} ({comm}) stalled {:.0} ms in direct reclaim ({n} reclaims, longest {:.1} ms) in {secs:.1} s",
                    p.pid,
                    ns as f64 / 1e6,
                    p.total.reclaim_max_ns.unwrap_or(0) as f64 / 1e6
                ),
                Some("memory (or its cgroup's limit) is short: a private copy of a model counts twice; map it, or raise the limit"),
            ));
        }
    }
    for f in &m.files {
        let pages = f.total.refault_pages.unwrap_or(0);
        // Files nobody can name (deleted temp files...) are noise in a diagnosis.
        if pages < REFAULT_MIN_PAGES || (f.path.is_none() && !f.of_interest) {
            continue;
        }
        let shown = f
            .path
            .clone()
            .unwrap_or_else(|| format!("[{} inode {}]", f.device, f.inode));
        out.push(finding(
            Severity::Notice,
            "refaults",
            shown.clone(),
            format!(
                "'{}' had {} evicted and read back in {secs:.1} s: the page cache cannot hold it",
                name(&shown),
                iec(pages.saturating_mul(4096))
            ),
            Some("leave room for the page cache (memory limit, competing copies) or keep it mapped and locked"),
        ));
    }
    for k in &m.oom_kills {
        out.push(finding(
            Severity::Warning,
            "oom-kill",
            format!("pid {}", k.pid),
            format!(
                "pid {} ({}) was OOM-killed (anonymous {}, file {})",
                k.pid,
                k.comm,
                iec(k.anon_rss_bytes),
                iec(k.file_rss_bytes)
            ),
            Some("a private copy of a model counts against memory twice with its page cache; map it instead"),
        ));
    }
    out.sort_by_key(|f| f.severity);
    out
}
