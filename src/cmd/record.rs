//! `twofold record`, `replay`, `dump` and `snapshot`: the engine's snapshots in a store
//! (docs/store.md), and the same report and renderer as `scan` over them.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context};

use std::io::IsTerminal;

use crate::cli::{DumpArgs, DumpFormat, DumpWhat, RecordArgs, ReplayArgs, SnapshotArgs};
use crate::collect::cache;
use crate::engine::{self, Engine, Snapshot};
use crate::render;
use crate::sample::warning::Said;
use crate::store::Store;
use crate::timespec;

use super::common::{
    append, decode, open_read, render_report, replayed, stop_flag, store_dir, warn_damage,
};

/// Checks a store directory before anything is created in it: if it exists it must be a
/// directory, else its nearest existing ancestor must be one.
fn check_store_dir(dir: &Path) -> anyhow::Result<()> {
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if at == dir => {
                bail!("the store '{}' is not a directory", dir.display())
            }
            Ok(_) => bail!(
                "cannot create the store '{}': '{}' is not a directory",
                dir.display(),
                at.display()
            ),
            Err(e)
                if e.kind() != std::io::ErrorKind::NotFound
                    && e.raw_os_error() != Some(libc::ENOTDIR) =>
            {
                return Err(e).with_context(|| format!("cannot access '{}'", at.display()))
            }
            Err(_) => {}
        }
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => return Ok(()),
        }
    }
}

pub fn record(args: &RecordArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    crate::engine::one_heap();
    // Every argument is checked before the store is touched or anything is printed.
    crate::input::check_targets(&args.selection.paths, &args.selection.pids)?;
    let dir = store_dir(&args.store);
    check_store_dir(&dir)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the store '{}'", dir.display()))?;
    let (mut store, damage) =
        Store::open_or_create(&dir).map_err(|e| super::common::open_error(&dir, e))?;
    warn_damage(&damage);
    let req = args.collect.request(&args.selection);
    let mut engine = Engine::new(req, args.collect.proof()).incremental(cache::MAX_AGE);
    if args.trace {
        if let Err(e) = engine.set_tracing(true) {
            super::warn_all(&[format!("--trace: {e}; the recording goes on without it")]);
        }
    }
    if args.trace_uploads {
        if let Err(e) = engine.set_upload_tracing() {
            super::warn_all(&[format!(
                "--trace-uploads: {e}; the recording goes on without it"
            )]);
        }
    }
    if engine.tracing() {
        // One tracer per host: the others (a plain scan, top) read what it traces.
        if let Err(why) = engine.publish_uploads("record") {
            super::warn_all(&[format!("the upload ledger is not shared: {why}")]);
        }
    }
    let stop = stop_flag();
    let wait = super::common::StopWait::new();
    let mut n = 0u64;
    let mut next = Instant::now();
    writeln!(
        out,
        "twofold record: a snapshot every {:.1} s into '{}'",
        args.interval.as_secs_f64(),
        render::safe::safe_path(&dir)
    )?;
    out.flush()?;
    let mut said = Said::default();
    let mut payload = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut warnings = Vec::new();
        let snap = engine.snapshot(&mut warnings)?;
        if crate::collect::stop::stopping() {
            // Stopped mid-snapshot: its proof was cut short, so it is not written.
            break;
        }
        super::warn_fresh(&mut said, &warnings);
        append(&mut store, &snap, &mut payload)?;
        n += 1;
        if n % 60 == 1 {
            let cutoff = snap
                .at_unix_ns
                .saturating_sub(args.retain.as_nanos() as u64);
            for removed in store.retain(cutoff, Some(args.max_size))? {
                eprintln!(
                    "twofold: removed '{}' (retention)",
                    render::safe::safe_path(&removed)
                );
            }
        }
        if args.count.is_some_and(|c| n >= c) {
            break;
        }
        next += args.interval;
        super::common::sleep_until(wait.as_ref(), &stop, next);
    }
    store.flush()?;
    writeln!(
        out,
        "twofold record: {} written",
        crate::units::count(n, "snapshot", "snapshots")
    )?;
    Ok(())
}

