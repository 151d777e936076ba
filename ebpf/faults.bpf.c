/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Page faults: every user-mode fault per process, split by error code, and
 * file faults (filemap fault handler, fault-around) per process and per file.
 *
 * Processes and files of interest are pre-inserted by twofold into the
 * `*_pinned` hashes, which never evict; everything else goes to bounded LRU
 * hashes, so a storm of short-lived processes or files cannot push out the
 * counters twofold was asked about.
 */
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct pid_faults);
} pid_faults_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pid_faults);
} pid_faults SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct file_key);
	__type(value, struct file_faults);
} file_faults_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct file_key);
	__type(value, struct file_faults);
} file_faults SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fault_cache);
} fault_cache SEC(".maps");

static __always_inline struct pid_faults *pid_entry_of(__u32 pid)
{
	static const struct pid_faults zero;
	if (any_pinned(CONFIG_PINNED_PIDS)) {
		struct pid_faults *v = bpf_map_lookup_elem(&pid_faults_pinned, &pid);
		if (v)
			return v;
	}
	return lookup_or_init(&pid_faults, &pid, &zero);
}

static __always_inline struct pid_faults *pid_entry(void)
{
	return pid_entry_of(current_tgid());
}

/* One fault of the current process. Tracing programs do not nest on a CPU and
 * run with migration disabled, so the per-CPU entry needs no atomics. */
static __always_inline void count_fault(__u64 code, __u64 kernel)
{
	__u32 zero = 0;
	struct fault_cache *c = bpf_map_lookup_elem(&fault_cache, &zero);
	if (!c)
		return;
	__u32 pid = current_tgid();
	if (c->pid != pid) {
		if (c->pid) {
			struct pid_faults *v = pid_entry_of(c->pid);
			if (v) {
				__sync_fetch_and_add(&v->by_code[0], c->by_code[0]);
				__sync_fetch_and_add(&v->by_code[1], c->by_code[1]);
				__sync_fetch_and_add(&v->by_code[2], c->by_code[2]);
				__sync_fetch_and_add(&v->by_code[3], c->by_code[3]);
				__sync_fetch_and_add(&v->kernel, c->kernel);
			}
		}
		c->pid = pid;
		c->gen += 1;
		c->by_code[0] = c->by_code[1] = c->by_code[2] = c->by_code[3] = 0;
		c->kernel = 0;
	}
	c->by_code[code & 3] += 1;
	c->kernel += kernel;
}

static __always_inline struct file_faults *file_entry(__u32 dev, __u64 ino)
{
	static const struct file_faults zero;
	struct file_key key = { .ino = ino, .dev = dev };
	if (any_pinned(CONFIG_PINNED_FILES)) {
		struct file_faults *v = bpf_map_lookup_elem(&file_faults_pinned, &key);
		if (v)
			return v;
	}
	return lookup_or_init(&file_faults, &key, &zero);
}

SEC("tracepoint/exceptions/page_fault_user")
int page_fault_user(struct page_fault_ctx *ctx)
{
	count_fault(ctx->error_code, 0);
	return 0;
}

/* Highest user address on x86-64 (4-level and 5-level paging alike, below the
 * kernel half); faults above it are the kernel's own. */
#define USER_ADDR_MAX 0x00ffffffffffffffull

/* The kernel touching user memory on a process's behalf (copy_to_user of a
 * read() into pages never touched before): the process's fault all the same,
 * and /proc/PID/stat counts it. */
SEC("tracepoint/exceptions/page_fault_kernel")
int page_fault_kernel(struct page_fault_ctx *ctx)
{
	if (ctx->address > USER_ADDR_MAX)
		return 0;
	count_fault(ctx->error_code, 1);
	return 0;
}

/* The same two tracepoints attached raw (BPF_RAW_TRACEPOINT_OPEN): the
 * program gets the TP_PROTO arguments (address, regs, error_code) instead of
 * a formatted record, which saves most of the per-fault cost of tracing the
 * hottest event there is. twofold attaches these and falls back to the
 * programs above where raw tracepoints are unavailable. */
SEC("raw_tp/page_fault_user")
int page_fault_user_raw(struct bpf_raw_tracepoint_args *ctx)
{
	count_fault(ctx->args[2], 0);
	return 0;
}

SEC("raw_tp/page_fault_kernel")
int page_fault_kernel_raw(struct bpf_raw_tracepoint_args *ctx)
{
	if (ctx->args[0] > USER_ADDR_MAX)
		return 0;
	count_fault(ctx->args[2], 1);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_fault")
int filemap_fault(struct trace_event_raw_mm_filemap_fault *ctx)
{
	__u32 dev = BPF_CORE_READ(ctx, s_dev);
	__u64 ino = BPF_CORE_READ(ctx, i_ino);
	struct pid_faults *p = pid_entry();
	if (p)
		__sync_fetch_and_add(&p->filemap_faults, 1);
	struct file_faults *f = file_entry(dev, ino);
	if (f)
		__sync_fetch_and_add(&f->filemap_faults, 1);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_map_pages")
int filemap_map_pages(struct trace_event_raw_mm_filemap_op_page_cache_range *ctx)
{
	__u32 dev = BPF_CORE_READ(ctx, s_dev);
	__u64 ino = BPF_CORE_READ(ctx, i_ino);
	__u64 first = BPF_CORE_READ(ctx, index);
	__u64 last = BPF_CORE_READ(ctx, last_index);
	__u64 pages = last >= first ? last - first + 1 : 0;
	struct pid_faults *p = pid_entry();
	if (p) {
		__sync_fetch_and_add(&p->map_pages_events, 1);
		__sync_fetch_and_add(&p->map_pages_pages, pages);
	}
	struct file_faults *f = file_entry(dev, ino);
	if (f) {
		__sync_fetch_and_add(&f->map_pages_events, 1);
		__sync_fetch_and_add(&f->map_pages_pages, pages);
	}
	return 0;
}
