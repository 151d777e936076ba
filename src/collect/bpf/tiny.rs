//! Tiny copies (`ebpf/uploads.bpf.c`, the `tiny` array): host-to-device copies of at most
//! [`super::uploads::SMALL`] bytes are counted per process in a slot of an array, not sent
//! one record each (a serving loop uploads a step's small input this way, and a record
//! cost it more than the uprobe's trap). The reader learns which slots are taken from
//! `UP_TINY_SLOT` records, reads those every second, hands on what each process added
//! since, and frees the slot of a process that exited, after its last read.

use std::collections::BTreeMap;
use std::path::Path;

use aya::maps::{Array, MapData};
use aya::Ebpf;

/// `UP_TINY_SLOTS` of `ebpf/twofold.h`.
pub const SLOTS: u32 = 1024;

/// `struct up_tiny` as words: tgid (low half), copies, bytes, then the last tiny copy
/// (src, dst, len) and `counted`.
type Slot = [u64; 7];

/// What one process counted since the last read: copies and bytes, signed (a copy counted
/// and then sent, because the next one continued it, is taken off again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinyDelta {
    pub pid: i32,
    pub copies: i64,
    pub bytes: i64,
}

/// The slots taken, each with its process and the counters as last read.
#[derive(Default)]
pub(super) struct TinySlots {
    taken: BTreeMap<u32, (i32, u64, u64)>,
}

impl TinySlots {
    /// `pid` took `slot` (an `UP_TINY_SLOT` record): read from zero.
    pub(super) fn took(&mut self, slot: u32, pid: i32) {
        if slot < SLOTS {
            self.taken.insert(slot, (pid, 0, 0));
        }
    }

    /// Every slot read, not only those announced: after records were lost (an
    /// announcement among them), a taken slot would never be read or freed.
    pub(super) fn find_all(&mut self, ebpf: &Ebpf) {
        let Some(a) = array(ebpf) else { return };
        for k in 0..SLOTS {
            if let Ok(v) = a.get(&k, 0) {
                let pid = v[0] as u32 as i32;
                if pid != 0 && self.taken.get(&k).is_none_or(|t| t.0 != pid) {
                    self.taken.insert(k, (pid, 0, 0));
                }
            }
        }
    }

    /// What each process counted since the last read; the slots of processes that no
    /// longer exist (looked at before their last read, so nothing is counted after it)
    /// are freed for others.
    pub(super) fn read(&mut self, ebpf: &mut Ebpf, proc_root: &Path) -> Vec<TinyDelta> {
        let mut out = Vec::new();
        if self.taken.is_empty() {
            return out;
        }
        let Some(mut a) = ebpf
            .map_mut("tiny")
            .and_then(|m| Array::<&mut MapData, Slot>::try_from(m).ok())
        else {
            return out;
        };
        self.taken.retain(|&k, (pid, copies, bytes)| {
            let exited = !proc_root.join(pid.to_string()).exists();
            let Ok(v) = a.get(&k, 0) else { return true };
            if v[0] as u32 as i32 == *pid {
                let d = TinyDelta {
                    pid: *pid,
                    copies: v[1].wrapping_sub(*copies) as i64,
                    bytes: v[2].wrapping_sub(*bytes) as i64,
                };
                (*copies, *bytes) = (v[1], v[2]);
                if d.copies != 0 || d.bytes != 0 {
                    out.push(d);
                }
            }
            // Zeroed: free for the next process whose pid falls on it.
            !(exited && a.set(k, [0u64; 7], 0).is_ok())
        });
        out
    }
}

fn array(ebpf: &Ebpf) -> Option<Array<&MapData, Slot>> {
    ebpf.map("tiny").and_then(|m| Array::try_from(m).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_is_the_c_struct() {
        let h = include_str!("../../../ebpf/twofold.h");
        assert!(h.contains(&format!("#define UP_TINY_SLOTS {SLOTS}")));
        let body = h
            .split("struct up_tiny {")
            .nth(1)
            .and_then(|b| b.split("};").next())
            .expect("struct up_tiny in twofold.h");
        let words = |t: &str| {
            body.lines()
                .filter(|l| l.trim_start().starts_with(t))
                .count()
        };
        // tgid and spare share the first word; counted and pad the last.
        assert_eq!(
            words("__u64") * 8 + words("__u32") * 4,
            std::mem::size_of::<Slot>()
        );
        assert!(body.trim_start().starts_with("__u32 tgid;"));
    }

    /// The reader against the real `tiny` map of `uploads.bpf.o` (loaded, nothing
    /// attached), its slots written here as the program writes them.
    #[test]
    fn counts_are_handed_on_as_differences_and_the_slot_of_an_exited_process_is_freed() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: loading a BPF object needs root (CAP_BPF)");
            return;
        }
        super::super::setup::raise_memlock();
        let mut ebpf = aya::EbpfLoader::new()
            .load(aya::include_bytes_aligned!("../../../ebpf/uploads.bpf.o"))
            .expect("uploads.bpf.o loads");
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("1500")).unwrap();
        fn set(ebpf: &mut Ebpf, k: u32, v: Slot) {
            let mut a: Array<&mut MapData, Slot> =
                Array::try_from(ebpf.map_mut("tiny").unwrap()).unwrap();
            a.set(k, v, 0).unwrap();
        }
        // pid 1500 took slot 1500 % 1024 and counted 3 copies of 200 B.
        set(&mut ebpf, 476, [1500, 3, 600, 0, 0, 0, 0]);
        let mut t = TinySlots::default();
        t.took(476, 1500);
        let d = |pid, copies, bytes| TinyDelta { pid, copies, bytes };
        assert_eq!(t.read(&mut ebpf, root.path()), [d(1500, 3, 600)]);
        // Nothing new: nothing handed on.
        assert_eq!(t.read(&mut ebpf, root.path()), []);
        // Two more, then one of the counted ones sent after all (taken off): +1 net.
        set(&mut ebpf, 476, [1500, 4, 800, 0, 0, 0, 0]);
        assert_eq!(t.read(&mut ebpf, root.path()), [d(1500, 1, 200)]);
        // A count that went down since the last read (a counted copy sent) is negative.
        set(&mut ebpf, 476, [1500, 3, 600, 0, 0, 0, 0]);
        assert_eq!(t.read(&mut ebpf, root.path()), [d(1500, -1, -200)]);
        // It exits after one more copy: the last count is read, then the slot is free.
        set(&mut ebpf, 476, [1500, 4, 856, 0, 0, 0, 0]);
        std::fs::remove_dir(root.path().join("1500")).unwrap();
        assert_eq!(t.read(&mut ebpf, root.path()), [d(1500, 1, 256)]);
        let a: Array<&MapData, Slot> = Array::try_from(ebpf.map("tiny").unwrap()).unwrap();
        assert_eq!(a.get(&476, 0).unwrap(), [0; 7]);
        assert!(t.taken.is_empty());
        // A slot taken while its announcement was lost is found by a full look.
        set(&mut ebpf, 3, [3075, 2, 10, 0, 0, 0, 0]);
        t.find_all(&ebpf);
        std::fs::create_dir(root.path().join("3075")).unwrap();
        assert_eq!(t.read(&mut ebpf, root.path()), [d(3075, 2, 10)]);
    }
}
