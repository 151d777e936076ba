//! Live tests: child processes with a footprint the test created, scanned by the library
//! and checked against /proc itself and peer tools (util-linux `fincore`, `smem`).

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::common::*;
use twofold::collect::gather::{gather, Request};
use twofold::collect::Roots;
use twofold::model::{self, MapKind, Report};

fn scan(req: &Request) -> Report {
    let mut warnings = Vec::new();
    let sample = gather(&Roots::live(), req, &mut warnings).unwrap();
    model::from_sample(&sample)
}

fn proc_of(r: &Report, pid: i32) -> &model::ProcessModel {
    r.processes.iter().find(|p| p.pid == pid).unwrap()
}

#[test]
fn copy_and_map_readers_are_told_apart() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let base = reader("anon", None, &["--bytes", "0"]);
    let copy = reader("copy", Some(&file), &[]);
    let map = reader("map", Some(&file), &[]);
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![base.pid(), copy.pid(), map.pid()],
        ..Request::default()
    };
    let pids = [base.pid(), copy.pid(), map.pid()];
    let truth = || -> Vec<(u64, u64)> {
        pids.iter()
            .map(|p| (status_bytes(*p, "RssAnon"), status_bytes(*p, "RssFile")))
            .collect()
    };
    // Numbers equal /proc's own. The readers are idle, but the pages of the shared twofold
    // binary they map can come and go with what else runs: compare a scan taken between
    // two equal readings.
    let r = (0..20)
        .find_map(|_| {
            let before = truth();
            let r = scan(&req);
            (before == truth()).then_some((r, before))
        })
        .map(|(r, before)| {
            for (pid, (anon, file)) in pids.iter().zip(before) {
                let p = proc_of(&r, *pid);
                assert_eq!(p.anon_bytes, Some(anon));
                assert_eq!(p.file_bytes, Some(file));
            }
            r
        })
        .expect("RSS never settled");
    let (b, c, m) = (
        proc_of(&r, base.pid()),
        proc_of(&r, copy.pid()),
        proc_of(&r, map.pid()),
    );
    let tol = tolerance(size);
    assert_near(
        c.anon_bytes.unwrap() - b.anon_bytes.unwrap(),
        size,
        tol,
        "copy RssAnon",
    );
    // RssFile of the mapping reader, less the file pages of everything else it maps (its
    // binary and libraries, whose touched code differs from the baseline reader's).
    let other_file: u64 = {
        let text = std::fs::read_to_string(format!("/proc/{}/smaps", map.pid())).unwrap();
        let mut sum = 0u64;
        let mut current = None;
        for line in text.lines() {
            if let Some(h) = twofold::collect::maps::parse_header(line) {
                current = (h.inode != 0 && !h.path.ends_with("m.safetensors")).then_some(0u64);
                continue;
            }
            let kb = |l: &str| -> u64 {
                l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
            };
            if let Some(c) = current.as_mut() {
                if line.starts_with("Rss:") {
                    *c += kb(line);
                    sum += kb(line);
                } else if line.starts_with("Anonymous:") {
                    sum -= kb(line);
                }
            }
        }
        sum
    };
    assert_near(m.file_bytes.unwrap() - other_file, size, tol, "map RssFile");
    assert_near(
        m.anon_bytes.unwrap(),
        b.anon_bytes.unwrap(),
        tol,
        "map RssAnon",
    );

    let f = &r.files[0];
    assert_eq!(f.size_bytes, Some(size));
    assert_eq!(
        f.resident_bytes,
        Some(size),
        "mapped and touched: fully resident"
    );
    assert_eq!(f.mappers.len(), 1);
    let mp = &f.mappers[0];
    assert_eq!(mp.pid, map.pid());
    assert_eq!(mp.kind, MapKind::Shared);
    assert_eq!(mp.prot, "r--s");
    assert_eq!(mp.mapped_bytes, size);
    assert_eq!(mp.resident_bytes, Some(size));
    assert_eq!(mp.cow_anon_bytes, Some(0));
    // Without the proof the copy is only suspected: beside the count, never in it.
    let suspects: Vec<i32> = f.suspected_copies.iter().map(|s| s.pid).collect();
    assert_eq!(suspects, [copy.pid()]);
    assert_eq!(f.representations.proven, Some(1.0));
    assert!(f.representations.lower_bound);
    assert!((f.representations.suspected - 1.0).abs() < 0.01);
    assert!(r.findings.iter().any(|x| x.code == "suspected-private-copy"
        && x.message()
            .starts_with(&format!("pid {} (twofold) could hold a copy", copy.pid()))));
}

