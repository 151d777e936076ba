//! Input that changes or is huge: a file truncated under an experiment, sparse files far
//! larger than memory. Each case ends with a clear error or a bounded run, never a signal
//! death or an allocation sized by the input.

#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// A file truncated to 4 KiB while `pressure --experiment integrity` hashes and refaults
/// it: no SIGBUS, exit 2 and one line naming the file, never a report of every chunk
/// differing.
#[test]
fn integrity_on_a_file_truncated_under_it() {
    let _group = crate::common::group(module_path!());
    // Truncated while the first hash runs, and later, during the cycles.
    for delay_ms in [1000, 2500] {
        truncated_after(Duration::from_millis(delay_ms));
    }
}

fn truncated_after(delay: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "shrinks.safetensors", 256 * MIB);
    let mut child = Command::new(exe());
    child
        .arg("pressure")
        .arg(&file)
        .args(["--experiment", "integrity", "--cycles", "40"]);
    let truncate = {
        let file = file.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(4096)
                .unwrap();
        })
    };
    let (status, out, err) = bounded(&mut child, Duration::from_secs(300));
    truncate.join().unwrap();
    assert_eq!(status.signal(), None, "killed by a signal: {err}");
    assert_eq!(status.code(), Some(2), "stdout: {out}\nstderr: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("twofold: error: "), "{err}");
    assert!(err.contains("shrinks.safetensors"), "{err}");
    assert!(err.contains("changed size"), "{err}");
    assert!(!out.contains("DIFFERS"), "{out}");
}

/// A sparse file of `size` bytes named `.safetensors` whose header is junk: twofold cannot
/// parse it, so it is searched as runs of its bytes.
fn sparse_junk(dir: &std::path::Path, size: u64) -> std::path::PathBuf {
    let path = dir.join("sparse.safetensors");
    let f = std::fs::File::create(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\xff\xfe not a header at all", 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 65536], 1 << 30).unwrap();
    f.set_len(size).unwrap();
    path
}

/// `dupes` of a 1 TiB sparse file it cannot parse, under a 4 GiB address-space limit: the
/// pieces searched are bounded by a limit, not one per 32 KiB of the declared size (which
/// aborted with `memory allocation of 3221225472 bytes failed`).
#[test]
fn dupes_of_a_huge_sparse_file_is_bounded() {
    let _group = crate::common::group(module_path!());
    if !require(have("prlimit"), "prlimit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_junk(dir.path(), 1 << 40);
    let sleeper = reader("anon", None, &["--bytes", "1048576"]);
    let pid = sleeper.pid().to_string();
    let (status, out, err) = bounded(
        Command::new("prlimit")
            .arg("--as=4294967296")
            .arg(exe())
            .args(["dupes", "--pid", &pid])
            .arg(&file),
        Duration::from_secs(240),
    );
    assert_eq!(status.signal(), None, "killed by a signal: {err}");
    assert!(!err.contains("memory allocation"), "{err}");
    assert_eq!(status.code(), Some(0), "stdout: {out}\nstderr: {err}");
}

/// `residency --map` of a 1 TiB sparse file with 8 MiB of cached data skips its holes:
/// it finishes in seconds (page by page it took 12.5 s, 17 s here) and still counts the
/// cached pages (the 8 MiB the test read, and no more than readahead adds).
#[test]
fn residency_map_of_a_huge_sparse_file_skips_holes() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.bin");
    let f = std::fs::File::create(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0x5a; 8 << 20], 1 << 30).unwrap();
    f.set_len(1 << 40).unwrap();
    f.sync_all().unwrap();
    drop(f);
    evict(&path);
    let mut buf = vec![0u8; 8 << 20];
    let f = std::fs::File::open(&path).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 1 << 30).unwrap();
    let took = map_counts_the_cached_8_mib(&path, Duration::from_secs(60));
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// Runs `residency --map --json` of `path` (killed after `limit`), checks that it counts
/// the 8 MiB the test read (and no more than readahead adds), and says how long it took.
fn map_counts_the_cached_8_mib(path: &std::path::Path, limit: Duration) -> Duration {
    let start = Instant::now();
    let (status, out, err) = bounded(
        Command::new(exe())
            .args(["residency", "--map", "--json"])
            .arg(path),
        limit,
    );
    let took = start.elapsed();
    assert_eq!(status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let resident = v["files"][0]["resident_bytes"].as_u64().unwrap();
    assert!(
        (8 << 20..=16 << 20).contains(&resident),
        "resident {resident}"
    );
    took
}

/// A safetensors header of 200,000 tensors (a 15 MB file): `inspect` parses it entry by
/// entry, never as a tree of JSON values (which took 280 MB). Its peak RSS is measured by
/// its parent alone (`RUSAGE_CHILDREN` of a python parent with this one child).
#[test]
fn a_header_of_many_tensors_is_parsed_in_bounded_memory() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let n = 200_000u64;
    let mut header = String::from("{");
    for i in 0..n {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"model.layers.{i}.weight\":{{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[{},{}]}}",
            i * 64,
            i * 64 + 64
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend((0..n * 64).map(|i| (i * 31 % 251) as u8));
    std::fs::write(&path, bytes).unwrap();
    let code = "import resource, subprocess, sys\n\
                r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n\
                print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let out = run_ok(
        Command::new("python3")
            .args(["-c", code])
            .arg(exe())
            .arg("inspect")
            .arg(&path),
    );
    let out = String::from_utf8(out).unwrap();
    let mut it = out.split_whitespace();
    assert_eq!(it.next(), Some("0"), "inspect failed: {out}");
    let kib: u64 = it.next().unwrap().parse().unwrap();
    assert!(
        kib < 150 * 1024,
        "inspect of 200,000 tensors peaked at {kib} KiB"
    );
}

