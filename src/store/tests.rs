//! Round trip, boundaries, retention, export and read-only use of the store.

use super::format::{day_start_ns, NS_PER_DAY};
use super::*;

pub(super) const SEC: u64 = 1_000_000_000;
/// 2025-11-30T00:00:00Z.
pub(super) const DAY0: u64 = 20_422 * NS_PER_DAY;

/// xorshift64*: deterministic payloads without a dependency.
pub(super) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `len` bytes: random, or JSON-like text that compresses well.
    pub fn payload(&mut self, len: usize) -> Vec<u8> {
        if self.below(2) == 0 {
            (0..len).map(|_| self.next() as u8).collect()
        } else {
            let mut s = Vec::with_capacity(len + 64);
            while s.len() < len {
                let pid = self.below(100_000);
                s.extend_from_slice(
                    format!("{{\"pid\":{pid},\"rss_bytes\":{}}},", self.next() >> 20).as_bytes(),
                );
            }
            s.truncate(len);
            s
        }
    }
}

fn all(store: &Store) -> Vec<Frame> {
    store
        .range(0, u64::MAX)
        .collect::<Result<Vec<_>>>()
        .unwrap()
}

#[test]
fn round_trip_over_sizes_and_days() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    let mut sizes = vec![0, 1, 2, 31, 32, 33, 4095, 4096, 65_536, 1 << 20];
    sizes.extend((0..70).map(|_| rng.below(50_000) as usize));
    let mut t = DAY0 + 3 * 3600 * SEC;
    let mut want = Vec::new();
    let (mut store, damage) = Store::open_or_create(dir.path()).unwrap();
    assert!(damage.is_empty());
    for &len in &sizes {
        // 1 s to ~14 h apart: the frames span several days.
        t += SEC + rng.below(50_000) * SEC;
        let payload = rng.payload(len);
        store.append(t, &payload).unwrap();
        want.push(Frame { at_ns: t, payload });
    }
    let days = store.stats().unwrap().shards;
    assert!(days >= 5, "{days} shards");
    let check = |store: &Store| {
        for w in &want {
            assert_eq!(store.nearest(w.at_ns).unwrap().as_ref(), Some(w));
            assert_eq!(store.nearest(w.at_ns + 1).unwrap().as_ref(), Some(w)); // 1 ns later: still nearest
        }
        for pair in want.windows(2) {
            assert_eq!(
                store.before(pair[1].at_ns).unwrap().as_ref(),
                Some(&pair[0])
            );
        }
        assert_eq!(all(store), want);
        let mid = &want[10..30];
        let got: Vec<_> = store
            .range(mid[0].at_ns, mid[19].at_ns)
            .collect::<Result<Vec<_>>>()
            .unwrap();
        assert_eq!(got, mid);
        let st = store.stats().unwrap();
        assert_eq!(st.frames, want.len() as u64);
        assert_eq!(st.first_ns, Some(want[0].at_ns));
        assert_eq!(st.last_ns, Some(t));
        assert!(store.take_damage().is_empty());
    };
    check(&store);
    store.flush().unwrap();
    drop(store);
    let (store, damage) = Store::open_or_create(dir.path()).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    check(&store);
    drop(store);
    let (store, damage) = Store::open_read_only(dir.path()).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    check(&store);
}

#[test]
fn frames_file_is_a_plain_zstd_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    store.append(DAY0, b"{\"a\":1}\n").unwrap();
    store.append(DAY0 + SEC, b"").unwrap();
    store.append(DAY0 + 2 * SEC, b"{\"a\":2}\n").unwrap();
    let bytes = std::fs::read(dir.path().join("2025-11-30.frames")).unwrap();
    assert_eq!(
        zstd::stream::decode_all(&bytes[..]).unwrap(),
        b"{\"a\":1}\n{\"a\":2}\n"
    );
    let header: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("store.json")).unwrap()).unwrap();
    assert_eq!(header["format"], "twofold-store");
    assert_eq!(header["version"], 1);
    assert_eq!(
        std::fs::metadata(dir.path().join("2025-11-30.index"))
            .unwrap()
            .len(),
        96
    );
}

