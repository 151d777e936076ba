//! Findings from traced counters: who copies a model with read(), which files thrash,
//! who stalls in direct reclaim, who was OOM-killed. Small rules over a [`TraceModel`].

use super::{TraceContext, TraceModel};
use crate::model::findings::{Code, Finding, Severity};

/// A process that read at least this much of a file with read() is copying it...
pub const COPY_MIN_BYTES: u64 = 64 << 20;
/// ...or at least this fraction of the file, if its size is known.
pub const COPY_MIN_FRACTION: f64 = 0.5;
/// Refaulted pages worth a notice.
pub const REFAULT_MIN_PAGES: u64 = 256;
/// Direct-reclaim time worth a notice.
pub const RECLAIM_MIN_NS: u64 = 10_000_000;

/// Findings over the totals since attach (whatever interval the model's rates cover).
pub fn evaluate(m: &TraceModel, ctx: &TraceContext) -> Vec<Finding> {
    let mut out = Vec::new();
    // The rules read totals since attach: they are stated over that time.
    let secs = m.at_secs;
    for p in &m.processes {
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
                out.push(Finding {
                    severity: Severity::Warning,
                    code: Code::ReadCopy {
                        file: key,
                        path: path.clone(),
                        pid: p.pid,
                        comm: p.comm.clone(),
                        read_bytes: f.read_bytes,
                        secs,
                    },
                });
            }
        }
        let ns = p.total.reclaim_ns.unwrap_or(0);
        if ns >= RECLAIM_MIN_NS {
            let n = p
                .total
                .direct_reclaims
                .unwrap_or(0)
                .saturating_add(p.total.memcg_reclaims.unwrap_or(0));
            out.push(Finding {
                severity: Severity::Notice,
                code: Code::DirectReclaim {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    reclaim_ns: ns,
                    reclaims: n,
                    longest_ns: p.total.reclaim_max_ns.unwrap_or(0),
                    secs,
                },
            });
        }
    }
    for f in &m.files {
        let pages = f.total.refault_pages.unwrap_or(0);
        // Files nobody can name (deleted temp files...) are noise in a diagnosis.
        if pages < REFAULT_MIN_PAGES || (f.path.is_none() && !f.of_interest) {
            continue;
        }
        out.push(Finding {
            severity: Severity::Notice,
            code: Code::Refaults {
                file: f.key,
                path: f.path.clone(),
                pages,
                page_bytes: ctx.page_bytes,
                secs,
            },
        });
    }
    for k in &m.oom_kills {
        out.push(Finding {
            severity: Severity::Warning,
            code: Code::OomKill {
                pid: k.pid,
                comm: k.comm.clone(),
                anon_rss_bytes: k.anon_rss_bytes,
                file_rss_bytes: k.file_rss_bytes,
            },
        });
    }
    out.sort_by_key(|f| f.severity);
    out
}