/// A 15 TiB sparse file whose hole has 8 MiB of cached zero pages (read by the test):
/// `residency --map` bisects the hole with `cachestat` instead of asking `mincore` about
/// 15 TiB (over 60 s before), and still counts the cached pages.
#[test]
fn residency_map_of_a_cached_hole_is_bisected() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse15T.bin");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(15 << 40).unwrap();
    drop(f);
    let mut buf = vec![0u8; 8 << 20];
    let f = std::fs::File::open(&path).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 5 << 40).unwrap();
    drop(f);
    // The cached zeros go whatever the outcome (the file is removed with its dir).
    struct Evict<'a>(&'a std::path::Path);
    impl Drop for Evict<'_> {
        fn drop(&mut self) {
            evict(self.0);
        }
    }
    let _evict = Evict(&path);
    let took = map_counts_the_cached_8_mib(&path, Duration::from_secs(120));
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// `pressure --experiment integrity` of a 15 TiB sparse file is refused at once (it read
/// zeros for minutes before): the experiment needs a file that fits in memory.
#[test]
fn integrity_refuses_a_file_larger_than_memory() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse15T.safetensors");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(15 << 40)
        .unwrap();
    let start = Instant::now();
    let (status, out, err) = bounded(
        Command::new(exe()).arg("pressure").arg(&path).args([
            "--experiment",
            "integrity",
            "--cycles",
            "1",
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(2), "stdout: {out}\nstderr: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("sparse15T.safetensors") && err.contains("MemAvailable"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    evict(&path);
}

/// A 15 TiB sparse safetensors (15 tensors of 1 TiB, 4 MiB of data after the header, the
/// rest a hole) and the offset of its data.
fn sparse_safetensors(dir: &std::path::Path) -> (std::path::PathBuf, u64) {
    const TIB: u64 = 1 << 40;
    let entries: Vec<String> = (0..15u64)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"F32","shape":[{},4096],"data_offsets":[{},{}]}}"#,
                TIB / 4 / 4096,
                i * TIB,
                (i + 1) * TIB
            )
        })
        .collect();
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let path = dir.join("sparse15t.safetensors");
    let f = std::fs::File::create(&path).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&(header.len() as u64).to_le_bytes(), 0)
        .unwrap();
    f.write_all_at(&header, 8).unwrap();
    let data_at = 8 + header.len() as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    f.write_all_at(&data, data_at).unwrap();
    f.set_len(data_at + 15 * TIB).unwrap();
    (path, data_at)
}

