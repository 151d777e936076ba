/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The few kernel types twofold reads, as minimal CO-RE definitions: only the
 * fields used, marked preserve_access_index, so the loader relocates every
 * offset against the running kernel's BTF (/sys/kernel/btf/vmlinux). No
 * vmlinux.h is needed to build: clang and libbpf's headers suffice.
 *
 * Tracepoint records of the mm events use the kernel's own type names
 * (trace_event_raw_*), so their offsets are relocated too and fields a kernel
 * lacks (`order` before large folios) can be tested with
 * bpf_core_field_exists. exceptions:* and syscalls:* have no BTF type: their
 * layouts are the stable ones printed in tracefs' `format` files.
 */
#ifndef TWOFOLD_KERNEL_H
#define TWOFOLD_KERNEL_H

typedef unsigned long long __u64;
typedef long long __s64;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned short __u16;
typedef unsigned char __u8;
typedef __u32 __be32;
typedef __u16 __be16;
typedef __u32 __wsum;
#define __TWOFOLD_TYPES 1

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct trace_event_raw_mm_filemap_op_page_cache {
	unsigned long i_ino;
	unsigned long index;
	unsigned int s_dev;
	unsigned char order;
};

struct trace_event_raw_mm_filemap_op_page_cache_range {
	unsigned long i_ino;
	unsigned int s_dev;
	unsigned long index;
	unsigned long last_index;
};

struct trace_event_raw_mm_filemap_fault {
	unsigned long i_ino;
	unsigned int s_dev;
	unsigned long index;
};

struct trace_event_raw_mark_victim {
	int pid;
	__u32 __data_loc_comm;
	unsigned long total_vm;
	unsigned long anon_rss;
	unsigned long file_rss;
	unsigned long shmem_rss;
	unsigned int uid;
};

struct trace_event_raw_mm_vmscan_direct_reclaim_end_template {
	unsigned long nr_reclaimed;
};

struct super_block {
	unsigned int s_dev;
};

struct inode {
	unsigned short i_mode;
	struct super_block *i_sb;
	unsigned long i_ino;
};

struct file {
	struct inode *f_inode;
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};

struct files_struct {
	struct fdtable *fdt;
};

struct task_struct {
	struct files_struct *files;
};

#pragma clang attribute pop

/* A raw tracepoint's context: the TP_PROTO arguments, 8 bytes each. */
struct bpf_raw_tracepoint_args {
	__u64 args[0];
};

/* exceptions:page_fault_user (x86), from its tracefs format. */
struct page_fault_ctx {
	__u64 common;
	unsigned long address;
	unsigned long ip;
	unsigned long error_code;
};

/* syscalls:sys_enter_* and sys_exit_*: the common header, the syscall number,
 * then the arguments (each 8 bytes) or the return value. */
struct sys_enter_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	unsigned long args[6];
};

struct sys_exit_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	long ret;
};

#define S_IFMT 00170000
#define S_IFREG 0100000

#define PROT_WRITE 0x2
#define MAP_SHARED 0x01
#define MAP_SHARED_VALIDATE 0x03
#define MAP_TYPE 0x0f

#endif
