/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Uploads to a GPU: uprobes on the CUDA driver library's copy, registration and
 * allocation entry points (libcuda.so.1; twofold attaches each exported symbol
 * it knows, with the entry point's number as the attach cookie).
 *
 * A device-to-device copy (cuMemcpyDtoD*, cuMemcpyPeer*) sends its destination,
 * source and size only: user space knows which device ranges hold model bytes.
 *
 * A host-to-device copy sends its destination, source and size with content
 * samples of the source taken at the moment of the call: the first UP_ANCHOR
 * bytes and, for a copy longer than that, UP_SAMPLES windows of UP_SAMPLE bytes
 * spread over the range: at most 2,576 bytes whatever the copy's size. A copy of at
 * most UP_SMALL bytes goes whole in a small record (320 bytes, not 2,640), and the
 * reader is woken only when 2 MiB wait. bpf_probe_read_user reads only
 * present pages (a uprobe program cannot fault), so nothing is paged in for
 * twofold; a window that is not present is marked missing. Which bytes of a
 * model file were uploaded is decided in user space by matching the samples
 * (provenance comes from the bytes, not the source address: runtimes upload
 * through reused pinned staging buffers).
 *
 * Arguments come from registers through uargs.h (one table per architecture).
 */
#include "common.h"
#include "uargs.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} uploads SEC(".maps");

/* Allocations between entry and return, per thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct upload_pending);
} pending SEC(".maps");

/* libcufile calls between entry and return, per thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct gds_pending);
} gds_pending SEC(".maps");

/* bpf_ringbuf_query / bpf_ringbuf_submit flags (uapi's BPF_RB_*). */
#define RB_NO_WAKEUP 1
#define RB_FORCE_WAKEUP 2
#define RB_AVAIL_DATA 0

/* Tiny copies counted per process (see UP_TINY_SLOTS). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, UP_TINY_SLOTS);
	__type(key, __u32);
	__type(value, struct up_tiny);
} tiny SEC(".maps");

/* Wakes the reader only when UP_WAKE_BYTES wait (it drains every 50 ms anyway). */
static __always_inline __u64 wakeup(void)
{
	return bpf_ringbuf_query(&uploads, RB_AVAIL_DATA) >= UP_WAKE_BYTES ? RB_FORCE_WAKEUP
									  : RB_NO_WAKEUP;
}

static __always_inline void head(struct upload_head *h, __u32 kind, __u32 entry)
{
	__u64 id = bpf_get_current_pid_tgid();
	h->ts_ns = bpf_ktime_get_ns();
	h->tgid = id >> 32;
	h->tid = (__u32)id;
	h->entry = entry;
	h->kind = kind;
	h->dst = 0;
	h->src = 0;
	h->bytes = 0;
	h->flags = 0;
	h->index = 0;
}

/* Sends a small record (no content). */
static __always_inline int small(__u32 kind, __u64 dst, __u64 src, __u64 bytes, __u32 entry)
{
	struct upload_head *h = bpf_ringbuf_reserve(&uploads, sizeof(*h), 0);
	if (!h) {
		total_add(TOTAL_MAP_FULL, 1);
		return 0;
	}
	head(h, kind, entry);
	h->dst = dst;
	h->src = src;
	h->bytes = bytes;
	bpf_ringbuf_submit(h, wakeup());
	return 0;
}

/* Sends a copy of at most UP_SMALL bytes whole, in a small record; 1 when sent. */
static __always_inline int copy_small(__u32 entry, __u64 dst, __u64 src, __u64 bytes,
				      __u32 flags, __u32 index)
{
	struct upload_small *e = bpf_ringbuf_reserve(&uploads, sizeof(*e), 0);
	if (!e) {
		total_add(TOTAL_MAP_FULL, 1);
		return 0;
	}
	head(&e->h, UP_COPY, entry);
	e->h.dst = dst;
	e->h.src = src;
	e->h.bytes = bytes;
	e->h.flags = flags | UPF_SMALL;
	e->h.index = index;
	e->anchor_len = 0;
	e->sampled = 0;
	__u64 n = bytes;
	asm volatile("" : "+r"(n));
	if (n > 0 && n <= UP_SMALL && bpf_probe_read_user(e->anchor, n, (const void *)src) == 0)
		e->anchor_len = n;
	bpf_ringbuf_submit(e, wakeup());
	return 1;
}

/* The attach cookie: the entry point's number. A helper call, so the fast path of tiny
 * copies does without it (a helper call costs about as much as the rest of that path). */
static __always_inline __u32 entry_of(struct uregs *ctx)
{
	return (__u32)bpf_get_attach_cookie(ctx);
}

/* The `tiny` slot of the calling process (`claim`: taking it if free, and telling
 * twofold which slot to read); NULL when it belongs to another process. */
static __always_inline struct up_tiny *tiny_slot(struct uregs *ctx, int claim)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u32 k = tgid & (UP_TINY_SLOTS - 1);
	struct up_tiny *s = bpf_map_lookup_elem(&tiny, &k);
	if (!s || !tgid)
		return NULL;
	if (s->tgid == tgid)
		return s;
	if (!claim || s->tgid || __sync_val_compare_and_swap(&s->tgid, 0, tgid) != 0)
		return NULL;
	s->len = 0;
	s->counted = 0;
	small(UP_TINY_SLOT, k, 0, 0, entry_of(ctx));
	return s;
}

