//! `residency --bytes / --noheadings / --output` against util-linux `fincore` itself on
//! files whose page cache the test set: the same columns, headings and values.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::Command;

use crate::common::*;

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tokens(s: &str) -> Vec<Vec<String>> {
    s.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn residency_prints_what_fincore_prints() {
    let _group = crate::common::group(module_path!());
    if !require(have("fincore"), "util-linux fincore") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Whole, part (3 of 8 MiB) and none of a file in the page cache, and a size that is
    // not a whole number of pages.
    let whole = model_file(dir.path(), "whole.bin", 4 * MIB);
    let part = model_file(dir.path(), "part.bin", 8 * MIB);
    let none = model_file(dir.path(), "none.bin", 2 * MIB);
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, vec![7u8; 1_536_000]).unwrap();
    for f in [&whole, &odd] {
        std::fs::read(f).unwrap();
    }
    evict(&part);
    evict(&none);
    // Without readahead, reading 3 MiB caches about those 3 MiB.
    let mut buf = vec![0u8; (3 * MIB) as usize];
    let mut f = std::fs::File::open(&part).unwrap();
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(rc, 0);
    f.read_exact(&mut buf).unwrap();
    drop(f);
    let files: Vec<&std::path::Path> = vec![&whole, &part, &none, &odd];
    for flags in [
        &["-b"][..],
        &["--noheadings"],
        &["-n", "-b"],
        &["--output", "FILE,RES"],
        &["-o", "pages,size", "--bytes"],
        &["-o", "RES,PAGES,SIZE,FILE"],
    ] {
        // fincore before and after ours: the cache did not change in between.
        let mut theirs = output(Command::new("fincore").args(flags).args(&files));
        let mut ours = output(
            Command::new(exe())
                .arg("residency")
                .args(flags)
                .args(&files),
        );
        for _ in 0..3 {
            let again = output(Command::new("fincore").args(flags).args(&files));
            if again == theirs {
                break;
            }
            theirs = again;
            ours = output(
                Command::new(exe())
                    .arg("residency")
                    .args(flags)
                    .args(&files),
            );
        }
        assert_eq!(
            tokens(&ours),
            tokens(&theirs),
            "{flags:?}\nours:\n{ours}\nfincore:\n{theirs}"
        );
        // Each row, alone, is laid out as fincore lays it out, byte for byte.
        let one = output(Command::new("fincore").args(flags).arg(&whole));
        let ours = output(Command::new(exe()).arg("residency").args(flags).arg(&whole));
        assert_eq!(ours, one, "{flags:?}");
    }
    // fincore's own column set; a bad one is bad input naming it.
    let out = Command::new(exe())
        .args(["residency", "--output", "RES,BOGUS"])
        .arg(&whole)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'BOGUS'"));
    // The part the test cached: at least what it read, not the whole file.
    let row = output(
        Command::new(exe())
            .args(["residency", "-n", "-b", "-o", "RES"])
            .arg(&part),
    );
    let res: u64 = row.trim().parse().unwrap();
    assert!((3 * MIB..8 * MIB).contains(&res), "{res}");
}
