/* A stand-in for the CUDA driver library (built by tests/trace/uploads.rs as
 * libcuda.so.1 in a temp dir): the upload, registration and allocation entry
 * points with the driver's signatures, doing nothing. Allocations hand out
 * addresses of a range no process maps, like device pointers. */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

static CUdeviceptr next_dev = 0x7e0000000000ULL;

static CUdeviceptr take(size_t n)
{
	CUdeviceptr p = next_dev;
	next_dev += (n + 0x1fffff) & ~(CUdeviceptr)0x1fffff;
	return p;
}

#define NOINLINE __attribute__((noinline, visibility("default")))

NOINLINE CUresult cuInit(unsigned flags) { (void)flags; return 0; }
NOINLINE CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { *p = take(n); return 0; }
NOINLINE CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
NOINLINE CUresult cuMemAllocHost_v2(void **p, size_t n) { (void)n; *p = 0; return 1; }
NOINLINE CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { (void)n; (void)f; *p = 0; return 1; }
NOINLINE CUresult cuMemFreeHost(void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
NOINLINE CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)d; (void)s; (void)n; (void)st; return 0; }
NOINLINE CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { (void)d; (void)s; (void)n; return 0; }
NOINLINE CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)d; (void)s; (void)n; (void)st; return 0; }
NOINLINE CUresult cuMemcpy2D_v2(const void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemcpy3D_v2(const void *p) { (void)p; return 0; }
NOINLINE CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return 0; }
NOINLINE CUresult cuMemHostUnregister(void *p) { (void)p; return 0; }
