#!/usr/bin/env bash
# Soak: `twofold record` and `twofold serve` side by side for MINUTES (default 30) beside
# process churn (a shell loop starting /bin/true), SCRAPERS curl loops on serve, and a
# many-tensor model (TENSORS tensors, default 200000) of which a `__child copy` process
# holds a private copy. RSS (VmRSS) of record and serve is sampled every 5 s; prints
# the min and max of each 5-minute window and the last window against the first (goal:
# within 10%), and each one's start (the sample at 10 s) against its end (the last
# sample, and the lowest of the last minute: a proof in flight lifts a single sample) with
# the host's load average (#41's limit: within 10 MB of the start on a quiet host).
#
# Usage: bash bench/soak.sh [MINUTES=30] [SCRAPERS=20] [TENSORS=200000]
# (TWOFOLD_BIN overrides the binary; the release build otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
scrapers=${2:-20}
tensors=${3:-200000}
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$PWD/target/release/twofold
fi
work=$(mktemp -d /var/tmp/twofold-soak.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  exec 7>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A safetensors of `tensors` F32 tensors of 16 elements (64 B each), random bytes.
python3 - "$work/many.safetensors" "$tensors" <<'PY'
import json, os, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
hdr = {f"t{i}": {"dtype": "F32", "shape": [16], "data_offsets": [i * 64, i * 64 + 64]} for i in range(n)}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + os.urandom(64 * n))
PY
# The copier holds its copy until its stdin (fd 7, held here) closes.
exec 7> >("$bin" __child copy "$work/many.safetensors" >/dev/null)
( while :; do /bin/true; done ) &
pids+=($!)

p=$(port)
"$bin" serve --listen "127.0.0.1:$p" --interval 5s --model-glob "$work/*.safetensors" \
  >/dev/null 2>"$work/serve.err" &
pids+=($!); serve=$!
"$bin" record --store "$work/store" --interval 5s "$work/many.safetensors" \
  >/dev/null 2>"$work/record.err" &
pids+=($!); record=$!
sleep 2
for _ in $(seq 1 "$scrapers"); do
  ( while :; do curl -s -o /dev/null "http://127.0.0.1:$p/metrics" || sleep 0.2; done ) &
  pids+=($!)
done

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Every 5 s: a proof of the many-tensor copy lifts RSS for a few seconds and gives it back
# (the engine returns free heap pages after each snapshot), so single samples swing; what
# must stay flat is the envelope: the highest and lowest sample of each 5-minute window.
samples=$((minutes * 12))
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "t_s record_kib serve_kib"
for i in $(seq 0 "$samples"); do
  echo "$((i * 5)) $(rss "$record") $(rss "$serve")"
  if [ "$i" -lt "$samples" ]; then sleep 5; fi
done | tee "$work/rss.txt"
# Flatness is judged after a warm-up (the first full proof of the copy, the first
# scrapes): each window's max and min against the first window after 120 s.
awk 'NR > 1 && $1 >= 120 {
  w = int(($1 - 120) / 300)
  if (!(w in rmax) || $2 > rmax[w]) rmax[w] = $2
  if (!(w in rmin) || $2 < rmin[w]) rmin[w] = $2
  if (!(w in smax) || $3 > smax[w]) smax[w] = $3
  if (!(w in smin) || $3 < smin[w]) smin[w] = $3
  if (w > last) last = w
} END {
  print "window (5 min from 120 s)  record min..max KiB  serve min..max KiB"
  for (w = 0; w <= last; w++) printf "%d  %d..%d  %d..%d\n", w, rmin[w], rmax[w], smin[w], smax[w]
  printf "record: last window max / first window max %.2f, min %.2f\n", rmax[last] / rmax[0], rmin[last] / rmin[0]
  printf "serve:  last window max / first window max %.2f, min %.2f\n", smax[last] / smax[0], smin[last] / smin[0]
}' "$work/rss.txt"
awk -v n=$((samples + 1)) 'NR > 1 && $1 == 10 { r0 = $2; s0 = $3 }
  NR > 1 { r1 = $2; s1 = $3; i = NR - 1 }
  NR > 1 && NR - 1 > n - 12 { if (rl == "" || $2 < rl) rl = $2; if (sl == "" || $3 < sl) sl = $3 }
  END {
    printf "record: start (10 s) %d KiB, end %d KiB (%+d), lowest of the last minute %d KiB (%+d)\n", r0, r1, r1 - r0, rl, rl - r0
    printf "serve:  start (10 s) %d KiB, end %d KiB (%+d), lowest of the last minute %d KiB (%+d)\n", s0, s1, s1 - s0, sl, sl - s0
  }' "$work/rss.txt"
echo "load average (1, 5, 15 min): at the start $load0; at the end $(cut -d' ' -f1-3 /proc/loadavg)"