pub fn replay(args: &ReplayArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let at = timespec::parse(&args.at, engine::now().0).map_err(anyhow::Error::msg)?;
    let store = open_read(&args.store)?;
    let held = store
        .stats()
        .with_context(|| format!("cannot read the store '{}'", store.dir().display()))?;
    // 'now' (the default) is the latest snapshot, however old; any other moment must lie
    // within the recording, give or take one interval.
    if args.at.trim() != "now" {
        check_within(at, &held).map_err(|range| {
            anyhow::anyhow!(
                "--at '{}' ({}) is outside the store '{}': it holds {range}",
                args.at,
                timespec::format(at),
                store.dir().display()
            )
        })?;
    }
    let mut report = replayed(&store, at)?;
    if args.output.json {
        return render_report(&report, true, out);
    }
    // The human view has no rates: it is what scan printed then, under the moment shown.
    report.rates = None;
    writeln!(
        out,
        "twofold replay: the snapshot of {} (nearest to --at '{}'; the store holds {})",
        report
            .at_unix_ns
            .map(timespec::format)
            .unwrap_or_else(|| "an unknown time".into()),
        render::safe::terminal(&args.at),
        holding(&held)
    )?;
    render_report(&report, false, out)
}

/// "N snapshots from 'A' to 'B'": what a store holds.
fn holding(st: &crate::store::Stats) -> String {
    format!(
        "{} from '{}' to '{}'",
        crate::units::count(st.frames, "snapshot", "snapshots"),
        st.first_ns.map(timespec::format).unwrap_or_default(),
        st.last_ns.map(timespec::format).unwrap_or_default()
    )
}

/// `Ok` when `at` lies within the recording, widened by one mean interval between its
/// snapshots (at least a second) on either side; else what the store holds, for the error.
fn check_within(at: u64, st: &crate::store::Stats) -> Result<(), String> {
    let (Some(first), Some(last)) = (st.first_ns, st.last_ns) else {
        return Ok(());
    };
    let interval = (last - first) / st.frames.saturating_sub(1).max(1);
    let slack = interval.max(1_000_000_000);
    if at.saturating_add(slack) < first || at > last.saturating_add(slack) {
        return Err(holding(st));
    }
    Ok(())
}

fn range_of(from: &str, to: &str) -> anyhow::Result<(u64, u64)> {
    let now = engine::now().0;
    let from = timespec::parse(from, now).map_err(anyhow::Error::msg)?;
    let to = timespec::parse(to, now).map_err(anyhow::Error::msg)?;
    if from > to {
        bail!(
            "--from '{}' is after --to '{}'",
            timespec::format(from),
            timespec::format(to)
        );
    }
    Ok((from, to))
}

pub fn snapshot(args: &SnapshotArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (from, to) = range_of(&args.from, &args.to)?;
    let store = open_read(&args.store)?;
    let n = store
        .export(from, to, &args.out)
        .with_context(|| format!("cannot write the bundle '{}'", args.out.display()))?;
    writeln!(
        out,
        "twofold snapshot: {n} snapshots from {} to {} in '{}'",
        timespec::format(from),
        timespec::format(to),
        render::safe::safe_path(&args.out)
    )?;
    Ok(())
}

impl From<DumpWhat> for render::dump::DumpWhat {
    fn from(w: DumpWhat) -> Self {
        match w {
            DumpWhat::Files => Self::Files,
            DumpWhat::Processes => Self::Processes,
            DumpWhat::Cgroups => Self::Cgroups,
            DumpWhat::Trace => Self::Trace,
        }
    }
}

impl From<DumpFormat> for render::dump::DumpFormat {
    fn from(f: DumpFormat) -> Self {
        match f {
            DumpFormat::Json => Self::Json,
            DumpFormat::Csv => Self::Csv,
            DumpFormat::Openmetrics => Self::Openmetrics,
        }
    }
}

