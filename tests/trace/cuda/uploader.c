/* A loader that "uploads" a model file through the stand-in driver library
 * (tests/trace/uploads.rs). Usage:
 *   uploader LIB MODE FILE OFF:LEN[,OFF:LEN...]
 * MODE: heap     read the whole file into the heap, cuMemcpyHtoD_v2 each range;
 *       staging  pread each range into one reused buffer, cuMemcpyHtoDAsync_v2;
 *       chunks   as staging, in copies of 200 bytes (UPLOADER_CHUNK) each;
 *       random   the same sizes from a heap buffer of random bytes;
 *       widen    each range (F16) widened to F32 in the heap, then uploaded;
 *       narrow   each range (F32) narrowed to BF16 (round to nearest even), uploaded;
 *       gds      GPUDirect Storage: the stand-in libcufile.so.0 beside LIB reads each
 *                range straight into device memory (cuFileHandleRegister, cuFileRead);
 *       register map the file shared, cuMemHostRegister_v2 of each range;
 *       tiny     a serving loop: UPLOADER_STEPS (20,000) copies of 200 bytes, refilled
 *                per step, from one buffer to one device allocation (ranges ignored).
 * UPLOADER_CLOSE=1 closes the file once read (heap, widen, narrow: as torch.load
 * does). UPLOADER_CLONE=dtod|dtoda|peer|peera|copy|copya clones each uploaded range
 * on the device into an allocation of its own (cuMemcpyDtoD_v2, cuMemcpyDtoDAsync_v2,
 * cuMemcpyPeer, cuMemcpyPeerAsync, cuMemcpy, cuMemcpyAsync), its first
 * UPLOADER_CLONE_BYTES bytes (default: all of it).
 * Says `armed`, waits for a line, loads LIB (dlopen), works, says `ready`, then
 * answers lines until stdin closes: `free` frees the clones (says `freed`), `dump`
 * writes the stand-in's device memory to UPLOADER_DUMP (says `dumped`), `overwrite`
 * writes pseudo-random bytes over the first half of each upload (cuMemcpyHtoD_v2, says
 * `overwritten`), `unload` frees each upload's allocation (says `unloaded`). */
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
typedef int (*free_t)(unsigned long long);
typedef int (*dtod_t)(unsigned long long, unsigned long long, size_t);
typedef int (*dtoda_t)(unsigned long long, unsigned long long, size_t, void *);
typedef int (*peer_t)(unsigned long long, void *, unsigned long long, void *, size_t);
typedef int (*peera_t)(unsigned long long, void *, unsigned long long, void *, size_t, void *);
typedef int (*dump_t)(const char *);
typedef struct {
	int err, cu_err;
} cufile_err_t;
typedef struct {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} cufile_descr_t;
typedef cufile_err_t (*cufile_open_t)(void);
typedef cufile_err_t (*cufile_reg_t)(void **, cufile_descr_t *);
typedef ssize_t (*cufile_read_t)(void *, void *, size_t, off_t, off_t);

static void *lib;
static unsigned long long clones[4096];
static int nclones;
static unsigned long long ups[4096];
static size_t uplens[4096];
static int nups;

/* Clones `len` device bytes at `d` into an allocation of its own, as UPLOADER_CLONE says. */
static void clone_range(alloc_t alloc, unsigned long long d, size_t len)
{
	const char *how = getenv("UPLOADER_CLONE");
	if (!how || nclones == 4096)
		return;
	size_t n = getenv("UPLOADER_CLONE_BYTES") ? (size_t)atol(getenv("UPLOADER_CLONE_BYTES")) : len;
	if (n > len)
		n = len;
	unsigned long long c = 0;
	alloc(&c, n);
	clones[nclones++] = c;
	if (!strcmp(how, "dtod"))
		((dtod_t)dlsym(lib, "cuMemcpyDtoD_v2"))(c, d, n);
	else if (!strcmp(how, "dtoda"))
		((dtoda_t)dlsym(lib, "cuMemcpyDtoDAsync_v2"))(c, d, n, NULL);
	else if (!strcmp(how, "peer"))
		((peer_t)dlsym(lib, "cuMemcpyPeer"))(c, NULL, d, NULL, n);
	else if (!strcmp(how, "peera"))
		((peera_t)dlsym(lib, "cuMemcpyPeerAsync"))(c, NULL, d, NULL, n, NULL);
	else if (!strcmp(how, "copy"))
		((dtod_t)dlsym(lib, "cuMemcpy"))(c, d, n);
	else if (!strcmp(how, "copya"))
		((dtoda_t)dlsym(lib, "cuMemcpyAsync"))(c, d, n, NULL);
}

