#!/usr/bin/env bash
# Two builds of twofold side by side in one run, alternating, on the same workload: is the
# newer one slower? A copier holding a MODEL_SIZE safetensors copy beside OTHER_SIZE of
# pseudo-random memory, and a mapper of the same file. Measures `scan --json MODEL` wall
# time (medians of RUNS, alternating old/new), the count each printed, and the CPU seconds
# of `record --interval 1s --count 20 MODEL` (a long-running engine on the same host).
#
# Usage: bash bench/ab.sh OLD_BIN NEW_BIN [MODEL_SIZE] [OTHER_SIZE] [RUNS]  (defaults 1G 2G 5)
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2
model_size=${3:-1G}
other_size=${4:-2G}
runs=${5:-5}
work=$(mktemp -d /var/tmp/twofold-bench-ab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  exec 3>&- 4>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
"$new" __bench write-model "$work/model.safetensors" "$model_size" >/dev/null
cat "$work/model.safetensors" >/dev/null
start_child() { # fd, ready-fifo, args...
  local fd=$1 fifo=$2
  shift 2
  mkfifo "$fifo"
  eval "exec $fd> >(\"\$new\" __child \"\$@\" >\"\$fifo\")"
  read -r _ <"$fifo"
}
start_child 3 "$work/r1" copy "$work/model.safetensors" --close --bytes "$other_size" --random
start_child 4 "$work/r2" map "$work/model.safetensors"
pids+=($(pgrep -f "__child copy $work/model.safetensors") $(pgrep -f "__child map $work/model.safetensors"))
python3 - "$old" "$new" "$work" "$runs" <<'PY'
import json, os, subprocess, sys, time
old, new, work, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = f"{work}/model.safetensors"
def scan(b):
    t = time.perf_counter()
    out = subprocess.run([b, "scan", "--json", model], check=True, capture_output=True, text=True).stdout
    dt = time.perf_counter() - t
    f = next(f for f in json.loads(out)["files"] if f["path"] == model)
    return dt, f["representations"]["proven"], f["representations"]["lower_bound"]
def record_cpu(b, store):
    t0 = os.times()
    subprocess.run([b, "record", "--interval", "1s", "--count", "20", "--store", store, model],
                   check=True, capture_output=True)
    t1 = os.times()
    return (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
res = {old: [], new: []}
for i in range(runs):
    for b in ((old, new) if i % 2 == 0 else (new, old)):
        res[b].append(scan(b))
med = lambda xs: sorted(xs)[len(xs) // 2]
cpu = {b: record_cpu(b, f"{work}/store-{n}") for n, b in (("old", old), ("new", new))}
print("| measure | old | new | new / old |\n|---|---|---|---|")
so, sn = med([r[0] for r in res[old]]), med([r[0] for r in res[new]])
print(f"| `scan --json MODEL`, median of {runs} (s) | {so:.3f} | {sn:.3f} | {sn/so:.2f} |")
print(f"| count printed (all runs) | {sorted(set(round(r[1],3) for r in res[old]))} | {sorted(set(round(r[1],3) for r in res[new]))} | |")
print(f"| lower bound in any run | {any(r[2] for r in res[old])} | {any(r[2] for r in res[new])} | |")
print(f"| `record --interval 1s --count 20 MODEL`, CPU seconds | {cpu[old]:.2f} | {cpu[new]:.2f} | {cpu[new]/max(cpu[old],1e-9):.2f} |")
PY