pub fn dump(args: &DumpArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (from, to) = range_of(&args.from, &args.to)?;
    let store = open_read(&args.store)?;
    // CSV and OpenMetrics to a terminal are escaped (a comm may hold ESC); to a pipe or a
    // file they stay exact (CSV quoted per RFC 4180). JSON escapes itself.
    let mut tty_out;
    let out: &mut dyn Write = if args.format != DumpFormat::Json && std::io::stdout().is_terminal()
    {
        tty_out = render::safe::Terminal(out);
        &mut tty_out
    } else {
        out
    };
    let mut rows = render::dump::Rows::new(args.what.into(), args.format.into(), args.top);
    let mut prev: Option<Snapshot> = None;
    let (mut snapshots, mut traced) = (0u64, 0u64);
    for frame in store.range(from, to) {
        let snap = decode(&frame?.payload)?;
        traced += u64::from(snap.trace.is_some());
        let report = engine::report(&snap, prev.as_ref());
        rows.add(&report, out)?;
        prev = Some(snap);
        snapshots += 1;
    }
    warn_damage(&store.take_damage());
    if rows.count() == 0 {
        let why = no_rows_reason(&store, args, from, to, snapshots, traced);
        // Asking for the trace of a recording that has none is an error, not an empty
        // result; an empty kind or range of a recording is an answer.
        if args.what == DumpWhat::Trace && snapshots > 0 && traced == 0 {
            bail!("{why}");
        }
        eprintln!("twofold: {why}");
    }
    rows.finish(out)?;
    Ok(())
}

/// Why `dump` wrote no row: no snapshot in the range (and what the store holds), or
/// snapshots that have nothing of the kind asked for.
fn no_rows_reason(
    store: &Store,
    args: &DumpArgs,
    from: u64,
    to: u64,
    snapshots: u64,
    traced: u64,
) -> String {
    let range = format!(
        "between '{}' and '{}'",
        timespec::format(from),
        timespec::format(to)
    );
    let what = format!("{:?}", args.what).to_lowercase();
    if snapshots > 0 {
        let one = snapshots == 1;
        let why = match args.what {
            DumpWhat::Trace if traced == 0 && one => "it was recorded without 'record --trace'",
            DumpWhat::Trace if traced == 0 => "they were recorded without 'record --trace'",
            DumpWhat::Trace => "the traced snapshots counted no file or process of interest",
            DumpWhat::Cgroups => "no memory cgroup held a file of interest",
            _ => "no process held or mapped a model file then",
        };
        return format!(
            "no {what} rows: the {} {range} {} none ({why})",
            crate::units::count(snapshots, "snapshot", "snapshots"),
            if one { "has" } else { "have" }
        );
    }
    match store.stats() {
        Ok(st) if st.frames > 0 => format!(
            "no {what} rows: no snapshot {range}; the store holds {}",
            holding(&st)
        ),
        _ => format!("no {what} rows: no snapshot {range}; the store holds none"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_moments_outside_the_recording_are_refused() {
        let s = |n: u64, first: u64, last: u64| crate::store::Stats {
            frames: n,
            bytes: 0,
            shards: 1,
            first_ns: Some(first),
            last_ns: Some(last),
        };
        const S: u64 = 1_000_000_000;
        // Ten snapshots 5 s apart: one interval of slack on either side.
        let st = s(10, 100 * S, 145 * S);
        assert!(check_within(100 * S, &st).is_ok());
        assert!(check_within(96 * S, &st).is_ok());
        assert!(check_within(150 * S, &st).is_ok());
        let e = check_within(94 * S, &st).unwrap_err();
        assert!(
            e.starts_with("10 snapshots from '1970-01-01T00:01:40.000Z' to "),
            "{e}"
        );
        assert!(check_within(151 * S, &st).is_err());
        assert!(check_within(0, &st).is_err());
        // One snapshot: a second either side.
        let one = s(1, 100 * S, 100 * S);
        assert!(check_within(100 * S + S / 2, &one).is_ok());
        assert!(check_within(102 * S, &one).is_err());
    }

    #[test]
    fn a_store_path_under_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap_or_else(|e| panic!("{e}"));
        assert!(check_store_dir(&dir.path().join("new/store")).is_ok());
        let err = check_store_dir(&file).unwrap_err().to_string();
        assert!(err.ends_with("is not a directory"), "{err}");
        let err = check_store_dir(&file.join("s")).unwrap_err().to_string();
        assert!(
            err.contains("'f' is not a directory") || err.contains("/f' is not a directory"),
            "{err}"
        );
    }
}