/* Counts a tiny copy (1 to UP_SMALL contiguous bytes to device memory) in the process's
 * slot; 0 when it must be sent instead: the slot belongs to another process, or the copy
 * continues the process's last one (then that one is sent too, if it was counted: the
 * two may be a chunked upload of a model's bytes, matched in user space; it is sent
 * under this call's entry point, which a chunked upload does not change). */
static __always_inline int tiny_count(struct uregs *ctx, __u64 dst, __u64 src, __u64 bytes)
{
	struct up_tiny *s = tiny_slot(ctx, 1);
	if (!s)
		return 0;
	__u64 len = s->len, psrc = s->src, pdst = s->dst;
	s->src = src;
	s->dst = dst;
	s->len = bytes;
	if (len && (src == psrc + len || dst == pdst + len)) {
		/* One thread sends the counted copy, and takes off the counters what its
		 * record says. */
		if (__sync_val_compare_and_swap(&s->counted, 1, 0) == 1 &&
		    copy_small(entry_of(ctx), pdst, psrc, len, 0, 0)) {
			__sync_fetch_and_add(&s->copies, -1);
			__sync_fetch_and_add(&s->bytes, -len);
		}
		return 0;
	}
	__sync_fetch_and_add(&s->copies, 1);
	__sync_fetch_and_add(&s->bytes, bytes);
	s->counted = 1;
	return 1;
}

/* A larger copy is the last one of its process: a tiny copy may continue it. */
static __always_inline void tiny_last(struct uregs *ctx, __u64 dst, __u64 src, __u64 bytes)
{
	struct up_tiny *s = tiny_slot(ctx, 0);
	if (!s)
		return;
	s->src = src;
	s->dst = dst;
	s->len = bytes;
	s->counted = 0;
}

/* Sends a copy of `bytes` from `src` (`first`: bytes contiguous from src that may be
 * sampled; less than `bytes` for a strided copy). A copy of at most UP_SMALL bytes goes
 * whole in a small record; one of at most UP_ANCHOR bytes is whole in the anchor, so
 * its windows are not read. */
static __always_inline int copy(__u32 entry, __u64 dst, __u64 src, __u64 bytes, __u64 first,
				__u32 flags, __u32 index)
{
	if (!bytes)
		return 0;
	if (first == bytes && bytes <= UP_SMALL)
		return copy_small(entry, dst, src, bytes, flags, index);
	struct upload_copy *e = bpf_ringbuf_reserve(&uploads, sizeof(*e), 0);
	if (!e) {
		total_add(TOTAL_MAP_FULL, 1);
		return 0;
	}
	head(&e->h, UP_COPY, entry);
	e->h.dst = dst;
	e->h.src = src;
	e->h.bytes = bytes;
	e->h.flags = flags;
	e->h.index = index;
	e->anchor_len = 0;
	e->sampled = 0;
	__u64 n = first;
	if (n > UP_ANCHOR)
		n = UP_ANCHOR;
	/* Keep clang from copying n before the check the verifier must see. */
	asm volatile("" : "+r"(n));
	if (n > 0 && n <= UP_ANCHOR &&
	    bpf_probe_read_user(e->anchor, n, (const void *)src) == 0)
		e->anchor_len = n;
	if (first > UP_ANCHOR && !(flags & UPF_STRIDED)) {
		__u64 span = first - UP_SAMPLE;
#pragma unroll
		for (int i = 0; i < UP_SAMPLES; i++) {
			__u64 off = span * i / (UP_SAMPLES - 1);
			if (bpf_probe_read_user(e->samples[i], UP_SAMPLE, (const void *)(src + off)) == 0)
				e->sampled |= 1u << i;
		}
	}
	bpf_ringbuf_submit(e, wakeup());
	return 0;
}

