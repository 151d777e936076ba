#!/usr/bin/env bash
# Upload tracing's cost per call on the real CUDA driver library, with no noise from a
# runtime: bench/upload_loop.c calls libcuda's cuMemcpyHtoDAsync_v2 (256 B) N times with
# no context (each call returns CUDA_ERROR_NOT_INITIALIZED at once, after the probe has
# fired and read its 256 bytes), in fresh processes, rounds rotating over: no tracer,
# `__bench uprobe-floor` (an empty program: the trap alone), `record --trace-uploads
# --no-prove`, `record --trace --no-prove`, and (with twofold-prev carried) `record
# --trace-uploads --no-prove` of the previous build, in the same rounds. Then a plain `scan` of a small file, timed
# with the build in twofold-prev (if carried) and this one alternating (CUDA's
# initialisation moved beside the collection). Run on the GPU machine from the folder
# holding the stripped builds and upload_loop (argument 1, default .devcarry).
# ROUNDS (default 5), N (default 200000). Results in $OUT/percall.txt.
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)
OUT=${OUT:-./out}
ROUNDS=${ROUNDS:-5}
N=${N:-200000}
mkdir -p "$OUT"
export PATH=$BIN:$PATH
W=$(mktemp -d /tmp/twofold-pc.XXXXXX)
RB=
cleanup() { [ -n "$RB" ] && kill -INT "$RB" 2>/dev/null; exec 7>&- 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && export TWOFOLD_LIBCUDA=$c && break
done
loop=$BIN/upload_loop
[ -x "$loop" ] || { gcc -O2 -o "$W/upload_loop" bench/upload_loop.c -ldl && loop=$W/upload_loop; }
frames() { ls "$1"/*/*.frames >/dev/null 2>&1 || find "$1" -name '*.frames' -size +0 2>/dev/null | grep -q .; }
wait_frame() { for _ in $(seq 600); do frames "$1" && return 0; sleep 0.1; done; echo "no frame in $1"; }
twofold __bench write-model "$W/m.safetensors" 64M > /dev/null
echo "libcuda: $TWOFOLD_LIBCUDA; $ROUNDS rounds of $N calls" | tee "$OUT/percall.txt"
modes=(none floor uploads all)
[ -x "$BIN/twofold-prev" ] && modes+=(prev)
nm=${#modes[@]}
for r in $(seq "$ROUNDS"); do
  for j in $(seq 0 $((nm - 1))); do
    mode=${modes[$(( (r + j) % nm ))]}
    case $mode in
      floor)
        rm -f "$W/fl"; mkfifo "$W/fl"
        twofold __bench uprobe-floor "$TWOFOLD_LIBCUDA" < "$W/fl" > "$W/floor.log" 2>&1 & FP=$!
        exec 7> "$W/fl"
        for _ in $(seq 100); do grep -q attached "$W/floor.log" && break; sleep 0.1; done ;;
      uploads|all|prev)
        flag=--trace; [ "$mode" = all ] || flag=--trace-uploads
        tf=twofold; [ "$mode" = prev ] && tf=$BIN/twofold-prev
        "$tf" record $flag --interval 60s --no-prove --store "$W/s-$mode-$r" "$W/m.safetensors" > "$W/rec.log" 2>&1 & RB=$!
        wait_frame "$W/s-$mode-$r" ;;
    esac
    sleep 0.5
    echo "$r $mode $("$loop" "$TWOFOLD_LIBCUDA" "$N" 256)" | tee -a "$OUT/percall.txt"
    if [ -n "$RB" ]; then kill -INT "$RB"; wait "$RB" 2>/dev/null; RB=; fi
    if [ "$mode" = floor ]; then exec 7>&-; wait "$FP"; fi
  done
done
python3 - "$OUT/percall.txt" <<'PY' | tee -a "$OUT/percall.txt"
import json, statistics as st, sys
rows = {}
for l in open(sys.argv[1]):
    p = l.split(" ", 2)
    if len(p) == 3 and p[2].startswith("{"):
        rows.setdefault(p[1], []).append(json.loads(p[2])["ns_per_call"])
base = st.median(rows["none"])
for m in ("none", "floor", "uploads", "all", "prev"):
    v = rows.get(m, [])
    if v:
        print(f"{m}: median {st.median(v):.1f} ns per call (added {st.median(v) - base:+.1f} ns); runs {' '.join(f'{x:.1f}' for x in v)}")
PY
# A plain scan, previous build against this one, alternating.
for i in 1 2 3 4 5; do
  for b in twofold-prev twofold; do
    [ -x "$BIN/$b" ] || continue
    echo "scan $b $(python3 -c 'import subprocess, sys, time; t = time.perf_counter(); subprocess.run(sys.argv[1:], capture_output=True); print(f"{time.perf_counter() - t:.3f} s")' "$BIN/$b" scan "$W/m.safetensors")" | tee -a "$OUT/percall.txt"
  done
done
TWOFOLD_PROFILE=1 twofold scan "$W/m.safetensors" 2>&1 >/dev/null | grep -E "^gpu|proof:" | tee -a "$OUT/percall.txt"
