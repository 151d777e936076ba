//! Tests of [`super`]: a sweep spread over threads finds what one thread finds.

use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};

use super::*;
use crate::container::{Format, Tensor};
use crate::dupes::filebytes::FileBytes;

use crate::dupes::test_tensor as tensor;

use crate::dupes::test_random as random;

/// A child of this process that waits to be killed (when dropped).
struct Forked(Pid);

impl Forked {
    fn new() -> Forked {
        // SAFETY: the child calls only pause(2), async-signal-safe, until it is killed.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => loop {
                // SAFETY: no arguments; returns only on a signal.
                unsafe { libc::pause() };
            },
            ForkResult::Parent { child } => Forked(child),
        }
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
        let _ = waitpid(self.0, None);
    }
}

/// A forked child of this process holds two copies of a 24 MiB file (ground truth: their
/// addresses); a sweep of its memory with 4 threads and 1 MiB windows, so that every tensor spans
/// windows searched by different threads, credits exactly what one thread credits: each
/// tensor of each copy once, at its address.
#[test]
fn threads_and_windows_credit_each_copy_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bin");
    // A seed no other test uses: the tests of this binary share its memory, which the
    // sweep searches, and grid_tests held the first 4 MiB of this seed's bytes (a copy of
    // half a tensor, confirmed when the two tests ran at once: the bound below missed).
    let bytes = random(24 << 20, 0x51ee_7e57_0024_0001);
    std::fs::write(&path, &bytes).unwrap();
    let tensors: Vec<Tensor> = (0..6).map(|i| tensor(i * (4 << 20), 4 << 20)).collect();
    let grid = Grid::build(
        vec![(
            FileBytes::open(&path).unwrap(),
            tensors,
            Format::Safetensors,
        )],
        16,
        crate::dupes::grid::Layouts::Identical,
        false,
    )
    .unwrap();
    // Page-aligned copies, touched so that every page is present.
    let copies: Vec<Vec<u8>> = (0..2)
        .map(|_| {
            let mut v = vec![0u8; bytes.len() + PAGE as usize];
            let skip = v.as_ptr().align_offset(PAGE as usize);
            v[skip..skip + bytes.len()].copy_from_slice(&bytes);
            v
        })
        .collect();
    let starts: Vec<u64> = copies
        .iter()
        .map(|v| {
            let p = v.as_ptr();
            p as u64 + p.align_offset(PAGE as usize) as u64
        })
        .collect();
    // Only the two copies hold the file's bytes: the generated buffer is zeroed (a third
    // copy in this process, found and confirmed by every sweep, made the saving of a
    // known copy a third instead of a half, and the bound below met or missed with the
    // scheduling).
    let len = bytes.len() as u64;
    let mut bytes = bytes;
    bytes.fill(0);
    std::hint::black_box(&bytes);
    drop(bytes);
    // The sweeps search a child forked now, which holds the copies (and this process's
    // memory as it was at the fork) until it is killed. Searching this process itself,
    // the sweeps found their own buffers, freed into its heap with sampled bytes of the
    // copies in them, as more partial copies, and the compared-bytes bound below was met
    // or missed with the allocator and the scheduling.
    let child = Forked::new();
    let target = ProcMemory::open(Path::new("/proc"), child.0.as_raw()).unwrap();
    let maps = PathBuf::from(format!("/proc/{}/maps", child.0));
    let regions = ProcMemory::regions(&maps, &std::fs::read_to_string(&maps).unwrap()).unwrap();
    let sweep = |threads, window, known: &[(u64, u64)]| {
        let s = Sweep {
            grid: &grid,
            target: &target,
            stride: grid.stride,
            exact: false,
            deadline: None,
            progress: None,
            threads,
            window,
            known,
            likeness: None,
            prefer: &[],
        };
        let (hits, stats, complete) = s.run(&regions).unwrap();
        assert!(complete);
        let mut found: Vec<(usize, u64, u64)> = hits
            .iter()
            .filter(|h| starts.iter().any(|&a| h.addr >= a && h.addr < a + len))
            .map(|h| (h.piece, h.addr, h.mem_bytes))
            .collect();
        found.sort();
        (found, stats)
    };
    let (one, one_stats) = sweep(1, WINDOW, &[]);
    let (many, many_stats) = sweep(4, 1 << 20, &[]);
    let mut want: Vec<(usize, u64, u64)> = starts
        .iter()
        .flat_map(|&a| (0..6).map(move |i| (i, a + i as u64 * (4 << 20), 4 << 20)))
        .collect();
    want.sort();
    assert_eq!(one, want, "one thread");
    assert_eq!(many, want, "4 threads, 1 MiB windows");
    assert_eq!(one_stats.mapped_bytes, many_stats.mapped_bytes);
    assert!(many_stats.sampled_pages > 0);
    // The first copy known already (kept from an earlier search): passed over, the
    // second still found, and the first one not confirmed again.
    let first = [(starts[0], starts[0] + len)];
    for (threads, window, all) in [(1, WINDOW, &one_stats), (4, 1 << 20, &many_stats)] {
        let (rest, stats) = sweep(threads, window, &first);
        let in_second = |w: &&(usize, u64, u64)| (starts[1]..starts[1] + len).contains(&w.1);
        let second: Vec<_> = want.iter().filter(in_second).copied().collect();
        assert_eq!(rest, second, "{threads} threads, the first copy known");
        // (A copy is found by its first sample and confirmed, and the pages it covers
        // are then not sampled: knowing it saves its confirmation.)
        assert!(stats.sampled_pages <= all.sampled_pages);
        // Its pages are not even walked for presence.
        assert!(
            stats.present_bytes + len / 2 <= all.present_bytes,
            "present {} with the first copy known, {} without",
            stats.present_bytes,
            all.present_bytes
        );
        // On one thread, the known copy's confirmation is saved. (On four, threads that
        // hit the second copy at once may each confirm it before either publishes it,
        // the more so as no thread is busy with the first copy's windows: how much is
        // compared then depends on the scheduling.)
        assert!(
            threads > 1 || stats.compared_bytes * 3 <= all.compared_bytes * 2,
            "compared {} bytes with the first copy known, {} without",
            stats.compared_bytes,
            all.compared_bytes
        );
    }
    drop(copies);
}

#[test]
fn windows_leave_out_whole_pages_of_known_copies() {
    let p = PAGE;
    // Unaligned copies keep their partial first and last pages; overlaps merge.
    assert_eq!(
        whole_pages(&[
            (10 * p + 1, 20 * p - 1),
            (2 * p, 4 * p),
            (3 * p, 6 * p),
            (7, 9)
        ]),
        vec![(2 * p, 6 * p), (11 * p, 19 * p)]
    );
    let known = [(2 * p, 6 * p), (11 * p, 19 * p)];
    assert_eq!(
        uncovered(0, 30 * p, &known),
        vec![(0, 2 * p), (6 * p, 11 * p), (19 * p, 30 * p)]
    );
    assert_eq!(uncovered(3 * p, 5 * p, &known), vec![]);
    assert_eq!(uncovered(4 * p, 12 * p, &known), vec![(6 * p, 11 * p)]);
    assert_eq!(uncovered(20 * p, 25 * p, &known), vec![(20 * p, 25 * p)]);
    assert_eq!(uncovered(0, 30 * p, &[]), vec![(0, 30 * p)]);
}
