//! Map keys and values, mirroring `ebpf/twofold.h` field for field.
//!
//! Each struct is `#[repr(C)]`, derives `bytemuck::Pod` (which refuses to compile if
//! the struct had implicit padding) and has its size asserted against the C side, so a
//! changed header that was not mirrored here fails the build; aya checks the same sizes
//! against the maps' BTF definitions when a map is opened.

use bytemuck::{Pod, Zeroable};

use crate::sample::FileKey;

/// `TWOFOLD_LAYOUT_VERSION` of `ebpf/twofold.h`.
pub const LAYOUT_VERSION: u32 = 3;
/// `RECLAIM_BUCKETS`.
pub const RECLAIM_BUCKETS: usize = 32;
/// Indices of the `totals` array.
pub const TOTAL_EVICTED_PAGES: u32 = 0;
pub const TOTAL_MAP_FULL: u32 = 1;
pub const TOTAL_OOM_KILLS: u32 = 2;
pub const TOTAL_ADDED_PAGES: u32 = 3;
/// Indices of the `config` array.
pub const CONFIG_PINNED_PIDS: u32 = 0;
pub const CONFIG_PINNED_FILES: u32 = 1;
/// `TASK_HAS_MM` of `struct task_stamp`'s flags.
pub const TASK_HAS_MM: u32 = 1;

/// The kernel's internal `dev_t` (`major << 20 | minor`), as tracepoints give `s_dev`.
pub fn kernel_dev(key: FileKey) -> u32 {
    (key.major << 20) | (key.minor & 0xf_ffff)
}

/// The [`FileKey`] of a kernel `dev_t` and inode.
pub fn file_key(dev: u32, ino: u64) -> FileKey {
    FileKey {
        major: dev >> 20,
        minor: dev & 0xf_ffff,
        inode: ino,
    }
}

macro_rules! layouts {
    ($($(#[$m:meta])* struct $name:ident ($size:expr) { $($(#[$fm:meta])* $field:ident : $ty:ty,)* })*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
            pub struct $name { $($(#[$fm])* pub $field: $ty,)* }
            const _: () = assert!(std::mem::size_of::<$name>() == $size);
            // SAFETY: repr(C), only integer fields and no padding (bytemuck::Pod checks
            // that at compile time), so every byte pattern is a valid value.
            unsafe impl aya::Pod for $name {}
        )*
    };
}

layouts! {
    /// `struct file_key`.
    struct FileKeyC (16) { ino: u64, dev: u32, pad: u32, }
    /// `struct pid_file_key`.
    struct PidFileKeyC (16) { ino: u64, dev: u32, pid: u32, }
    /// `struct pid_faults`: `by_code[error_code & 3]`, user and kernel mode.
    struct PidFaults (64) {
        by_code: [u64; 4],
        filemap_faults: u64,
        map_pages_events: u64,
        map_pages_pages: u64,
        kernel: u64,
    }
    /// `struct fault_cache` (one per CPU).
    struct FaultCache (48) {
        pid: u32,
        gen: u32,
        by_code: [u64; 4],
        kernel: u64,
    }
    /// `struct file_faults`.
    struct FileFaults (32) {
        filemap_faults: u64,
        map_pages_events: u64,
        map_pages_pages: u64,
        pad: u64,
    }
    /// `struct task_stamp` (records of the `iter/task` program, not a map).
    struct TaskStampC (104) {
        tgid: u32,
        tid: u32,
        run_ns: u64,
        rchar: u64,
        faults: u64,
        start_ns: u64,
        total_vm: u64,
        rss_file: u64,
        rss_anon: u64,
        rss_shmem: u64,
        data: u64,
        dead_rchar: u64,
        dead_faults: u64,
        flags: u32,
        pad: u32,
    }
    /// `struct held_pages` (records of the `iter/task_file` program).
    struct HeldPagesC (24) {
        fd: u32,
        pad: u32,
        ino: u64,
        nrpages: u64,
    }
    /// `struct file_cache`.
    struct FileCache (48) {
        added_pages: u64,
        evicted_pages: u64,
        refault_pages: u64,
        add_events: u64,
        evict_events: u64,
        pad: u64,
    }
    /// `struct pid_reclaim`.
    struct PidReclaim (304) {
        direct_count: u64,
        memcg_count: u64,
        total_ns: u64,
        max_ns: u64,
        reclaimed_pages: u64,
        pad: u64,
        hist: [u64; RECLAIM_BUCKETS],
    }
    /// `struct oom_victim`.
    struct OomVictim (72) {
        ts_ns: u64,
        total_vm_kb: u64,
        anon_rss_kb: u64,
        file_rss_kb: u64,
        shmem_rss_kb: u64,
        pid: u32,
        uid: u32,
        killer_pid: u32,
        pad: u32,
        comm: [u8; 16],
    }
    /// `struct pid_file_io`.
    struct PidFileIo (72) {
        read_bytes: u64,
        read_calls: u64,
        mmap_shared: u64,
        mmap_shared_write: u64,
        mmap_private: u64,
        mmap_private_write: u64,
        mmap_bytes: u64,
        comm: [u8; 16],
    }
}

impl FileKeyC {
    pub fn new(key: FileKey) -> Self {
        FileKeyC {
            ino: key.inode,
            dev: kernel_dev(key),
            pad: 0,
        }
    }
    pub fn key(&self) -> FileKey {
        file_key(self.dev, self.ino)
    }
}

impl PidFileKeyC {
    pub fn new(pid: i32, key: FileKey) -> Self {
        PidFileKeyC {
            ino: key.inode,
            dev: kernel_dev(key),
            pid: pid as u32,
        }
    }
    pub fn key(&self) -> (i32, FileKey) {
        (self.pid as i32, file_key(self.dev, self.ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_round_trip() {
        let k = FileKey {
            major: 259,
            minor: 1_048_575,
            inode: 1 << 40,
        };
        assert_eq!(file_key(kernel_dev(k), k.inode), k);
        assert_eq!(
            kernel_dev(FileKey {
                major: 254,
                minor: 0,
                inode: 1
            }),
            254 << 20
        );
    }

    /// The header states the same sizes (a cheap textual check of the mirror).
    #[test]
    fn header_mirrors_these_structs() {
        let h = include_str!("../../../ebpf/twofold.h");
        assert!(h.contains(&format!("#define TWOFOLD_LAYOUT_VERSION {LAYOUT_VERSION}")));
        assert!(h.contains(&format!("#define RECLAIM_BUCKETS {RECLAIM_BUCKETS}")));
        for s in [
            "file_key",
            "pid_file_key",
            "pid_faults",
            "fault_cache",
            "file_faults",
            "file_cache",
            "pid_reclaim",
            "oom_victim",
            "pid_file_io",
        ] {
            assert!(h.contains(&format!("struct {s} {{")), "{s}");
        }
    }
}
