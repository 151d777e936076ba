//! Tests of [`super`]: the stride plan and small tensors.

use super::*;

#[test]
fn plan_guarantees_the_run_with_coprime_stride_and_spacing() {
    for run in [2u64, 3, 8, 9, 24, 100, 505, 16384, 1 << 20] {
        for min_every in [1u64, 2, 8] {
            let (s, m) = plan(run, min_every);
            assert!(m >= min_every && m.is_power_of_two(), "{run} {min_every}");
            assert!((1..=MAX_STRIDE).contains(&s));
            assert!(m == 1 || s % 2 == 1, "S must be odd when M > 1");
            if run > min_every {
                assert!(m * s < run, "run {run}: S {s} M {m}");
            }
        }
    }
    assert_eq!(plan(16384, 1), (127, 128));
    assert_eq!(plan(8, 1), (7, 1));
}

use crate::dupes::test_tensor as t;

#[test]
fn a_file_of_small_tensors_is_sampled_at_every_page_over_whole_pages() {
    assert!(small_heavy(&[300, 4000, 8192]));
    assert!(!small_heavy(&[300, 1 << 20]));
    assert_eq!(run_pages(vec![300, 4000]), 0);
    assert_eq!(run_pages(vec![300, 64 << 10]), 16);
}

#[test]
fn small_tensors_are_indexed_and_looked_up_over_whole_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bin");
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..8192)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    let tensors = vec![t(0, 100), t(100, 300), t(400, 1000), t(1400, 6000)];
    let fb = FileBytes::open(&path).unwrap();
    let g = Grid::build(
        vec![(fb, tensors, Format::Safetensors)],
        16,
        Layouts::Identical,
        false,
    )
    .unwrap();
    let lens: Vec<u64> = g.pieces.iter().map(|p| p.mem_len).collect();
    assert_eq!(lens, [300, 1000, 6000], "under SMALL_MIN is too small");
    assert_eq!(
        g.files[0].unsearchable,
        [(0, CopyKind::Identical, Unsearchable::TooSmall)]
    );
    assert!(g.small && g.dense_small && g.stride == 1);
    let sampling = g.sampling(1);
    assert_eq!(sampling.len, PAGE as usize);
    // The second half is looked up at the alignment (16) only.
    assert!(sampling.full.contains(&(PAGE as u16 - 16)));
    assert!(!sampling.full.contains(&(HALF as u16 + 4)));
    assert_eq!((g.prev[1], g.next[1]), (Some(0), Some(2)));
}

/// Sampled pages step through every page class of the point pairs: for any copy start,
/// a copy of `M × S + 1` pages contains a sampled page whose first half holds a point.
#[test]
fn every_copy_of_the_guaranteed_run_is_hit() {
    for (s, m) in [(1u64, 1u64), (7, 1), (5, 4), (3, 8), (7, 16)] {
        let run = m * s + 1;
        for start in (0..(2 * m * s * PAGE)).step_by(16 * 37) {
            let end = start + run * PAGE;
            let hit = (start / PAGE..end / PAGE + 1)
                .filter(|p| p % s == 0)
                .any(|p| {
                    (0..HALF).step_by(16).any(|d| {
                        let at = p * PAGE + d;
                        at >= start
                            && at + WIN as u64 <= end
                            && (at - start) % HALF == 0
                            && is_point((at - start) / HALF, m)
                    })
                });
            assert!(hit, "S {s} M {m} start {start}");
        }
    }
}

/// What a grid looks up, and what it says it could not.
fn shape_of(g: &Grid) -> impl PartialEq + std::fmt::Debug {
    let unsearchable: Vec<_> = g.files.iter().map(|f| f.unsearchable.clone()).collect();
    (
        g.table.clone(),
        g.informative.clone(),
        unsearchable,
        g.every,
        g.stride,
    )
}