/// `dupes --pid` of a 15 TiB sparse safetensors, under a 4 GiB address-space limit, and
/// the index `trace --file` builds of it to match GPU uploads: the holes are not read
/// (zeros, told by `SEEK_DATA`), and the index steps from point to point, not through
/// every 2 KiB of the file. Took about 40 hours (27,000 reads of holes a second) and
/// over 60 s, now well under a second each (debug build).
#[test]
fn dupes_and_the_upload_index_skip_the_holes_of_a_15_tib_file() {
    let _group = crate::common::group(module_path!());
    if !require(have("prlimit"), "prlimit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, data_at) = sparse_safetensors(dir.path());
    let range = format!("{data_at}:{}", 4 << 20);
    let holder = reader("copy", Some(&file), &["--range", &range]);
    let pid = holder.pid().to_string();
    let start = Instant::now();
    let (status, out, err) = bounded(
        Command::new("prlimit")
            .arg("--as=4294967296")
            .arg(exe())
            .args(["dupes", "--json", "--pid", &pid])
            .arg(&file),
        Duration::from_secs(120),
    );
    let took = start.elapsed();
    assert_eq!(status.code(), Some(0), "stdout: {out}\nstderr: {err}");
    let r: twofold::model::dupes::DupesReport = serde_json::from_str(&out).unwrap();
    let f = &r.processes[0].files[0];
    // The 4 MiB copied, and the zeros after it in the heap, as zeros follow in the file.
    let found = f.identical.memory_bytes;
    assert!((4 << 20..(4 << 20) + 65536).contains(&found), "{out}");
    eprintln!("dupes --pid of 15 TiB sparse: {took:?}");
    assert!(took < Duration::from_secs(20), "dupes took {took:?}");

    let key = file_key(&file);
    let start = Instant::now();
    let (matcher, warnings) = twofold::dupes::uploads::Matcher::build(&[(file.clone(), key)]);
    let took = start.elapsed();
    eprintln!("the upload index of 15 TiB sparse: {took:?}");
    assert!(matcher.is_some(), "{warnings:?}");
    assert!(
        took < Duration::from_secs(20),
        "the upload index took {took:?}"
    );
}

/// Peak RSS in KiB of `bin args...` as its python parent sees it (`RUSAGE_CHILDREN`),
/// run as 'nobody' with `nobody`, and its exit code.
fn peak_kib(bin: &std::path::Path, args: &[&std::ffi::OsStr], nobody: bool) -> (i32, u64) {
    let code = "import resource, subprocess, sys\n\
                r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n\
                print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    // setpriv execs twofold: the same child, its peak the one measured.
    let mut cmd = Command::new("python3");
    cmd.args(["-c", code]);
    if nobody {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    let out = run_ok(cmd.arg(bin).args(args));
    let out = String::from_utf8(out).unwrap();
    let mut it = out.split_whitespace();
    let rc = it.next().unwrap().parse().unwrap();
    (rc, it.next().unwrap().parse().unwrap())
}

/// `pressure --experiment integrity` of an empty, a truncated and a small ONNX file
/// peaks well under 200 MB, as root and as 'nobody': its memcpy reference no longer
/// takes two 256 MiB buffers whatever the file (531–534 MB before, 153 MB after).
#[test]
fn integrity_of_a_small_file_peaks_under_200_mb() {
    let _group = crate::common::group(module_path!());
    let nobody = nobody_setup();
    let tmp = tempfile::tempdir().unwrap();
    let (dir, bin) = match &nobody {
        Some((d, b, _)) => (d.path(), b.clone()),
        None => (tmp.path(), exe()),
    };
    // ir_version 8, then a graph field cut off: its length runs past the end.
    let small: Vec<u8> = [0x08, 0x08].iter().copied().chain([0x5au8; 4096]).collect();
    let truncated = [0x08, 0x08, 0x3a, 0xff, 0xff, 0x03, 0x0a, 0x01];
    let mut files = Vec::new();
    for (name, bytes) in [
        ("empty.onnx", &[][..]),
        ("truncated.onnx", &truncated[..]),
        ("small.onnx", &small[..]),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        files.push(p);
    }
    let users: &[bool] = if nobody.is_some() {
        &[false, true]
    } else {
        &[false]
    };
    for &as_nobody in users {
        for f in &files {
            let args = [
                "pressure".as_ref(),
                f.as_os_str(),
                "--experiment".as_ref(),
                "integrity".as_ref(),
            ];
            let (rc, kib) = peak_kib(&bin, &args, as_nobody);
            let who = if as_nobody { "nobody" } else { "root" };
            eprintln!("{} as {who}: exit {rc}, peak {kib} KiB", f.display());
            assert!(rc == 0 || rc == 2, "{}: exit {rc}", f.display());
            assert!(
                kib < 200 * 1000,
                "{} as {who} peaked at {kib} KiB",
                f.display()
            );
        }
    }
}