#[test]
fn two_mappers_split_pss() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let file = model_file(dir.path(), "m.gguf", size);
    let a = reader("map", Some(&file), &[]);
    let b = reader("map", Some(&file), &[]);
    // Another twofold beside the suite reading the file's pages would be a third mapper.
    let r = while_others_quiet(|| {
        scan(&Request {
            paths: vec![file.clone()],
            pids: vec![a.pid(), b.pid()],
            ..Request::default()
        })
    });
    let f = &r.files[0];
    assert_eq!(f.mappers.len(), 2);
    for m in &f.mappers {
        assert_eq!(m.resident_bytes, Some(size));
        assert_near(
            m.pss_bytes.unwrap(),
            size / 2,
            tolerance(size),
            "PSS of one of two mappers",
        );
    }
    assert!(r.findings.iter().any(|x| x.code == "shared-mapping"));
    assert!(f.suspected_copies.is_empty());
}

#[test]
fn cow_pages_inside_a_private_mapping_are_exact() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let size = 32 * MIB;
    let file = model_file(dir.path(), "m.safetensors", size);
    let before = std::fs::read(&file).unwrap();
    let w = reader("private-write", Some(&file), &["--bytes", "8M"]);
    let r = scan(&Request {
        paths: vec![file.clone()],
        pids: vec![w.pid()],
        ..Request::default()
    });
    let m = &r.files[0].mappers[0];
    assert_eq!(m.kind, MapKind::Private);
    assert!(m.writable);
    assert_eq!(m.cow_anon_bytes, Some(8 * MIB));
    assert!(r
        .findings
        .iter()
        .any(|x| x.code == "cow-in-private-mapping"));
    drop(w);
    assert!(
        std::fs::read(&file).unwrap() == before,
        "the file must be unchanged"
    );
}

fn fincore_bytes(path: &std::path::Path) -> u64 {
    let out = run_ok(
        Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path),
    );
    String::from_utf8_lossy(&out).trim().parse().unwrap()
}

fn twofold_residency(path: &std::path::Path, method: &str) -> u64 {
    let v: serde_json::Value = twofold_json(&[
        "residency".as_ref(),
        "--json".as_ref(),
        "--method".as_ref(),
        method.as_ref(),
        path.as_os_str(),
    ]);
    v["files"][0]["resident_bytes"].as_u64().unwrap()
}

#[test]
fn residency_matches_fincore_in_set_states() {
    let _group = crate::common::group(module_path!());
    if !require(have("fincore"), "util-linux fincore") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let file = model_file(dir.path(), "m.npy", size);
    // Evicted: whole-file DONTNEED of an unmapped, clean file.
    evict(&file);
    assert_eq!(twofold_residency(&file, "cachestat"), 0);
    assert_eq!(twofold_residency(&file, "mincore"), 0);
    assert_eq!(fincore_bytes(&file), 0);
    // Mapped and touched: fully resident, and stays so while mapped.
    let m = reader("map", Some(&file), &[]);
    assert_eq!(twofold_residency(&file, "cachestat"), size);
    assert_eq!(twofold_residency(&file, "mincore"), size);
    assert_eq!(fincore_bytes(&file), size);
    drop(m);
    // A partial state (first 16 MiB read): whatever readahead did, all three agree.
    evict(&file);
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&file).unwrap();
        let mut buf = vec![0u8; (16 * MIB) as usize];
        f.read_exact(&mut buf).unwrap();
    }
    // Readahead completes asynchronously (later on a loaded host): the three are compared
    // while fincore reads the same before and after twofold's two readings.
    let mut seen = Vec::new();
    for _ in 0..50 {
        let peer = fincore_bytes(&file);
        let cachestat = twofold_residency(&file, "cachestat");
        let mincore = twofold_residency(&file, "mincore");
        if fincore_bytes(&file) == peer {
            assert!(peer >= 16 * MIB && peer < size, "{peer}");
            assert_eq!(cachestat, peer);
            assert_eq!(mincore, peer);
            return;
        }
        seen.push((peer, cachestat, mincore));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("the page cache of the file kept moving: {seen:?}");
}

