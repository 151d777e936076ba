#!/usr/bin/env bash
# Times `twofold inspect` (tables and --json) on a generated GGUF v3 of N tensors
# (default 10,000, with a 1,000-string vocabulary) using hyperfine. Goal: median < 20 ms.
# Usage: bench/inspect.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
command -v hyperfine >/dev/null || { echo "bench/inspect.sh: needs hyperfine" >&2; exit 2; }
cargo build --release --quiet --bin twofold --example containers
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
target/release/examples/containers gguf "$n" "$tmp/model.gguf"
echo "model: $n tensors, $(stat -c %s "$tmp/model.gguf") bytes"
hyperfine --warmup 5 --min-runs 50 -N --export-json "$tmp/times.json" \
  "target/release/twofold inspect $tmp/model.gguf" \
  "target/release/twofold inspect --json $tmp/model.gguf"
python3 - "$tmp/times.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"median {r['median'] * 1000:.2f} ms  {r['command']}")
PY
