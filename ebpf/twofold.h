/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Key and value layouts shared by the BPF programs (ebpf/NAME.bpf.c) and twofold
 * (src/collect/bpf/layout.rs mirrors every struct with #[repr(C)] and asserts
 * the same sizes). Change both sides together, then run ebpf/build.sh.
 *
 * Conventions: every field is a fixed-width integer; structs have no implicit
 * padding (explicit `pad` fields); `dev` is the kernel's internal dev_t
 * (major << 20 | minor), as tracepoints report `s_dev`.
 */
#ifndef TWOFOLD_H
#define TWOFOLD_H

#ifndef __TWOFOLD_TYPES
typedef unsigned long long __u64;
typedef unsigned int __u32;
typedef unsigned char __u8;
#endif

/* Bump when a layout below changes. */
#define TWOFOLD_LAYOUT_VERSION 3

/* A file: (dev, inode). */
struct file_key {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

/* One process (thread group id) and one file. */
struct pid_file_key {
	__u64 ino;
	__u32 dev;
	__u32 pid;
};

/* 512 pages (2 MiB) of one file: index >> 9. */
struct chunk_key {
	__u64 ino;
	__u32 dev;
	__u32 pad;
	__u64 chunk;
};

/* Pages of a chunk that twofold saw evicted and not yet added again. */
struct chunk_bits {
	__u64 bits[8];
};

/* exceptions:page_fault_user and page_fault_kernel (at user addresses),
 * filemap:mm_filemap_fault and filemap:mm_filemap_map_pages, per thread
 * group. `by_code` counts user- and kernel-mode faults by error_code & 3:
 * 0 read of a not-present page, 1 read protection fault, 2 write to a
 * not-present page, 3 write protection fault (copy-on-write); `kernel` is the
 * part taken in kernel mode (e.g. read() copying into untouched memory). */
struct pid_faults {
	__u64 by_code[4];
	__u64 filemap_faults;
	__u64 map_pages_events;
	__u64 map_pages_pages;
	__u64 kernel;
};

/* Faults not yet added to `pid_faults`, per CPU: the hot path counts into
 * this entry while the same process keeps faulting on the CPU (no hash lookup,
 * no atomic), and moves the counts to the process's hash entry when another
 * process faults there (`gen` counts those moves). Readers add what is pending
 * here to the hash, and look again at the hash entry of a process whose
 * pending counts moved while they read. */
struct fault_cache {
	__u32 pid;
	__u32 gen;
	__u64 by_code[4];
	__u64 kernel;
};

/* filemap:mm_filemap_fault and filemap:mm_filemap_map_pages, per file. */
struct file_faults {
	__u64 filemap_faults;
	__u64 map_pages_events;
	__u64 map_pages_pages;
	__u64 pad;
};

/* filemap:mm_filemap_add_to_page_cache / _delete_from_page_cache, per file.
 * Pages are summed as 1 << order (folios of up to 512 pages). */
struct file_cache {
	__u64 added_pages;
	__u64 evicted_pages;
	__u64 refault_pages;
	__u64 add_events;
	__u64 evict_events;
	__u64 pad;
};

#define RECLAIM_BUCKETS 32

/* vmscan direct reclaim (global and memory cgroup), per thread group.
 * hist[k] counts reclaims that took [2^k, 2^(k+1)) microseconds (k = 0 also
 * holds those under 1 us). */
struct pid_reclaim {
	__u64 direct_count;
	__u64 memcg_count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 reclaimed_pages;
	__u64 pad;
	__u64 hist[RECLAIM_BUCKETS];
};

/* A reclaim in progress, per thread. */
struct reclaim_start {
	__u64 ts_ns;
	__u32 memcg;
	__u32 pad;
};

/* oom:mark_victim, per victim pid. Sizes in kB as the tracepoint gives them. */
struct oom_victim {
	__u64 ts_ns;
	__u64 total_vm_kb;
	__u64 anon_rss_kb;
	__u64 file_rss_kb;
	__u64 shmem_rss_kb;
	__u32 pid;
	__u32 uid;
	__u32 killer_pid;
	__u32 pad;
	char comm[16];
};

/* read()/pread64()/readv()/preadv() and mmap() of one file by one process. */
struct pid_file_io {
	__u64 read_bytes;
	__u64 read_calls;
	__u64 mmap_shared;
	__u64 mmap_shared_write;
	__u64 mmap_private;
	__u64 mmap_private_write;
	__u64 mmap_bytes;
	char comm[16]; /* of the last counted call */
};

/* A syscall in progress, per thread: the file its fd named at entry. */
struct io_start {
	__u64 ino;
	__u32 dev;
	__u32 kind; /* IO_READ or IO_MMAP */
	__u64 len;
	__u32 prot;
	__u32 flags;
};

#define IO_READ 1
#define IO_MMAP 2

/* Index of the global counters array (`totals` in each object). */
#define TOTAL_EVICTED_PAGES 0 /* page-cache pages evicted, all files */
#define TOTAL_MAP_FULL 1      /* updates refused because a non-LRU map was full */
#define TOTAL_OOM_KILLS 2
#define TOTAL_ADDED_PAGES 3   /* page-cache pages added, all files */
#define TOTAL_COUNT 4

/* Index of the `config` array, set by twofold: non-zero when some processes
 * (files) were pinned, so the hot paths skip the pinned lookup otherwise. */
#define CONFIG_PINNED_PIDS 0
#define CONFIG_PINNED_FILES 1
#define CONFIG_COUNT 4

/* Uploads to a GPU (uploads.bpf.c): one ring-buffer record per driver call.
 * `kind` says which record; copies carry content samples of the source range
 * read at the moment of the call (present pages only). */
#define UP_COPY 1         /* host -> device copy; dst, src, bytes */
#define UP_REGISTER 2     /* cuMemHostRegister: src, bytes */
#define UP_UNREGISTER 3   /* cuMemHostUnregister: src */
#define UP_ALLOC 4        /* device allocation: dst, bytes */
#define UP_FREE 5         /* device free: dst */
#define UP_HOST_ALLOC 6   /* pinned host allocation: src, bytes */
#define UP_HOST_FREE 7    /* pinned host free: src */
#define UP_TINY_SLOT 8    /* the process took slot `index` of the `tiny` counters */
#define UP_DTOD 9         /* device -> device copy (cuMemcpyDtoD*, cuMemcpyPeer*,
			   * a 2D/3D copy between device ranges): dst, src, bytes */