#[test]
fn pss_and_uss_match_smem() {
    let _group = crate::common::group(module_path!());
    if !require(have("smem"), "smem") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 32 * MIB);
    // Readers from a private copy of the binary: its pages are then shared by these three
    // only, not by the twofold processes other tests start and stop meanwhile.
    let exe_copy = dir.path().join("twofold-smem");
    std::fs::copy(exe(), &exe_copy).unwrap();
    let start = |mode: &str| crate::common::reader_from_copy(&exe_copy, mode, Some(&file));
    let readers = [start("copy"), start("map"), start("map")];
    let pids: Vec<i32> = readers.iter().map(|r| r.pid()).collect();
    let req = Request {
        pids: pids.clone(),
        all_processes: true,
        ..Request::default()
    };
    let pss = |r: &Report| -> Vec<(i32, Option<u64>, Option<u64>)> {
        r.processes
            .iter()
            .map(|p| (p.pid, p.pss_bytes, p.uss_bytes))
            .collect()
    };
    // Other tests start and stop processes that share these readers' binary and library
    // pages, which moves their PSS: compare only when twofold reads the same before and
    // after smem does.
    for attempt in 0..20 {
        let before = scan(&req);
        let out = run_ok(Command::new("smem").args([
            "-H",
            "-c",
            "pid pss uss",
            "-P",
            "twofold-smem __child",
        ]));
        let after = scan(&req);
        if pss(&before) != pss(&after) {
            assert!(attempt < 19, "PSS never settled");
            continue;
        }
        let text = String::from_utf8_lossy(&out);
        let mut checked = 0;
        for line in text.lines() {
            let cols: Vec<u64> = line
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect();
            let [pid, pss_kb, uss_kb] = cols[..] else {
                continue;
            };
            let Some(p) = before.processes.iter().find(|p| p.pid as u64 == pid) else {
                continue;
            };
            // Both sum per-VMA kB for processes whose smaps twofold reads; smaps_rollup
            // (the others) rounds once: allow 64 KiB.
            assert_near(
                p.pss_bytes.unwrap(),
                pss_kb * 1024,
                64 * 1024,
                "PSS vs smem",
            );
            assert_near(
                p.uss_bytes.unwrap(),
                uss_kb * 1024,
                64 * 1024,
                "USS vs smem",
            );
            checked += 1;
        }
        assert_eq!(checked, pids.len(), "smem output: {text}");
        return;
    }
}

#[test]
fn file_that_shrinks_while_mapped() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.gguf", 16 * MIB);
    let m = reader("map", Some(&file), &[]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let r = scan(&Request {
        paths: vec![file],
        pids: vec![m.pid()],
        ..Request::default()
    });
    let f = &r.files[0];
    assert_eq!(f.size_bytes, Some(4 * MIB));
    assert_eq!(f.mappers[0].mapped_bytes, 16 * MIB);
    assert_eq!(f.mappers[0].beyond_eof_bytes, 12 * MIB);
    assert!(r.findings.iter().any(|x| x.code == "mapping-beyond-eof"));
}

#[test]
fn whole_system_scan_finds_the_readers_by_model_extension_and_size() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    // No model extension but over --min-size; and a small file with one.
    let big = model_file(dir.path(), "weights.data", 80 * MIB);
    let small = model_file(dir.path(), "tiny.onnx", MIB);
    let a = reader("map", Some(&big), &[]);
    let b = reader("copy", Some(&small), &[]);
    let r = scan(&Request::default());
    let paths: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert!(paths.contains(&big.to_str().unwrap()), "{paths:?}");
    assert!(paths.contains(&small.to_str().unwrap()), "{paths:?}");
    assert!(r.processes.iter().any(|p| p.pid == a.pid()));
    assert!(r.processes.iter().any(|p| p.pid == b.pid()));
    let r = scan(&Request {
        min_size: 100 * MIB,
        ..Request::default()
    });
    assert!(!r.files.iter().any(|f| f.path == big.to_str().unwrap()));
}