/* cuMemcpyHtoD*(dst, src, n, ...): a tiny copy is counted (no attach cookie read, no
 * record), any other sent. */
SEC("uprobe")
int up_copy(struct uregs *ctx)
{
	__u64 dst = UARG1(ctx), src = UARG2(ctx), n = UARG3(ctx);
	if (n && n <= UP_SMALL) {
		if (tiny_count(ctx, dst, src, n))
			return 0;
	} else {
		tiny_last(ctx, dst, src, n);
	}
	return copy(entry_of(ctx), dst, src, n, n, 0, 0);
}

/* cuMemcpy*(dst, src, n, ...) (unified addressing): a device copy only if the destination
 * is a traced device allocation, which user space decides; always sent. */
SEC("uprobe")
int up_copy_unified(struct uregs *ctx)
{
	__u64 n = UARG3(ctx);
	return copy(entry_of(ctx), UARG1(ctx), UARG2(ctx), n, n, UPF_UNIFIED, 0);
}

#define MT_HOST 1
#define MT_DEVICE 2
#define MT_ARRAY 3
#define MT_UNIFIED 4

/* CUDA_MEMCPY2D and CUDA_MEMCPY3D, as the driver API lays them out (64-bit). */
struct memcpy2d {
	__u64 src_x, src_y;
	__u32 src_type, pad0;
	__u64 src_host, src_device, src_array, src_pitch;
	__u64 dst_x, dst_y;
	__u32 dst_type, pad1;
	__u64 dst_host, dst_device, dst_array, dst_pitch;
	__u64 width, height;
};

struct memcpy3d {
	__u64 src_x, src_y, src_z, src_lod;
	__u32 src_type, pad0;
	__u64 src_host, src_device, src_array, reserved0, src_pitch, src_height;
	__u64 dst_x, dst_y, dst_z, dst_lod;
	__u32 dst_type, pad1;
	__u64 dst_host, dst_device, dst_array, reserved1, dst_pitch, dst_height;
	__u64 width, height, depth;
};

static __always_inline int planar(__u32 entry, __u32 src_type, __u64 src_host, __u64 src_device,
				  __u32 dst_type, __u64 dst_device, __u64 dst_array,
				  __u64 start, __u64 width, __u64 rows, int contiguous)
{
	__u64 src;
	__u32 flags = 0;
	if (src_type == MT_DEVICE && dst_type == MT_DEVICE && contiguous)
		/* On the device: a clone of what the source holds (user space decides). */
		return small(UP_DTOD, dst_device, src_device + start, width * rows, entry);
	if (src_type == MT_HOST)
		src = src_host;
	else if (src_type == MT_UNIFIED)
		src = src_device, flags |= UPF_UNIFIED;
	else
		return 0;
	if (dst_type == MT_HOST)
		return 0;
	if (dst_type == MT_UNIFIED)
		flags |= UPF_UNIFIED;
	__u64 dst = dst_type == MT_ARRAY ? dst_array : dst_device;
	__u64 bytes = width * rows;
	if (!contiguous)
		flags |= UPF_STRIDED;
	return copy(entry, dst, src + start, bytes, contiguous ? bytes : width, flags, 0);
}

/* cuMemcpy2D*(const CUDA_MEMCPY2D *p, ...) */
SEC("uprobe")
int up_copy2d(struct uregs *ctx)
{
	struct memcpy2d p;
	if (bpf_probe_read_user(&p, sizeof(p), (const void *)UARG1(ctx)))
		return 0;
	int contiguous = p.height <= 1 || p.src_pitch == p.width;
	return planar((__u32)bpf_get_attach_cookie(ctx), p.src_type, p.src_host, p.src_device, p.dst_type, p.dst_device,
		      p.dst_array, p.src_y * p.src_pitch + p.src_x, p.width, p.height,
		      contiguous);
}

/* cuMemcpy3D*(const CUDA_MEMCPY3D *p, ...) */
SEC("uprobe")
int up_copy3d(struct uregs *ctx)
{
	struct memcpy3d p;
	if (bpf_probe_read_user(&p, sizeof(p), (const void *)UARG1(ctx)))
		return 0;
	__u64 depth = p.depth ? p.depth : 1;
	int rows_ok = p.height <= 1 || p.src_pitch == p.width;
	int slices_ok = depth <= 1 || p.src_height * p.src_pitch == p.width * p.height;
	__u64 start = (p.src_z * p.src_height + p.src_y) * p.src_pitch + p.src_x;
	return planar((__u32)bpf_get_attach_cookie(ctx), p.src_type, p.src_host, p.src_device, p.dst_type, p.dst_device,
		      p.dst_array, start, p.width, p.height * depth, rows_ok && slices_ok);
}

