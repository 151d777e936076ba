/* The per-call cost of upload tracing (bench/uploads.sh): dlopen LIB (the stand-in
 * libcuda.so.1 of tests/trace/cuda, whose entry points do nothing), then time N calls of
 * cuMemcpyHtoDAsync_v2 of SIZE bytes from one heap buffer refilled per call, as a serving
 * loop uploads a step's small input. Prints one JSON line: {"calls", "bytes", "ns_per_call"}.
 * Usage: upload_loop LIB N SIZE */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*htoda_t)(unsigned long long, const void *, size_t, void *);
typedef int (*alloc_t)(unsigned long long *, size_t);

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	long n = atol(argv[2]);
	size_t size = (size_t)atol(argv[3]);
	htoda_t htoda = (htoda_t)dlsym(lib, "cuMemcpyHtoDAsync_v2");
	alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
	if (!htoda || !alloc || n <= 0 || size == 0)
		return 1;
	unsigned long long dst = 0;
	alloc(&dst, size);
	unsigned char *src = malloc(size);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (long i = 0; i < 1000; i++)
		htoda(dst, src, size, 0);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(src, &x, 8);
		htoda(dst, src, size, 0);
	}
	double t = now() - t0;
	printf("{\"calls\": %ld, \"bytes\": %zu, \"ns_per_call\": %.1f}\n", n, size, t * 1e9 / n);
	return 0;
}