#[test]
fn scan_prove_confirms_and_disproves() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = model_file(dir.path(), "m.gguf", size);
    let copy = reader("copy", Some(&file), &[]);
    // Holds the file open and has as much anonymous memory, none of it the file.
    let decoy = reader("anon", Some(&file), &["--bytes", "20M"]);
    let (c, d) = (copy.pid().to_string(), decoy.pid().to_string());
    let r: Report = twofold_json(&[
        "scan".as_ref(),
        "--json".as_ref(),
        "--pid".as_ref(),
        c.as_ref(),
        "--pid".as_ref(),
        d.as_ref(),
        file.as_os_str(),
    ]);
    let f = &r.files[0];
    let proven: Vec<(i32, f64)> = f
        .proven_copies
        .iter()
        .map(|c| (c.pid, c.fraction))
        .collect();
    assert_eq!(proven.len(), 1, "{proven:?}");
    assert_eq!(proven[0].0, copy.pid());
    assert!(proven[0].1 > 0.999, "{proven:?}");
    // The decoy was searched and holds nothing of the file: no suspicion, no bound.
    assert!(f.suspected_copies.is_empty(), "{:?}", f.suspected_copies);
    assert_eq!(f.candidates.could_hold, 2);
    assert_eq!(f.candidates.searched, 2);
    assert!(!f.representations.lower_bound);
    assert!((f.representations.proven.unwrap() - 2.0).abs() < 0.001);
    let codes: Vec<&str> = r.findings.iter().map(|x| x.code.as_str()).collect();
    assert!(codes.contains(&"proven-private-copy"), "{codes:?}");
}

#[test]
fn totals_from_smaps_match_smaps_rollup() {
    let _group = crate::common::group(module_path!());
    use twofold::collect::process::ProcReader;
    let dir = tempfile::tempdir().unwrap();
    let file = model_file(dir.path(), "m.safetensors", 16 * MIB);
    let readers = [
        reader("copy", Some(&file), &[]),
        reader("map", Some(&file), &[]),
        reader("private-write", Some(&file), &["--bytes", "4M"]),
    ];
    let procs = ProcReader::new("/proc");
    for r in &readers {
        let text = std::fs::read_to_string(format!("/proc/{}/smaps", r.pid())).unwrap();
        let vmas = text.lines().filter(|l| l.starts_with("Rss:")).count() as u64;
        // A rollup read between two equal smaps sums (shared binary pages can move).
        let (sum, roll) = (0..20)
            .find_map(|_| {
                let (_, a) = procs.smaps(r.pid(), &Default::default()).unwrap();
                let roll = procs.rollup(r.pid()).unwrap().unwrap();
                let (_, b) = procs.smaps(r.pid(), &Default::default()).unwrap();
                (a == b).then_some((a, roll))
            })
            .expect("smaps never settled");
        assert_eq!(sum.rss_bytes, roll.rss_bytes);
        assert_eq!(sum.shared_clean_bytes, roll.shared_clean_bytes);
        assert_eq!(sum.private_dirty_bytes, roll.private_dirty_bytes);
        assert_eq!(sum.private_clean_bytes, roll.private_clean_bytes);
        assert_eq!(sum.anonymous_bytes, roll.anonymous_bytes);
        // Per-VMA kB rounding: under 1 KiB per VMA.
        let tol = vmas * 1024;
        assert!(sum.pss_bytes <= roll.pss_bytes && roll.pss_bytes - sum.pss_bytes < tol);
        for (a, b) in [
            (sum.pss_anon_bytes, roll.pss_anon_bytes),
            (sum.pss_file_bytes, roll.pss_file_bytes),
            (sum.pss_shmem_bytes, roll.pss_shmem_bytes),
        ] {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(a.abs_diff(b) < tol, "{a} vs {b} (pid {})", r.pid());
        }
    }
}

