#!/usr/bin/env bash
# `twofold serve` cost: scrape latency p50/p99 (curl -w, 500 sequential and 500 at 50 in
# parallel) and the exporter's CPU (user+sys over wall, from /proc/PID/stat) and RSS over
# DURATION seconds of collections at --interval 1s.
# Usage: bash bench/serve.sh [DURATION]     (TWOFOLD_BIN overrides the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-20}
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$PWD/target/release/twofold
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --interval 1s >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/metrics")" = 200 ] && break
  sleep 0.1
done
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$pid/stat"; }
c0=$(cpu); t0=$(date +%s.%N)
sleep "$dur"
c1=$(cpu); t1=$(date +%s.%N)
pct() { sort -n | awk '{a[NR]=$1} END {printf "p50 %.2f ms  p99 %.2f ms  (n=%d)\n", a[int(NR*0.5)]*1000, a[int(NR*0.99)]*1000, NR}'; }
echo "body: $(curl -s "127.0.0.1:$port/metrics" | wc -c) bytes, $(curl -s "127.0.0.1:$port/metrics" | grep -vc '^#') series"
echo "collection CPU: $(echo "($c1 - $c0) / $ticks / ($t1 - $t0) * 100" | bc -l | xargs printf '%.1f')% of one core over ${dur}s at --interval 1s"
echo "last collection: $(curl -s "127.0.0.1:$port/metrics" | awk '/^twofold_collect_duration_seconds/ {print $2}') s"
echo -n "sequential scrapes: "
for _ in $(seq 1 500); do curl -s -o /dev/null -w '%{time_total}\n' "127.0.0.1:$port/metrics"; done | pct
echo -n "50 in parallel:     "
seq 1 500 | xargs -P 50 -I{} curl -s -o /dev/null -w '%{time_total}\n' "127.0.0.1:$port/metrics" | pct
echo "exporter RSS: $(awk '/VmRSS/ {printf "%.1f MiB", $2/1024}' "/proc/$pid/status")"
