#!/usr/bin/env bash
# The proof's index with the page cache left as found (#39), before and after, in one run.
#
# For each MODEL_SIZE: a safetensors model held by a process that read() it into its heap and
# closed it (`__child copy --close`). For each state of the model's page cache (cached: all of
# it; evicted: none of it, POSIX_FADV_DONTNEED after a write-back) and each binary, `scan FILE`
# (the default proof) and `scan --exact FILE`, each with an empty point cache (every point
# read from the file, as a first scan on a host), 3 runs: the index's time (TWOFOLD_PROFILE's
# "index X s"), the whole command's wall time, and util-linux fincore's page count of the
# model before and after. Medians are printed; one row per (size, state, mode, binary).
#
# Usage: bash bench/untouched.sh [SIZES]           (default "1G 8G")
#   BEFORE=/path/to/old/twofold  adds a binary to compare with (e.g. a build of 532684c)
# Needs root (to search the reader's memory), fincore, python3. Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-"1G 8G"}
after=${TWOFOLD_BIN:-}
if [ -z "$after" ]; then
  cargo build --release --quiet
  after=$PWD/target/release/twofold
fi
bins=("after=$after")
[ -n "${BEFORE:-}" ] && bins=("before=$BEFORE" "${bins[@]}")
work=$(mktemp -d /var/tmp/twofold-bench-untouched.XXXXXX)
holder=""
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  exec 3>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

printf '%-5s %-8s %-7s %-6s %9s %9s %8s %10s\n' size state mode binary index_s wall_s pages0 pages_after
for size in $sizes; do
  model="$work/model-$size.safetensors"
  "$after" __bench write-model "$model" "$size" >/dev/null
  sync "$model"
  mkfifo "$work/ready"
  exec 3> >("$after" __child copy "$model" --close >"$work/ready")
  read -r _ <"$work/ready"
  rm "$work/ready"
  holder=$(pgrep -f "__child copy $model" | head -n1)
  python3 - "$model" "$work" "${bins[@]}" <<'PY'
import os, re, statistics, subprocess, sys, time
model, work, bins = sys.argv[1], sys.argv[2], [b.split("=", 1) for b in sys.argv[3:]]
size = os.path.getsize(model)
label = f"{size >> 30}G" if size >= 1 << 30 else f"{size >> 20}M"

def pages():
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "PAGES", model],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())

def set_state(state):
    if state == "cached":
        with open(model, "rb") as f:
            while f.read(16 << 20):
                pass
    else:
        fd = os.open(model, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

for state in ("cached", "evicted"):
    for mode in ("scan", "exact"):
        for name, exe in bins:
            idx, wall, before, after = [], [], [], []
            for run in range(3):
                cache = os.path.join(work, f"index-{name}-{state}-{mode}-{run}")
                os.mkdir(cache)
                set_state(state)
                before.append(pages())
                args = [exe, "scan", "--prove-budget", "600s"] + (["--exact"] if mode == "exact" else []) + [model]
                env = dict(os.environ, TWOFOLD_INDEX_CACHE=cache, TWOFOLD_PROFILE="1")
                t0 = time.monotonic()
                p = subprocess.run(args, env=env, capture_output=True, text=True)
                wall.append(time.monotonic() - t0)
                if p.returncode != 0:
                    sys.exit(f"{args}: exit {p.returncode}: {p.stderr[-2000:]}")
                m = re.search(r"index ([0-9.]+) s", p.stderr)
                idx.append(float(m.group(1)) if m else float("nan"))
                after.append(pages())
                subprocess.run(["rm", "-rf", cache], check=True)
            print(f"{label:<5} {state:<8} {mode:<7} {name:<6} {statistics.median(idx):9.3f} "
                  f"{statistics.median(wall):9.2f} {statistics.median(before):8d} {statistics.median(after):10d}",
                  flush=True)
PY
  kill "$holder" 2>/dev/null || true
  exec 3>&-
  holder=""
  rm -f "$model"
done