/* Remembers the upload of `len` device bytes at `d`, then clones it. */
static void uploaded(alloc_t alloc, unsigned long long d, size_t len)
{
	if (nups < 4096) {
		ups[nups] = d;
		uplens[nups++] = len;
	}
	clone_range(alloc, d, len);
}

/* F32 to BF16, round to nearest even (finite values). */
static uint16_t bf16(uint32_t u)
{
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

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
	const char *mode = argv[2];
	int gds = !strcmp(mode, "gds");
	/* GPUDirect Storage: libcufile reads into the stand-in's device memory. */
	lib = dlopen(argv[1], RTLD_NOW | (gds ? RTLD_GLOBAL : 0));
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
	htod_t htod = (htod_t)dlsym(lib, "cuMemcpyHtoD_v2");
	htoda_t htoda = (htoda_t)dlsym(lib, "cuMemcpyHtoDAsync_v2");
	reg_t reg = (reg_t)dlsym(lib, "cuMemHostRegister_v2");
	int fd = open(argv[3], O_RDONLY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st))
		return 1;
	size_t size = st.st_size;
	unsigned char *whole = NULL, *stage = NULL, *map = NULL;
	if (!strcmp(mode, "heap") || !strcmp(mode, "widen") || !strcmp(mode, "random") ||
	    !strcmp(mode, "narrow")) {
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
			if (getenv("UPLOADER_CLOSE"))
				close(fd), fd = -1;
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
	void *cufile = NULL, *fh = NULL;
	cufile_read_t cuf_read = NULL;
	if (gds) {
		char path[4096];
		snprintf(path, sizeof path, "%s", argv[1]);
		char *slash = strrchr(path, '/');
		snprintf(slash ? slash + 1 : path, sizeof path - (slash ? slash + 1 - path : 0),
			 "libcufile.so.0");
		void *cuf = dlopen(path, RTLD_NOW);
		if (!cuf) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		((cufile_open_t)dlsym(cuf, "cuFileDriverOpen"))();
		cufile_descr_t descr = { .type = 1 };
		descr.handle.fd = fd;
		if (((cufile_reg_t)dlsym(cuf, "cuFileHandleRegister"))(&fh, &descr).err)
			return 1;
		cuf_read = (cufile_read_t)dlsym(cuf, "cuFileRead");
		cufile = cuf;
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
			uploaded(alloc, d, len * 2);
			continue;
		}
		if (!strcmp(mode, "narrow")) {
			uint16_t *b = malloc(len / 2);
			for (size_t i = 0; i < len / 4; i++) {
				uint32_t u;
				memcpy(&u, whole + off + 4 * i, 4);
				b[i] = bf16(u);
			}
			alloc(&d, len / 2);
			htod(d, b, len / 2);
			free(b);
			uploaded(alloc, d, len / 2);
			continue;
		}
		alloc(&d, len);
		if (cufile) {
			if (cuf_read(fh, (void *)(uintptr_t)d, len, off, 0) != (ssize_t)len)
				return 1;
		} else if (stage) {
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
		uploaded(alloc, d, len);
	}
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		if (!strncmp(line, "free", 4)) {
			free_t fr = (free_t)dlsym(lib, "cuMemFree_v2");
			for (int i = 0; i < nclones; i++)
				fr(clones[i]);
			nclones = 0;
			printf("freed\n");
		} else if (!strncmp(line, "dump", 4)) {
			dump_t dump = (dump_t)dlsym(lib, "standin_dump");
			const char *to = getenv("UPLOADER_DUMP");
			printf("%s\n", dump && to && dump(to) == 0 ? "dumped" : "no dump");
		} else if (!strncmp(line, "overwrite", 9)) {
			htod_t put = (htod_t)dlsym(lib, "cuMemcpyHtoD_v2");
			srand(7);
			for (int i = 0; i < nups; i++) {
				size_t n = uplens[i] / 2;
				unsigned char *junk = malloc(n ? n : 1);
				for (size_t k = 0; k < n; k++)
					junk[k] = (unsigned char)rand();
				put(ups[i], junk, n);
				free(junk);
			}
			printf("overwritten\n");
		} else if (!strncmp(line, "unload", 6)) {
			free_t fr = (free_t)dlsym(lib, "cuMemFree_v2");
			for (int i = 0; i < nups; i++)
				fr(ups[i]);
			nups = 0;
			printf("unloaded\n");
		}
	}
	return 0;
}
