/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * File ingestion by system call: bytes read with read(), pread64(), readv()
 * and preadv(), and mmap() calls (shared or private, writable or not), per
 * process and file.
 *
 * The fd is resolved to its file in BPF, at syscall entry, through the
 * current task (task->files->fdt->fd[fd]->f_inode, CO-RE relocated): doing it
 * later in user space through /proc/PID/fd would miss every fd closed before
 * twofold looks (a loader opens, reads and closes in a fraction of a second).
 * Only regular files are counted. The exit event adds the bytes actually read
 * (the return value), or counts the mmap if it succeeded.
 *
 * Files of interest (pre-inserted by twofold into `interest`) are counted in
 * a non-LRU hash per (pid, file); other files in a bounded LRU hash.
 */
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct file_key);
	__type(value, __u8);
} interest SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pid_file_key);
	__type(value, struct pid_file_io);
} io_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pid_file_key);
	__type(value, struct pid_file_io);
} io SEC(".maps");

/* Syscalls in progress, per thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct io_start);
} io_start SEC(".maps");

static const struct pid_file_io zero_io;

static __always_inline int enter(__u64 fd, __u32 kind, __u64 len, __u32 prot, __u32 flags)
{
	struct file_key f;
	if (!fd_file(fd, &f))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct io_start s = { .ino = f.ino, .dev = f.dev, .kind = kind,
			      .len = len, .prot = prot, .flags = flags };
	bpf_map_update_elem(&io_start, &tid, &s, BPF_ANY);
	return 0;
}

static __always_inline struct pid_file_io *entry(struct io_start *s)
{
	struct pid_file_key k = { .ino = s->ino, .dev = s->dev, .pid = current_tgid() };
	struct file_key f = { .ino = s->ino, .dev = s->dev };
	struct pid_file_io *v = 0;
	if (bpf_map_lookup_elem(&interest, &f))
		v = lookup_or_init(&io_pinned, &k, &zero_io);
	if (!v)
		v = lookup_or_init(&io, &k, &zero_io);
	return v;
}

static __always_inline int exit_(struct sys_exit_ctx *ctx, __u32 kind)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct io_start *s = bpf_map_lookup_elem(&io_start, &tid);
	if (!s)
		return 0;
	struct io_start st = *s;
	bpf_map_delete_elem(&io_start, &tid);
	if (st.kind != kind)
		return 0;
	long ret = ctx->ret;
	if (kind == IO_READ && ret <= 0)
		return 0;
	/* mmap returns an address; -4095..-1 are errors. */
	if (kind == IO_MMAP && (unsigned long)ret >= (unsigned long)-4095)
		return 0;
	struct pid_file_io *v = entry(&st);
	if (!v)
		return 0;
	bpf_get_current_comm(v->comm, sizeof(v->comm));
	if (kind == IO_READ) {
		__sync_fetch_and_add(&v->read_bytes, ret);
		__sync_fetch_and_add(&v->read_calls, 1);
		return 0;
	}
	int shared = (st.flags & MAP_TYPE) == MAP_SHARED ||
		     (st.flags & MAP_TYPE) == MAP_SHARED_VALIDATE;
	int write = (st.prot & PROT_WRITE) != 0;
	if (shared && write)
		__sync_fetch_and_add(&v->mmap_shared_write, 1);
	else if (shared)
		__sync_fetch_and_add(&v->mmap_shared, 1);
	else if (write)
		__sync_fetch_and_add(&v->mmap_private_write, 1);
	else
		__sync_fetch_and_add(&v->mmap_private, 1);
	__sync_fetch_and_add(&v->mmap_bytes, st.len);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_read")
int enter_read(struct sys_enter_ctx *ctx)
{
	return enter(ctx->args[0], IO_READ, 0, 0, 0);
}

SEC("tracepoint/syscalls/sys_exit_read")
int exit_read(struct sys_exit_ctx *ctx)
{
	return exit_(ctx, IO_READ);
}

SEC("tracepoint/syscalls/sys_enter_pread64")
int enter_pread64(struct sys_enter_ctx *ctx)
{
	return enter(ctx->args[0], IO_READ, 0, 0, 0);
}

SEC("tracepoint/syscalls/sys_exit_pread64")
int exit_pread64(struct sys_exit_ctx *ctx)
{
	return exit_(ctx, IO_READ);
}

SEC("tracepoint/syscalls/sys_enter_readv")
int enter_readv(struct sys_enter_ctx *ctx)
{
	return enter(ctx->args[0], IO_READ, 0, 0, 0);
}

SEC("tracepoint/syscalls/sys_exit_readv")
int exit_readv(struct sys_exit_ctx *ctx)
{
	return exit_(ctx, IO_READ);
}

SEC("tracepoint/syscalls/sys_enter_preadv")
int enter_preadv(struct sys_enter_ctx *ctx)
{
	return enter(ctx->args[0], IO_READ, 0, 0, 0);
}

SEC("tracepoint/syscalls/sys_exit_preadv")
int exit_preadv(struct sys_exit_ctx *ctx)
{
	return exit_(ctx, IO_READ);
}

SEC("tracepoint/syscalls/sys_enter_mmap")
int enter_mmap(struct sys_enter_ctx *ctx)
{
	/* mmap(addr, len, prot, flags, fd, off) */
	if (ctx->args[3] & 0x20 /* MAP_ANONYMOUS */)
		return 0;
	return enter(ctx->args[4], IO_MMAP, ctx->args[1], ctx->args[2], ctx->args[3]);
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int exit_mmap(struct sys_exit_ctx *ctx)
{
	return exit_(ctx, IO_MMAP);
}
