//! Every process's stamp in one read: a BPF task iterator (`ebpf/tasks.bpf.c`, `iter/task`)
//! instead of `/proc/PID/statm`, `/proc/PID/io` and `/proc/PID/task/TID/schedstat` of each
//! process, and instead of listing `/proc`. A live engine reads it at the start of every
//! snapshot (about 0.2 ms for 600 processes here, against about 3.5 ms of `/proc` reads).
//!
//! Nothing is attached to an event: the program runs only while twofold reads a fresh
//! iterator, under RCU, and writes nothing but its own output. It needs root (or
//! `CAP_BPF` and `CAP_PERFMON`), BTF and Linux 5.8; without them [`TaskIter::load`] says
//! why and the engine reads `/proc` as before. Each read makes an iterator link and closes
//! it: nothing is left when twofold exits, however it exits.
//!
//! What a [`ProcStamp`] is for: an engine whose process stamp equals the last snapshot's
//! need not read that process's `statm` (see `collect::cache`). The address space's
//! counters are their global parts (`percpu_counter.count`); `statm` adds the per-CPU
//! deltas, which can hold up to the kernel's batch per CPU (32 pages or twice the CPUs).
//! A stamp also holds every thread's run time, faults and `read()` bytes, so a process that
//! ran, faulted or read is never taken as unchanged; what the global parts may hide is a
//! change made by something else while the process slept (reclaim of a few of its pages):
//! that shows within the cache entry's maximum age, as other slow drifts do.
//!
//! `rchar` and run time are exact: the sums `/proc/PID/io` and the threads' `schedstat`
//! make, from the same counters. Thread group id 1 is skipped by the kernel's iterator
//! here (Linux 6.18, measured): [`TaskStamps::pids`] adds it.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use aya::programs::Iter;
use aya::{Btf, Ebpf, EbpfLoader};

use super::layout::{HeldPagesC, TaskStampC, TASK_HAS_MM};

/// The program's name in `ebpf/tasks.bpf.c`.
const PROGRAM: &str = "task_stamps";
/// The `iter/task_file` program's: the page counts of this process's open files.
const HELD_PAGES: &str = "held_pages";

/// `ebpf/tasks.bpf.o`, embedded.
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../ebpf/tasks.bpf.o");

/// What one process's threads say, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStamp {
    /// `start_boottime` in nanoseconds: with the pid, names one process.
    pub start_ns: u64,
    /// Run time of its live threads (`se.sum_exec_runtime`), in nanoseconds.
    pub run_ns: u64,
    /// Bytes `read()` by its threads, live and exited (`/proc/PID/io`'s `rchar`).
    pub rchar: u64,
    /// Minor and major faults of its threads, live and exited.
    pub faults: u64,
    /// Bytes `read()` by its live threads, their count and the sum of their ids: while
    /// these stand, none of its threads read since (`rchar` also takes in what its reaped
    /// children read, which cannot have written into its memory: a server that runs a
    /// helper process every second moved its `rchar` by the helper's reads).
    pub own_reads: (u64, u32, u64),
    /// `total_vm`, `data_vm + stack_vm`, and the file, anonymous and shmem resident
    /// counters' global parts, in pages.
    pub total_vm: u64,
    pub data: u64,
    pub rss: [u64; 3],
    /// Whether it has an address space (a kernel thread has none, nor does a group whose
    /// leader exited).
    pub has_mm: bool,
}

impl ProcStamp {
    /// Whether nothing that moves with its memory moved between the two: a process
    /// without an address space has no memory to move, whatever it ran.
    pub fn unchanged_since(&self, before: &ProcStamp) -> bool {
        match self.has_mm {
            true => self == before,
            false => !before.has_mm && self.start_ns == before.start_ns,
        }
    }
}

/// The stamps of one read, by thread group id.
#[derive(Debug, Default)]
pub struct TaskStamps {
    procs: HashMap<i32, ProcStamp, foldhash::fast::RandomState>,
}

