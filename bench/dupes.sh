#!/usr/bin/env bash
# dupes throughput: a process holding a 4 GiB copy of a 4 GiB model among 8 GiB of other
# (pseudo-random) memory. Compares `twofold dupes` with a plain pread of /proc/PID/mem of the
# same pages (the memory-bandwidth baseline), in the same run, and reports twofold's peak
# RSS and index size.  Usage: bash bench/dupes.sh [MODEL_SIZE] [OTHER_SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
model_size=${1:-4G}
other_size=${2:-8G}
cargo build --release --quiet
bin=$PWD/target/release/twofold
work=$(mktemp -d /var/tmp/twofold-bench-dupes.XXXXXX)
child=""
cleanup() {
  [ -n "$child" ] && kill "$child" 2>/dev/null || true
  exec 3>&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "writing a $model_size safetensors model..." >&2
"$bin" __bench write-model "$work/model.safetensors" "$model_size" >/dev/null
mkfifo "$work/ready"
# The child copies the whole file (pread into a heap buffer) plus other_size of random data.
exec 3> >("$bin" __child copy "$work/model.safetensors" --bytes "$other_size" --random >"$work/ready")
read -r _ <"$work/ready"
child=$(pgrep -f "__child copy $work/model.safetensors" | head -n1)
echo "target pid $child: $(grep -E 'RssAnon' /proc/$child/status)" >&2

python3 - "$bin" "$child" "$work/model.safetensors" <<'PY'
import json, resource, subprocess, sys, time
bin, pid, model = sys.argv[1], sys.argv[2], sys.argv[3]
def run(args):
    t = time.perf_counter()
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t, out
rows = []
for i in range(3):
    base_t, base = run([bin, "__bench", "readmem", pid])
    base = json.loads(base)
    t, out = run([bin, "dupes", "--json", "--pid", pid, model])
    r = json.loads(out)
    f = r["processes"][0]["files"][0]
    rows.append((base["seconds"], base["bytes"], t, f))
rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
rows.sort(key=lambda x: x[2])
base_s, base_b, t, f = rows[len(rows) // 2]
base_sorted = sorted(r[0] for r in rows)
base_s = base_sorted[len(base_sorted) // 2]
present = f["stats"]["present_bytes"]
print("| measure | value |\n|---|---|")
print(f"| target private memory searched | {present/2**30:.2f} GiB |")
print(f"| identical copy found | {f['identical']['memory_bytes']/2**30:.3f} GiB, {f['identical']['tensors']} tensors of {f['tensors']} |")
print(f"| pread of /proc/PID/mem, same pages (baseline), median of 3 | {base_s:.3f} s = {base_b/base_s/1e9:.2f} GB/s |")
print(f"| twofold dupes (whole command), median of 3 | {t:.3f} s = {present/t/1e9:.2f} GB/s of target memory |")
print(f"| ratio dupes / baseline throughput | {(present/t)/(base_b/base_s):.2f} |")
print(f"| bytes compared to confirm | {f['stats']['compared_bytes']/2**30:.2f} GiB |")
print(f"| peak RSS of any child run (twofold dupes or readmem) | {rss_kib/1024:.1f} MiB |")
PY
