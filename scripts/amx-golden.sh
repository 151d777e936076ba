#!/usr/bin/env bash
# Writes the golden vectors of formats::repack::amx (formats/tests/fixtures/repack/amx/):
# random source tensors in GGUF byte order (LAYOUT.in) and the bytes ggml's own AMX packing
# made of them (LAYOUT.out), through tests/runtimes/amx_dump. MANIFEST lists them for the
# Rust test, each with how amx_dump reached ggml's code:
#   buffer  the path llama.cpp takes: a tensor in ggml's AMX buffer, set with
#           ggml_backend_tensor_set (only where the kernel grants AMX tile state)
#   direct  ggml_backend_amx_get_alloc_size + ggml_backend_amx_convert_weight called directly
#           (what that buffer's get_alloc_size and set_tensor call); the packing itself runs
#           AVX2/AVX-512 code only, so it runs on machines that raise SIGILL on AMX
#
# Not part of the default test command: it builds a second ggml-cpu, with GGML_AMX_INT8=ON
# and AVX-512 (scripts/llama-cache.sh's build has neither), from the llama.cpp source that
# scripts/llama-cache.sh keeps (fetched by it if absent), into a temporary directory removed
# on exit (AMX_BUILD=DIR keeps it there instead): 90 s for `--check` on the 2-core machine.
# AMX_DUMP names an amx_dump binary already built (then nothing is built). The machine must
# run AVX-512 (F, BW, VL, DQ, VNNI) code.
#
#   scripts/amx-golden.sh            rewrite the fixtures
#   scripts/amx-golden.sh --check    fresh random inputs into a temporary directory, then the
#                                    Rust test against them (TWOFOLD_AMX_FIXTURES)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -n "${AMX_DUMP:-}" ]; then
    dump=$AMX_DUMP
else
    src=$("$repo/scripts/llama-cache.sh" path)/src/llama.cpp
    [ -f "$src/CMakeLists.txt" ] || "$repo/scripts/llama-cache.sh" ggml >/dev/null
    build=${AMX_BUILD:-$tmp/build}
    if [ ! -f "$build/ggml/src/libggml-cpu.a" ]; then
        echo "amx-golden: building ggml-cpu with AMX into $build" >&2
        cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
            -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=ON \
            -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
            >"$tmp/configure.log"
        nice cmake --build "$build" -j "${JOBS:-$(nproc)}" --target ggml-cpu ggml-base \
            >"$tmp/build.log"
    fi
    dump=$tmp/amx_dump
    g++ -O1 -std=c++17 -I"$src/ggml/include" "$repo/tests/runtimes/amx_dump.cpp" \
        "$build/ggml/src/libggml-cpu.a" "$build/ggml/src/libggml-base.a" -lpthread -lm -o "$dump"
fi

out=$repo/formats/tests/fixtures/repack/amx
[ "${1:-}" = --check ] && out=$tmp/fixtures
mkdir -p "$out"

# layout ggml-type rows cols: rows a multiple of 32 (what llama.cpp places in the AMX buffer),
# two row groups of 16 and a few block columns
cases="amx_q4_0 q4_0 32 96
amx_q4_1 q4_1 32 96
amx_q8_0 q8_0 32 96
amx_q4_K q4_K 32 512
amx_q5_K q5_K 32 512
amx_q6_K q6_K 32 512
amx_iq4_xs iq4_xs 32 512"

{
    echo "# layout ggml-type rows cols via: LAYOUT.in (GGUF order), LAYOUT.out (ggml's AMX-packed bytes)"
    echo "# made by scripts/amx-golden.sh: llama-cpp-python 0.3.36 (llama.cpp 0c1e570), ggml-cpu with AVX-512 and GGML_AMX_INT8"
} >"$out/MANIFEST"

seed=101
[ "${1:-}" = --check ] && seed=$((RANDOM + 1000))
while read -r layout type rows cols; do
    python3 - "$type" "$rows" "$cols" "$seed" "$out/$layout.in" <<'EOF'
import random, sys
ty, rows, cols, seed, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
elems, size = {"q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34), "q4_K": (256, 144),
               "q5_K": (256, 176), "q6_K": (256, 210), "iq4_xs": (256, 136)}[ty]
data = random.Random(seed).randbytes(rows * cols // elems * size)
open(path, "wb").write(data)
EOF
    log=$("$dump" "$type" "$rows" "$cols" "$out/$layout.in" "$out/$layout.out" 2>&1)
    case "$log" in
        *"amx_dump: via buffer"*) via=buffer ;;
        *"amx_dump: via direct"*) via=direct ;;
        *) echo "amx-golden: amx_dump failed for $type: $log" >&2; exit 1 ;;
    esac
    echo "$layout ${type^^} $rows $cols $via" >>"$out/MANIFEST"
    seed=$((seed + 1))
done <<<"$cases"

echo "amx-golden: wrote $(ls "$out" | wc -l) files to $out" >&2
if [ "${1:-}" = --check ]; then
    cd "$repo"
    TWOFOLD_AMX_FIXTURES=$out cargo test -p twofold-formats --lib repack::amx::tests::matches_bytes_ggml_wrote
fi
