#!/usr/bin/env bash
# Upload tracing's cost on real PyTorch (issue 22), paired inside one process so that
# process-to-process spread (CUDA context, allocator state) is not measured as overhead.
# One python3 process loads a 4 GiB F16 file with load_file(device="cuda:0") (16 uploads
# of 256 MiB; freed and loaded again each time) and runs 100,000 dst.copy_(src) of 256 B
# (pageable, cuMemcpyHtoDAsync_v2) in 20 batches of 5,000 (loop_s: their sum; loop_med_s:
# 20 x the median batch, which a stall in one batch does not move). Per round, in a rotating order, it does both with no
# tracer, beside `record --trace-uploads --no-prove` (the upload probes alone), beside
# `record --trace --no-prove` (every program), and beside `__bench uprobe-floor` (an empty
# program on the same entry points: the trap's own cost, which no program can cut). Prints each measurement and, per mode, the
# median and the median of the paired differences against the untraced run of its round.
# Run on the GPU machine from the folder holding a stripped release build of `twofold`
# (argument 1, default .devcarry). ROUNDS (default 9). Results in $OUT/overhead.txt.
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)
OUT=${OUT:-./out}
ROUNDS=${ROUNDS:-9}
mkdir -p "$OUT"
export PATH=$BIN:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/twofold-oh.XXXXXX)
RB=
cleanup() { [ -n "$RB" ] && kill -INT "$RB" 2>/dev/null; exec 5>&- 6<&- 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && export TWOFOLD_LIBCUDA=$c && break
done
frames() { ls "$1"/*/*.frames >/dev/null 2>&1 || find "$1" -name '*.frames' -size +0 2>/dev/null | grep -q .; }
wait_frame() { for _ in $(seq 600); do frames "$1" && return 0; sleep 0.1; done; echo "no frame in $1"; }
cat > "$W/bench.py" <<'PY'
import json, sys, time, torch
from safetensors.torch import load_file, save_file
path = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(7)
save_file({f"w{i}": torch.randn(8192, 16384, generator=g, device="cuda").half().cpu() for i in range(16)}, path)
torch.cuda.empty_cache()
src = torch.randn(64); dst = torch.empty(64, device="cuda")
for _ in range(1000): dst.copy_(src)
t = load_file(path, device="cuda:0"); del t; torch.cuda.synchronize(); torch.cuda.empty_cache()
print("ready", flush=True)
for line in sys.stdin:
    torch.cuda.synchronize()
    t0 = time.perf_counter(); t = load_file(path, device="cuda:0"); torch.cuda.synchronize(); load = time.perf_counter() - t0
    del t; torch.cuda.empty_cache(); torch.cuda.synchronize()
    batches = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(5000): dst.copy_(src)
        torch.cuda.synchronize(); batches.append(time.perf_counter() - t0)
    batches.sort()
    print(json.dumps({"load_s": load, "loop_s": sum(batches), "loop_med_s": 20 * (batches[9] + batches[10]) / 2}), flush=True)
PY
mkfifo "$W/in" "$W/out"
python3 "$W/bench.py" "$W/d.safetensors" < "$W/in" > "$W/out" 2> "$W/bench.err" &
exec 5> "$W/in" 6< "$W/out"
read -r ready <&6 || { echo "bench did not start"; cat "$W/bench.err"; exit 1; }
echo "libcuda: $TWOFOLD_LIBCUDA; $ROUNDS rounds" | tee "$OUT/overhead.txt"
modes=(none uploads all floor)
for r in $(seq "$ROUNDS"); do
  for j in 0 1 2 3; do
    mode=${modes[$(( (r + j) % 4 ))]}
    RB=
    if [ "$mode" = floor ]; then
      rm -f "$W/fl"; mkfifo "$W/fl"
      twofold __bench uprobe-floor "$TWOFOLD_LIBCUDA" < "$W/fl" > "$W/floor.log" 2>&1 & FP=$!
      exec 7> "$W/fl"
      for _ in $(seq 100); do grep -q attached "$W/floor.log" && break; sleep 0.1; done
      cat "$W/floor.log"; sleep 1
    elif [ "$mode" != none ]; then
      flag=--trace; [ "$mode" = uploads ] && flag=--trace-uploads
      twofold record $flag --interval 60s --no-prove --store "$W/s-$mode-$r" "$W/d.safetensors" > "$W/rec.log" 2>&1 & RB=$!
      wait_frame "$W/s-$mode-$r"; sleep 1
    fi
    echo go >&5
    read -r line <&6
    echo "$r $mode $line" | tee -a "$OUT/overhead.txt"
    if [ -n "$RB" ]; then kill -INT "$RB"; wait "$RB" 2>/dev/null; RB=; fi
    if [ "$mode" = floor ]; then exec 7>&-; wait "$FP"; fi
  done
done
python3 - "$OUT/overhead.txt" <<'PY' | tee -a "$OUT/overhead.txt"
import json, statistics as st, sys
rows = {}
for l in open(sys.argv[1]):
    p = l.split(" ", 2)
    if len(p) == 3 and p[2].startswith("{"):
        rows[(int(p[0]), p[1])] = json.loads(p[2])
rounds = sorted({r for r, _ in rows})
for what, per in (("load_s", None), ("loop_s", 1e5), ("loop_med_s", 1e5)):
    base = [rows[(r, "none")][what] for r in rounds]
    print(f"{what}: untraced median {st.median(base):.4f} s (min {min(base):.4f}, max {max(base):.4f})")
    for mode, name in (("floor", "__bench uprobe-floor"), ("uploads", "record --trace-uploads"), ("all", "record --trace")):
        t = [rows[(r, mode)][what] for r in rounds]
        d = [rows[(r, mode)][what] - rows[(r, "none")][what] for r in rounds]
        extra = f", {st.median(d) / per * 1e6:+.2f} us per upload" if per else ""
        print(f"  {name}: median {st.median(t):.4f} s, paired difference median {st.median(d):+.4f} s = {100 * st.median(d) / st.median(base):+.2f}%{extra}; differences {' '.join(f'{x:+.4f}' for x in d)}")
PY
