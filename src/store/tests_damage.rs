//! Crash safety: torn tails at every byte offset, flipped bytes inside earlier frames and
//! entries, and leftovers of an interrupted retention.

use super::format::{Entry, ENTRY_BYTES};
use super::tests::{Rng, DAY0, SEC};
use super::*;

const EARLIER: u64 = 20; // frames on the day before
const LAST_DAY: u64 = 150; // frames on the last day

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    want: Vec<Frame>,
    frames: Vec<u8>,
    index: Vec<u8>,
}

/// A store with frames on two days; the last day's files are kept in memory.
fn fixture() -> Fixture {
    // tmpfs where there is one: thousands of reopenings each fsync the truncated files.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let dir = tmp.path().join("rec");
    let mut rng = Rng(7);
    let (mut store, _) = Store::open_or_create(&dir).unwrap();
    let mut want = Vec::new();
    for i in 0..EARLIER + LAST_DAY {
        let at_ns = DAY0 + 60 * SEC + i * 300 * SEC - EARLIER * 300 * SEC;
        let len = 40 + rng.below(60) as usize;
        let payload = rng.payload(len);
        store.append(at_ns, &payload).unwrap();
        want.push(Frame { at_ns, payload });
    }
    assert_eq!(
        format::day_of(want[EARLIER as usize].at_ns),
        format::day_of(DAY0)
    );
    assert_eq!(
        format::day_of(want[EARLIER as usize - 1].at_ns),
        format::day_of(DAY0) - 1
    );
    store.flush().unwrap();
    drop(store);
    let frames = std::fs::read(dir.join("2025-11-30.frames")).unwrap();
    let index = std::fs::read(dir.join("2025-11-30.index")).unwrap();
    assert!(
        frames.len() > 4096 && index.len() > 4096,
        "{} {}",
        frames.len(),
        index.len()
    );
    Fixture {
        _tmp: tmp,
        dir,
        want,
        frames,
        index,
    }
}

fn entry(index: &[u8], i: usize) -> Entry {
    let b: &[u8; ENTRY_BYTES] = index[i * ENTRY_BYTES..][..ENTRY_BYTES].try_into().unwrap();
    Entry::decode(b).unwrap()
}

fn all(store: &Store) -> Vec<Frame> {
    store
        .range(0, u64::MAX)
        .collect::<Result<Vec<_>>>()
        .unwrap()
}

/// Writes the last day's files, opens the store and checks that exactly the first
/// `EARLIER + kept` frames survive, the damage is reported once and recording resumes.
fn check_torn(fx: &Fixture, frames: &[u8], index: &[u8], kept: usize, file: &str) {
    std::fs::write(fx.dir.join("2025-11-30.frames"), frames).unwrap();
    std::fs::write(fx.dir.join("2025-11-30.index"), index).unwrap();
    let survivors = &fx.want[..EARLIER as usize + kept];
    let (mut store, damage) = Store::open_or_create(&fx.dir).unwrap();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(
        damage[0].contains("ignored a torn tail of") && damage[0].contains(file),
        "{damage:?}"
    );
    assert_eq!(all(&store), survivors);
    let last = survivors.last().unwrap().at_ns;
    assert_eq!(store.nearest(u64::MAX).unwrap().unwrap().at_ns, last);
    assert!(store.take_damage().is_empty());
    // Recording resumes after the last whole frame.
    store.append(last + SEC, b"resumed").unwrap();
    assert_eq!(
        store.nearest(last + SEC).unwrap().unwrap().payload,
        b"resumed"
    );
    drop(store);
    let (store, damage) = Store::open_or_create(&fx.dir).unwrap();
    assert!(damage.is_empty(), "reported twice: {damage:?}");
    assert_eq!(store.stats().unwrap().frames, survivors.len() as u64 + 1);
    assert_eq!(store.before(last + SEC).unwrap().as_ref(), survivors.last());
}

