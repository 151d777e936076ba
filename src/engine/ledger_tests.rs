//! Tests of the upload ledger (`ledger.rs`).

use super::*;

fn copy(src: u64, dst: u64, bytes: u64) -> CopyRecord {
    CopyRecord {
        entry: 5,
        dst,
        src,
        bytes,
        unified: false,
        strided: false,
        anchor: vec![7; 64],
        samples: Vec::new(),
    }
}

#[test]
fn processes_that_exited_are_forgotten_with_what_they_left() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("10")).unwrap();
    let mut l = Ledger {
        proc_root: root.path().to_path_buf(),
        ..Ledger::default()
    };
    for pid in [10, 11] {
        l.note(Note::Mapped {
            pid,
            preloaded: false,
        });
        l.record(
            pid,
            1,
            Call::Alloc {
                dst: 0x1000,
                bytes: 64,
            },
        );
        // No matcher: the copy is kept for a later match.
        l.record(pid, 2, Call::Copy(copy(0x10, 0x1000, 64)));
    }
    let file = FileKey::from_dev(1, 2);
    let widened = Some(Conversion::F16ToF32);
    let up = |file_bytes| FileUpload {
        file_bytes,
        widened: true,
        conversion: widened,
        ..FileUpload::default()
    };
    l.uploads.insert((11, file, widened), up(4096));
    l.uploads.insert((10, file, widened), up(1024));
    l.last_gpu.insert(11, 3);
    assert_eq!((l.procs.len(), l.pending.len()), (2, 2));
    l.forget_exited();
    // What pid 11 uploaded stays, on the GPU it was last seen on (widened: twice).
    let retired = l.snapshot().retired;
    assert_eq!(
        retired,
        [RetiredUpload {
            file,
            gpu: Some(3),
            device_bytes: 8192
        }]
    );
    l.uploads.clear();
    // pid 11 has no /proc entry: its row, upload and kept copy are gone.
    assert_eq!(l.procs.keys().copied().collect::<Vec<_>>(), [10]);
    assert!(l.uploads.is_empty());
    assert_eq!(l.pending.len(), 1);
    assert_eq!(l.pending_bytes, 64);
    let s = l.snapshot();
    assert_eq!(s.processes.len(), 1);
    assert_eq!(s.processes[0].device_alloc_bytes, 64);
}

#[test]
fn tiny_copies_are_counted_as_not_examined_and_a_copy_sent_later_is_taken_off() {
    let root = tempfile::tempdir().unwrap();
    let mut l = Ledger {
        proc_root: root.path().to_path_buf(),
        ..Ledger::default()
    };
    l.record(
        7,
        1_000,
        Call::Tiny {
            copies: 3,
            bytes: 600,
        },
    );
    // One of them began a chunked upload: it came as a record after all (no matcher
    // here, so not model bytes), and the counters took it off.
    l.record(7, 1_500, Call::Copy(copy(0x10, 0x1000, 200)));
    l.record(
        7,
        2_000,
        Call::Tiny {
            copies: -1,
            bytes: -200,
        },
    );
    let r = &l.snapshot().processes[0];
    assert_eq!((r.copies, r.copy_bytes), (3, 600));
    assert_eq!(
        (r.unexamined_bytes, r.other_bytes, r.model_bytes),
        (400, 200, 0)
    );
    assert_eq!((r.first_copy_unix_ns, r.last_copy_unix_ns), (1_000, 1_500));
}

/// The files a process holds open or maps, among those asked about: an fd is looked at
/// only when its inode is one of theirs.
#[test]
fn held_files_finds_an_open_file_among_those_asked() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::write(&a, b"a").unwrap();
    std::fs::write(&b, b"b").unwrap();
    let key = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        FileKey::from_dev(m.dev(), m.ino())
    };
    let held = std::fs::File::open(&a).unwrap();
    let want: BTreeSet<FileKey> = [key(&a), key(&b)].into_iter().collect();
    let me = std::process::id() as i32;
    let found = held_files(std::path::Path::new("/proc"), me, &want);
    assert_eq!(found, [key(&a)].into_iter().collect());
    drop(held);
    assert!(held_files(std::path::Path::new("/proc"), me, &want).is_empty());
}
