/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * A task iterator (iter/task): one struct task_stamp per thread of the host,
 * read with one read() loop at every snapshot of a long-lived twofold instead
 * of a /proc file or three per process. And a task_file iterator linked to
 * twofold's own process only: one struct held_pages per descriptor it holds,
 * the page count of each model file it keeps open (an O(1) read where
 * cachestat walks every page of the file). Nothing is attached to any event: the
 * program runs only while twofold reads its iterator, under RCU, and changes
 * nothing.
 *
 * The types are flavours (___tasks) of the kernel's own, relocated by CO-RE
 * against its BTF, so they stay apart from kernel.h's task_struct.
 */
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include "twofold.h"

char LICENSE[] SEC("license") = "GPL";

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct percpu_counter___tasks {
	__s64 count;
};

struct mm_struct___tasks {
	unsigned long total_vm;
	unsigned long data_vm;
	unsigned long stack_vm;
	struct percpu_counter___tasks rss_stat[4];
};

struct task_io_accounting___tasks {
	__u64 rchar;
};

struct sched_entity___tasks {
	__u64 sum_exec_runtime;
};

struct signal_struct___tasks {
	struct task_io_accounting___tasks ioac;
	unsigned long min_flt;
	unsigned long maj_flt;
};

struct task_struct___tasks {
	int pid;
	int tgid;
	struct mm_struct___tasks *mm;
	struct sched_entity___tasks se;
	struct task_io_accounting___tasks ioac;
	unsigned long min_flt;
	unsigned long maj_flt;
	__u64 start_boottime;
	struct signal_struct___tasks *signal;
};

struct bpf_iter_meta___tasks {
	void *seq;
};

struct bpf_iter__task___tasks {
	struct bpf_iter_meta___tasks *meta;
	struct task_struct___tasks *task;
};

struct address_space___tasks {
	unsigned long nrpages;
};

struct inode___tasks {
	unsigned long i_ino;
};

struct file___tasks {
	struct inode___tasks *f_inode;
	struct address_space___tasks *f_mapping;
};

struct bpf_iter__task_file___tasks {
	struct bpf_iter_meta___tasks *meta;
	struct task_struct___tasks *task;
	__u32 fd;
	struct file___tasks *file;
};

#pragma clang attribute pop

/* enum mm_counter_type */
#define MM_FILEPAGES 0
#define MM_ANONPAGES 1
#define MM_SHMEMPAGES 3

static __always_inline __u64 positive(__s64 v)
{
	return v > 0 ? v : 0;
}

SEC("iter/task")
int task_stamps(struct bpf_iter__task___tasks *ctx)
{
	struct task_struct___tasks *t = ctx->task;
	struct task_stamp r = {};

	if (!t)
		return 0;
	r.tgid = t->tgid;
	r.tid = t->pid;
	r.run_ns = t->se.sum_exec_runtime;
	r.rchar = t->ioac.rchar;
	r.faults = t->min_flt + t->maj_flt;
	if (r.tgid == r.tid) {
		struct mm_struct___tasks *mm = t->mm;
		struct signal_struct___tasks *sig = t->signal;

		r.start_ns = t->start_boottime;
		if (sig) {
			r.dead_rchar = sig->ioac.rchar;
			r.dead_faults = sig->min_flt + sig->maj_flt;
		}
		if (mm) {
			r.flags = TASK_HAS_MM;
			r.total_vm = mm->total_vm;
			r.rss_file = positive(mm->rss_stat[MM_FILEPAGES].count);
			r.rss_anon = positive(mm->rss_stat[MM_ANONPAGES].count);
			r.rss_shmem = positive(mm->rss_stat[MM_SHMEMPAGES].count);
			r.data = mm->data_vm + mm->stack_vm;
		}
	}
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}

SEC("iter/task_file")
int held_pages(struct bpf_iter__task_file___tasks *ctx)
{
	struct file___tasks *f = ctx->file;
	struct held_pages r = {};

	if (!f)
		return 0;
	r.fd = ctx->fd;
	r.ino = f->f_inode->i_ino;
	r.nrpages = f->f_mapping->nrpages;
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
