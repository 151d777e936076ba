//! `twofold serve`: a Prometheus exporter.
//!
//! One collector thread runs the engine every `--interval` (snapshot → report →
//! [`crate::export`] families → encoded bodies, once per collection) and publishes the
//! bodies; a few HTTP worker threads answer scrapes with the latest bodies, so a scrape
//! never walks `/proc` (it reads only this process's own stat) and N concurrent scrapes cost a copy-free write each. The bodies are
//! handed over through one `RwLock<Arc<Bodies>>` (held for a pointer clone): the workers
//! need the *latest* value at any time, not a stream of them, which a channel would give.
//!
//! Read-only: GET (and HEAD) of `/metrics` and `/healthz`; anything else is 404 (or 405
//! for another method). Nothing from the request is used beyond its path and `Accept`.
//!
//! Honest about itself: `/healthz` answers 503 once the last good collection is older than
//! [`STALE_INTERVALS`] intervals (or none came that long after the start), and each scrape
//! appends, at the time it is answered, the age of the last good collection and the
//! process's CPU time and RSS ([`export::scrape_time`]).

use std::ffi::{CStr, CString};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::anyhow;

use crate::cli::ServeArgs;
use crate::collect::cache;
use crate::collect::gather::Request;
use crate::engine::{self, Engine, Snapshot};
use crate::export::{self, Options, SelfStats};
use crate::sample::warning::Said;
use crate::sample::{Warning, WarningKind};

/// `--web.max-connections` unless given: 256, at most a quarter of the soft limit of open
/// files (the rest is the collector's: it keeps a `/proc/PID/statm` open per process).
const MAX_CONNECTIONS: usize = 256;
/// `/healthz` fails when the last good collection is older than this many intervals.
pub const STALE_INTERVALS: u32 = 3;

/// The encoded expositions of one collection.
#[derive(Debug, Default)]
pub struct Bodies {
    pub openmetrics: Arc<[u8]>,
    pub text: Arc<[u8]>,
    /// False until the first collection has finished.
    pub ready: bool,
    /// When the last good collection finished.
    pub at: Option<Instant>,
}

pub type Latest = Arc<RwLock<Arc<Bodies>>>;

/// What the HTTP side knows besides the bodies: when the exporter started, its interval.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    started: Instant,
    interval: Duration,
}

impl Clock {
    /// Healthy while the last good collection (or, before the first, the start) is at
    /// most [`STALE_INTERVALS`] intervals old.
    fn healthy(&self, b: &Bodies, now: Instant) -> bool {
        now.duration_since(b.at.unwrap_or(self.started)) <= self.interval * STALE_INTERVALS
    }
}

/// Paths matching `pattern` (glob(3)); none when nothing matches.
fn glob(pattern: &str) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(pattern) else {
        return Vec::new();
    };
    // SAFETY: glob_t is plain data; zeroed is its documented initial state.
    let mut g: libc::glob_t = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string, `g` a valid glob_t that globfree releases below.
    let rc = unsafe { libc::glob(c.as_ptr(), 0, None, &mut g) };
    let mut out = Vec::new();
    if rc == 0 {
        for i in 0..g.gl_pathc {
            // SAFETY: glob filled gl_pathv with gl_pathc valid C strings.
            let p = unsafe { CStr::from_ptr(*g.gl_pathv.add(i)) };
            out.push(PathBuf::from(std::ffi::OsStr::from_bytes(p.to_bytes())));
        }
    }
    // SAFETY: `g` was initialised (zeroed or by glob); globfree accepts both.
    unsafe { libc::globfree(&mut g) };
    out
}

fn request(args: &ServeArgs) -> Request {
    let mut paths: Vec<PathBuf> = args.model_globs.iter().flat_map(|g| glob(g)).collect();
    paths.sort();
    paths.dedup();
    Request {
        paths,
        min_size: args.collect.min_size,
        stores: args.model_globs.is_empty(),
        candidates: true,
        ..Request::default()
    }
}

