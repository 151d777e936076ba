#!/usr/bin/env bash
# What indexing transformed forms (dtype conversions, llama.cpp repack layouts) costs the
# default `twofold scan`, against a build from before them, in one run.
#
# Models (MODEL_SIZE each): F16 and F32 safetensors (8 MiB tensors of normal values), and a
# Q4_0 GGUF of llama-like matrix weights (random blocks, 4096 columns, rows of 8). Each is
# held by a process that maps it and keeps a read() copy of it (count 2.00). Per round,
# BEFORE and AFTER alternate on each model, each timed with every index point read from
# the file (TWOFOLD_INDEX_CACHE=off, a first scan on a host) and with the run's point cache
# (later scans). Prints medians, the median of paired ratios and the counts each printed.
#
# Usage: bash bench/transforms.sh BEFORE_BINARY [AFTER_BINARY] [MODEL_SIZE] [ROUNDS]
#   (defaults: AFTER = target/release/twofold built here, 1G, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: bench/transforms.sh BEFORE_BINARY [AFTER_BINARY] [MODEL_SIZE] [ROUNDS]}
after=${2:-}
size=${3:-1G}
rounds=${4:-5}
if [ -z "$after" ]; then
  cargo build --release --quiet
  after=$PWD/target/release/twofold
fi
work=$(mktemp -d /var/tmp/twofold-bench-transforms.XXXXXX)
export TWOFOLD_INDEX_CACHE="$work/index-cache"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

python3 - "$work" "$size" <<'PY'
import json, struct, sys
import numpy as np
work, size = sys.argv[1], sys.argv[2]
size = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]] if size[-1] in "KMG" else int(size)
rng = np.random.default_rng(7)
def safetensors(path, dtype, np_dtype, esize):
    n, per = size // (8 << 20), (8 << 20) // esize
    hdr, off = {}, 0
    for i in range(n):
        hdr[f"t{i}"] = {"dtype": dtype, "shape": [per], "data_offsets": [off, off + (8 << 20)]}
        off += 8 << 20
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for _ in range(n):
            f.write(rng.standard_normal(per, dtype=np.float32).astype(np_dtype).tobytes())
safetensors(f"{work}/f16.safetensors", "F16", np.float16, 2)
safetensors(f"{work}/f32.safetensors", "F32", np.float32, 4)
# GGUF v3, Q4_0 (type 2) weights of 4096 columns (2304 bytes a row) and 1024 rows each.
row, rows = 4096 // 32 * 18, 1024
n = max(1, size // (row * rows))
def s(b): return struct.pack("<Q", len(b)) + b
kv = s(b"general.architecture") + struct.pack("<I", 8) + s(b"llama")
infos, off = b"", 0
for i in range(n):
    infos += s(f"blk.{i}.ffn_up.weight".encode()) + struct.pack("<IQQIQ", 2, 4096, rows, 2, off)
    off += row * rows
head = b"GGUF" + struct.pack("<IQQ", 3, n, 1) + kv + infos
with open(f"{work}/q4_0.gguf", "wb") as f:
    f.write(head + b"\0" * ((32 - len(head) % 32) % 32))
    for _ in range(n):
        blocks = rng.integers(0, 256, size=(rows * 128, 18), dtype=np.uint8)
        blocks[:, 0:2] = np.frombuffer(np.full(rows * 128, 0.01, np.float16).tobytes(), np.uint8).reshape(-1, 2)
        f.write(blocks.tobytes())
PY

for m in f16.safetensors f32.safetensors q4_0.gguf; do
  python3 - "$work/$m" >"$work/$m.ready" <<'PY' &
import mmap, sys, time
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
s = sum(m[i] for i in range(0, len(m), 4096))
copy = bytearray(f.read())
print("ready", flush=True)
time.sleep(1e6)
PY
  pids+=($!)
done
for m in f16.safetensors f32.safetensors q4_0.gguf; do
  until grep -q ready "$work/$m.ready" 2>/dev/null; do sleep 0.2; done
done

python3 - "$work" "$before" "$after" "$rounds" <<'PY'
import json, os, statistics, subprocess, sys, time
work, before, after, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
models = ["f16.safetensors", "f32.safetensors", "q4_0.gguf"]
t = {(m, b, c): [] for m in models for b in "BA" for c in ("cold", "warm")}
counts = {}
def run(binary, model, cold):
    env = dict(os.environ)
    if cold:
        env["TWOFOLD_INDEX_CACHE"] = "off"
    s = time.perf_counter()
    out = subprocess.run([binary, "scan", "--json", f"{work}/{model}"], env=env,
                         check=True, capture_output=True).stdout
    e = time.perf_counter() - s
    f = json.loads(out)["files"][0]
    return e, f["representations"]["proven"]
for m in models:  # the point cache of each build, once
    run(before, m, False); run(after, m, False)
for r in range(rounds):
    for m in models:
        for c in ("cold", "warm"):
            order = [("B", before), ("A", after)] if r % 2 == 0 else [("A", after), ("B", before)]
            for tag, b in order:
                e, n = run(b, m, c == "cold")
                t[(m, tag, c)].append(e)
                counts.setdefault((m, tag), set()).add(round(n, 3))
print(f"| model | points | before (s) | after (s) | after / before (median of paired ratios) | count before | count after |")
print("|---|---|---|---|---|---|---|")
for m in models:
    for c in ("cold", "warm"):
        b, a = t[(m, "B", c)], t[(m, "A", c)]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(f"| {m} | {'read from the file' if c == 'cold' else 'from the point cache'} | {statistics.median(b):.3f} | {statistics.median(a):.3f} | **{ratio:.2f}** | {sorted(counts[(m, 'B')])} | {sorted(counts[(m, 'A')])} |")
PY
