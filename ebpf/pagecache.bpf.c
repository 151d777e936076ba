/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Page cache: pages added and evicted per file (each folio weighs 1 << order
 * pages), and refaults: pages of a file added again after twofold saw them
 * evicted in this session.
 *
 * Evicted pages are remembered per 512-page chunk of a file as a bitmap, so a
 * refault is counted page by page whatever folio sizes the eviction and the
 * later read used. Files of interest (pre-inserted by twofold into
 * `file_cache_pinned`) keep their counters and their evicted bitmaps in
 * non-LRU hashes; a system-wide cache drop of millions of pages of other
 * files only churns the LRU ones.
 */
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct file_key);
	__type(value, struct file_cache);
} file_cache_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct file_key);
	__type(value, struct file_cache);
} file_cache SEC(".maps");

/* 65536 chunks = 128 GiB of evicted pages of files of interest. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct chunk_key);
	__type(value, struct chunk_bits);
} evicted_pinned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct chunk_key);
	__type(value, struct chunk_bits);
} evicted SEC(".maps");

#define CHUNK_SHIFT 9
#define CHUNK_PAGES (1u << CHUNK_SHIFT)
/* Folios above this order (larger than 2 MiB) are not tracked for refaults. */
#define MAX_TRACKED_ORDER CHUNK_SHIFT

static const struct file_cache zero_cache;
static const struct chunk_bits zero_bits;

struct event {
	struct file_key file;
	__u64 index;
	__u64 pages;
	__u32 order;
};

static __always_inline void read_event(struct trace_event_raw_mm_filemap_op_page_cache *ctx,
				       struct event *e)
{
	e->file.ino = BPF_CORE_READ(ctx, i_ino);
	e->file.dev = BPF_CORE_READ(ctx, s_dev);
	e->file.pad = 0;
	e->index = BPF_CORE_READ(ctx, index);
	e->order = 0;
	if (bpf_core_field_exists(ctx->order))
		e->order = BPF_CORE_READ(ctx, order);
	e->pages = 1ull << (e->order & 31);
}

/* The words of a chunk's bitmap a folio covers. Folios are naturally aligned
 * in the file, so a folio of 64 pages or more covers whole words (`count` of
 * them from `first`, all bits), and a smaller one lies inside one word. */
struct span {
	__u32 first;
	__u32 count;
	__u64 mask;
};

static __always_inline struct span folio_span(__u64 index, __u32 order)
{
	struct span s;
	__u32 lo = index & (CHUNK_PAGES - 1);
	s.first = lo >> 6;
	if (order >= 6) {
		s.count = 1u << ((order - 6) & 3);
		s.mask = ~0ull;
	} else {
		s.count = 1;
		s.mask = ((1ull << (1u << order)) - 1) << (lo & 63);
	}
	return s;
}

static __always_inline __u64 popcount(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ull);
	x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
	return (x * 0x0101010101010101ull) >> 56;
}

SEC("tracepoint/filemap/mm_filemap_delete_from_page_cache")
int delete_from_page_cache(struct trace_event_raw_mm_filemap_op_page_cache *ctx)
{
	struct event e;
	read_event(ctx, &e);
	struct file_cache *c = bpf_map_lookup_elem(&file_cache_pinned, &e.file);
	int pinned = c != 0;
	if (!c)
		c = lookup_or_init(&file_cache, &e.file, &zero_cache);
	total_add(TOTAL_EVICTED_PAGES, e.pages);
	if (c) {
		__sync_fetch_and_add(&c->evicted_pages, e.pages);
		__sync_fetch_and_add(&c->evict_events, 1);
	}
	if (e.order > MAX_TRACKED_ORDER)
		return 0;
	struct chunk_key k = { .ino = e.file.ino, .dev = e.file.dev,
			       .chunk = e.index >> CHUNK_SHIFT };
	struct chunk_bits *b = 0;
	if (pinned)
		b = lookup_or_init(&evicted_pinned, &k, &zero_bits);
	if (!b)
		b = lookup_or_init(&evicted, &k, &zero_bits);
	if (!b)
		return 0;
	struct span sp = folio_span(e.index, e.order);
	/* At most 8 iterations, one exit each: cheap for the verifier. */
	for (__u32 i = 0; i < 8; i++) {
		if (i >= sp.count)
			break;
		__sync_fetch_and_or(&b->bits[(sp.first + i) & 7], sp.mask);
	}
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int add_to_page_cache(struct trace_event_raw_mm_filemap_op_page_cache *ctx)
{
	struct event e;
	read_event(ctx, &e);
	struct file_cache *c = bpf_map_lookup_elem(&file_cache_pinned, &e.file);
	if (!c)
		c = lookup_or_init(&file_cache, &e.file, &zero_cache);
	total_add(TOTAL_ADDED_PAGES, e.pages);
	if (c) {
		__sync_fetch_and_add(&c->added_pages, e.pages);
		__sync_fetch_and_add(&c->add_events, 1);
	}
	if (e.order > MAX_TRACKED_ORDER)
		return 0;
	struct chunk_key k = { .ino = e.file.ino, .dev = e.file.dev,
			       .chunk = e.index >> CHUNK_SHIFT };
	struct chunk_bits *b = bpf_map_lookup_elem(&evicted_pinned, &k);
	if (!b)
		b = bpf_map_lookup_elem(&evicted, &k);
	if (!b)
		return 0;
	struct span sp = folio_span(e.index, e.order);
	__u64 refaults = 0;
	for (__u32 i = 0; i < 8; i++) {
		if (i >= sp.count)
			break;
		__u64 old = __sync_fetch_and_and(&b->bits[(sp.first + i) & 7], ~sp.mask);
		refaults += popcount(old & sp.mask);
	}
	if (refaults && c)
		__sync_fetch_and_add(&c->refault_pages, refaults);
	return 0;
}
