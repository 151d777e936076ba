/* A loader that "uploads" a model file through the stand-in driver library
 * (tests/trace/uploads.rs). Usage:
 *   uploader LIB MODE FILE OFF:LEN[,OFF:LEN...]
 * MODE: heap     read the whole file into the heap, cuMemcpyHtoD_v2 each range;
 *       staging  pread each range into one reused buffer, cuMemcpyHtoDAsync_v2;
 *       chunks   as staging, in copies of 200 bytes (UPLOADER_CHUNK) each;
 *       random   the same sizes from a heap buffer of random bytes;
 *       widen    each range (F16) widened to F32 in the heap, then uploaded;
 *       register map the file shared, cuMemHostRegister_v2 of each range;
 *       tiny     a serving loop: UPLOADER_STEPS (20,000) copies of 200 bytes, refilled
 *                per step, from one buffer to one device allocation (ranges ignored).
 * Says `armed`, waits for a line, loads LIB (dlopen), works, says `ready`, and
 * waits for stdin to close. */
#include <dlfcn.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*htod_t)(unsigned long long, const void *, size_t);
typedef int (*htoda_t)(unsigned long long, const void *, size_t, void *);
typedef int (*reg_t)(void *, size_t, unsigned);

static float half_to_float(uint16_t h)
{
	uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
	if (e == 0) {
		if (m == 0) {
			u = s;
		} else {
			float f = ldexpf((float)m, -24);
			memcpy(&u, &f, 4);
			u |= s;
		}
	} else if (e == 31) {
		u = s | 0x7f800000 | (m << 13);
	} else {
		u = s | ((e + 112) << 23) | (m << 13);
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

int main(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	setvbuf(stdout, NULL, _IONBF, 0);
	char line[16];
	printf("armed\n");
	if (!fgets(line, sizeof line, stdin))
		return 1;
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
	htod_t htod = (htod_t)dlsym(lib, "cuMemcpyHtoD_v2");
	htoda_t htoda = (htoda_t)dlsym(lib, "cuMemcpyHtoDAsync_v2");
	reg_t reg = (reg_t)dlsym(lib, "cuMemHostRegister_v2");
	const char *mode = argv[2];
	int fd = open(argv[3], O_RDONLY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st))
		return 1;
	size_t size = st.st_size;
	unsigned char *whole = NULL, *stage = NULL, *map = NULL;
	if (!strcmp(mode, "heap") || !strcmp(mode, "widen") || !strcmp(mode, "random")) {
		whole = malloc(size);
		if (!strcmp(mode, "random")) {
			int r = open("/dev/urandom", O_RDONLY);
			for (size_t d = 0; d < size;) {
				ssize_t n = read(r, whole + d, size - d);
				if (n <= 0)
					return 1;
				d += n;
			}
			close(r);
		} else {
			for (size_t d = 0; d < size;) {
				ssize_t n = pread(fd, whole + d, size - d, d);
				if (n <= 0)
					return 1;
				d += n;
			}
		}
	} else if (!strcmp(mode, "staging") || !strcmp(mode, "chunks")) {
		stage = malloc(64 << 20);
	} else if (!strcmp(mode, "register")) {
		map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED)
			return 1;
	}
	if (!strcmp(mode, "tiny")) {
		long steps = getenv("UPLOADER_STEPS") ? atol(getenv("UPLOADER_STEPS")) : 20000;
		unsigned long long d = 0;
		unsigned char in[200];
		uint64_t x = 0x9e3779b97f4a7c15ull;
		alloc(&d, sizeof in);
		for (long i = 0; i < steps; i++) {
			for (size_t j = 0; j < sizeof in; j += 8) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				memcpy(in + j, &x, 8);
			}
			htoda(d, in, sizeof in, NULL);
		}
	}
	for (char *tok = strtok(argv[4], ","); tok && strcmp(mode, "tiny"); tok = strtok(NULL, ",")) {
		unsigned long long off, len, d = 0;
		if (sscanf(tok, "%llu:%llu", &off, &len) != 2)
			return 2;
		if (!strcmp(mode, "register")) {
			reg(map + off, len, 0);
			continue;
		}
		if (!strcmp(mode, "widen")) {
			float *w = malloc(len * 2);
			for (size_t i = 0; i < len / 2; i++) {
				uint16_t h;
				memcpy(&h, whole + off + 2 * i, 2);
				w[i] = half_to_float(h);
			}
			alloc(&d, len * 2);
			htod(d, w, len * 2);
			free(w);
			continue;
		}
		alloc(&d, len);
		if (stage) {
			if (pread(fd, stage, len, off) != (ssize_t)len)
				return 1;
			size_t c = len;
			if (!strcmp(mode, "chunks"))
				c = getenv("UPLOADER_CHUNK") ? (size_t)atol(getenv("UPLOADER_CHUNK")) : 200;
			for (size_t p = 0; p < len; p += c)
				htoda(d + p, stage + p, len - p < c ? len - p : c, NULL);
		} else {
			htod(d, whole + off, len);
		}
	}
	printf("ready\n");
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