#[test]
fn nearest_and_before_on_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    assert_eq!(store.nearest(DAY0).unwrap(), None);
    assert_eq!(store.before(DAY0).unwrap(), None);
    assert_eq!(store.range(0, u64::MAX).count(), 0);
    // Day 0 at 10:00 and 23:59:50, day 2 at 00:00:10 (day 1 has no shard), twice at 01:00.
    let times = [
        DAY0 + 10 * 3600 * SEC,
        DAY0 + NS_PER_DAY - 10 * SEC,
        DAY0 + 2 * NS_PER_DAY + 10 * SEC,
        DAY0 + 2 * NS_PER_DAY + 3600 * SEC,
        DAY0 + 2 * NS_PER_DAY + 3600 * SEC,
    ];
    for (i, &t) in times.iter().enumerate() {
        store.append(t, format!("frame {i}").as_bytes()).unwrap();
    }
    let at = |f: Option<Frame>| f.map(|f| (f.at_ns, String::from_utf8(f.payload).unwrap()));
    let near = |t| at(store.nearest(t).unwrap());
    let before = |t| at(store.before(t).unwrap());
    let f = |i: usize| Some((times[i], format!("frame {i}")));
    // Before the first frame, in an earlier day with no shard, and at time 0.
    assert_eq!(near(0), f(0));
    assert_eq!(near(DAY0 - NS_PER_DAY), f(0));
    assert_eq!(near(times[0] - 1), f(0));
    assert_eq!(before(times[0]), None);
    assert_eq!(before(times[0] + 1), f(0));
    // Exactly on a timestamp.
    assert_eq!(near(times[1]), f(1));
    assert_eq!(before(times[1]), f(0));
    // Between days: in the missing day 1, nearer to the end of day 0 or the start of day 2.
    assert_eq!(near(DAY0 + NS_PER_DAY + 3600 * SEC), f(1));
    assert_eq!(near(DAY0 + 2 * NS_PER_DAY - 3600 * SEC), f(2));
    assert_eq!(near(DAY0 + 2 * NS_PER_DAY), f(2)); // 10 s before f2, a day after f1
    assert_eq!(before(DAY0 + 2 * NS_PER_DAY + 5 * SEC), f(1));
    assert_eq!(before(times[2]), f(1));
    // A tie takes the earlier frame; equal timestamps both kept, the first found first.
    let mid = (times[0] + times[1]) / 2;
    assert_eq!(near(mid), f(0));
    assert_eq!(before(times[4] + 1), f(4));
    assert_eq!(before(times[3]), f(2));
    // After the last.
    assert_eq!(near(u64::MAX), f(4));
    assert_eq!(before(u64::MAX), f(4));
    // Ranges include both ends.
    let r: Vec<_> = store
        .range(times[1], times[3])
        .map(|f| f.unwrap().at_ns)
        .collect();
    assert_eq!(r, vec![times[1], times[2], times[3], times[4]]);
    assert_eq!(store.range(times[1] + 1, times[2] - 1).count(), 0);
    assert_eq!(store.range(times[2], times[1]).count(), 0);
}

#[test]
fn timestamps_must_not_decrease() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    store.append(DAY0 + 5 * SEC, b"a").unwrap();
    store.append(DAY0 + 5 * SEC, b"b").unwrap();
    let err = store.append(DAY0 + 4 * SEC, b"c").unwrap_err();
    assert!(matches!(err, StoreError::OutOfOrder { .. }), "{err}");
    drop(store);
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    assert!(store.append(DAY0 - NS_PER_DAY, b"c").is_err());
    store.append(DAY0 + 6 * SEC, b"d").unwrap();
}

#[test]
fn one_writer_and_read_only_readers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    store.append(DAY0, b"a").unwrap();
    let err = Store::open_or_create(dir.path()).err().unwrap();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    let (reader, damage) = Store::open_read_only(dir.path()).unwrap();
    assert!(damage.is_empty());
    assert_eq!(reader.nearest(DAY0).unwrap().unwrap().payload, b"a");
    let mut reader = reader;
    assert!(matches!(
        reader.append(DAY0 + 1, b"b"),
        Err(StoreError::ReadOnly { .. })
    ));
    // Not a store: a directory with other files.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("x"), b"x").unwrap();
    assert!(matches!(
        Store::open_or_create(other.path()),
        Err(StoreError::NotAStore { .. })
    ));
    // A later version.
    let v2 = tempfile::tempdir().unwrap();
    std::fs::write(v2.path().join("store.json"), br#"{"format":"twofold-store","version":2,"created_ns":0,"shard":"utc-day","compression":"zstd","index_entry_bytes":32}"#).unwrap();
    assert!(matches!(
        Store::open_read_only(v2.path()),
        Err(StoreError::Version { version: 2, .. })
    ));
}

/// Five days with three frames each.
fn five_days(dir: &Path) -> Store {
    let (mut store, _) = Store::open_or_create(dir).unwrap();
    for d in 0..5 {
        for k in 0..3 {
            store
                .append(DAY0 + d * NS_PER_DAY + k * 3600 * SEC, &[d as u8; 1000])
                .unwrap();
        }
    }
    store
}