/* cuMemcpyBatchAsync*(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, ...):
 * the first UP_BATCH_MAX copies of the batch. */
SEC("uprobe")
int up_batch(struct uregs *ctx)
{
	__u32 entry = (__u32)bpf_get_attach_cookie(ctx);
	__u64 dsts = UARG1(ctx), srcs = UARG2(ctx), sizes = UARG3(ctx), count = UARG4(ctx);
	for (__u32 i = 0; i < UP_BATCH_MAX; i++) {
		if (i >= count)
			break;
		__u64 d = 0, s = 0, n = 0;
		if (bpf_probe_read_user(&d, 8, (const void *)(dsts + i * 8)) ||
		    bpf_probe_read_user(&s, 8, (const void *)(srcs + i * 8)) ||
		    bpf_probe_read_user(&n, 8, (const void *)(sizes + i * 8)))
			break;
		copy(entry, d, s, n, n, UPF_UNIFIED, i);
	}
	return 0;
}

/* cuMemcpyDtoD*(CUdeviceptr dst, CUdeviceptr src, size_t n, ...): no content (device
 * memory); whether the source holds model bytes is user space's to say. */
SEC("uprobe")
int up_dtod(struct uregs *ctx)
{
	return small(UP_DTOD, UARG1(ctx), UARG2(ctx), UARG3(ctx), entry_of(ctx));
}

/* cuMemcpyPeer*(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
 * size_t n, ...) */
SEC("uprobe")
int up_peer(struct uregs *ctx)
{
	return small(UP_DTOD, UARG1(ctx), UARG3(ctx), UARG5(ctx), entry_of(ctx));
}

/* cuMemHostRegister*(void *p, size_t bytes, unsigned flags) */
SEC("uprobe")
int up_register(struct uregs *ctx)
{
	return small(UP_REGISTER, 0, UARG1(ctx), UARG2(ctx), (__u32)bpf_get_attach_cookie(ctx));
}

/* cuMemHostUnregister(void *p) */
SEC("uprobe")
int up_unregister(struct uregs *ctx)
{
	return small(UP_UNREGISTER, 0, UARG1(ctx), 0, (__u32)bpf_get_attach_cookie(ctx));
}

/* cuMemFree*(CUdeviceptr, ...) */
SEC("uprobe")
int up_free(struct uregs *ctx)
{
	return small(UP_FREE, UARG1(ctx), 0, 0, (__u32)bpf_get_attach_cookie(ctx));
}

/* cuMemFreeHost(void *) */
SEC("uprobe")
int up_free_host(struct uregs *ctx)
{
	return small(UP_HOST_FREE, 0, UARG1(ctx), 0, (__u32)bpf_get_attach_cookie(ctx));
}

static __always_inline int alloc_enter(__u32 entry, __u64 out, __u64 bytes, __u64 pitch_out, __u32 kind)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct upload_pending p = { .out = out, .bytes = bytes, .pitch_out = pitch_out,
				    .entry = entry, .kind = kind };
	bpf_map_update_elem(&pending, &tid, &p, BPF_ANY);
	return 0;
}

/* cuMemAlloc_v2 / cuMemAllocAsync / cuMemAllocFromPoolAsync / cuMemAllocManaged
 * (CUdeviceptr *out, size_t bytes, ...) */
SEC("uprobe")
int up_alloc(struct uregs *ctx)
{
	return alloc_enter((__u32)bpf_get_attach_cookie(ctx), UARG1(ctx), UARG2(ctx), 0, UP_ALLOC);
}

/* cuMemAllocPitch_v2(CUdeviceptr *out, size_t *pitch, size_t width, size_t height, ...) */
SEC("uprobe")
int up_alloc_pitch(struct uregs *ctx)
{
	return alloc_enter((__u32)bpf_get_attach_cookie(ctx), UARG1(ctx), UARG4(ctx), UARG2(ctx), UP_ALLOC);
}