#[test]
fn torn_frames_file_at_every_offset_of_its_last_4k() {
    let fx = fixture();
    let ends: Vec<u64> = (0..LAST_DAY as usize)
        .map(|i| entry(&fx.index, i).end())
        .collect();
    for cut in fx.frames.len() - 4096..fx.frames.len() {
        let kept = ends.iter().filter(|&&e| e <= cut as u64).count();
        // A cut on a frame boundary leaves only index entries past the last frame.
        let on_boundary = ends.contains(&(cut as u64));
        let file = if on_boundary {
            "2025-11-30.index"
        } else {
            "2025-11-30.frames"
        };
        check_torn(&fx, &fx.frames[..cut], &fx.index, kept, file);
    }
}

#[test]
fn torn_index_file_at_every_offset_of_its_last_4k() {
    let fx = fixture();
    for cut in fx.index.len() - 4096..fx.index.len() {
        let kept = cut / ENTRY_BYTES;
        // A cut on an entry boundary leaves only frames bytes past the last entry.
        let file = if cut % ENTRY_BYTES == 0 {
            "2025-11-30.frames"
        } else {
            "2025-11-30.index"
        };
        check_torn(&fx, &fx.frames, &fx.index[..cut], kept, file);
    }
}

#[test]
fn zeroed_tail_after_power_loss() {
    // The index reached the disk but the frame data did not: the tail reads as zeros.
    let fx = fixture();
    let mut frames = fx.frames.clone();
    let last = entry(&fx.index, LAST_DAY as usize - 1);
    frames[last.offset as usize..].fill(0);
    check_torn(
        &fx,
        &frames,
        &fx.index,
        LAST_DAY as usize - 1,
        "2025-11-30.frames",
    );
}

#[test]
fn flipped_byte_in_an_earlier_frame_makes_only_it_absent() {
    let fx = fixture();
    let e = entry(&fx.index, 5);
    let mut frames = fx.frames.clone();
    frames[(e.offset + u64::from(e.len) / 2) as usize] ^= 0x40;
    std::fs::write(fx.dir.join("2025-11-30.frames"), &frames).unwrap();
    let (store, damage) = Store::open_or_create(&fx.dir).unwrap();
    assert!(damage.is_empty(), "not a tail: {damage:?}");
    let lost = &fx.want[EARLIER as usize + 5];
    assert_eq!(lost.at_ns, e.at_ns);
    let mut want = fx.want.clone();
    want.retain(|f| f.at_ns != lost.at_ns);
    assert_eq!(all(&store), want);
    // Nearest falls back to a neighbour (equally far: the earlier one); before skips it.
    let prev = &fx.want[EARLIER as usize + 4];
    let next = &fx.want[EARLIER as usize + 6];
    assert_eq!(store.nearest(lost.at_ns).unwrap().as_ref(), Some(prev));
    assert_eq!(store.nearest(lost.at_ns + 1).unwrap().as_ref(), Some(next));
    assert_eq!(store.before(next.at_ns).unwrap().as_ref(), Some(prev));
    let reported = store.take_damage();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(
        reported[0].contains("frame 5 of 2025-11-30.frames"),
        "{reported:?}"
    );
    assert!(store.take_damage().is_empty());
    let _ = store.nearest(lost.at_ns).unwrap();
    assert!(store.take_damage().is_empty(), "reported once");
    assert_eq!(store.verify().unwrap().len(), 1);
}

#[test]
fn flipped_byte_in_an_earlier_entry_makes_only_its_frame_absent() {
    let fx = fixture();
    let mut index = fx.index.clone();
    for i in [7, 8, 60] {
        index[i * ENTRY_BYTES + 3] ^= 0x01; // in the timestamp
    }
    std::fs::write(fx.dir.join("2025-11-30.index"), &index).unwrap();
    let (store, damage) = Store::open_or_create(&fx.dir).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    let lost: Vec<u64> = [7, 8, 60]
        .map(|i| fx.want[EARLIER as usize + i].at_ns)
        .into();
    let mut want = fx.want.clone();
    want.retain(|f| !lost.contains(&f.at_ns));
    assert_eq!(all(&store), want);
    // Every remaining frame is still found by the binary search.
    for f in &want {
        assert_eq!(store.nearest(f.at_ns).unwrap().as_ref(), Some(f));
    }
    assert_eq!(
        store.nearest(lost[2]).unwrap().unwrap().at_ns,
        fx.want[EARLIER as usize + 59].at_ns
    );
    let reported = store.take_damage();
    assert_eq!(reported.len(), 3, "{reported:?}");
    assert!(
        reported
            .iter()
            .all(|l| l.contains("of 2025-11-30.index is damaged")),
        "{reported:?}"
    );
    assert_eq!(store.stats().unwrap().frames, want.len() as u64);
}

