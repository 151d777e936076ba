#!/usr/bin/env bash
# Where copies live on a real CUDA host (issue 39), on the GPU machine (H100 or H200): the CUDA driver's
# shared anonymous regions (`/dev/zero (deleted)`) are no model files, and a PyTorch
# `pin_memory()` copy of a model is a pinned host copy.
#
# A 1 GiB safetensors model (F16, written by PyTorch). Three processes: `pinned` loads it
# with safetensors' load_file (a MAP_PRIVATE mapping, no copy) and makes a pin_memory()
# copy of every tensor (page-locked memory from the CUDA driver, RssShmem); `cuda` only
# creates a CUDA context and a device tensor (its driver regions); `map` maps the file.
# Then `twofold scan MODEL` (text and JSON), a bare `twofold scan --json` (every file of
# interest on the host) and `twofold serve` for 10 s (its /metrics): the model's count and
# each copy's cause, and every file path any of them lists.
# Run from the folder holding a stripped release build of `twofold` (argument 1, default
# .devcarry). Results in $OUT.
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PATH=$BIN:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/twofold-places.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && export TWOFOLD_LIBCUDA=$c && break
done
cat > "$W/make.py" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(39)
save_file({f"w{i}": torch.randn(4096, 8192, generator=g).half() for i in range(16)}, sys.argv[1])
PY
cat > "$W/hold.py" <<'PY'
import mmap, sys, time, torch
mode, path = sys.argv[1], sys.argv[2]
if mode == "pinned":
    from safetensors.torch import load_file
    t = load_file(path)
    keep = {k: v.pin_memory() for k, v in t.items()}
    assert all(keep[k].is_pinned() for k in keep)
elif mode == "cuda":
    keep = torch.ones(1 << 20, device="cuda")
else:
    f = open(path, "rb")
    keep = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    s = sum(keep[i] for i in range(0, len(keep), 4096))
print("ready", flush=True)
time.sleep(3600)
PY
M=$W/model.safetensors
python3 "$W/make.py" "$M"
for mode in pinned cuda map; do
  python3 "$W/hold.py" "$mode" "$M" > "$W/$mode.ready" 2>"$OUT/$mode.err" &
  pids+=($!)
done
for mode in pinned cuda map; do
  for _ in $(seq 600); do grep -q ready "$W/$mode.ready" 2>/dev/null && break; sleep 0.2; done
done
for p in "${pids[@]}"; do
  { echo "pid $p"; grep -E 'RssAnon|RssFile|RssShmem' /proc/$p/status; grep -c 'dev/zero' /proc/$p/maps; } >> "$OUT/processes.txt"
done
twofold scan --prove-budget 120s "$M" > "$OUT/scan.txt" 2>&1
twofold scan --json --prove-budget 120s "$M" > "$OUT/scan.json" 2>"$OUT/scan.err"
twofold scan --json --prove-budget 120s > "$OUT/scan-all.json" 2>"$OUT/scan-all.err"
twofold serve --listen 127.0.0.1:19464 --interval 1s --prove-budget 60s > /dev/null 2>&1 &
S=$!
sleep 12
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(\"http://127.0.0.1:19464/metrics\").read().decode())" > "$OUT/metrics.txt"
kill $S; wait $S 2>/dev/null
python3 - "$OUT" "$M" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, model = sys.argv[1], sys.argv[2]
r = json.load(open(f"{out}/scan.json"))
f = [f for f in r["files"] if f["path"] == model][0]
print("model count", f["representations"]["proven"], f["representations"])
for c in f["proven_copies"]:
    print("copy pid", c["pid"], "how", c["how"], "fraction", round(c["fraction"], 3))
a = json.load(open(f"{out}/scan-all.json"))
print("bare scan files:", [x["path"] for x in a["files"]])
m = open(f"{out}/metrics.txt").read()
print("/dev/zero in metrics:", "/dev/zero" in m, "; model in metrics:", model in m)
PY