/* cuMemAllocHost_v2 / cuMemHostAlloc(void **out, size_t bytes, ...) */
SEC("uprobe")
int up_alloc_host(struct uregs *ctx)
{
	return alloc_enter((__u32)bpf_get_attach_cookie(ctx), UARG1(ctx), UARG2(ctx), 0, UP_HOST_ALLOC);
}

/* The return of any allocation above: CUDA_SUCCESS (0) sends it. */
SEC("uretprobe")
int ret_alloc(struct uregs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct upload_pending *p = bpf_map_lookup_elem(&pending, &tid);
	if (!p)
		return 0;
	struct upload_pending st = *p;
	bpf_map_delete_elem(&pending, &tid);
	if (URET(ctx) != 0)
		return 0;
	__u64 ptr = 0;
	if (bpf_probe_read_user(&ptr, 8, (const void *)st.out))
		return 0;
	__u64 bytes = st.bytes;
	if (st.pitch_out) {
		__u64 pitch = 0;
		if (bpf_probe_read_user(&pitch, 8, (const void *)st.pitch_out) == 0)
			bytes *= pitch; /* height x pitch */
	}
	if (st.kind == UP_ALLOC)
		return small(UP_ALLOC, ptr, 0, bytes, st.entry);
	return small(UP_HOST_ALLOC, 0, ptr, bytes, st.entry);
}

/* CU_FILE_HANDLE_TYPE_OPAQUE_FD: a descriptor that names a file by an fd. */
#define CUFILE_FD 1

/* cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr): the file the fd of
 * descr (type at offset 0, the fd at 8) names, resolved now (the fd may be closed once
 * registered). */
SEC("uprobe")
int up_gds_register(struct uregs *ctx)
{
	__u64 descr = UARG2(ctx);
	__u32 type = 0;
	int fd = -1;
	struct file_key k;
	if (bpf_probe_read_user(&type, 4, (const void *)descr) || type != CUFILE_FD ||
	    bpf_probe_read_user(&fd, 4, (const void *)(descr + 8)) || fd < 0 ||
	    !fd_file(fd, &k))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct gds_pending p = { .a = UARG1(ctx), .b = k.ino, .dev = k.dev,
				 .kind = UP_GDS_HANDLE };
	bpf_map_update_elem(&gds_pending, &tid, &p, BPF_ANY);
	return 0;
}

/* cuFileRead(CUfileHandle_t fh, void *dev_base, size_t n, off_t file_offset,
 * off_t dev_offset): file bytes DMA'd into device memory, no host copy to sample. */
SEC("uprobe")
int up_gds_read(struct uregs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct gds_pending p = { .a = UARG1(ctx), .b = UARG2(ctx) + UARG5(ctx), .c = UARG3(ctx),
				 .d = UARG4(ctx), .kind = UP_GDS_READ };
	bpf_map_update_elem(&gds_pending, &tid, &p, BPF_ANY);
	return 0;
}

/* The return of either: a registration that succeeded (CUfileError_t's err, the low 32
 * bits, is 0) sends the handle and its file; a read sends the bytes it read. */
SEC("uretprobe")
int ret_gds(struct uregs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct gds_pending *q = bpf_map_lookup_elem(&gds_pending, &tid);
	if (!q)
		return 0;
	struct gds_pending p = *q;
	bpf_map_delete_elem(&gds_pending, &tid);
	__u64 ret = URET(ctx);
	__u64 handle = p.a;
	if (p.kind == UP_GDS_HANDLE) {
		if ((__u32)ret != 0 || bpf_probe_read_user(&handle, 8, (const void *)p.a))
			return 0;
	} else if ((long)ret <= 0) {
		return 0;
	}
	struct upload_gds *e = bpf_ringbuf_reserve(&uploads, sizeof(*e), 0);
	if (!e) {
		total_add(TOTAL_MAP_FULL, 1);
		return 0;
	}
	head(&e->h, p.kind, (__u32)bpf_get_attach_cookie(ctx));
	e->handle = handle;
	e->file_offset = p.d;
	e->ino = p.b;
	e->dev = p.dev;
	e->pad = 0;
	if (p.kind == UP_GDS_READ) {
		e->h.dst = p.b;
		e->h.bytes = ret;
		e->ino = 0;
	}
	bpf_ringbuf_submit(e, wakeup());
	return 0;
}

/* Does nothing: the cost of the uprobe alone (the trap and the program's dispatch), which
 * `twofold __bench uprobe-floor` attaches for the overhead benchmark to compare with. */
SEC("uprobe")
int up_floor(struct uregs *ctx)
{
	return 0;
}
