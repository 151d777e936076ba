#!/usr/bin/env bash
# Writes the golden vectors of formats::repack (formats/tests/fixtures/repack/): random source
# tensors in GGUF byte order (NAME.in) and the bytes ggml's own CPU repack made of them
# (NAME.out), through tests/runtimes/repack_dump built by scripts/llama-cache.sh (x86 AVX2,
# no AMX, no AVX-512). MANIFEST lists them for the Rust test, each with how it was made:
#   buffer  the path llama.cpp takes: a tensor in ggml's CPU_REPACK buffer, repacked by
#           ggml_backend_tensor_set with the layout ggml chose for this build (checked against
#           ggml's log line); this build chooses the *_8x8 layouts
#   direct  ggml's repack function of the named layout called directly (the ARM layouts,
#           compiled on x86 too but never chosen here)
# REPACK_DUMP names another repack_dump binary (then the cache is not built).
# The AMX buffer's layouts have their own script, scripts/amx-golden.sh (another ggml-cpu
# build, with AVX-512 and AMX).
#
#   scripts/repack-golden.sh            rewrite the fixtures
#   scripts/repack-golden.sh --check    fresh random inputs into a temporary directory, then
#                                       the Rust test against them (TWOFOLD_REPACK_FIXTURES)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${REPACK_DUMP:-}" ]; then
    dump=$REPACK_DUMP
else
    dump=$("$repo/scripts/llama-cache.sh" ggml)/bin/repack_dump
fi
out=$repo/formats/tests/fixtures/repack
[ "${1:-}" = --check ] && out=$(mktemp -d)

mkdir -p "$out"
# layout ggml-type rows cols via   (small: a few row groups and block columns)
cases="q4_0_8x8 q4_0 16 96 buffer
q4_K_8x8 q4_K 8 512 buffer
iq4_nl_8x8 iq4_nl 16 64 buffer
mxfp4_8x8 mxfp4 8 128 buffer
q4_0_4x4 q4_0 8 64 direct
q4_0_4x8 q4_0 8 64 direct
q4_K_8x4 q4_K 8 512 direct
iq4_nl_4x4 iq4_nl 8 64 direct
mxfp4_4x4 mxfp4 8 64 direct
q8_0_4x4 q8_0 8 64 direct
q8_0_4x8 q8_0 12 64 direct"

{
    echo "# layout ggml-type rows cols via: LAYOUT.in (GGUF order), LAYOUT.out (ggml's repacked bytes)"
    echo "# made by scripts/repack-golden.sh: llama-cpp-python 0.3.36 (llama.cpp 0c1e570), x86 AVX2 without AMX"
} >"$out/MANIFEST"

seed=1
[ "${1:-}" = --check ] && seed=$((RANDOM + 100))
while read -r layout type rows cols via; do
    stem=$layout
    python3 - "$type" "$rows" "$cols" "$seed" "$out/$stem.in" <<'EOF'
import random, sys
ty, rows, cols, seed, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
elems, size = {"q4_0": (32, 18), "q4_K": (256, 144), "iq4_nl": (32, 18), "mxfp4": (32, 17),
               "q8_0": (32, 34)}[ty]
data = random.Random(seed).randbytes(rows * cols // elems * size)
open(path, "wb").write(data)
EOF
    if [ "$via" = buffer ]; then
        log=$("$dump" "$type" "$rows" "$cols" "$out/$stem.in" "$out/$stem.out" 2>&1)
        # ggml logs the layout it chose (GGML_LOG_DEBUG in tensor_traits::repack)
        case "$log" in
            *"with $layout"*) ;;
            *) echo "repack-golden: expected layout '$layout' for $type, ggml said: $log" >&2; exit 1 ;;
        esac
    else
        "$dump" "$type" "$rows" "$cols" "$out/$stem.in" "$out/$stem.out" "$layout"
    fi
    echo "$layout ${type^^} $rows $cols $via" >>"$out/MANIFEST"
    seed=$((seed + 1))
done <<<"$cases"

echo "repack-golden: wrote $(ls "$out" | wc -l) files to $out" >&2
if [ "${1:-}" = --check ]; then
    cd "$repo"
    TWOFOLD_REPACK_FIXTURES=$out cargo test -p twofold-formats --lib repack::tests::matches_bytes_ggml_wrote
    rm -rf "$out"
fi
