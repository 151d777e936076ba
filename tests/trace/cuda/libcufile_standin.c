/* A stand-in for GPUDirect Storage's libcufile.so.0 (built by tests/trace/uploads.rs
 * beside the stand-in libcuda.so.1): cuFileHandleRegister keeps the fd of a descriptor,
 * cuFileRead reads the file's bytes (pread) straight into the stand-in device memory
 * (`standin_shadow` of the stand-in libcuda, loaded RTLD_GLOBAL by the uploader), as a
 * DMA from storage would: no host buffer, no cuMemcpyHtoD. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct {
	int err;
	int cu_err;
} CUfileError_t;

typedef struct {
	int type; /* 1: CU_FILE_HANDLE_TYPE_OPAQUE_FD */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} CUfileDescr_t;

typedef void *CUfileHandle_t;

struct handle {
	int fd;
};

/* From the stand-in libcuda: the bytes of device range [d, d + n), or NULL. */
extern unsigned char *standin_shadow(unsigned long long d, size_t n);

#define NOINLINE __attribute__((noinline, visibility("default")))

NOINLINE CUfileError_t cuFileDriverOpen(void)
{
	CUfileError_t ok = { 0, 0 };
	return ok;
}

NOINLINE CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *d)
{
	CUfileError_t r = { 0, 0 };
	if (d->type != 1) {
		r.err = 5030; /* CU_FILE_INVALID_VALUE */
		return r;
	}
	struct handle *h = malloc(sizeof *h);
	h->fd = d->handle.fd;
	*fh = h;
	return r;
}

NOINLINE void cuFileHandleDeregister(CUfileHandle_t fh)
{
	free(fh);
}

NOINLINE ssize_t cuFileRead(CUfileHandle_t fh, void *dev, size_t n, off_t file_offset,
			    off_t dev_offset)
{
	struct handle *h = fh;
	unsigned char *to = standin_shadow((uintptr_t)dev + dev_offset, n);
	if (!to)
		return -1;
	size_t done = 0;
	while (done < n) {
		ssize_t r = pread(h->fd, to + done, n - done, file_offset + done);
		if (r <= 0)
			break;
		done += r;
	}
	return done;
}
