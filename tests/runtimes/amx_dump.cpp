// amx_dump: run ggml's own AMX weight packing (ggml-cpu/amx/mmq.cpp) on a quantised tensor and
// dump the packed bytes, for twofold's `formats::repack::amx` tests.
//
// usage: amx_dump TYPE ROWS COLS IN OUT
//   TYPE    a ggml type name as ggml_type_name() spells it (q4_0, q4_1, q8_0, q4_K, q5_K,
//           q6_K, iq4_xs)
//   IN      ROWS x (COLS / block elements) source blocks, as a GGUF stores them
//   OUT     written with the packed bytes: ggml_backend_amx_get_alloc_size() of them
//
// Needs a ggml-cpu built with GGML_AMX_INT8=ON and AVX512-VNNI (the AMX sources compile to
// nothing otherwise); scripts/amx-golden.sh builds one. Two paths, the first that exists:
//   buffer  the path llama.cpp takes: the CPU backend's extra buffer type "AMX" (listed through
//           ggml_backend_dev_get_extra_bufts), a tensor allocated in it and set with
//           ggml_backend_tensor_set (ggml_backend_amx_buffer_set_tensor, which calls
//           ggml_backend_amx_convert_weight). ggml lists that buffer type only where the kernel
//           grants AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM).
//   direct  where it does not (a CPU or VM without AMX): the two functions that buffer type
//           calls, ggml_backend_amx_get_alloc_size() and ggml_backend_amx_convert_weight(),
//           called on a tensor whose data is a buffer of that size. The packing runs AVX2 and
//           AVX-512 (VNNI for Q8_0's compensation), no AMX instruction. These are
//           ggml-internal symbols (amx/mmq.h), declared here.
// The path taken is printed on stderr ("amx_dump: via buffer" / "amx_dump: via direct").
// Exit status: 0 written, 2 usage or I/O error, 4 unknown type, 5 not a type AMX packs.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// ggml-cpu/amx/mmq.h (C++ linkage, defined when __AMX_INT8__ and __AVX512VNNI__)
size_t ggml_backend_amx_get_alloc_size(const struct ggml_tensor * tensor);
void   ggml_backend_amx_convert_weight(struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);

typedef ggml_backend_buffer_type_t * (*extra_bufts_fn)(ggml_backend_dev_t);

static bool read_all(const char * path, std::vector<unsigned char> & out) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        return false;
    }
    unsigned char buf[65536];
    size_t        n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        out.insert(out.end(), buf, buf + n);
    }
    bool ok = !ferror(f);
    fclose(f);
    return ok;
}

static bool write_all(const char * path, const void * data, size_t n) {
    FILE * f = fopen(path, "wb");
    if (!f) {
        return false;
    }
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static ggml_backend_buffer_type_t amx_buft() {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    auto get = (extra_bufts_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) {
        return nullptr;
    }
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "AMX") == 0) {
            return *b;
        }
    }
    return nullptr;
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS IN OUT\n", argv[0]);
        return 2;
    }
    ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * name = ggml_type_name((ggml_type) t);
        if (name && strcmp(name, argv[1]) == 0) {
            type = (ggml_type) t;
        }
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown ggml type '%s'\n", argv[1]);
        return 4;
    }
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K:
        case GGML_TYPE_IQ4_XS:
            break;
        default:
            fprintf(stderr, "ggml's AMX buffer does not pack '%s'\n", argv[1]);
            return 5;
    }
    const int64_t rows = atoll(argv[2]);
    const int64_t cols = atoll(argv[3]);

    std::vector<unsigned char> src;
    if (!read_all(argv[4], src)) {
        fprintf(stderr, "cannot read '%s'\n", argv[4]);
        return 2;
    }

    ggml_init_params params = { /*.mem_size =*/ggml_tensor_overhead() * 4, /*.mem_buffer =*/nullptr,
                                /*.no_alloc =*/true };
    ggml_context *   ctx    = ggml_init(params);
    ggml_tensor *    t      = ggml_new_tensor_2d(ctx, type, cols, rows);
    ggml_set_name(t, "blk.0.ffn_down.weight");
    if (src.size() != ggml_nbytes(t)) {
        fprintf(stderr, "'%s' has %zu bytes, a %s tensor of %lld x %lld needs %zu\n", argv[4], src.size(), argv[1],
                (long long) rows, (long long) cols, ggml_nbytes(t));
        return 2;
    }

    ggml_backend_buffer_type_t buft = amx_buft();
    if (buft) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            fprintf(stderr, "cannot allocate an AMX buffer\n");
            return 2;
        }
        const size_t size = ggml_backend_buft_get_alloc_size(buft, t);
        ggml_backend_tensor_set(t, src.data(), 0, src.size());
        fprintf(stderr, "amx_dump: via buffer (%zu bytes from %zu)\n", size, src.size());
        if (!write_all(argv[5], t->data, size)) {
            fprintf(stderr, "cannot write '%s'\n", argv[5]);
            return 2;
        }
        ggml_backend_buffer_free(buf);
    } else {
        const size_t size = ggml_backend_amx_get_alloc_size(t);
        // 64-byte aligned like ggml_aligned_malloc; pack_B uses unaligned stores anyway
        void *       data = aligned_alloc(64, (size + 63) / 64 * 64);
        if (!data) {
            fprintf(stderr, "cannot allocate %zu bytes\n", size);
            return 2;
        }
        memset(data, 0, size);
        t->data = data;
        ggml_backend_amx_convert_weight(t, src.data(), 0, src.size());
        fprintf(stderr, "amx_dump: via direct (%zu bytes from %zu)\n", size, src.size());
        if (!write_all(argv[5], data, size)) {
            fprintf(stderr, "cannot write '%s'\n", argv[5]);
            return 2;
        }
        t->data = nullptr;
        free(data);
    }
    ggml_free(ctx);
    return 0;
}
