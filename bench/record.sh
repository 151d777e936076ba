#!/usr/bin/env bash
# Recording cost and replay latency, in one run.
# 1. `twofold record --interval 1s` for 60 snapshots on the scan bench workload (200
#    readers mapping one 64 MiB file, 300 processes of 1 MiB anonymous memory): the
#    recorder's CPU (user+sys over wall), its peak RSS, bytes stored per snapshot and per
#    day, and the compression ratio against the raw JSON of the same snapshots.
# 2. A 7-day store at a 5 s interval (120,960 snapshots of that workload): time to first
#    output of `twofold replay --at "3 days ago"` (hyperfine, 20 runs).
# Usage: bash bench/record.sh        (TWOFOLD_BIN overrides the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$PWD/target/release/twofold
fi
cargo build --release --quiet --example fill_store
work=$(mktemp -d /var/tmp/twofold-bench-record.XXXXXX)
helper=""
cleanup() {
  [ -n "$helper" ] && kill "$helper" 2>/dev/null && wait "$helper" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
head -c 64M /dev/urandom > "$work/model.gguf"
python3 bench/spawn_readers.py --twofold "$bin" --file "$work/model.gguf" \
    --map 200 --anon 300 --anon-bytes 1M --ready-file "$work/ready" --pid-file "$work/pids" &
helper=$!
for _ in $(seq 1 1200); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || { echo "readers not ready" >&2; exit 1; }
/usr/bin/time -f "%U %S %e %M" -o "$work/time" \
    "$bin" record --store "$work/store" --interval 1s --count 60 >/dev/null 2>&1
read -r user sys wall rss_kb < "$work/time"
frames=$(cat "$work"/store/*.frames | wc -c)
raw=$(zstd -dc "$work"/store/*.frames 2>/dev/null | wc -c || echo 0)
python3 - "$user" "$sys" "$wall" "$rss_kb" "$frames" "$raw" <<'PY'
import sys
u, s, w, rss, frames, raw = map(float, sys.argv[1:])
n = 60
print("| measure | value |\n|---|---|")
print(f"| recorder CPU, 60 snapshots at 1 s (user+sys / wall) | {(u+s)/w*100:.1f}% of one core ({u+s:.2f} s in {w:.1f} s) |")
print(f"| recorder peak RSS | {rss/1024:.1f} MiB |")
print(f"| stored per snapshot (zstd frame) | {frames/n/1024:.1f} KiB |")
print(f"| raw JSON per snapshot | {raw/n/1024:.1f} KiB |")
print(f"| compression ratio | {raw/frames:.1f}x |")
print(f"| stored per day at 5 s / at 1 s | {frames/n*17280/2**20:.0f} MiB / {frames/n*86400/2**20:.0f} MiB |")
PY
kill "$helper"; wait "$helper" 2>/dev/null || true; helper=""
n=$(target/release/examples/fill_store "$work/store" "$work/week" 7 5)
echo "| 7-day store at 5 s | $n snapshots, $(du -sh "$work/week" | cut -f1) |"
hyperfine -N --warmup 2 --runs 20 --style basic --export-json "$work/replay.json" \
    "$bin replay --store $work/week --at '3 days ago'" >/dev/null
python3 - "$work/replay.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"| `replay --at '3 days ago'` on it, median of 20 | {r['median']*1000:.1f} ms (min {r['min']*1000:.1f}, max {r['max']*1000:.1f}) |")
PY