#[test]
fn residency_summary_of_a_directory_matches_fincore() {
    let _group = crate::common::group(module_path!());
    if !require(have("fincore"), "util-linux fincore") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for i in 0..20 {
        files.push(model_file(dir.path(), &format!("f{i}.bin"), 256 << 10));
    }
    // Half of them evicted.
    for f in files.iter().step_by(2) {
        evict(f);
    }
    // fincore before and after twofold: the host may reclaim a cold file between (DAMON
    // runs here); the count must be exact whenever the files stayed put, so a round in
    // which fincore saw them move is measured again (and one never moves twice in a row).
    for round in 0.. {
        let want: u64 = files.iter().map(|f| fincore_bytes(f)).sum();
        let v: serde_json::Value = twofold_json(&[
            "residency".as_ref(),
            "-r".as_ref(),
            "--summary".as_ref(),
            "--json".as_ref(),
            dir.path().as_os_str(),
        ]);
        let after: u64 = files.iter().map(|f| fincore_bytes(f)).sum();
        if after != want && round < 3 {
            eprintln!("round {round}: the files moved under the test ({want} -> {after}), again");
            continue;
        }
        assert_eq!(v["total_resident_bytes"].as_u64(), Some(want));
        assert_eq!(v["total_size_bytes"].as_u64(), Some(20 * (256 << 10)));
        if round == 0 {
            assert_eq!(want, 10 * (256 << 10));
        }
        break;
    }
}

/// Human output holds no raw control character: no C0 byte but the line feed, no DEL,
/// no C1 control (U+0080–U+009F), and it is UTF-8.
fn assert_terminal_safe(what: &str, out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    for (i, c) in text.char_indices() {
        let bad = (c < ' ' && c != '\n') || c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c);
        assert!(!bad, "{what}: raw {c:?} at byte {i}:\n{text}");
    }
}

/// The terminal column where `needle` starts in `line`.
fn column_of(line: &str, needle: &str) -> usize {
    twofold::render::safe::width(&line[..line.find(needle).unwrap()])
}

#[test]
fn hostile_names_are_escaped_and_tables_stay_aligned() {
    let _group = crate::common::group(module_path!());
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A file name with escape sequences (title, colour), a C1 CSI, a wide CJK character
    // and a byte that is not UTF-8.
    let mut name = b"evil\x1b]0;pwned\x07\x1b[31m".to_vec();
    name.extend_from_slice("\u{9b}模".as_bytes());
    name.extend_from_slice(b"\xff.gguf");
    let file = dir.path().join(std::ffi::OsStr::from_bytes(&name));
    std::fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    // A reader whose comm has the same trouble: a copy of the binary named so.
    let exe_name = "t\u{1b}[31m模\u{9b}x";
    let odd_exe = dir.path().join(exe_name);
    std::fs::copy(exe(), &odd_exe).unwrap();
    std::fs::set_permissions(&odd_exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = crate::common::reader_from_copy(&odd_exe, "map", Some(&file));
    let pid = r.pid().to_string();

    let out = Command::new(crate::common::exe())
        .arg("scan")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_terminal_safe("scan stdout", &out.stdout);
    assert_terminal_safe("scan stderr", &out.stderr);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("evil\\e]0;pwned\\a\\e[31m\\u{9b}模\\xff.gguf"),
        "path escaped byte by byte:\n{text}"
    );
    // The mappers table: the reader's row (its comm escaped, a wide character in it)
    // has its columns where the header has them.
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.contains("pwned")).unwrap();
    let header = at
        + lines[at..]
            .iter()
            .position(|l| l.contains(" comm ") && l.contains(" how "))
            .unwrap();
    let row = lines[header..]
        .iter()
        .find(|l| l.trim_start().starts_with(&format!("{pid} ")))
        .unwrap_or_else(|| panic!("no row of pid {pid}:\n{text}"));
    assert!(row.contains("t\\e[31m模\\u{9b}x"), "{row}");
    let h = lines[header];
    assert_eq!(column_of(row, "t\\e"), column_of(h, "comm"), "\n{h}\n{row}");
    assert_eq!(
        column_of(row, "MAP_SHARED"),
        column_of(h, "how"),
        "\n{h}\n{row}"
    );
    assert_eq!(column_of(row, "r--s"), column_of(h, "prot"), "\n{h}\n{row}");

    // residency: the file column and the unknown/map lines.
    let out = Command::new(crate::common::exe())
        .args(["residency", "--map"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_terminal_safe("residency stdout", &out.stdout);
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("\\u{9b}模\\xff.gguf"));
    // An error quoting the name (a directory given as a file) is escaped too.
    let out = Command::new(crate::common::exe())
        .arg("inspect")
        .arg(dir.path().join("nonexistent\x1b[2J"))
        .output()
        .unwrap();
    assert_terminal_safe("inspect stderr", &out.stderr);
    drop(r);
}
