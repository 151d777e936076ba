//! `scan --pid P` and `dupes --pid P` without a file named: P is searched for the host's
//! files of interest, so a loader that read its model and closed it (the demo's own case)
//! is found holding the copy; when no process of the host maps, holds or names the file,
//! the output says to name it.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::*;
use twofold::model::dupes::DupesReport;
use twofold::model::Report;

/// A copying loader that does not name its file on its command line: it reads the path
/// from its environment, read()s the whole file, closes it and holds the bytes until its
/// stdin closes. Killed and reaped on drop.
struct Loader(Child);

impl Loader {
    fn start(file: &Path) -> Loader {
        let mut c = Command::new("python3")
            .args([
                "-c",
                "import os,sys\nf=open(os.environ['MODEL'],'rb')\nd=f.read()\nf.close()\nprint('ready',flush=True)\nsys.stdin.read()",
            ])
            .env("MODEL", file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        Loader(c)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        let _ = self.0.stdin.take().map(|mut s| s.flush());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The process's fds, read by the test: the loader holds none of the model.
fn holds(pid: i32, file: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == file))
}

#[test]
fn scan_pid_finds_the_copy_of_a_file_read_and_closed() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 8 * MIB, Fill::Random(1)),
            ("b", 8 * MIB, Fill::Random(2)),
        ],
    );
    let size = std::fs::metadata(&file).unwrap().len();
    // Another process maps the file (as a server of the same model would): it is one of
    // the host's files of interest.
    let mapper = reader("map", Some(&file), &[]);
    let loader = Loader::start(&file);
    assert!(!holds(loader.pid(), &file));
    let anon = status_bytes(loader.pid(), "RssAnon");
    assert!(anon >= size, "the loader's RssAnon {anon} holds the copy");
    let pages = fincore_pages(&file);

    let pid = loader.pid().to_string();
    let r: Report = twofold_json(&[
        "scan".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
    ]);
    let host = r.host_files.clone().expect("host files considered");
    assert!(host.considered >= 1, "{host:?}");
    let f = r
        .files
        .iter()
        .find(|f| Path::new(&f.path) == file)
        .unwrap_or_else(|| {
            panic!(
                "{file:?} not in {:?}",
                r.files.iter().map(|f| &f.path).collect::<Vec<_>>()
            )
        });
    let c = f
        .proven_copies
        .iter()
        .find(|c| c.pid == loader.pid())
        .expect("the loader's copy proven");
    // The whole file's tensors, byte by byte (the header is not a tensor).
    assert_near(c.identical_bytes, 16 * MIB, 4096, "proven copy");
    // Only the named process is in the sample: the mapper is no holder here.
    assert!(f.mappers.iter().all(|m| m.pid != mapper.pid()));
    // page cache (fincore) + one private copy.
    let want = pages as f64 * 4096.0 / size as f64 + 16.0 * MIB as f64 / size as f64;
    let got = twofold::model::copies::representations(f).proven.unwrap();
    assert!((got - want).abs() < 0.01, "count {got}, truth {want}");

    // `dupes --pid P` searches the same files.
    let d: DupesReport = twofold_json(&[
        "dupes".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
    ]);
    let p = &d.processes[0];
    assert!(p.host_files.as_ref().is_some_and(|h| h.considered >= 1));
    let df = p
        .files
        .iter()
        .find(|f| Path::new(&f.path) == file)
        .expect("dupes --pid searched the host's file");
    assert_eq!(df.identical.tensors, 2);
    assert_near(
        df.identical.memory_bytes,
        16 * MIB,
        4096,
        "dupes identical bytes",
    );
    drop(mapper);
}

#[test]
fn scan_pid_says_to_name_a_file_no_process_holds() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(dir.path(), &[("a", 8 * MIB, Fill::Random(3))]);
    let loader = Loader::start(&file);
    let pid = loader.pid().to_string();
    let out = run_ok(Command::new(exe()).args(["scan", "--pid", &pid]));
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains(&*file.to_string_lossy()), "{text}");
    assert!(
        text.contains(&format!("name it: twofold scan --pid {pid} FILE")),
        "{text}"
    );
    // Named, the file is searched and the copy proven.
    let r: Report = twofold_json(&[
        "scan".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        pid.as_ref(),
        file.as_os_str(),
    ]);
    let f = &r.files[0];
    assert!(f.proven_copies.iter().any(|c| c.pid == loader.pid()));
    let out = run_ok(Command::new(exe()).args(["dupes", "--pid", &pid]));
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains(&format!("name it: twofold dupes --pid {pid} FILE")),
        "{text}"
    );
}

/// A candidate not searched is named with its reason, in `scan` as in the summary.
#[test]
fn the_unsearched_are_named_with_their_reason() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(dir.path(), &[("a", 8 * MIB, Fill::Random(5))]);
    let loader = Loader::start(&file);
    let out = run_ok(
        Command::new(exe())
            .args(["scan", "--prove-budget", "1ms", "--pid"])
            .arg(loader.pid().to_string())
            .arg(&file),
    );
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .find(|l| l.contains("could hold a copy"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.ends_with(&format!(
            "1 process could hold a copy: 0 searched byte by byte, 1 not: pid {} (over the proof budget (0.0 s; raise --prove-budget))",
            loader.pid()
        )),
        "{line}"
    );
}