#define UP_GDS_HANDLE 10  /* cuFileHandleRegister of a file: a struct upload_gds with
			   * the handle, dev and ino */
#define UP_GDS_READ 11    /* cuFileRead into device memory: a struct upload_gds with
			   * the handle, dst, bytes read and file_offset */

#define UPF_UNIFIED 1     /* cuMemcpy*, batch: the destination is device memory
			   * only if it lies in a traced device allocation */
#define UPF_STRIDED 2     /* a 2D/3D copy whose rows are not contiguous: only
			   * its first row was sampled */
#define UPF_SMALL 4       /* a copy of at most UP_SMALL bytes: a struct
			   * upload_small record, the whole copy in its anchor */

/* Bytes read at the start of the source (a grid window at every residue). */
#define UP_ANCHOR 2064
#define UP_SAMPLES 16
#define UP_SAMPLE 32
/* Copies of at most this many bytes are sent whole in a small record. */
#define UP_SMALL 256
/* The reader is woken only when this much is waiting (it also drains every 50 ms):
 * a wakeup per record would cost every small upload a context switch. */
#define UP_WAKE_BYTES (2 << 20)
/* Host-to-device copies (cuMemcpyHtoD*) of at most UP_SMALL bytes are counted per
 * process in the `tiny` array (slot tgid % UP_TINY_SLOTS), not sent: a serving loop
 * uploads a step's small input this way, and a record costs it more than the trap.
 * A tiny copy that continues the process's last one (a loader uploading in small
 * chunks) is sent, and so is the counted one it continues. */
#define UP_TINY_SLOTS 1024
/* Batched copies (cuMemcpyBatchAsync) sampled per call. */
#define UP_BATCH_MAX 8

