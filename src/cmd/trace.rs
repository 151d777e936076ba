//! `twofold trace`: attach the eBPF programs,
//! sample their maps every interval, name what they count (scan collectors for files of
//! interest, `/proc` for the rest) and print rates.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cli::TraceArgs;
use crate::collect::gather::Request;
use crate::collect::Roots;
use crate::engine::Engine;
use crate::model::trace::{TraceContext, TraceModel};
use crate::render::trace::{self as out_trace, Attached, Record};
use crate::sample::trace::TraceSample;
use crate::sample::FileKey;

/// (dev, inode) of each path (files, or the model files of directories).
fn explicit_files(paths: &[PathBuf]) -> anyhow::Result<BTreeMap<FileKey, String>> {
    let mut out = BTreeMap::new();
    for p in paths {
        let place = crate::collect::answer::Place::of(p);
        let meta = crate::collect::answer::metadata(place, p)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .with_context(|| format!("cannot access '{}'", p.display()))?;
        crate::input::refuse_pseudo(p, if meta.is_dir() { "directory" } else { "file" })?;
        if meta.is_file() {
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            out.insert(
                FileKey::from_dev(meta.dev(), meta.ino()),
                abs.display().to_string(),
            );
        } else if !meta.is_dir() {
            bail!("'{}' is not a regular file or directory", p.display());
        }
    }
    Ok(out)
}

/// What `trace`'s models show beside the counters: the files of interest, their paths
/// and sizes, and the rows asked for.
struct TraceView {
    paths: BTreeMap<FileKey, String>,
    sizes: BTreeMap<FileKey, u64>,
    pids: Vec<i32>,
    only_files: Vec<FileKey>,
    top: usize,
    page_bytes: u64,
}

impl TraceView {
    /// The model of `cur` (over the time since `prev`, or since the attach), with the
    /// names the engine looked up when it read the counters.
    fn model(&self, cur: &TraceSample, prev: Option<&TraceSample>) -> TraceModel {
        let mut paths = self.paths.clone();
        for (k, p) in &cur.names.paths {
            paths.entry(*k).or_insert_with(|| p.clone());
        }
        let ctx = TraceContext {
            paths,
            interest: self.paths.keys().copied().collect(),
            sizes: self.sizes.clone(),
            comms: cur.names.comms.clone(),
            pids: self.pids.clone(),
            files: self.only_files.clone(),
            top: self.top,
            page_bytes: self.page_bytes,
        };
        TraceModel::new(cur, prev, &ctx)
    }
}

/// Sleeps until `until` or until `stop` is set; false if stopped.
fn sleep_until(until: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

pub fn run(args: &TraceArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let roots = Roots::live();
    crate::collect::bpf::check_privilege(&roots.proc)?;
    if args.interval.is_zero() {
        bail!("--interval must be longer than '0s'");
    }
    let explicit = explicit_files(&args.files)?;
    // Files of interest now: the named ones, and model files the processes hold. The
    // engine collects them once, attaches (pinning them and the named processes), and
    // then reads only the counters, naming what the rows show.
    let mut engine = Engine::new(
        Request {
            paths: args.files.clone(),
            pids: args.pids.clone(),
            min_size: args.min_size,
            ..Request::default()
        },
        None,
    );
    let mut warnings = Vec::new();
    let snap = engine.snapshot(&mut warnings)?;
    super::warn_all(&warnings);
    let sample = &snap.sample;
    let mut paths = explicit.clone();
    let mut sizes = BTreeMap::new();
    for f in &sample.files {
        paths.entry(f.key).or_insert_with(|| f.path.clone());
        if let Some(s) = f.size_bytes {
            sizes.insert(f.key, s);
        }
    }
    // --file: only the named files (and the model files of named directories).
    let only_files: Vec<FileKey> = sample
        .files
        .iter()
        .filter(|f| f.explicit)
        .map(|f| f.key)
        .chain(explicit.keys().copied())
        .collect();
    engine.set_tracing(true).map_err(|e| anyhow::anyhow!(e))?;
    engine.trace_rows(args.top);
    let view = TraceView {
        paths: paths.clone(),
        sizes,
        pids: args.pids.clone(),
        only_files,
        top: args.top,
        page_bytes: sample.system.page_bytes(),
    };
    let attached = Attached {
        attach_ms: engine.trace_attach_time().unwrap_or_default().as_secs_f64() * 1e3,
        unavailable: engine.trace_unavailable(),
        files: paths.values().cloned().collect(),
        pids: args.pids.clone(),
    };
    let mut sample_now = || -> anyhow::Result<TraceSample> {
        let mut warnings = Vec::new();
        let s = engine
            .trace_sample(&mut warnings)
            .ok_or_else(|| anyhow::anyhow!("the eBPF programs were detached"));
        super::warn_all(&warnings);
        s
    };
    // SIGINT/SIGTERM stop the loop, so the summary is still printed.
    let stop = super::common::stop_flag();
    let start = Instant::now();
    let end = args.duration.map(|d| start + d);
    // Sampled before saying "attached", so nothing that follows is left out.
    let mut prev = sample_now()?;
    if args.output.json {
        out_trace::json_line(out, Record::Attached(attached))?;
    } else {
        out.write_all(
            crate::render::safe::terminal(&out_trace::human_attached(&attached)).as_bytes(),
        )?;
        out.flush()?;
    }
    let mut next = start + args.interval;
    loop {
        let until = end.map_or(next, |e| e.min(next));
        let finished = !sleep_until(until, &stop) || end.is_some_and(|e| Instant::now() >= e);
        let cur = sample_now()?;
        if !finished || end.is_none() {
            let m = view.model(&cur, Some(&prev));
            emit(out, args.output.json, Record::Interval(m))?;
        } else if cur.at_secs - prev.at_secs > 0.01 {
            // The last, partial interval.
            let m = view.model(&cur, Some(&prev));
            emit(out, args.output.json, Record::Interval(m))?;
        }
        if finished {
            let m = view.model(&cur, None);
            emit(out, args.output.json, Record::Summary(m))?;
            return Ok(());
        }
        prev = cur;
        next += args.interval;
    }
}

fn emit(out: &mut dyn Write, json: bool, record: Record) -> anyhow::Result<()> {
    if json {
        out_trace::json_line(out, record)?;
        return Ok(());
    }
    let text = match &record {
        Record::Interval(m) => out_trace::human(m, "interval"),
        Record::Summary(m) => out_trace::human(m, "summary since attach"),
        Record::Attached(a) => out_trace::human_attached(a),
    };
    writeln!(out, "{}", crate::render::safe::terminal(&text))?;
    out.flush()?;
    Ok(())
}
