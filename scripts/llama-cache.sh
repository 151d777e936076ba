#!/usr/bin/env bash
# Builds llama.cpp from source once into a cache directory, for tests that need the real
# runtime; later calls reuse what is there and print the same paths.
#
#   scripts/llama-cache.sh ggml    ggml-base + ggml-cpu (static) and tests/runtimes/repack_dump
#   scripts/llama-cache.sh tools   the above, plus llama-simple, llama-completion, llama-quantize
#   scripts/llama-cache.sh server  the above, plus llama-server (bench/runtimes.sh; the build
#                                  is configured again with the server on, nothing rebuilt)
#
# (In this llama.cpp, llama-cli is a client of llama-server's code and needs the server
# build; llama-completion is the former llama-cli: prompt in, tokens out, `-no-repack`.)
#   scripts/llama-cache.sh path    prints the cache directory and exits
#
# The source is llama.cpp as vendored by the PyPI sdist of llama-cpp-python (network access
# here is to package registries only); the sources stay in the cache, never in the repo.
# Build: x86-64 AVX2 without AVX-512 and without AMX (AMX raises SIGILL on these machines,
# see /work/shared/notes/platform-facts.md), GGML_NATIVE=OFF, CPU only, no curl, no OpenMP.
# That build picks the repack layouts q4_0_8x8, q4_K_8x8, iq4_nl_8x8 and mxfp4_8x8.
#
# Environment:
#   TWOFOLD_LLAMA_CACHE   cache directory (default: <repo>/target/llama-cache)
#   LLAMA_SDIST           a llama_cpp_python-*.tar.gz already downloaded (skips the download)
#   JOBS                  parallel compile jobs (default: nproc)
#
# Measured on the 2-core development VM (shared with other builds, JOBS=2): ggml-cpu and
# ggml-base 90-115 s; then llama-simple 439 s (libllama and common), llama-completion 383 s,
# llama-quantize 3 s: `tools` from nothing about 15 minutes. A second call with everything
# present returns in 0.01 s.
set -euo pipefail

VERSION=0.3.36   # llama-cpp-python; vendors llama.cpp 0c1e570
SDIST_SHA256=""  # filled from the registry's metadata when the download is not pip's

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${TWOFOLD_LLAMA_CACHE:-$repo/target/llama-cache}
what=${1:-ggml}
jobs=${JOBS:-$(nproc)}

case "$what" in
    path) if [ "$what" = server ] && [ ! -x "$bin/llama-server" ]; then
    cmake -S "$src" -B "$build" -DLLAMA_BUILD_SERVER=ON >>"$cache/configure.log"
    timed nice cmake --build "$build" -j "$jobs" --target llama-server >"$cache/build-llama-server.log"
    cp "$build/bin/llama-server" "$bin/llama-server"
fi

echo "$cache"; exit 0 ;;
    ggml|tools|server) ;;
    *) echo "usage: $0 ggml|tools|server|path" >&2; exit 2 ;;
esac

mkdir -p "$cache"
src=$cache/src/llama.cpp
build=$cache/build
bin=$cache/bin

fetch_source() {
    [ -f "$src/CMakeLists.txt" ] && return 0
    local tarball=${LLAMA_SDIST:-}
    if [ -z "$tarball" ]; then
        mkdir -p "$cache/dl"
        tarball=$(ls "$cache"/dl/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)
    fi
    if [ -z "$tarball" ]; then
        echo "llama-cache: downloading llama-cpp-python $VERSION (sdist) from PyPI" >&2
        if ! pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$VERSION" -d "$cache/dl" 2>"$cache/dl/pip.log"; then
            # pip prepares the package's metadata, which needs its build backend; the file
            # itself comes from the registry's JSON API, checked against its sha256
            local meta url
            # (the project's JSON, not the version's: a registry mirror may serve only the
            # former, with links relative to it)
            local index=https://pypi.org/pypi/llama-cpp-python/json
            meta=$(curl -fsS "$index")
            url=$(printf '%s' "$meta" | python3 -c 'import json,sys,urllib.parse
for u in json.load(sys.stdin)["releases"][sys.argv[2]]:
    if u["packagetype"] == "sdist": print(urllib.parse.urljoin(sys.argv[1], u["url"]), u["digests"]["sha256"])' "$index" "$VERSION")
            SDIST_SHA256=${url#* }
            curl -fsSL -o "$cache/dl/llama_cpp_python-$VERSION.tar.gz" "${url%% *}"
            echo "$SDIST_SHA256  $cache/dl/llama_cpp_python-$VERSION.tar.gz" | sha256sum -c --quiet
        fi
        tarball=$cache/dl/llama_cpp_python-$VERSION.tar.gz
    fi
    echo "llama-cache: unpacking vendor/llama.cpp from $(basename "$tarball")" >&2
    rm -rf "$cache/src.tmp" && mkdir -p "$cache/src.tmp"
    tar -xzf "$tarball" -C "$cache/src.tmp" --wildcards '*/vendor/llama.cpp/*'
    mkdir -p "$cache/src"
    mv "$cache"/src.tmp/*/vendor/llama.cpp "$src"
    # a submodule's gitfile pointing into the sdist's absent .git: cmake's git calls fail on it
    [ -f "$src/.git" ] && rm -f "$src/.git"
    rm -rf "$cache/src.tmp"
}

need_cmake() {
    if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
        echo "llama-cache: installing cmake and ninja from PyPI" >&2
        pip install --quiet cmake ninja
    fi
}

configure() {
    [ -f "$build/build.ninja" ] && return 0
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON >"$cache/configure.log"
}

timed() {
    local start=$SECONDS
    "$@"
    echo "llama-cache: '$*' took $((SECONDS - start)) s" >&2
}

fetch_source
need_cmake
configure
mkdir -p "$bin"

if [ ! -x "$bin/repack_dump" ] || [ "$repo/tests/runtimes/repack_dump.cpp" -nt "$bin/repack_dump" ]; then
    timed nice cmake --build "$build" -j "$jobs" --target ggml-cpu ggml-base >"$cache/build-ggml.log"
    g++ -O1 -std=c++17 -I"$src/ggml/include" "$repo/tests/runtimes/repack_dump.cpp" \
        "$build/ggml/src/libggml-cpu.a" "$build/ggml/src/libggml-base.a" -lpthread -lm \
        -o "$bin/repack_dump"
fi

if [ "$what" = tools ] || [ "$what" = server ]; then
    for t in llama-simple llama-completion llama-quantize; do
        if [ ! -x "$bin/$t" ]; then
            timed nice cmake --build "$build" -j "$jobs" --target "$t" >"$cache/build-$t.log"
            cp "$build/bin/$t" "$bin/$t"
        fi
    done
fi

if [ "$what" = server ] && [ ! -x "$bin/llama-server" ]; then
    cmake -S "$src" -B "$build" -DLLAMA_BUILD_SERVER=ON >>"$cache/configure.log"
    timed nice cmake --build "$build" -j "$jobs" --target llama-server >"$cache/build-llama-server.log"
    cp "$build/bin/llama-server" "$bin/llama-server"
fi

echo "$cache"