impl TaskStamps {
    /// Sums the records of a read, by thread group. A group whose leader was not seen
    /// (it appeared or went during the read) has no stamp.
    pub fn parse(bytes: &[u8]) -> TaskStamps {
        let mut sums: HashMap<i32, (ProcStamp, bool), foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(
                bytes.len() / std::mem::size_of::<TaskStampC>(),
                Default::default(),
            );
        for chunk in bytes.chunks_exact(std::mem::size_of::<TaskStampC>()) {
            let r: TaskStampC = bytemuck::pod_read_unaligned(chunk);
            let (s, leader) = sums.entry(r.tgid as i32).or_default();
            s.run_ns = s.run_ns.wrapping_add(r.run_ns);
            s.rchar = s.rchar.wrapping_add(r.rchar);
            s.faults = s.faults.wrapping_add(r.faults);
            s.own_reads = (
                s.own_reads.0.wrapping_add(r.rchar),
                s.own_reads.1.wrapping_add(1),
                s.own_reads.2.wrapping_add(u64::from(r.tid)),
            );
            if r.tid == r.tgid {
                *leader = true;
                s.start_ns = r.start_ns;
                s.rchar = s.rchar.wrapping_add(r.dead_rchar);
                s.faults = s.faults.wrapping_add(r.dead_faults);
                s.total_vm = r.total_vm;
                s.data = r.data;
                s.rss = [r.rss_file, r.rss_anon, r.rss_shmem];
                s.has_mm = r.flags & TASK_HAS_MM != 0;
            }
        }
        TaskStamps {
            procs: sums
                .into_iter()
                .filter_map(|(pid, (s, leader))| leader.then_some((pid, s)))
                .collect(),
        }
    }

    pub fn get(&self, pid: i32) -> Option<&ProcStamp> {
        self.procs.get(&pid)
    }

    /// The thread group ids, sorted, with 1 (see the module documentation).
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.procs.keys().copied().collect();
        if !self.procs.contains_key(&1) {
            pids.push(1);
        }
        pids.sort_unstable();
        pids
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

/// The loaded iterator program.
pub struct TaskIter {
    ebpf: Ebpf,
    buf: Vec<u8>,
    /// The `held_pages` program's link to this process, made at the first read (`Err`:
    /// why it cannot be).
    held: Option<Result<std::os::fd::OwnedFd, String>>,
}

/// The page count of each file this process holds open, by descriptor: (inode number,
/// `nrpages`), read in one pass (`ebpf/tasks.bpf.c`'s `held_pages`).
pub type HeldPages = HashMap<i32, (u64, u64), foldhash::fast::RandomState>;

impl TaskIter {
    /// Loads the program, or says why it cannot be: no privilege, no BTF, a kernel without
    /// task iterators, or a `/proc` that is not the host's (another pid namespace: the
    /// iterator gives the host's pids).
    pub fn load(proc_root: &Path) -> Result<TaskIter, String> {
        super::check_privilege(proc_root).map_err(|e| e.to_string())?;
        if !in_host_pid_namespace(proc_root) {
            return Err("twofold is not in the host's pid namespace".into());
        }
        let btf = Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBJECT)
            .map_err(|e| format!("tasks.bpf.o: {e}"))?;
        let prog: &mut Iter = ebpf
            .program_mut(PROGRAM)
            .ok_or("tasks.bpf.o has no program")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        prog.load("task", &btf)
            .map_err(|e| format!("the kernel refused the task iterator: {e}"))?;
        let held = match ebpf.program_mut(HELD_PAGES).map(<&mut Iter>::try_from) {
            Some(Ok(p)) => p
                .load("task_file", &btf)
                .map_err(|e| format!("the kernel refused the task_file iterator: {e}"))
                .err(),
            _ => Some("tasks.bpf.o has no held_pages program".to_string()),
        };
        let mut it = TaskIter {
            ebpf,
            buf: Vec::new(),
            held: held.map(Err),
        };
        // A first read proves the whole path works before anything relies on it.
        it.read()
            .map_err(|e| format!("the task iterator read failed: {e}"))?;
        Ok(it)
    }