/// The collector: one collection every `interval` until `stop`, each published in `latest`.
fn collect_loop(args: &ServeArgs, latest: &Latest, stop: &AtomicBool) {
    let opts = Options {
        max_files: args.max_files,
        per_pid: args.per_pid,
    };
    let mut engine = Engine::new(request(args), args.collect.proof()).incremental(cache::MAX_AGE);
    let mut trace_failed = false;
    if args.trace {
        if let Err(why) = engine.set_tracing(true) {
            trace_failed = true;
            super::warn_all(&[format!(
                "--trace: tracing unavailable, no trace counters: {why}"
            )]);
        }
    }
    if args.trace_uploads {
        if let Err(why) = engine.set_upload_tracing() {
            super::warn_all(&[format!("--trace-uploads: uploads are not traced: {why}")]);
        }
    }
    if engine.tracing() {
        // One tracer per host: the others (a plain scan, top) read what it traces.
        if let Err(why) = engine.publish_uploads("serve") {
            super::warn_all(&[format!("the upload ledger is not shared: {why}")]);
        }
    }
    let mut stats = SelfStats::default();
    if trace_failed {
        stats.error("trace", 1);
    }
    let mut prev: Option<Snapshot> = None;
    let mut last: Option<crate::model::Report> = None;
    let mut names = export::names::Canonical::default();
    let resolved = Resolved::default();
    let mut next = Instant::now();
    let mut said = Said::default();
    let wait = super::common::StopWait::new();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        // Globs are expanded again each time: models appear and go.
        if !args.model_globs.is_empty() {
            engine.req = request(args);
        }
        let mut warnings = Vec::new();
        match engine.snapshot(&mut warnings) {
            Ok(snap) => {
                let mut report = engine::report(&snap, prev.as_ref());
                names.apply(&mut report, |n, k| resolved.get(n, k));
                resolved.forget_old();
                count_errors(&mut stats, &report);
                if let Some(p) = engine.last_proof_seconds {
                    stats.proof_durations.observe(p);
                }
                let took = t0.elapsed().as_secs_f64();
                stats.collect_duration_seconds = took;
                stats.collect_durations.observe(took);
                stats.last_success_unix_seconds = Some(snap.at_unix_ns as f64 / 1e9);
                let exp = export::families(&report, opts, &stats);
                stats.series_dropped_total += exp.dropped_series;
                publish(latest, exp.families, Some(Instant::now()));
                last = Some(report);
                prev = Some(snap);
            }
            Err(e) => {
                stats.error("collection", 1);
                stats.collect_durations.observe(t0.elapsed().as_secs_f64());
                warnings.push(Warning::host(
                    WarningKind::CollectionFailed,
                    format!("collection failed: {e:#}"),
                ));
                // The last good numbers stay, with the exporter's own series brought up
                // to date (the error, the duration); their age keeps growing.
                if let Some(r) = last.as_ref() {
                    let at = latest.read().ok().and_then(|l| l.at);
                    publish(latest, export::families(r, opts, &stats).families, at);
                }
            }
        }
        // The same warning every few seconds is noise: only new or changed ones are printed.
        super::warn_fresh(&mut said, &warnings);
        next += args.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        super::common::sleep_until(wait.as_ref(), stop, next);
    }
}

/// `name` resolved (`realpath`) when it names the inode `key` now; under the deadline of
/// `collect::answer` (a name on a mount that does not answer is not resolved).
fn resolve(name: &str, key: crate::sample::FileKey) -> Option<String> {
    use crate::collect::answer::{within, Place};
    use std::path::Path;
    let n = std::path::PathBuf::from(name);
    let real = within(Place::of_key(key), Path::new(name), move || {
        std::fs::canonicalize(n)
    })
    .ok()?
    .ok()?;
    names_inode(&real, key).then(|| real.to_str().map(str::to_string))?
}

