#!/usr/bin/env bash
# Bare `twofold scan` time and twofold's peak RSS against three sizes (issue #21), each
# point on its own workload (bench/host_workload.py, no churn) in a memory-limited cgroup:
# - processes: PROCS idle processes (64 KiB of anonymous memory each) beside one daemon
#   holding a read() copy of a 64 MiB model; `scan` with no paths (the whole host);
# - candidate memory: MEM GiB of present private memory in one process, a read() copy
#   of a 256 MiB model plus pseudo-random bytes; `scan MODEL` (its proof);
# - model files: FILES small 1 MiB models, each mapped by one idle process;
#   `scan DIR` with the proof, and once with --no-prove (the "200 small files cost under
#   0.2 s with the proof" check).
# Each point: the median wall time of RUNS runs, the largest peak RSS (/usr/bin/time -f
# %M), whether any count was a lower bound, and the processes on the host. A point that
# does not fit in MemAvailable less 2 GiB is written as SKIPPED with that reason.
# Writes bench/RESULTS-scaling.md, bench/scaling.json and bench/scaling.png
# (`twofold __bench plot-scaling`).
# Usage: [PROCS="100 1000 5000"] [MEM="1 16"] [FILES="10 200 2000"] [RUNS=3] bash bench/scaling.sh
#   (MEM="1 16 64" on a 128 GiB host; TWOFOLD_BIN overrides the binary; root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PROCS=${PROCS:-100 1000 5000} MEM=${MEM:-1 16} FILES=${FILES:-10 200 2000} RUNS=${RUNS:-3}
[ "$(id -u)" = 0 ] || { echo "bench/scaling.sh needs root (memory cgroups, every process's /proc)" >&2; exit 2; }
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$(realpath "${CARGO_TARGET_DIR:-target}")/release/twofold
fi
work=$(mktemp -d /var/tmp/twofold-bench-scaling.XXXXXX)
cg=""
workload=""
stop_point() {
  if [ -n "$workload" ]; then
    kill "$workload" 2>/dev/null || true
    wait "$workload" 2>/dev/null || true
    workload=""
  fi
  if [ -n "$cg" ]; then
    for _ in $(seq 50); do
      [ -s "$cg/cgroup.procs" ] || break
      while read -r p; do kill -9 "$p" 2>/dev/null || true; done <"$cg/cgroup.procs"
      sleep 0.1
    done
    rmdir "$cg" 2>/dev/null || echo "bench/scaling.sh: could not remove '$cg'" >&2
    cg=""
  fi
  rm -rf "$work/point"
}
trap 'stop_point; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# start_point LIMIT_BYTES workload-args...: the workload in a new cgroup, until ready.
start_point() {
  local limit=$1
  shift
  local avail=$(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) * 1024))
  if [ "$limit" -gt $((avail - (2 << 30))) ]; then
    skip="needs $(numfmt --to=iec "$limit"), MemAvailable is $(numfmt --to=iec "$avail") (less 2 GiB kept free)"
    return 1
  fi
  mkdir "$work/point"
  if [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/twofold-bench-scaling-$$
    mkdir "$cg"
    echo "$limit" >"$cg/memory.limit_in_bytes"
  else
    cg=/sys/fs/cgroup/twofold-bench-scaling-$$
    mkdir "$cg"
    echo "$limit" >"$cg/memory.max"
  fi
  bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    python3 bench/host_workload.py --twofold "$bin" --dir "$work/point" \
    --ready-file "$work/point/ready" --churn 0 --pool-size 0 "$@" &
  workload=$!
  for _ in $(seq 9000); do
    [ -e "$work/point/ready" ] && return 0
    kill -0 "$workload" 2>/dev/null || { echo "bench/scaling.sh: the workload failed" >&2; exit 1; }
    sleep 0.1
  done
  echo "bench/scaling.sh: the workload was not ready in 900 s" >&2
  exit 1
}

