/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/* Helpers shared by the program families. */
#ifndef TWOFOLD_COMMON_H
#define TWOFOLD_COMMON_H

#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "twofold.h"

char LICENSE[] SEC("license") = "GPL";

/* Global counters of this object (see TOTAL_* in twofold.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TOTAL_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

/* Settings written by twofold (see CONFIG_* in twofold.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONFIG_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} config SEC(".maps");

/* Whether twofold pinned any process (CONFIG_PINNED_PIDS) or file. An array
 * lookup is a few instructions (the JIT inlines it); a hash miss is not. */
static __always_inline int any_pinned(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&config, &which);
	return v && *v;
}

static __always_inline void total_add(__u32 which, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&totals, &which);
	if (v)
		__sync_fetch_and_add(v, n);
}

/* The value for `key` in `map`, inserted as zeroes when missing. NULL only
 * when the map is full (a non-LRU map) or out of memory. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	/* BPF_NOEXIST: another CPU may have inserted it meanwhile; then the
	 * lookup below finds that one. */
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		total_add(TOTAL_MAP_FULL, 1);
	return v;
}

/* The regular file `fd` names in the current process, or 0. The fd is resolved through
 * the current task (task->files->fdt->fd[fd]->f_inode, CO-RE relocated). */
static __always_inline int fd_file(__u64 fd, struct file_key *key)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return 0;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if (fd >= max)
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	if (!f)
		return 0;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	if (!inode)
		return 0;
	unsigned short mode = BPF_CORE_READ(inode, i_mode);
	if ((mode & S_IFMT) != S_IFREG)
		return 0;
	key->ino = BPF_CORE_READ(inode, i_ino);
	key->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	key->pad = 0;
	return 1;
}

static __always_inline __u32 current_tgid(void)
{
	return bpf_get_current_pid_tgid() >> 32;
}

#endif
