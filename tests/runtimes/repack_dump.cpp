// repack_dump: run ggml's own CPU repack (ggml-cpu/repack.cpp) on a quantised tensor and
// dump the repacked bytes, for twofold's `formats::repack` tests.
//
// usage: repack_dump TYPE ROWS COLS IN OUT [LAYOUT]
//   TYPE    a ggml type name as ggml_type_name() spells it (q4_0, q4_K, iq4_nl, mxfp4, q8_0)
//   IN      ROWS x (COLS / block elements) source blocks, as a GGUF stores them
//   OUT     written with the repacked bytes
//   LAYOUT  absent: the path llama.cpp takes. The CPU backend's extra buffer types are listed
//           through ggml_backend_reg_get_proc_address("ggml_backend_dev_get_extra_bufts"),
//           the one named "CPU_REPACK" is taken, and a tensor allocated in it is repacked by
//           ggml_backend_tensor_set with the layout ggml chooses for this build (it logs
//           "repack tensor NAME with LAYOUT" on stderr).
//           present (q4_0_4x8, q8_0_4x4...): ggml's repack function of that layout is called
//           directly (ggml::cpu::repack::repack<BLOCK, INTER_SIZE, NB_COLS>, an exported
//           template specialisation of repack.cpp, built on every architecture), so the ARM
//           layouts run on x86 too. This relies on a ggml-internal symbol.
// Exit status: 0 written, 2 usage or I/O error, 3 no CPU_REPACK buffer type, 4 unknown type
// or layout, 5 ggml picks no layout, 6 ggml's repack refused the shape.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef ggml_backend_buffer_type_t * (*extra_bufts_fn)(ggml_backend_dev_t);

// ggml's block types, declared only to name the template specialisations (repack.h).
struct block_q4_0;
struct block_q4_K;
struct block_iq4_nl;
struct block_mxfp4;
struct block_q8_0;

namespace ggml::cpu::repack {
template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS>
int repack(struct ggml_tensor *, const void *, size_t);
}

typedef int (*repack_fn)(struct ggml_tensor *, const void *, size_t);

// NAME_RxC: R rows (NB_COLS), C bytes a chunk (INTER_SIZE), as ggml logs them.
static repack_fn layout_fn(const char * name) {
    using namespace ggml::cpu::repack;
    static const struct {
        const char * name;
        repack_fn    fn;
    } table[] = {
        { "q4_0_4x4", repack<block_q4_0, 4, 4> },     { "q4_0_4x8", repack<block_q4_0, 8, 4> },
        { "q4_0_8x8", repack<block_q4_0, 8, 8> },     { "q4_K_8x4", repack<block_q4_K, 4, 8> },
        { "q4_K_8x8", repack<block_q4_K, 8, 8> },     { "iq4_nl_4x4", repack<block_iq4_nl, 4, 4> },
        { "iq4_nl_8x8", repack<block_iq4_nl, 8, 8> }, { "mxfp4_4x4", repack<block_mxfp4, 4, 4> },
        { "mxfp4_8x8", repack<block_mxfp4, 8, 8> },   { "q8_0_4x4", repack<block_q8_0, 4, 4> },
        { "q8_0_4x8", repack<block_q8_0, 8, 4> },
    };
    for (const auto & e : table) {
        if (strcmp(e.name, name) == 0) {
            return e.fn;
        }
    }
    return nullptr;
}

static bool write_all(const char * path, const void * data, size_t n) {
    FILE * f = fopen(path, "wb");
    if (!f) {
        return false;
    }
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static ggml_backend_buffer_type_t repack_buft() {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    auto get = (extra_bufts_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) {
        return nullptr;
    }
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            return *b;
        }
    }
    return nullptr;
}

static bool read_all(const char * path, std::vector<unsigned char> & out) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        return false;
    }
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        out.insert(out.end(), buf, buf + n);
    }
    bool ok = !ferror(f);
    fclose(f);
    return ok;
}

int main(int argc, char ** argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS IN OUT [LAYOUT]\n", argv[0]);
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
    const int64_t rows = atoll(argv[2]);
    const int64_t cols = atoll(argv[3]);

    std::vector<unsigned char> src;
    if (!read_all(argv[4], src)) {
        fprintf(stderr, "cannot read '%s'\n", argv[4]);
        return 2;
    }

    if (argc == 7) {
        repack_fn fn = layout_fn(argv[6]);
        if (!fn) {
            fprintf(stderr, "unknown layout '%s'\n", argv[6]);
            return 4;
        }
        ggml_init_params params = { /*.mem_size =*/ ggml_tensor_overhead() * 4 + src.size() + 256,
                                    /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ false };
        ggml_context * ctx = ggml_init(params);
        ggml_tensor * t = ggml_new_tensor_2d(ctx, type, cols, rows);
        if (src.size() != ggml_nbytes(t)) {
            fprintf(stderr, "'%s' has %zu bytes, the tensor needs %zu\n", argv[4], src.size(), ggml_nbytes(t));
            return 2;
        }
        if (fn(t, src.data(), src.size()) != 0) {
            fprintf(stderr, "ggml's %s refused %lld x %lld\n", argv[6], (long long) rows, (long long) cols);
            return 6;
        }
        if (!write_all(argv[5], t->data, ggml_nbytes(t))) {
            fprintf(stderr, "cannot write '%s'\n", argv[5]);
            return 2;
        }
        ggml_free(ctx);
        return 0;
    }

    ggml_backend_buffer_type_t buft = repack_buft();
    if (!buft) {
        fprintf(stderr, "this ggml-cpu build has no CPU_REPACK buffer type\n");
        return 3;
    }

    ggml_init_params params = { /*.mem_size =*/ ggml_tensor_overhead() * 4, /*.mem_buffer =*/ nullptr,
                                /*.no_alloc =*/ true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * t = ggml_new_tensor_2d(ctx, type, cols, rows);
    ggml_set_name(t, "blk.0.ffn_down.weight");
    if ((size_t) src.size() != ggml_nbytes(t)) {
        fprintf(stderr, "'%s' has %zu bytes, a %s tensor of %lld x %lld needs %zu\n", argv[4], src.size(),
                argv[1], (long long) rows, (long long) cols, ggml_nbytes(t));
        return 2;
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (!buf) {
        fprintf(stderr, "cannot allocate a CPU_REPACK buffer\n");
        return 2;
    }
    if (t->extra == nullptr) {
        fprintf(stderr, "ggml picks no repack layout for %s %lld x %lld on this build\n", argv[1],
                (long long) rows, (long long) cols);
        return 5;
    }
    // set_tensor repacks (ggml_backend_cpu_repack_buffer_set_tensor); the buffer is host memory.
    ggml_backend_tensor_set(t, src.data(), 0, src.size());

    if (!write_all(argv[5], t->data, ggml_nbytes(t))) {
        fprintf(stderr, "cannot write '%s'\n", argv[5]);
        return 2;
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return 0;
}
