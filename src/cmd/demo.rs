//! `twofold demo`: the main job on an embedded default.
//!
//! Writes a valid safetensors file of `--size` bytes of pseudo-random F16 tensors into a
//! fresh temp dir, starts two readers of it (one `read()`s it into a heap buffer and keeps
//! the fd open; one maps it `MAP_SHARED` read-only and touches every page), scans them with
//! the same code as `twofold scan`, prints the diagnosis and removes everything it made:
//! on success, on error, and on Ctrl-C / SIGTERM (a signal thread kills the readers and
//! removes the dir; the readers also die with their parent through `PR_SET_PDEATHSIG`).
//! After a `kill -9` the dir (`twofold-PID-sSTART-demo-*`) is removed by the next campaign.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;

use crate::cleanup::Registry;
use crate::cli::DemoArgs;
use crate::collect::gather::Request;
use crate::spawn::Reader;
use crate::units::iec;
use crate::{model, render};

use super::common::{self, write_safetensors};

pub fn run(args: &DemoArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // Before anything is written: the file must fit on disk, and the copying reader's heap
    // copy plus the file's page cache must fit in memory.
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    crate::input::ensure_room("--size", args.size, &parent.join("model.safetensors"), 2)?;
    let cleanup = Registry::install()?;
    if let Some(d) = &args.dir {
        crate::cleanup::sweep_leftovers(std::slice::from_ref(d));
    }
    let dir = cleanup
        .temp_dir("demo", args.dir.as_deref())
        .context("cannot create the demo's temp dir")?;
    let file = dir.path().join("model.safetensors");
    let size = write_safetensors(&file, args.size)?;
    let exe = std::env::current_exe().context("cannot find the twofold executable")?;
    let timeout = Duration::from_secs(120);
    let copy = Reader::start(&exe, "copy", Some(&file), &["--close"], timeout)?;
    let map = Reader::start(&exe, "map", Some(&file), &[], timeout)?;
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![copy.pid(), map.pid()],
        ..Request::default()
    };
    // The readers are our children: ptrace rights hold even under Yama's ptrace_scope 1,
    // so the suspected copy is proven byte by byte.
    let report = common::report(&req, Some(Default::default()), common::TraceWindow::Off)?;
    crate::cleanup::check_interrupted()?;
    if args.output.json {
        render::json(out, &report)?;
    } else {
        let out = &mut render::safe::Terminal(out);
        writeln!(
            out,
            "twofold demo: wrote a {} safetensors model to '{}' and started two readers:\n  \
             pid {} 'copy': read() the file into a heap buffer and closed it, as a copying loader does\n  \
             pid {} 'map':  mmap MAP_SHARED read-only and touched every page, as a zero-copy loader does\n",
            iec(size),
            file.display(),
            copy.pid(),
            map.pid()
        )?;
        out.write_all(render::scan::human(&report).as_bytes())?;
        writeln!(out, "\n{}", diagnosis(&report, copy.pid(), map.pid()))?;
    }
    drop(copy);
    drop(map);
    let path = dir.path().to_path_buf();
    dir.close().context("cannot remove the demo's temp dir")?;
    cleanup.forget_path(&path);
    Ok(())
}

/// The demo's closing lines: the RssAnon vs RssFile split of the two readers.
fn diagnosis(report: &model::Report, copy: i32, map: i32) -> String {
    let find = |pid| report.processes.iter().find(|p| p.pid == pid);
    let mut s = String::from("DIAGNOSIS\n");
    for (pid, what) in [(copy, "copy"), (map, "map")] {
        if let Some(p) = find(pid) {
            s.push_str(&format!(
                "  {what:<4} pid {pid}: RssAnon {} (private, dirty: only reclaimable by killing it), RssFile {} (page cache, shared, clean), PSS {}\n",
                crate::units::iec_opt(p.anon_bytes),
                crate::units::iec_opt(p.file_bytes),
                crate::units::iec_opt(p.pss_bytes),
            ));
        }
    }
    if let Some(f) = report.files.first() {
        if let Some(t) = f.representations.proven {
            s.push_str(&format!(
                "  the model is in memory {t:.2} times (proven); mapping it in both readers would make it 1.00\n"
            ));
        }
    }
    s
}
