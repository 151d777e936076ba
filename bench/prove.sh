#!/usr/bin/env bash
# The proof behind plain `twofold scan`, against a full read of the same memory, in one run.
#
# Workload 1 (with a copy): a process that read() a MODEL_SIZE safetensors model into its
# heap and closed it, beside OTHER_SIZE of pseudo-random memory (the dupes bench workload).
# Workload 2 (no copy): a process holding the model open with NOCOPY_SIZE of pseudo-random
# memory and no copy of it.
# For each: `twofold scan MODEL` (default proof), `twofold dupes` (every page sampled, every
# copy compared in full), and a plain pread of /proc/PID/mem of the same pages (`__bench readmem`,
# the bandwidth baseline), medians of 3.
#
# Usage: bash bench/prove.sh [MODEL_SIZE] [OTHER_SIZE] [NOCOPY_SIZE]   (defaults 4G 8G 12G)
# MODEL_DTYPE=F32 or BF16 writes the model in that dtype (NumPy), F16 by default.
# Each scan is timed twice: with the run's point cache (TWOFOLD_INDEX_CACHE) and with it
# off, every point of the index read from the file (a first run on a host).
# DUPES=0 leaves out the `dupes` runs (minutes on 64 GiB). With TWOFOLD_PROFILE=1 one more
# `scan` per workload prints where its time went (collection phases, index, search) on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
model_size=${1:-4G}
other_size=${2:-8G}
nocopy_size=${3:-12G}
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$PWD/target/release/twofold
fi
work=$(mktemp -d /var/tmp/twofold-bench-prove.XXXXXX)
# The proof's point cache (docs/dupes.md) of this run: `scan` takes the index's points from
# it; the "points read" rows turn it off (every point read from the file, as a first run).
export TWOFOLD_INDEX_CACHE="$work/index-cache"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  exec 3>&- 4>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "writing a $model_size ${MODEL_DTYPE:-F16} safetensors model..." >&2
if [ "${MODEL_DTYPE:-F16}" = F16 ]; then
  "$bin" __bench write-model "$work/model.safetensors" "$model_size" >/dev/null
else
  # MODEL_DTYPE=F32 (or BF16): the same layout (8 MiB tensors) in that dtype, finite
  # normal values, written by NumPy: the conversions twofold indexes depend on the dtype.
  python3 - "$work/model.safetensors" "$model_size" "$MODEL_DTYPE" <<'PY'