/// Whether `path` (symlinks followed) is the inode `key` now (its `stat` under the
/// deadline: a mount that does not answer says no).
fn names_inode(path: impl AsRef<std::path::Path>, key: crate::sample::FileKey) -> bool {
    use crate::collect::answer::{metadata, Place};
    metadata(Place::of_key(key), path.as_ref())
        .is_ok_and(|m| m.is_ok_and(|m| crate::collect::reopen::identity(&m) == key))
}

/// How long a name's resolution is kept while it and what it resolved to still name the
/// inode.
const RESOLVED_AGE: Duration = Duration::from_secs(60);

/// [`resolve`] of each exported name, kept for [`RESOLVED_AGE`]: while the name and the
/// path it resolved to both still name the inode (a `stat` each), the resolution stands,
/// instead of a `realpath` (a `readlink` per component: a thousand calls per collection
/// for 200 model files). A symlink in the name changed to another path of the same inode
/// shows within that age.
#[derive(Default)]
struct Resolved {
    memo: std::cell::RefCell<
        std::collections::HashMap<(String, crate::sample::FileKey), (String, Instant)>,
    >,
}

impl Resolved {
    fn get(&self, name: &str, key: crate::sample::FileKey) -> Option<String> {
        let id = (name.to_string(), key);
        if let Some((real, at)) = self.memo.borrow().get(&id) {
            if at.elapsed() < RESOLVED_AGE
                && names_inode(name, key)
                && (real == name || names_inode(real, key))
            {
                return Some(real.clone());
            }
        }
        let real = resolve(name, key);
        let mut memo = self.memo.borrow_mut();
        match &real {
            Some(r) => memo.insert(id, (r.clone(), Instant::now())),
            None => memo.remove(&id),
        };
        real
    }

    /// Forgets the names resolved longer ago than their age (the models gone).
    fn forget_old(&self) {
        self.memo
            .borrow_mut()
            .retain(|_, (_, at)| at.elapsed() < RESOLVED_AGE);
    }
}

/// `node="$NODE_NAME"` on every series when `NODE_NAME` is set and not empty (the
/// DaemonSet sets it from `spec.nodeName`); nothing otherwise.
fn node_label() -> Vec<(String, String)> {
    match std::env::var("NODE_NAME") {
        Ok(n) if !n.trim().is_empty() => vec![("node".to_string(), n)],
        _ => Vec::new(),
    }
}

/// Encodes `families` once (the encoder takes them) and hands them to the HTTP workers;
/// `at`: when the good collection they come from finished.
fn publish(latest: &Latest, families: Vec<export::Family>, at: Option<Instant>) {
    let om = export::openmetrics_with(families, &node_label());
    let text = export::prometheus_text(&om);
    let om = om.strip_suffix("# EOF\n").unwrap_or(&om).to_string();
    let bodies = Arc::new(Bodies {
        openmetrics: Arc::from(om.into_bytes()),
        text: Arc::from(text.into_bytes()),
        ready: true,
        at,
    });
    if let Ok(mut l) = latest.write() {
        *l = bodies;
    }
}

/// Errors a good collection still had: files whose residency could not be read, processes
/// not read fully.
fn count_errors(stats: &mut SelfStats, r: &crate::model::Report) {
    let residency = r
        .files
        .iter()
        .filter(|f| f.residency_unknown_reason.is_some())
        .count();
    let unreadable = r
        .processes
        .iter()
        .filter(|p| p.unreadable.is_some())
        .count();
    stats.error("residency", residency as u64);
    stats.error("process_unreadable", unreadable as u64);
}

/// The Prometheus text format 0.0.4 unless the Accept header asks for OpenMetrics (with a
/// quality above 0), as node_exporter and the client libraries negotiate: a plain `curl`
/// gets the text format (`promtool check metrics` reads it); Prometheus asks for
/// OpenMetrics first and gets it.
pub fn wants_text_004(accept: Option<&str>) -> bool {
    !accept.is_some_and(|a| {
        a.split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            media == "application/openmetrics-text" && !refused
        })
    })
}

