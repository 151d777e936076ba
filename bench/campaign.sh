#!/usr/bin/env bash
# Campaign costs: the sampler's CPU (getrusage of its thread) at 100 ms with 10 processes
# and 4 files of interest, for 20 s; and the readers table of the article (N = 1, 6, 10
# readers of a 512 MiB file under 4 GiB, both arms) with integrity hashing rates.
# Needs root (cgroups). Usage: bash bench/campaign.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=$PWD/target/release/twofold
work=$(mktemp -d /var/tmp/twofold-bench-campaign.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
for i in 1 2 3 4; do head -c 64M /dev/urandom > "$work/f$i.bin"; done
readers=""
for i in $(seq 1 10); do
  f="$work/f$(( (i - 1) % 4 + 1 )).bin"
  readers="$readers $bin __child map $f --exit-after-ms 20000 &"
done
echo "== sampler: 10 readers, 4 files, 100 ms, 20 s" >&2
"$bin" run --json --interval-ms 100 --memory-max 2G \
  --watch "$work/f1.bin" --watch "$work/f2.bin" --watch "$work/f3.bin" --watch "$work/f4.bin" \
  -- sh -c "$readers wait" > "$work/run.json"
python3 - "$work/run.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| sampler | {s['samples']} samples in {s['wall_seconds']:.1f} s | CPU {s['sampler_cpu_seconds']*1000:.0f} ms = {s['sampler_cpu_fraction']*100:.2f}% of one core (goal <= 1%) |")
PY
echo "== readers and integrity: 512 MiB file under 4 GiB" >&2
head -c 512M /dev/urandom > "$work/model.gguf"
"$bin" pressure "$work/model.gguf" --memory-max 4G --readers 1,6,10 --cycles 3 --out "$work/out" >/dev/null
cat "$work/out/pressure.md"
