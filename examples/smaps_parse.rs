//! How fast `/proc/PID/smaps` parses: twofold's single-pass parser
//! (`collect::maps::parse_smaps`) against procfs's `MemoryMaps::from_buf_read`, on the
//! smaps of a live process (`PID`, default this one) or on a synthetic one of N mappings
//! (`--synthetic N`). Run with `cargo run --release --example smaps_parse -- [PID]`; the
//! figure is quoted in `src/collect/maps.rs`.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use procfs::FromBufRead;

fn synthetic(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let start = 0x7f00_0000_0000u64 + (i as u64) * 0x20_0000;
        s.push_str(&format!(
            "{start:x}-{:x} r--p 00000000 fd:01 {} /models/m{}.gguf\n",
            start + 0x20_0000,
            1000 + i,
            i % 7
        ));
        for (k, v) in [
            ("Size", 2048),
            ("KernelPageSize", 4),
            ("MMUPageSize", 4),
            ("Rss", 1024),
            ("Pss", 512),
            ("Pss_Dirty", 0),
            ("Shared_Clean", 1024),
            ("Shared_Dirty", 0),
            ("Private_Clean", 0),
            ("Private_Dirty", 0),
            ("Referenced", 1024),
            ("Anonymous", 0),
            ("KSM", 0),
            ("LazyFree", 0),
            ("AnonHugePages", 0),
            ("ShmemPmdMapped", 0),
            ("FilePmdMapped", 0),
            ("Shared_Hugetlb", 0),
            ("Private_Hugetlb", 0),
            ("Swap", 0),
            ("SwapPss", 0),
            ("Locked", 0),
        ] {
            s.push_str(&format!("{k}:{:>width$} kB\n", v, width = 20 - k.len()));
        }
        s.push_str("THPeligible:    0\nVmFlags: rd mr mw me sd \n");
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let text = match args.as_slice() {
        [flag, n] if flag == "--synthetic" => synthetic(n.parse().expect("N")),
        [pid] => std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps"),
        _ => std::fs::read_to_string("/proc/self/smaps").expect("smaps"),
    };
    let wanted: HashSet<twofold::sample::FileKey> = HashSet::new();
    let rounds = (20_000_000 / text.len().max(1)).clamp(5, 2000);
    let path = Path::new("smaps");
    // Warm up both, and check they agree on the number of mappings.
    let procfs_vmas = procfs::process::MemoryMaps::from_buf_read(text.as_bytes())
        .expect("procfs parses it")
        .len();
    twofold::collect::maps::parse_smaps(path, &text, &wanted).expect("twofold parses it");
    let t = Instant::now();
    for _ in 0..rounds {
        let r = twofold::collect::maps::parse_smaps(path, &text, &wanted).expect("parse");
        std::hint::black_box(r);
    }
    let ours = t.elapsed().as_secs_f64() / rounds as f64;
    let t = Instant::now();
    for _ in 0..rounds {
        let r = procfs::process::MemoryMaps::from_buf_read(text.as_bytes()).expect("parse");
        std::hint::black_box(r);
    }
    let theirs = t.elapsed().as_secs_f64() / rounds as f64;
    let mib = text.len() as f64 / (1 << 20) as f64;
    println!(
        "smaps of {procfs_vmas} mappings, {:.2} MiB, {rounds} rounds:\n  twofold parse_smaps  {:8.3} ms  ({:.0} MiB/s)\n  procfs MemoryMaps    {:8.3} ms  ({:.0} MiB/s)\n  procfs / twofold     {:.1}x",
        mib,
        ours * 1e3,
        mib / ours,
        theirs * 1e3,
        mib / theirs,
        theirs / ours
    );
}