struct upload_head {
	__u64 ts_ns;     /* bpf_ktime_get_ns */
	__u32 tgid;
	__u32 tid;
	__u32 entry;     /* entry point (the attach cookie) */
	__u32 kind;      /* UP_* */
	__u64 dst;
	__u64 src;
	__u64 bytes;
	__u32 flags;     /* UPF_* */
	__u32 index;     /* position in a batch */
};

/* An UP_COPY record. Sample i lies at ((bytes - 32) * i) / 15 when bytes >= 32;
 * bit i of `sampled` says it was read (its pages were present). */
struct upload_copy {
	struct upload_head h;
	__u32 anchor_len;
	__u32 sampled;
	__u8 anchor[UP_ANCHOR];
	__u8 samples[UP_SAMPLES][UP_SAMPLE];
};

/* An UP_COPY record of at most UP_SMALL bytes (flag UPF_SMALL): no samples. */
struct upload_small {
	struct upload_head h;
	__u32 anchor_len;
	__u32 sampled;   /* 0 */
	__u8 anchor[UP_SMALL];
};

/* One process's tiny copies (`tiny` array): what was counted, and the last tiny copy
 * (to see a chunked upload continue it). */
struct up_tiny {
	__u32 tgid;      /* 0: free (twofold frees the slot of a process that exited) */
	__u32 spare;
	__u64 copies;    /* counted, not sent */
	__u64 bytes;
	__u64 src;       /* the last tiny copy */
	__u64 dst;
	__u64 len;
	__u32 counted;   /* the last tiny copy is in `copies` (not sent) */
	__u32 pad;
};

/* A GPUDirect Storage record (libcufile): UP_GDS_HANDLE, UP_GDS_READ. */
struct upload_gds {
	struct upload_head h;
	__u64 handle;      /* CUfileHandle_t */
	__u64 file_offset; /* UP_GDS_READ */
	__u64 ino;         /* UP_GDS_HANDLE: the registered file */
	__u32 dev;
	__u32 pad;
};

/* A libcufile call in progress, per thread (entry to return). */
struct gds_pending {
	__u64 a;    /* HANDLE: where the handle is written; READ: the handle */
	__u64 b;    /* HANDLE: ino; READ: the device address read into */
	__u64 c;    /* READ: bytes asked for */
	__u64 d;    /* READ: file offset */
	__u32 dev;  /* HANDLE */
	__u32 kind; /* UP_GDS_* */
};

/* An allocation in progress, per thread (entry to return). */
struct upload_pending {
	__u64 out;       /* where the driver writes the pointer */
	__u64 bytes;
	__u64 pitch_out; /* cuMemAllocPitch: where it writes the pitch */
	__u32 entry;
	__u32 kind;
};

/* iter/task (tasks.bpf.c): one record per thread, read by twofold at every
 * snapshot instead of /proc/PID/statm, io and task/TID/schedstat of each
 * process (src/collect/bpf/tasks.rs). The process part is the thread group
 * leader's only (tid == tgid); other threads leave it 0. */
#define TASK_HAS_MM 1 /* the task has an address space (not a kernel thread) */
struct task_stamp {
	__u32 tgid;
	__u32 tid;
	__u64 run_ns;       /* se.sum_exec_runtime: schedstat's first field */
	__u64 rchar;        /* ioac.rchar */
	__u64 faults;       /* min_flt + maj_flt */
	__u64 start_ns;     /* start_boottime: with the tgid, names one process */
	__u64 total_vm;     /* pages */
	__u64 rss_file;     /* the rss counters' global parts (percpu_counter.count) */
	__u64 rss_anon;
	__u64 rss_shmem;
	__u64 data;         /* data_vm + stack_vm */
	__u64 dead_rchar;   /* signal->ioac.rchar: of threads that exited */
	__u64 dead_faults;  /* signal->min_flt + maj_flt */
	__u32 flags;        /* TASK_HAS_MM */
	__u32 pad;
};

/* One open file of the process the held_pages iterator (iter/task_file) was
 * linked to: its descriptor, inode number and page-cache page count. */
struct held_pages {
	__u32 fd;
	__u32 pad;
	__u64 ino;          /* f_inode->i_ino */
	__u64 nrpages;      /* f_mapping->nrpages: cachestat's nr_cache of the file */
};

#endif
