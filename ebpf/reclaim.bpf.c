/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Reclaim and OOM: synchronous (direct) reclaim a process had to do itself,
 * global (vmscan:mm_vmscan_direct_reclaim_*) or because its memory cgroup hit
 * its limit (vmscan:mm_vmscan_memcg_reclaim_*), with a latency histogram; and
 * OOM kills (oom:mark_victim) with the victim's pid and comm.
 */
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct pid_reclaim);
} pid_reclaim_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct pid_reclaim);
} pid_reclaim SEC(".maps");

/* Reclaims in progress, per thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct reclaim_start);
} reclaim_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct oom_victim);
} oom_victims SEC(".maps");

static const struct pid_reclaim zero_reclaim;

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

static __always_inline int begin(__u32 memcg)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct reclaim_start s = { .ts_ns = bpf_ktime_get_ns(), .memcg = memcg };
	bpf_map_update_elem(&reclaim_start, &tid, &s, BPF_ANY);
	return 0;
}

static __always_inline int end(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct reclaim_start *s = bpf_map_lookup_elem(&reclaim_start, &tid);
	if (!s)
		return 0;
	__u64 ns = bpf_ktime_get_ns() - s->ts_ns;
	__u32 memcg = s->memcg;
	bpf_map_delete_elem(&reclaim_start, &tid);
	__u32 pid = current_tgid();
	struct pid_reclaim *r = bpf_map_lookup_elem(&pid_reclaim_pinned, &pid);
	if (!r)
		r = lookup_or_init(&pid_reclaim, &pid, &zero_reclaim);
	if (!r)
		return 0;
	if (memcg)
		__sync_fetch_and_add(&r->memcg_count, 1);
	else
		__sync_fetch_and_add(&r->direct_count, 1);
	__sync_fetch_and_add(&r->total_ns, ns);
	__sync_fetch_and_add(&r->reclaimed_pages, BPF_CORE_READ(ctx, nr_reclaimed));
	if (ns > r->max_ns)
		r->max_ns = ns; /* racy between CPUs, good enough for a maximum */
	__u32 b = log2_u64(ns / 1000);
	if (b >= RECLAIM_BUCKETS)
		b = RECLAIM_BUCKETS - 1;
	__sync_fetch_and_add(&r->hist[b], 1);
	return 0;
}

SEC("tracepoint/vmscan/mm_vmscan_direct_reclaim_begin")
int direct_reclaim_begin(void *ctx)
{
	return begin(0);
}

SEC("tracepoint/vmscan/mm_vmscan_direct_reclaim_end")
int direct_reclaim_end(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	return end(ctx);
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin")
int memcg_reclaim_begin(void *ctx)
{
	return begin(1);
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_end")
int memcg_reclaim_end(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	return end(ctx);
}

SEC("tracepoint/oom/mark_victim")
int mark_victim(struct trace_event_raw_mark_victim *ctx)
{
	struct oom_victim v = {};
	v.ts_ns = bpf_ktime_get_ns();
	v.pid = BPF_CORE_READ(ctx, pid);
	v.killer_pid = current_tgid();
	if (bpf_core_field_exists(ctx->total_vm)) {
		v.total_vm_kb = BPF_CORE_READ(ctx, total_vm);
		v.anon_rss_kb = BPF_CORE_READ(ctx, anon_rss);
		v.file_rss_kb = BPF_CORE_READ(ctx, file_rss);
		v.shmem_rss_kb = BPF_CORE_READ(ctx, shmem_rss);
	}
	if (bpf_core_field_exists(ctx->uid))
		v.uid = BPF_CORE_READ(ctx, uid);
	if (bpf_core_field_exists(ctx->__data_loc_comm)) {
		/* __data_loc: low 16 bits the offset from the record start. */
		__u32 loc = BPF_CORE_READ(ctx, __data_loc_comm);
		bpf_probe_read_kernel_str(v.comm, sizeof(v.comm), (char *)ctx + (loc & 0xffff));
	}
	bpf_map_update_elem(&oom_victims, &v.pid, &v, BPF_ANY);
	total_add(TOTAL_OOM_KILLS, 1);
	return 0;
}