#[test]
fn leftovers_of_an_interrupted_retention() {
    let fx = fixture();
    // Retention removes the index first; a crash before the frames file goes leaves it alone.
    std::fs::remove_file(fx.dir.join("2025-11-29.index")).unwrap();
    let (store, damage) = Store::open_read_only(&fx.dir).unwrap();
    assert!(damage.is_empty(), "read-only changes nothing: {damage:?}");
    drop(store);
    let (store, damage) = Store::open_or_create(&fx.dir).unwrap();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(
        damage[0].contains("removed '2025-11-29.frames'"),
        "{damage:?}"
    );
    assert!(!fx.dir.join("2025-11-29.frames").exists());
    assert_eq!(all(&store), fx.want[EARLIER as usize..]);
}

#[test]
fn read_only_ignores_a_torn_tail_without_touching_it() {
    let fx = fixture();
    let cut = fx.frames.len() - 3;
    std::fs::write(fx.dir.join("2025-11-30.frames"), &fx.frames[..cut]).unwrap();
    let (store, damage) = Store::open_read_only(&fx.dir).unwrap();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!(all(&store), fx.want[..fx.want.len() - 1]);
    let len = std::fs::metadata(fx.dir.join("2025-11-30.frames"))
        .unwrap()
        .len();
    assert_eq!(len, cut as u64);
    // While a writer holds the store, its tail is being written, not torn: no report.
    drop(store);
    std::fs::write(fx.dir.join("2025-11-30.frames"), &fx.frames).unwrap();
    let (_writer, _) = Store::open_or_create(&fx.dir).unwrap();
    std::fs::write(fx.dir.join("2025-11-30.frames"), &fx.frames[..cut]).unwrap();
    let (_, damage) = Store::open_read_only(&fx.dir).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
}

/// A zstd frame (no content size in its header) that decodes to `n` zero bytes, made
/// without holding them.
fn zero_bomb(n: u64) -> Vec<u8> {
    use std::io::Write;
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_contentsize(false).unwrap();
    let block = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len() as u64) as usize;
        enc.write_all(&block[..k]).unwrap();
        left -= k as u64;
    }
    enc.finish().unwrap()
}

/// A frame of valid CRCs that decodes past [`format::MAX_FRAME_BYTES`] (a decompression
/// bomb in a bundle passed around for a bug report) is damaged: skipped and reported, its
/// neighbours read, and nothing larger than the limit decoded. The writer refuses such a
/// payload.
#[test]
fn a_frame_that_decodes_past_the_limit_is_damage_not_an_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    let (mut store, _) = Store::open_or_create(&dir).unwrap();
    let bomb = zero_bomb(format::MAX_FRAME_BYTES + 1);
    assert!(bomb.len() < 1 << 20, "a bomb: {} bytes", bomb.len());
    store.append(DAY0, b"before").unwrap();
    store.append_raw(DAY0 + SEC, &bomb).unwrap();
    store.append(DAY0 + 2 * SEC, b"after").unwrap();
    let huge = vec![0u8; format::MAX_FRAME_BYTES as usize + 1];
    let refused = store.append(DAY0 + 3 * SEC, &huge).unwrap_err();
    assert!(matches!(refused, StoreError::TooLarge { .. }), "{refused}");
    drop(huge);
    store.flush().unwrap();
    drop(store);
    let (store, _) = Store::open_read_only(&dir).unwrap();
    let got: Vec<Vec<u8>> = all(&store).into_iter().map(|f| f.payload).collect();
    assert_eq!(got, [b"before".to_vec(), b"after".to_vec()]);
    let reported = store.take_damage();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(reported[0].contains("frame 1 of "), "{reported:?}");
    assert!(reported[0].contains("256 MiB frame limit"), "{reported:?}");
    assert!(store.nearest(DAY0 + SEC).unwrap().is_some());
    assert_eq!(store.verify().unwrap().len(), 1);
}
