/* A stand-in for the CUDA driver library (built by tests/trace/uploads.rs as
 * libcuda.so.1 in a temp dir): the upload, device-to-device, registration and
 * allocation entry points with the driver's signatures. Allocations hand out
 * addresses of a range no process maps, like device pointers, and keep a shadow
 * of each allocation's bytes in the heap, so that what the "device" holds is
 * known: copies to, from and between allocations move bytes between shadows.
 *
 * Ground truth for the tests: `standin_dump(path)` (not a CUDA symbol) writes
 * every live allocation as [u64 address][u64 bytes][the bytes], and with
 * STANDIN_LEDGER set each call appends a line `pid call dst src bytes` to that
 * file (its own ledger of what it was asked to do). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUcontext;

#define DEV_BASE 0x100000000000ULL /* 16 TiB: below where mmap puts heaps */

struct alloc {
	CUdeviceptr p;
	size_t n;
	unsigned char *mem;
	struct alloc *next;
};

static CUdeviceptr next_dev = DEV_BASE;
static struct alloc *allocs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void note(const char *call, unsigned long long d, unsigned long long s, size_t n)
{
	const char *path = getenv("STANDIN_LEDGER");
	if (!path)
		return;
	FILE *f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, "%d %s %llu %llu %zu\n", (int)getpid(), call, d, s, n);
	fclose(f);
}

static CUdeviceptr take(size_t n)
{
	CUdeviceptr p = next_dev;
	next_dev += (n + 0x1fffff) & ~(CUdeviceptr)0x1fffff;
	return p;
}

/* The shadow bytes of device address d (n of them), or NULL: not allocated. */
static unsigned char *shadow(CUdeviceptr d, size_t n)
{
	for (struct alloc *a = allocs; a; a = a->next)
		if (d >= a->p && d + n <= a->p + a->n)
			return a->mem + (d - a->p);
	return NULL;
}

static int is_device(CUdeviceptr d)
{
	return d >= DEV_BASE && d < DEV_BASE + (1ULL << 40);
}

/* Moves n bytes to d from s, device or host addresses each. */
static CUresult move(const char *call, CUdeviceptr d, CUdeviceptr s, size_t n)
{
	pthread_mutex_lock(&lock);
	unsigned char *to = is_device(d) ? shadow(d, n) : (unsigned char *)(uintptr_t)d;
	const unsigned char *from = is_device(s) ? shadow(s, n) : (const unsigned char *)(uintptr_t)s;
	if (to && from && n)
		memmove(to, from, n);
	pthread_mutex_unlock(&lock);
	note(call, d, s, n);
	return to && from ? 0 : 1;
}

#define NOINLINE __attribute__((noinline, visibility("default")))

NOINLINE CUresult cuInit(unsigned flags) { (void)flags; return 0; }

NOINLINE CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	struct alloc *a = calloc(1, sizeof *a);
	pthread_mutex_lock(&lock);
	a->p = take(n);
	a->n = n;
	a->mem = calloc(1, n ? n : 1);
	a->next = allocs;
	allocs = a;
	*p = a->p;
	pthread_mutex_unlock(&lock);
	note("alloc", a->p, 0, n);
	return 0;
}

NOINLINE CUresult cuMemFree_v2(CUdeviceptr p)
{
	pthread_mutex_lock(&lock);
	for (struct alloc **a = &allocs; *a; a = &(*a)->next) {
		if ((*a)->p == p) {
			struct alloc *gone = *a;
			*a = gone->next;
			free(gone->mem);
			free(gone);
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	note("free", p, 0, 0);
	return 0;
}

NOINLINE CUresult cuMemAllocHost_v2(void **p, size_t n) { (void)n; *p = 0; return 1; }
NOINLINE CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { (void)n; (void)f; *p = 0; return 1; }
NOINLINE CUresult cuMemFreeHost(void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return move("htod", d, (uintptr_t)s, n); }
NOINLINE CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return move("htod", d, (uintptr_t)s, n); }
NOINLINE CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return move("dtod", d, s, n); }
NOINLINE CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return move("dtod", d, s, n); }
NOINLINE CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) { (void)dc; (void)sc; return move("dtod", d, s, n); }
NOINLINE CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) { (void)dc; (void)sc; (void)st; return move("dtod", d, s, n); }
NOINLINE CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return move("copy", d, s, n); }
NOINLINE CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return move("copy", d, s, n); }
NOINLINE CUresult cuMemcpy2D_v2(const void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemcpy3D_v2(const void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return 0; }
NOINLINE CUresult cuMemHostUnregister(void *p) { (void)p; return 0; }

/* The shadow bytes of device range [d, d + n), or NULL (for the stand-in libcufile). */
NOINLINE unsigned char *standin_shadow(CUdeviceptr d, size_t n)
{
	pthread_mutex_lock(&lock);
	unsigned char *p = shadow(d, n);
	pthread_mutex_unlock(&lock);
	return p;
}

/* Every live allocation: [u64 address][u64 bytes][the bytes]; 0 when written. */
NOINLINE int standin_dump(const char *path)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return 1;
	pthread_mutex_lock(&lock);
	for (struct alloc *a = allocs; a; a = a->next) {
		uint64_t h[2] = { a->p, a->n };
		fwrite(h, sizeof h, 1, f);
		fwrite(a->mem, 1, a->n, f);
	}
	pthread_mutex_unlock(&lock);
	return fclose(f) ? 1 : 0;
}