# measure ARGS...: RUNS x `twofold scan --json ARGS`; prints "median_s max_rss_mib lower procs".
measure() {
  local runs=() rss=0 lower=0 i
  for i in $(seq "$RUNS"); do
    /usr/bin/time -f "%e %M" -o "$work/time" "$bin" scan --json "$@" >"$work/scan.json" 2>/dev/null
    read -r s kb <"$work/time"
    runs+=("$s")
    [ "$kb" -gt "$rss" ] && rss=$kb
    python3 -c 'import json,sys; sys.exit(any(f["representations"]["lower_bound"] for f in json.load(open(sys.argv[1]))["files"]))' "$work/scan.json" || lower=1
  done
  local med
  med=$(printf '%s\n' "${runs[@]}" | sort -g | sed -n "$(((RUNS + 1) / 2))p")
  echo "$med $((rss / 1024)) $lower $(ls -d /proc/[0-9]* | wc -l)"
}

rows=()
add() { # dimension x label result|SKIPPED...
  rows+=("$1|$2|$3|$4")
  echo "$1 $2: $4" >&2
}
for n in $PROCS; do
  if start_point $((64 * 2 * (1 << 20) + n * (3 << 20) + (1 << 30))) \
    --daemons 1 --model-size 64M --kv 0 --idle "$n" --files 0; then
    add processes "$n" "$n idle processes" "$(measure)"
  else add processes "$n" "$n idle processes" "SKIPPED: $skip"; fi
  stop_point
done
for g in $MEM; do
  extra=$((g * (1 << 30) - (256 << 20)))
  if start_point $((g * (1 << 30) + (256 << 20) + (1 << 30))) \
    --daemons 1 --model-size 256M --kv "$extra" --kv-rate 0 --idle 0 --files 0; then
    add memory_gib "$g" "$g GiB candidate memory" "$(measure "$work/point/models/daemon-0.safetensors")"
  else add memory_gib "$g" "$g GiB candidate memory" "SKIPPED: $skip"; fi
  stop_point
done
for n in $FILES; do
  if start_point $((n * (4 << 20) + (1 << 30))) \
    --daemons 0 --idle "$n" --files "$n" --file-size 1M; then
    add files "$n" "$n model files of 1 MiB" "$(measure "$work/point/small")"
    if [ "$n" = 200 ]; then
      add files_noprove "$n" "$n model files of 1 MiB, --no-prove" "$(measure --no-prove "$work/point/small")"
    fi
  else add files "$n" "$n model files of 1 MiB" "SKIPPED: $skip"; fi
  stop_point
done

python3 - "$work/scaling.json" bench/RESULTS-scaling.md "$bin" "${rows[@]}" <<'PY'
import json, os, platform, sys, time
out_json, out_md, binary, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
data = {"processes": [], "memory_gib": [], "files": []}
lines = [
    "# `twofold scan` scaling (bench/scaling.sh)", "",
    f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {os.cpu_count()} cores, "
    f"{mem / 2**20:.0f} GiB, Linux {platform.release()}; binary `{binary}`. "
    "Median wall time of the runs, the largest peak RSS (`/usr/bin/time -f %M`). "
    f"Settings: PROCS=\"{os.environ['PROCS']}\" MEM=\"{os.environ['MEM']}\" "
    f"FILES=\"{os.environ['FILES']}\" RUNS={os.environ['RUNS']}.", "",
    "| workload | command | scan s | peak RSS MiB | lower bound | processes on the host |",
    "|---|---|---|---|---|---|",
]
cmd = {"processes": "`scan` (the host)", "memory_gib": "`scan MODEL`",
       "files": "`scan DIR`", "files_noprove": "`scan --no-prove DIR`"}
for r in rows:
    dim, x, label, res = r.split("|", 3)
    if res.startswith("SKIPPED"):
        lines.append(f"| {label} | {cmd[dim]} | {res} | | | |")
        continue
    s, rss, lower, procs = res.split()
    lines.append(f"| {label} | {cmd[dim]} | {float(s):.2f} | {rss} | {'yes' if lower == '1' else 'no'} | {procs} |")
    if dim in data:
        data[dim].append({"x": float(x), "scan_s": float(s), "rss_mib": float(rss)})
lines += ["", "![scan time and peak RSS against processes, candidate memory and model files](scaling.png)", ""]
json.dump(data, open(out_json, "w"), indent=1)
open(out_md, "w").write("\n".join(lines))
print("\n".join(lines))
PY
cp "$work/scaling.json" bench/scaling.json
"$bin" __bench plot-scaling bench/scaling.json bench/scaling.png