#[test]
fn retention_by_age_then_size_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = five_days(dir.path());
    let bytes = store.stats().unwrap().bytes;
    // Keep what is after day 2 starts: days 0 and 1 go.
    let removed = store.retain(day_start_ns(20_424), None).unwrap();
    let names: Vec<_> = removed
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "2025-11-30.index",
            "2025-11-30.frames",
            "2025-12-01.index",
            "2025-12-01.frames"
        ]
    );
    assert!(!dir.path().join("2025-12-01.frames").exists());
    let st = store.stats().unwrap();
    assert_eq!((st.shards, st.frames), (3, 9));
    assert_eq!(st.first_ns, Some(DAY0 + 2 * NS_PER_DAY));
    assert!(st.bytes < bytes);
    assert_eq!(store.nearest(0).unwrap().unwrap().payload, [2u8; 1000]);
    // A cap just under the total drops one more shard; a cap of 0 keeps only the newest.
    assert_eq!(store.retain(0, Some(st.bytes - 1)).unwrap().len(), 2);
    assert_eq!(store.stats().unwrap().shards, 2);
    assert_eq!(store.retain(u64::MAX, Some(0)).unwrap().len(), 2);
    let st = store.stats().unwrap();
    assert_eq!((st.shards, st.frames), (1, 3));
    assert_eq!(
        store.retain(u64::MAX, Some(0)).unwrap(),
        Vec::<PathBuf>::new()
    );
    // Recording goes on; a reopened store sees the same.
    store
        .append(DAY0 + 4 * NS_PER_DAY + 4 * 3600 * SEC, b"next")
        .unwrap();
    drop(store);
    let (store, damage) = Store::open_or_create(dir.path()).unwrap();
    assert!(damage.is_empty());
    assert_eq!(store.stats().unwrap().frames, 4);
}

#[test]
fn export_writes_a_store_of_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = five_days(dir.path());
    let dest = tempfile::tempdir().unwrap();
    let bundle = dest.path().join("bundle");
    let (from, to) = (DAY0 + NS_PER_DAY + 3600 * SEC, DAY0 + 3 * NS_PER_DAY);
    assert_eq!(store.export(from, to, &bundle).unwrap(), 6); // 2 + 3 + 1
    let want: Vec<_> = store.range(from, to).collect::<Result<_>>().unwrap();
    let (copy, damage) = Store::open_read_only(&bundle).unwrap();
    assert!(damage.is_empty());
    assert_eq!(all(&copy), want);
    assert_eq!(copy.stats().unwrap().shards, 3);
    assert!(matches!(
        store.export(from, to, &bundle),
        Err(StoreError::DestNotEmpty { .. })
    ));
}

/// 7 days at a 5 s interval with ~20 KiB JSON payloads; times `nearest`.
/// `cargo test --release --lib store::tests::bench_nearest -- --ignored --nocapture`
#[test]
#[ignore = "builds a ~120k-frame store; run by hand"]
fn bench_nearest() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(42);
    // 64 distinct payloads compressed once, then copied: building the store is I/O bound.
    let raws: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            let mut s = String::from("{\"schema_version\":1,\"processes\":[");
            while s.len() < 20 * 1024 {
                let pid = rng.below(4_000_000);
                s.push_str(&format!(
                    "{{\"pid\":{pid},\"comm\":\"python{}\",\"rss_bytes\":{},\"pss_bytes\":{},\"file\":\"/models/m{}.safetensors\",\"cached_bytes\":{}}},",
                    rng.below(10),
                    rng.next() >> 24,
                    rng.next() >> 25,
                    rng.below(8),
                    rng.next() >> 26
                ));
            }
            s.push_str("{}]}");
            zstd::bulk::compress(s.as_bytes(), ZSTD_LEVEL).unwrap()
        })
        .collect();
    let (mut store, _) = Store::open_or_create(dir.path()).unwrap();
    let frames = 7 * 86_400 / 5;
    let t0 = std::time::Instant::now();
    for i in 0..frames {
        store
            .append_raw(DAY0 + i * 5 * SEC, &raws[(i % 64) as usize])
            .unwrap();
    }
    store.flush().unwrap();
    let st = store.stats().unwrap();
    println!(
        "built {} frames, {} shards, {:.0} MiB, {:.1} KiB/frame compressed, in {:.1} s",
        st.frames,
        st.shards,
        st.bytes as f64 / 1048576.0,
        st.bytes as f64 / st.frames as f64 / 1024.0,
        t0.elapsed().as_secs_f64()
    );
    drop(store);
    let t1 = std::time::Instant::now();
    let (store, _) = Store::open_or_create(dir.path()).unwrap();
    println!("open: {:.2} ms", t1.elapsed().as_secs_f64() * 1e3);
    let n = 2000;
    let mut worst = 0f64;
    let t2 = std::time::Instant::now();
    for _ in 0..n {
        let at = DAY0 + rng.below(7 * NS_PER_DAY);
        let q = std::time::Instant::now();
        let f = store.nearest(at).unwrap().unwrap();
        worst = worst.max(q.elapsed().as_secs_f64());
        assert!(f.at_ns.abs_diff(at) <= 5 * SEC / 2);
        assert!(f.payload.len() >= 20 * 1024);
    }
    let mean = t2.elapsed().as_secs_f64() / n as f64;
    println!(
        "nearest: mean {:.3} ms, worst {:.3} ms over {n} queries",
        mean * 1e3,
        worst * 1e3
    );
    assert!(mean < 0.05, "nearest took {mean} s on average");
}
