//! `twofold demo`: the main job on an embedded default.
//!
//! Writes a valid safetensors file of `--size` bytes of pseudo-random F16 tensors into a
//! fresh temp dir, starts two readers of it (one `read()`s it into a heap buffer and keeps
//! the fd open; one maps it `MAP_SHARED` read-only and touches every page), scans them with
//! the same code as `twofold scan`, prints the diagnosis and removes everything it made:
//! on success, on error, and on Ctrl-C / SIGTERM (a signal thread kills the readers and
//! removes the dir; the readers also die with their parent through `PR_SET_PDEATHSIG`).
//! After a `kill -9` the dir (`twofold-PID-sSTART-demo-*`) is removed by the next campaign.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::cleanup::Registry;
use crate::cli::DemoArgs;
use crate::collect::gather::Request;
use crate::spawn::Reader;
use crate::units::iec;
use crate::{model, render};

/// Bytes per tensor in the synthetic model (F16 [2048, 2048]).
const TENSOR_BYTES: u64 = 2048 * 2048 * 2;

/// Writes a valid safetensors file of about `size` bytes: F16 tensors of pseudo-random
/// data (so no page is all zeros), header padded to 8 bytes as the format requires.
pub fn write_safetensors(path: &Path, size: u64) -> anyhow::Result<u64> {
    let n = (size / TENSOR_BYTES).max(1);
    let mut header = String::from(r#"{"__metadata__":{"format":"pt","generator":"twofold demo"}"#);
    for i in 0..n {
        let (a, b) = (i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES);
        header.push_str(&format!(
            r#","layers.{i}.weight":{{"dtype":"F16","shape":[2048,2048],"data_offsets":[{a},{b}]}}"#
        ));
    }
    header.push('}');
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let file = std::fs::File::create_new(path)
        .with_context(|| format!("cannot create '{}'", path.display()))?;
    let write_err = || format!("cannot write '{}'", path.display());
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .with_context(write_err)?;
    w.write_all(header.as_bytes()).with_context(write_err)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = n * TENSOR_BYTES;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            // xorshift64*: cheap, deterministic, never all-zero.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let take = left.min(block.len() as u64) as usize;
        w.write_all(&block[..take]).with_context(write_err)?;
        left -= take as u64;
    }
    // Write back now: a just-written file's pages are dirty page cache, which smaps shows
    // as Private_Dirty of the mapping reader and would blur the clean/dirty split.
    w.into_inner()
        .map_err(|e| e.into_error())
        .with_context(write_err)?
        .sync_all()
        .with_context(|| format!("cannot sync '{}'", path.display()))?;
    Ok(8 + header.len() as u64 + n * TENSOR_BYTES)
}

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
    let report = super::scan::report(&req, Some(Default::default()), None)?;
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
