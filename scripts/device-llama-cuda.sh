#!/usr/bin/env bash
# Issue 44's second real runtime on a GPU: llama.cpp built there with CUDA from the source
# that the llama-cpp-python sdist vendors (the GPU machine has no network: the source
# travels as a tarball, made here by
#   tar -xzf llama_cpp_python-0.3.36.tar.gz --wildcards '*/vendor/llama.cpp/*'
#   tar --exclude=llama.cpp/{models,docs,media,benches,tests} -cJf .devcarry/llama-src.tar.xz llama.cpp
# about 8 MB), serving a small GGUF (tests/runtimes/tiny_llama.py, F16, 272 MiB) with every
# layer offloaded (-ngl 99), once mapped and once not (this llama.cpp's `--load-mode none`,
# formerly --no-mmap: its pinned CUDA_Host
# buffer), beside one resident upload tracer (`record --trace-uploads`, started first);
# then a plain `scan` and a plain `serve` read the tracer's ledger.
#
#   scripts/device-llama-cuda.sh build [DIR]   configure and build llama-server (CUDA, sm_90)
#                                              into /tmp/twofold-llama; log in build.log there
#   scripts/device-llama-cuda.sh run [DIR]     the two servers, the scans; raw results in $OUT
#
# DIR holds a stripped x86-64 release build of twofold and llama-src.tar.xz (default
# .devcarry), and PyYAML's pure-Python yaml/ where the GPU machine's Python has none. Truth: each server's own log lines ("CUDA0 model buffer size", "CPU_Mapped
# model buffer size", "CUDA_Host model buffer size"), nvidia-smi --query-compute-apps and
# fincore. $OUT gets scan.json, scan.txt, metrics.txt, logs.txt.
set -u
what=${1:-run}
BIN=$(cd "${2:-.devcarry}" && pwd)
OUT=${OUT:-./out}
L=/tmp/twofold-llama
mkdir -p "$OUT" "$L"

if [ "$what" = build ]; then
  T0=$SECONDS
  if [ ! -f "$L/src/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$L/src" && tar -xJf "$BIN/llama-src.tar.xz" -C "$L/src"
  fi
  cmake -S "$L/src/llama.cpp" -B "$L/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF > "$L/configure.log" 2>&1 \
    || { echo "build rc 1 (configure failed)" | tee -a "$L/build.log"; tail -30 "$L/configure.log" | tee -a "$L/build.log"; exit 1; }
  cmake --build "$L/build" -j "$(nproc)" --target llama-server > "$L/build.log" 2>&1
  rc=$?
  echo "build rc $rc in $((SECONDS - T0)) s" | tee -a "$L/build.log"
  [ $rc = 0 ] && touch "$L/built"
  exit $rc
fi

export PATH=$BIN:$PATH PYTHONUNBUFFERED=1 TWOFOLD_LLAMA_CACHE=$L
# gguf-py imports yaml; a GPU image's Python may lack it (DIR may carry PyYAML's pure-Python lib/yaml)
python3 -c "import yaml" 2>/dev/null || export PYTHONPATH=$BIN${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d /tmp/twofold-llcuda.XXXXXX)
export TWOFOLD_UPLOADS_DIR=$W/ledgers
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && export TWOFOLD_LIBCUDA=$c && break
done
for _ in $(seq 600); do { [ -f "$L/built" ] || grep -qs "^build rc" "$L/build.log"; } && break; sleep 1; done
[ -f "$L/built" ] || { echo "llama-server not built"; tail -20 "$L/build.log"; exit 1; }
SRV=$L/build/bin/llama-server
M=$W/model.gguf
python3 tests/runtimes/tiny_llama.py write "$M" 44 || exit 1
SIZE=$(stat -c %s "$M")
echo "model $M $SIZE bytes" > "$W/log.txt"
twofold record --trace-uploads --interval 2s --no-prove --store "$W/store" "$M" > "$W/record.log" 2>&1 & pids+=($!); REC=$!
for _ in $(seq 600); do ls "$TWOFOLD_UPLOADS_DIR"/*.json >/dev/null 2>&1 && break; sleep 0.1; done
ready() { for _ in $(seq 600); do curl -fsS "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
# -lv 4: the model loader's buffer-size lines are logged below the default verbosity.
"$SRV" -m "$M" -ngl 99 -c 512 -lv 4 --port 8091 > "$W/mmap.log" 2>&1 & pids+=($!); P1=$!
ready 8091 || echo "mmap server never ready" >> "$W/log.txt"
"$SRV" -m "$M" -ngl 99 -c 512 -lv 4 --load-mode none --port 8092 > "$W/nommap.log" 2>&1 & pids+=($!); P2=$!
ready 8092 || { echo "no-mmap server never ready (running: $(kill -0 $P2 2>/dev/null && echo yes || echo no))" >> "$W/log.txt"; }
for port in 8091 8092; do
  curl -fsS "http://127.0.0.1:$port/completion" -d '{"prompt":"hello","n_predict":8}' | head -c 300 >> "$W/log.txt"; echo >> "$W/log.txt"
done
echo "pids: mmap $P1, no-mmap $P2" >> "$W/log.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$W/smi.txt" 2>&1
if command -v fincore >/dev/null; then fincore -b -n -o RES,SIZE "$M"; else echo "no fincore here: twofold residency"; twofold residency "$M"; fi > "$W/fincore.txt" 2>&1
sleep 2  # the ledger is rewritten within 0.5 s of a change
twofold scan "$M" --json > "$OUT/scan.json" 2> "$W/scan.err"
twofold scan "$M" > "$OUT/scan.txt" 2>&1
twofold serve --listen 127.0.0.1:9467 --interval 2s --model-glob "$W/*.gguf" > "$W/serve.log" 2>&1 & pids+=($!); SV=$!
python3 - "$OUT/metrics.txt" <<'PY'
import sys, time, urllib.request
t0, text = time.time(), ""
while time.time() - t0 < 60:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9467/metrics").read().decode()
        if 'kind="device"' in text and "twofold_file_copies" in text:
            break
    except Exception as e:
        text = f"scrape failed: {e}"
    time.sleep(1)
open(sys.argv[1], "w").write("".join(l + "\n" for l in text.splitlines() if l.startswith("twofold_file")))
PY
kill -INT $SV; wait $SV 2>/dev/null
# The no-mmap server exits: its device copy leaves the plain scan.
kill -INT $P2; wait $P2 2>/dev/null
sleep 1
{ echo; echo "== after the --no-mmap server (pid $P2) exited"; twofold scan "$M" 2>&1; } >> "$OUT/scan.txt"
kill -INT $REC; wait $REC 2>/dev/null
echo "ledger files after record stopped: $(ls "$TWOFOLD_UPLOADS_DIR" 2>/dev/null | wc -l)" >> "$W/log.txt"
{
  for f in log.txt smi.txt fincore.txt scan.err record.log serve.log; do echo "== $f"; cat "$W/$f"; done
  for f in mmap.log nommap.log; do
    echo "== $f (buffer lines)"; grep -E "buffer size|offload|model size|type +f16|KV" "$W/$f"
    echo "== $f (last lines)"; tail -n 25 "$W/$f" | cut -c1-200
  done
} > "$OUT/logs.txt" 2>&1
echo "run done"
