#!/usr/bin/env bash
# Upload tracing's per-call cost, without a GPU: a loop of N cuMemcpyHtoDAsync_v2 calls
# of SIZE bytes (bench/upload_loop.c) through the stand-in libcuda.so.1 of tests/trace/cuda
# (entry points that do nothing, so the loop's time is the call and the probe), timed in
# fresh processes with no tracer, with `record --trace-uploads` (the upload probes alone)
# and with `record --trace` (every program), rounds alternating. With OLD_OBJECTS=DIR
# (a folder holding an earlier uploads.bpf.o whose programs this build names) `--trace-uploads`
# also runs on that object; with OLD_BIN=BINARY (an earlier build, its own objects inside)
# `uploads-prev` is that build's `record --trace-uploads`;
# `floor` is twofold's own empty program (`__bench uprobe-floor`: `up_floor` of
# uploads.bpf.o, attached as the tracer attaches, on every entry point): the trap's own
# cost, which no program can cut; with bpftrace, `floor-bt` is an empty bpftrace uprobe.
# Prints each run and, per tracer, the median ns per call and what it adds per call, and the
# programs' own time per run from the kernel's BPF statistics (kernel.bpf_stats_enabled,
# set for the run and restored: run_time_ns / run_cnt of the tracer's uprobe programs, read
# from /proc/PID/fdinfo), which the trap's noise does not blur.
# Run as root. Usage: bash bench/uploads.sh [ROUNDS] [N] [SIZE]   (TWOFOLD=binary)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=${2:-100000}
size=${3:-256}
[ "$(id -u)" = 0 ] || { echo "bench/uploads.sh: run as root" >&2; exit 2; }
bin=${TWOFOLD:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=${CARGO_TARGET_DIR:-$PWD/target}/release/twofold
fi
work=$(mktemp -d /tmp/twofold-bench-uploads.XXXXXX)
rec=
stats0=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  [ -n "$rec" ] && kill -INT "$rec" 2>/dev/null && wait "$rec" 2>/dev/null || true
  exec 7>&- 2>/dev/null || true
  echo "$stats0" > /proc/sys/kernel/bpf_stats_enabled
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
gcc -shared -fPIC -O1 -o "$work/libcuda.so.1" tests/trace/cuda/libcuda_standin.c
gcc -O2 -o "$work/loop" bench/upload_loop.c -ldl
"$bin" __bench write-model "$work/model.safetensors" 16M >/dev/null
export TWOFOLD_LIBCUDA=$work/libcuda.so.1
tracers="none floor uploads all"
[ -n "${OLD_OBJECTS:-}" ] && tracers="$tracers uploads-old"
[ -n "${OLD_BIN:-}" ] && tracers="$tracers uploads-prev"
command -v bpftrace >/dev/null && tracers="$tracers floor-bt"
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo 1 > /proc/sys/kernel/bpf_stats_enabled
# run_time_ns and run_cnt summed over the uprobe programs (prog_type 2) process $1 holds.
progs() {
  awk 'FNR == 1 { if (k) { t += ft; c += fc } k = 0; ft = 0; fc = 0 }
       /^prog_type:/ { k = ($2 == 2) } /^run_time_ns:/ { ft = $2 } /^run_cnt:/ { fc = $2 }
       END { if (k) { t += ft; c += fc } print t + 0, c + 0 }' /proc/"$1"/fdinfo/* 2>/dev/null
}
for r in $(seq "$rounds"); do
  for t in $tracers; do
    rec=
    case $t in
      uploads) "$bin" record --trace-uploads --interval 600s --no-prove --store "$work/s-$t-$r" "$work/model.safetensors" >"$work/rec.log" 2>&1 & rec=$! ;;
      uploads-old) TWOFOLD_BPF_OBJECTS=$OLD_OBJECTS "$bin" record --trace-uploads --interval 600s --no-prove --store "$work/s-$t-$r" "$work/model.safetensors" >"$work/rec.log" 2>&1 & rec=$! ;;
      uploads-prev) "$OLD_BIN" record --trace-uploads --interval 600s --no-prove --store "$work/s-$t-$r" "$work/model.safetensors" >"$work/rec.log" 2>&1 & rec=$! ;;
      all) "$bin" record --trace --interval 600s --no-prove --store "$work/s-$t-$r" "$work/model.safetensors" >"$work/rec.log" 2>&1 & rec=$! ;;
      floor) rm -f "$work/fl"; mkfifo "$work/fl"
        "$bin" __bench uprobe-floor "$work/libcuda.so.1" < "$work/fl" > "$work/fl.log" 2>&1 & rec=$!
        exec 7> "$work/fl"
        for _ in $(seq 300); do grep -q attached "$work/fl.log" && break; sleep 0.1; done ;;
      floor-bt) bpftrace -e "uprobe:$work/libcuda.so.1:cuMemcpyHtoDAsync_v2 { } BEGIN { printf(\"started\\n\"); }" >"$work/bt.log" 2>&1 & rec=$!
        for _ in $(seq 300); do grep -q started "$work/bt.log" && break; sleep 0.1; done ;;
    esac
    c0=0
    if [ -n "$rec" ]; then
      # Attached and the first snapshot written: the loop runs beside a quiet tracer.
      for _ in $(seq 300); do [ "${t#floor}" != "$t" ] || ls "$work/s-$t-$r"/*/* >/dev/null 2>&1 && break; sleep 0.1; done
      sleep 0.5
      if ! kill -0 "$rec" 2>/dev/null; then
        echo "$t: the tracer exited: $(tail -2 "$work/rec.log" 2>/dev/null)" >&2
        rec=; continue
      fi
      c0=$(cpu "$rec")
      p0=$(progs "$rec")
    fi
    line=$("$work/loop" "$work/libcuda.so.1" "$n" "$size")
    tcpu=0
    prog="null"
    if [ -n "$rec" ]; then
      sleep 0.2 # the reader drains every 50 ms
      tcpu=$(( $(cpu "$rec") - c0 ))
      read -r t0 n0 <<< "$p0"
      read -r t1 n1 <<< "$(progs "$rec")"
      [ "$n1" -gt "$n0" ] && prog=$(( (t1 - t0) / (n1 - n0) ))
      if [ "$t" = floor ]; then exec 7>&-; else kill -INT "$rec"; fi
      wait "$rec" || true; rec=
      [ -f "$work/rec.log" ] && { grep -i "error" "$work/rec.log" | head -3 || true; }
    fi
    echo "$t ${line%\}}, \"tracer_cpu_ticks\": $tcpu, \"prog_ns_per_run\": $prog}"
  done
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" "$n" <<'PY'
import json, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    k, _, j = l.partition(" ")
    if j.strip().startswith("{"):
        runs.setdefault(k, []).append(json.loads(j))
base = statistics.median(r["ns_per_call"] for r in runs["none"])
for k, rs in runs.items():
    m = statistics.median(r["ns_per_call"] for r in rs)
    cpu = statistics.median(r["tracer_cpu_ticks"] for r in rs) / 100
    pr = [r["prog_ns_per_run"] for r in rs if r.get("prog_ns_per_run") is not None]
    prog = f"  program {statistics.median(pr):.0f} ns/run ({' '.join(str(x) for x in pr)})" if pr else ""
    print(f"{k:12} median {m:8.1f} ns/call  +{m - base:7.1f} ns/call  tracer CPU {cpu:.2f} s for {sys.argv[2]} calls{prog}")
PY