import json, struct, sys
import numpy as np
path, size, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
size = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]] if size[-1] in "KMG" else int(size)
per = 8 << 20
n = size // per
header = {f"layers.{i}.weight": {"dtype": dtype, "shape": [per // (4 if dtype == "F32" else 2)],
          "data_offsets": [i * per, (i + 1) * per]} for i in range(n)}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
rng = np.random.default_rng(1)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):
        v = (rng.standard_normal(per // 4) * 0.05).astype(np.float32)
        if dtype == "BF16":
            v = np.concatenate([v, (rng.standard_normal(per // 4) * 0.05).astype(np.float32)])
            v = (v.view(np.uint32) >> 16).astype(np.uint16)
        f.write(v.tobytes())
PY
fi
cat "$work/model.safetensors" >/dev/null

start_child() { # fd, ready-fifo, args...
  local fd=$1 fifo=$2
  shift 2
  mkfifo "$fifo"
  eval "exec $fd> >(\"\$bin\" __child \"\$@\" >\"\$fifo\")"
  read -r _ <"$fifo"
}

start_child 3 "$work/ready1" copy "$work/model.safetensors" --close --bytes "$other_size" --random
copy=$(pgrep -f "__child copy $work/model.safetensors" | head -n1)
pids+=("$copy")
echo "copying reader pid $copy: $(grep RssAnon /proc/$copy/status)" >&2

python3 - "$bin" "$copy" "$work/model.safetensors" "copy" <<'PY'
import json, subprocess, sys, time
bin, pid, model, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
import os
def timed(args, env=None):
    t = time.perf_counter()
    out = subprocess.run(args, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return time.perf_counter() - t, out
NO_SCAN = {"TWOFOLD_NO_PAGEMAP_SCAN": "1"}
def median(xs):
    return sorted(xs)[len(xs) // 2]
scan_t, dupes_t, base_t, old_t, cold_t = [], [], [], [], []
COLD = {"TWOFOLD_INDEX_CACHE": "off"}
for _ in range(3):
    t, out = timed([bin, "__bench", "readmem", str(pid)])
    base = json.loads(out)
    base_t.append(base["seconds"])
    t, out = timed([bin, "scan", "--json", model], NO_SCAN)
    old_t.append(t)
    old = next(f for f in json.loads(out)["files"] if f["path"] == model)["representations"]
    t, _ = timed([bin, "scan", "--json", model], COLD)
    cold_t.append(t)
    t, out = timed([bin, "scan", "--json", model])
    scan_t.append(t)
    report = json.loads(out)
    if os.environ.get("DUPES", "1") != "0":
        t, _ = timed([bin, "dupes", "--json", "--pid", str(pid), model])
        dupes_t.append(t)
if os.environ.get("TWOFOLD_PROFILE"):
    subprocess.run([bin, "scan", "--json", model], check=True, stdout=subprocess.DEVNULL)
f = next(f for f in report["files"] if f["path"] == model)
# The same copies found both ways (the page cache may move between the runs).
same = ("private_copies", "cow", "lower_bound")
assert all(old[k] == f["representations"][k] for k in same), (old, f["representations"])
mine = [c for c in f["proven_copies"] if c["pid"] == pid]
gib = base["bytes"] / 2**30
print(f"### workload: {label} ({gib:.2f} GiB of the candidate's present private memory)\n")
print("| measure | value |\n|---|---|")
print(f"| count printed by `twofold scan` | {f['representations']['proven']:.3f} (lower bound: {f['representations']['lower_bound']}) |")
print(f"| proven copy in the candidate | {mine[0]['fraction'] if mine else 0:.4f} of the file |")
print(f"| pread of /proc/PID/mem, every present page (baseline), median of 3 | {median(base_t):.3f} s |")
print(f"| `twofold scan MODEL` with pagemap instead of PAGEMAP_SCAN, median of 3 | {median(old_t):.3f} s |")
print(f"| `twofold scan MODEL`, every index point read from the file (TWOFOLD_INDEX_CACHE=off), median of 3 | {median(cold_t):.3f} s |")
print(f"| `twofold scan MODEL` (whole command, default proof, points from the cache), median of 3 | {median(scan_t):.3f} s |")
print(f"| full read / scan, points read | **{median(base_t)/median(cold_t):.1f}x** |")
if dupes_t:
    print(f"| `twofold dupes --pid` (every page sampled, full compare), median of 3 | {median(dupes_t):.3f} s |")
print(f"| full read / scan, points from the cache | **{median(base_t)/median(scan_t):.1f}x** |")
if dupes_t:
    print(f"| dupes / scan | {median(dupes_t)/median(scan_t):.1f}x |")
print()
PY
kill "$copy" 2>/dev/null || true
exec 3>&-

start_child 4 "$work/ready2" anon "$work/model.safetensors" --bytes "$nocopy_size" --random
holder=$(pgrep -f "__child anon $work/model.safetensors" | head -n1)
pids+=("$holder")
echo "non-copying holder pid $holder: $(grep RssAnon /proc/$holder/status)" >&2
python3 - "$bin" "$holder" "$work/model.safetensors" "no copy" <<'PY'
import json, subprocess, sys, time
bin, pid, model, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
import os
def timed(args, env=None):
    t = time.perf_counter()
    out = subprocess.run(args, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return time.perf_counter() - t, out
NO_SCAN = {"TWOFOLD_NO_PAGEMAP_SCAN": "1"}
def median(xs):
    return sorted(xs)[len(xs) // 2]
scan_t, base_t, old_t, cold_t = [], [], [], []
COLD = {"TWOFOLD_INDEX_CACHE": "off"}
for _ in range(3):
    t, out = timed([bin, "__bench", "readmem", str(pid)])
    base = json.loads(out)
    base_t.append(base["seconds"])
    t, _ = timed([bin, "scan", "--json", "--prove-budget", "600s", model], NO_SCAN)
    old_t.append(t)
    t, _ = timed([bin, "scan", "--json", "--prove-budget", "600s", model], COLD)
    cold_t.append(t)
    t, out = timed([bin, "scan", "--json", "--prove-budget", "600s", model])
    scan_t.append(t)
    report = json.loads(out)
if os.environ.get("TWOFOLD_PROFILE"):
    subprocess.run([bin, "scan", "--json", "--prove-budget", "600s", model], check=True, stdout=subprocess.DEVNULL)
f = next(f for f in report["files"] if f["path"] == model)
gib = base["bytes"] / 2**30
print(f"### workload: {label} ({gib:.2f} GiB of the candidate's present private memory)\n")
print("| measure | value |\n|---|---|")
print(f"| count printed by `twofold scan` | {f['representations']['proven']:.3f} (lower bound: {f['representations']['lower_bound']}, searched {f['candidates']['searched']} of {f['candidates']['could_hold']}) |")
print(f"| pread of /proc/PID/mem, every present page (baseline), median of 3 | {median(base_t):.3f} s |")
print(f"| `twofold scan MODEL` with pagemap instead of PAGEMAP_SCAN, median of 3 | {median(old_t):.3f} s |")
print(f"| `twofold scan MODEL`, every index point read from the file (TWOFOLD_INDEX_CACHE=off), median of 3 | {median(cold_t):.3f} s |")
print(f"| `twofold scan MODEL` (whole command, default proof, points from the cache), median of 3 | {median(scan_t):.3f} s |")
print(f"| full read / scan, points read | **{median(base_t)/median(cold_t):.1f}x** |")
print(f"| full read / scan, points from the cache | **{median(base_t)/median(scan_t):.1f}x** |\n")
PY