#[test]
fn points_taken_from_the_cache_make_the_grid_read_from_the_files() {
    use crate::dupes::pointcache::PointCache;
    let dir = tempfile::tempdir().unwrap();
    let random = crate::dupes::test_random;
    // A: four 1 MiB F16 tensors (widened too), the third all zeros (low entropy); B: two.
    let mut a = random(4 << 20, 0x9e37_79b9_7f4a_7c15);
    a[2 << 20..3 << 20].fill(0);
    let b = random(2 << 20, 0x2545_f491_4f6c_dd1d);
    std::fs::write(dir.path().join("a"), &a).unwrap();
    std::fs::write(dir.path().join("b"), &b).unwrap();
    let f16 = |o: u64| crate::container::Tensor {
        dtype: crate::container::Dtype::F16,
        shape: vec![1 << 19],
        ..t(o, 1 << 20)
    };
    let inputs = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                let len = std::fs::metadata(dir.path().join(n)).unwrap().len();
                let tensors = (0..len >> 20).map(|i| f16(i << 20)).collect();
                let fb = FileBytes::open(&dir.path().join(n)).unwrap();
                (fb, tensors, Format::Safetensors)
            })
            .collect::<Vec<_>>()
    };
    let reference = Grid::build(inputs(&["a", "b"]), 16, Layouts::Converted, false).unwrap();
    assert!(reference.every > 1, "the test needs spaced points");
    assert!(reference.files[0]
        .unsearchable
        .iter()
        .any(|u| u.2 == Unsearchable::LowEntropy));
    let store = tempfile::tempdir().unwrap();
    // Built exact first (every point): kept at the finest spacing.
    let c = PointCache::with_dir(Some(store.path()));
    let exact = Grid::build_cached(inputs(&["a"]), 16, Layouts::Converted, true, Some(&c)).unwrap();
    assert_eq!(exact.every, 1);
    assert_eq!(*c.stats.lock().unwrap(), (0, 1));
    // The same run: a from memory, b read.
    let g =
        Grid::build_cached(inputs(&["a", "b"]), 16, Layouts::Converted, false, Some(&c)).unwrap();
    assert_eq!(shape_of(&g), shape_of(&reference));
    assert_eq!(*c.stats.lock().unwrap(), (1, 2));
    drop(c);
    // A later run: both from disk, and the same grid.
    let c = PointCache::with_dir(Some(store.path()));
    let g =
        Grid::build_cached(inputs(&["a", "b"]), 16, Layouts::Converted, false, Some(&c)).unwrap();
    assert_eq!(shape_of(&g), shape_of(&reference));
    assert_eq!(*c.stats.lock().unwrap(), (2, 0));
    // A rewritten file (its mtime moves) is read again.
    let new_b = random(2 << 20, 0x1234_5678_9abc_def1);
    std::fs::write(dir.path().join("b"), &new_b).unwrap();
    let f = std::fs::File::options()
        .write(true)
        .open(dir.path().join("b"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let c = PointCache::with_dir(Some(store.path()));
    let g =
        Grid::build_cached(inputs(&["a", "b"]), 16, Layouts::Converted, false, Some(&c)).unwrap();
    let fresh = Grid::build(inputs(&["a", "b"]), 16, Layouts::Converted, false).unwrap();
    assert_eq!(shape_of(&g), shape_of(&fresh));
    assert_ne!(shape_of(&g), shape_of(&reference));
    assert_eq!(*c.stats.lock().unwrap(), (1, 1));
}

/// The filter in front of the table: every key in the table passes it (a key it dropped
/// would be a copy never looked up), and it passes few keys that are not in the table.
#[test]
fn the_filter_passes_every_point_and_few_others() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = crate::dupes::test_random(16 << 20, 0x5851_f42d_4c95_7f2d);
    let path = dir.path().join("m.bin");
    std::fs::write(&path, &bytes).unwrap();
    let tensors = (0..16u64).map(|i| t(i << 20, 1 << 20)).collect();
    let fb = FileBytes::open(&path).unwrap();
    let g = Grid::build(
        vec![(fb, tensors, Format::Safetensors)],
        16,
        Layouts::Identical,
        false,
    )
    .unwrap();
    let keys: std::collections::HashSet<u64> =
        g.table.iter().map(|s| s.key).filter(|k| *k != 0).collect();
    assert!(keys.len() > 1000, "{} points", keys.len());
    assert!(keys.iter().all(|k| g.maybe(*k)), "a point the filter drops");
    // Keys of windows that are not points (hashes of other bytes), checked against the
    // table itself.
    let others = crate::dupes::test_random(1 << 20, 0x1405_7b7e_f767_814f);
    let (mut passed, mut tried) = (0u32, 0u32);
    for w in others.chunks_exact(WIN) {
        let k = hash(w);
        if keys.contains(&k) {
            continue;
        }
        tried += 1;
        passed += u32::from(g.maybe(k));
    }
    let rate = f64::from(passed) / f64::from(tried);
    // Three bits of one word at FILTER_BITS_PER_POINT bits per point: about 0.6% at 16.
    assert!(rate < 0.02, "{passed} of {tried} passed ({rate:.4})");
    assert!(tried > 60_000);
}