/// The body of one scrape: the last collection's, then what is known only now (the age of
/// that collection, the process's CPU and RSS), then `# EOF` for OpenMetrics.
pub fn scrape_body(bodies: &Bodies, text_004: bool, now: Instant) -> Vec<u8> {
    let age = bodies.at.map(|at| now.duration_since(at).as_secs_f64());
    let own = crate::collect::own::read(std::path::Path::new("/proc"));
    let tail = export::openmetrics_with(export::scrape_time(age, own), &node_label());
    let (main, tail) = if text_004 {
        (&bodies.text, export::prometheus_text(&tail))
    } else {
        (&bodies.openmetrics, tail)
    };
    let mut out = Vec::with_capacity(main.len() + tail.len());
    out.extend_from_slice(main);
    out.extend_from_slice(tail.as_bytes());
    out
}

pub fn run(args: &ServeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    crate::engine::one_heap();
    let web = match &args.web_config {
        Some(p) => web::load(p)?,
        None => web::WebConfig::default(),
    };
    let auth = web::Auth::new(web.users);
    let listen_err = |e: &dyn std::fmt::Display| anyhow!("cannot listen on '{}': {e}", args.listen);
    let listener = std::net::TcpListener::bind(args.listen).map_err(|e| listen_err(&e))?;
    let tls = web.tls;
    let conns = listen::Conns::new(max_connections(args.max_connections));
    let latest: Latest = Arc::new(RwLock::new(Arc::new(Bodies::default())));
    let stop = super::common::stop_flag();
    let clock = Clock {
        started: Instant::now(),
        interval: args.interval,
    };
    let site = http::Site {
        latest: &latest,
        clock,
        auth: &auth,
        listening: &conns.listening,
    };
    writeln!(
        out,
        "twofold serve: {}://{}/metrics{}, a collection every {:.1} s",
        if tls.is_some() { "https" } else { "http" },
        args.listen,
        if auth.is_open() { "" } else { " (basic auth)" },
        args.interval.as_secs_f64()
    )?;
    out.flush()?;
    let accepted = std::thread::scope(|s| {
        s.spawn(|| {
            collect_loop(args, &latest, &stop);
            // The accept loop and the connections wait without a timeout: woken to stop.
            conns.close_all(&listener);
        });
        let (site, conns, stop, listener) = (&site, &conns, &*stop, &listener);
        let accepted = listen::accept_loop(s, listener, tls, site, conns, args.idle_timeout, stop);
        if accepted.is_err() {
            // The collector sees it at its next wake-up, then closes the connections.
            stop.store(true, Ordering::Relaxed);
        }
        accepted
    });
    accepted.map_err(|e| anyhow!("http: the listener on '{}' failed: {e}", args.listen))?;
    writeln!(out, "twofold serve: stopped")?;
    Ok(())
}

/// The bound on open connections: `--web.max-connections`, else [`MAX_CONNECTIONS`] or a
/// quarter of the soft limit of open files if less (at least 16).
fn max_connections(given: Option<u32>) -> usize {
    if let Some(n) = given {
        return n as usize;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limits into `lim`, a valid rlimit.
    let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    (soft / 4).clamp(16, MAX_CONNECTIONS)
}

mod conn;
mod http;
mod listen;
mod web;

#[cfg(test)]
mod tests {
    use super::wants_text_004;

    #[test]
    fn text_unless_openmetrics_is_asked_for() {
        // Prometheus 3's scrape Accept header (OpenMetrics first), and 2.x's.
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(!wants_text_004(Some(prometheus)));
        assert!(!wants_text_004(Some(
            "application/openmetrics-text; version=1.0.0"
        )));
        assert!(!wants_text_004(Some("Application/OpenMetrics-Text")));
        // curl, a browser, a 0.0.4 client, OpenMetrics refused.
        assert!(wants_text_004(None));
        assert!(wants_text_004(Some("*/*")));
        assert!(wants_text_004(Some("text/plain; version=0.0.4")));
        assert!(wants_text_004(Some(
            "application/openmetrics-text; q=0, text/plain"
        )));
    }
}
