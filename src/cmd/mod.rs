//! Command glue: each command wires collect → model → render and writes the result.

pub mod bench;
pub mod child;
pub mod common;
pub mod compare;
pub mod demo;
pub mod dupes;
pub mod inspect;
pub mod man;
pub mod pressure;
pub mod probe;
pub mod record;
pub mod residency;
pub mod run;
pub mod scan;
pub mod serve;
pub mod top;
pub mod trace;

use std::io::Write;

/// Prints the warnings of `now` that `said` has not said yet, or said otherwise: a
/// condition that holds for a whole run is said once, then again only when it changes
/// (and a minute after it was last said at the earliest).
pub fn warn_fresh(said: &mut crate::sample::warning::Said, now: &[crate::sample::Warning]) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let at = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64();
    let fresh: Vec<&crate::sample::Warning> = said.fresh(now, at);
    warn_all(&fresh);
}

/// Prints warnings to stderr, one line each, never to stdout. A warning quotes paths
/// and kernel messages: its control characters are escaped (newlines too: one line each).
pub fn warn_all<W: std::fmt::Display>(warnings: &[W]) {
    let mut err = std::io::stderr().lock();
    for w in warnings {
        let _ = writeln!(
            err,
            "twofold: warning: {}",
            crate::render::safe::safe(&w.to_string())
        );
    }
}

/// A condition the user asked to fail on held (`scan --fail-on`): exit status 1 (not 2,
/// which is bad input), each line on stderr. The command's output was written first.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct ConditionMet(pub Vec<String>);
