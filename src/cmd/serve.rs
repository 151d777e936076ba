//! `twofold serve`: a Prometheus exporter.
//!
//! One collector thread runs the engine every `--interval` (snapshot → report →
//! [`crate::export`] families → encoded bodies, once per collection) and publishes the
//! bodies; a few HTTP worker threads answer scrapes with the latest bodies, so a scrape
//! never walks `/proc` and N concurrent scrapes cost a copy-free write each. The bodies are
//! handed over through one `RwLock<Arc<Bodies>>` (held for a pointer clone): the workers
//! need the *latest* value at any time, not a stream of them, which a channel would give.
//!
//! Read-only: GET (and HEAD) of `/metrics` and `/healthz`; anything else is 404 (or 405
//! for another method). Nothing from the request is used beyond its path and `Accept`.

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

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
const WORKERS: usize = 4;

/// The encoded expositions of one collection.
#[derive(Debug, Default)]
pub struct Bodies {
    pub openmetrics: Arc<[u8]>,
    pub text: Arc<[u8]>,
    /// False until the first collection has finished.
    pub ready: bool,
}

type Latest = Arc<RwLock<Arc<Bodies>>>;

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
    if args.trace {
        if let Err(why) = engine.set_tracing(true) {
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
    let mut stats = SelfStats::default();
    let mut prev: Option<Snapshot> = None;
    let mut next = Instant::now();
    let mut said = Said::default();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        // Globs are expanded again each time: models appear and go.
        if !args.model_globs.is_empty() {
            engine.req = request(args);
        }
        let mut warnings = Vec::new();
        match engine.snapshot(&mut warnings) {
            Ok(snap) => {
                let report = engine::report(&snap, prev.as_ref());
                stats.collect_duration_seconds = t0.elapsed().as_secs_f64();
                stats.last_success_unix_seconds = Some(snap.at_unix_ns as f64 / 1e9);
                let exp = export::families(&report, opts, &stats);
                stats.series_dropped_total += exp.dropped_series;
                let om = export::openmetrics(&exp.families);
                let text = export::prometheus_text(&om);
                let bodies = Arc::new(Bodies {
                    openmetrics: Arc::from(om.into_bytes()),
                    text: Arc::from(text.into_bytes()),
                    ready: true,
                });
                if let Ok(mut l) = latest.write() {
                    *l = bodies;
                }
                prev = Some(snap);
            }
            Err(e) => {
                stats.collect_errors_total += 1;
                warnings.push(Warning::host(
                    WarningKind::CollectionFailed,
                    format!("collection failed: {e:#}"),
                ));
            }
        }
        // The same warning every few seconds is noise: only new or changed ones are printed.
        super::warn_fresh(&mut said, &warnings);
        next += args.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while !stop.load(Ordering::Relaxed) && Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50).min(next - Instant::now()));
        }
    }
}

/// OpenMetrics unless the Accept header asks for the 0.0.4 text format and not for
/// OpenMetrics.
pub fn wants_text_004(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        let a = a.to_ascii_lowercase();
        !a.contains("application/openmetrics-text") && a.contains("text/plain")
    })
}

/// A header of this module's ASCII constants (never refused; if it were, it is left out).
fn header(name: &str, value: &str) -> Vec<tiny_http::Header> {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .into_iter()
        .collect()
}

fn respond(req: tiny_http::Request, latest: &Latest) {
    use tiny_http::{Method, Response, StatusCode};
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let method = req.method().clone();
    let plain = |code: u16, body: &str| {
        let mut r = Response::from_string(body).with_status_code(StatusCode(code));
        for h in header("Content-Type", "text/plain; charset=utf-8") {
            r.add_header(h);
        }
        r
    };
    if !matches!(method, Method::Get | Method::Head) {
        let _ = req.respond(plain(405, "method not allowed\n"));
        return;
    }
    let bodies = match latest.read() {
        Ok(l) => Arc::clone(&l),
        Err(_) => Arc::new(Bodies::default()),
    };
    match path.as_str() {
        "/metrics" if !bodies.ready => {
            let _ = req.respond(plain(503, "the first collection is still running\n"));
        }
        "/metrics" => {
            let accept = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("Accept"))
                .map(|h| h.value.as_str().to_string());
            let (body, ctype) = if wants_text_004(accept.as_deref()) {
                (Arc::clone(&bodies.text), TEXT_004)
            } else {
                (Arc::clone(&bodies.openmetrics), OPENMETRICS)
            };
            let len = body.len();
            let resp = Response::new(
                StatusCode(200),
                header("Content-Type", ctype),
                std::io::Cursor::new(body),
                Some(len),
                None,
            );
            let _ = req.respond(resp);
        }
        "/healthz" => {
            let _ = req.respond(plain(200, "ok\n"));
        }
        _ => {
            let _ = req.respond(plain(404, "not found: try /metrics\n"));
        }
    }
}

pub fn run(args: &ServeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    crate::engine::one_heap();
    let server = tiny_http::Server::http(args.listen)
        .map_err(|e| anyhow!("cannot listen on '{}': {e}", args.listen))?;
    let server = Arc::new(server);
    let latest: Latest = Arc::new(RwLock::new(Arc::new(Bodies::default())));
    let stop = super::common::stop_flag();
    writeln!(
        out,
        "twofold serve: http://{}/metrics, a collection every {:.1} s",
        args.listen,
        args.interval.as_secs_f64()
    )?;
    out.flush()?;
    std::thread::scope(|s| {
        s.spawn(|| collect_loop(args, &latest, &stop));
        for _ in 0..WORKERS {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    match server.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(req)) => respond(req, &latest),
                        Ok(None) => {}
                        Err(e) => {
                            eprintln!("twofold: warning: http: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            });
        }
    });
    writeln!(out, "twofold serve: stopped")?;
    Ok(())
}