    /// Every thread's record, read afresh.
    pub fn read(&mut self) -> std::io::Result<TaskStamps> {
        let prog: &mut Iter = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| std::io::Error::other("no program"))?
            .try_into()
            .map_err(std::io::Error::other)?;
        let id = prog.attach().map_err(std::io::Error::other)?;
        let link = prog.take_link(id).map_err(std::io::Error::other)?;
        let mut file = link.into_file().map_err(std::io::Error::other)?;
        self.buf.clear();
        file.read_to_end(&mut self.buf)?;
        Ok(TaskStamps::parse(&self.buf))
    }
}

impl TaskIter {
    /// The page counts of the files this process holds open, read afresh: one iterator
    /// over this process's descriptors only (a link with its pid, made once).
    pub fn held_pages(&mut self) -> Result<HeldPages, String> {
        use std::os::fd::{AsFd, AsRawFd, FromRawFd};
        if self.held.is_none() {
            let prog: &mut Iter = self
                .ebpf
                .program_mut(HELD_PAGES)
                .ok_or("no held_pages program")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            let fd = prog.fd().map_err(|e| format!("{e}"))?;
            self.held = Some(link_to_process(fd.as_fd(), std::process::id()));
        }
        let link = match self.held.as_ref() {
            Some(Ok(l)) => l,
            Some(Err(why)) => return Err(why.clone()),
            None => return Err("no link".into()),
        };
        let mut create = IterCreate {
            link_fd: link.as_raw_fd() as u32,
            ..Default::default()
        };
        let fd = bpf(BPF_ITER_CREATE, &mut create).map_err(|e| format!("BPF_ITER_CREATE: {e}"))?;
        // SAFETY: a descriptor the kernel just returned, owned by nothing else.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        self.buf.clear();
        file.read_to_end(&mut self.buf)
            .map_err(|e| format!("read: {e}"))?;
        let size = std::mem::size_of::<HeldPagesC>();
        Ok(self
            .buf
            .chunks_exact(size)
            .map(|c| {
                let r: HeldPagesC = bytemuck::pod_read_unaligned(c);
                (r.fd as i32, (r.ino, r.nrpages))
            })
            .collect())
    }
}

/// `enum bpf_cmd` and `enum bpf_attach_type` values (`include/uapi/linux/bpf.h`).
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_ITER_CREATE: libc::c_int = 33;
const BPF_TRACE_ITER: u32 = 28;

/// `bpf_attr.link_create` with an iterator's `iter_info` (aya 0.14 makes iterator links
/// without one), zero-padded.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    pad: [u32; 9],
}

/// `union bpf_iter_link_info`'s `task` (Linux 6.1): iterate one process's tasks only.
#[repr(C)]
#[derive(Default)]
struct IterTask {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    pad: u32,
}

/// `bpf_attr.iter_create`, zero-padded.
#[repr(C)]
#[derive(Default)]
struct IterCreate {
    link_fd: u32,
    flags: u32,
    pad: [u64; 7],
}

/// `bpf(2)` with `attr`; the descriptor it returns.
fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> std::io::Result<i32> {
    // SAFETY: `attr` is a live, zero-padded `repr(C)` struct of the size given; the kernel
    // reads it (and the memory `iter_info` points to, which outlives the call).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    match rc {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        r => Ok(r as i32),
    }
}

/// A link of the `iter/task_file` program to process `pid`'s descriptors only.
fn link_to_process(
    prog: std::os::fd::BorrowedFd<'_>,
    pid: u32,
) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let info = IterTask {
        pid,
        ..Default::default()
    };
    let mut attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_ITER,
        iter_info: &info as *const IterTask as u64,
        iter_info_len: std::mem::size_of::<IterTask>() as u32,
        ..Default::default()
    };
    let fd = bpf(BPF_LINK_CREATE, &mut attr)
        .map_err(|e| format!("the kernel refused a task_file link to one process: {e}"))?;
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `PROC_PID_INIT_INO`: the inode number of the initial pid namespace.
const PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// Whether this process is in the initial pid namespace, as `proc_root` shows it.
fn in_host_pid_namespace(proc_root: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    proc_root == Path::new("/proc")
        && std::fs::metadata(proc_root.join("self/ns/pid")).is_ok_and(|m| m.ino() == PID_INIT_INO)
}
