#!/usr/bin/env bash
# The H200 run behind docs/device-h200.md: device copies in scan and serve, checked
# against nvidia-smi. Run on the GPU machine from the folder holding a stripped x86-64
# release build of `twofold` (argument 1, default .dev). Results go to $OUT (default
# ./out): scan.json, scan.txt, metrics.txt, check.txt, attestation.json, smi.txt.
#
# Two loaders of one real safetensors file (1 GiB of F16 tensors, written by torch):
#  A  `twofold __child cuda-load`: read() into the heap, cuMemAlloc + cuMemcpyHtoD, read
#     back and compared (xxh3), attested: a proven device copy (and a private host copy);
#  B  PyTorch `safetensors.torch.load_file(path, device="cuda:0")`: a real runtime whose
#     device memory twofold can only size (NVML): a suspected device copy.
set -u
BIN=$(cd "${1:-.dev}" && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PATH=$BIN:$PATH
W=$(mktemp -d /tmp/twofold-h200.XXXXXX)
M=$W/model.safetensors
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
smi() { nvidia-smi "$@" 2>&1; }
{
  echo "# nvidia-smi"; smi --query-gpu=index,name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv
} > "$OUT/smi.txt"
python3 - "$M" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(7)
save_file({f"w{i}": torch.randn(8192, 16384, generator=g).to(torch.float16) for i in range(4)}, sys.argv[1])
PY
ls -l "$M"
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
wait_ready() { for _ in $(seq 600); do grep -q ready "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "never ready: $1"; cat "$1"; return 1; }
U0=$(used)
mkfifo "$W/a.in" "$W/b.in"
twofold __child cuda-load "$M" --go < "$W/a.in" > "$W/a.out" 2>&1 & pids+=($!); A=$!
exec 7> "$W/a.in"
# A says `armed` once its CUDA context exists, before any upload: scan it then.
for _ in $(seq 600); do grep -q armed "$W/a.out" 2>/dev/null && break; sleep 0.1; done
twofold scan "$M" --json > "$OUT/scan-context.json" 2>/dev/null
echo >&7
wait_ready "$W/a.out"
UA=$(used)
python3 -c '
import sys, torch
from safetensors.torch import load_file
t = load_file(sys.argv[1], device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
' "$M" < "$W/b.in" > "$W/b.out" 2>&1 & pids+=($!); B=$!
exec 8> "$W/b.in"
wait_ready "$W/b.out"
UB=$(used)
{
  echo "# loader A (twofold cuda-load) pid $A, loader B (torch) pid $B"
  echo "# GPU memory.used MiB: before $U0, after A $UA, after B $UB"
  echo "# nvidia-smi --query-compute-apps"
  smi --query-compute-apps=pid,process_name,used_memory --format=csv
} >> "$OUT/smi.txt"
cat "$OUT/smi.txt"
cp /run/twofold/device/twofold-$A-*.json "$OUT/attestation.json" 2>/dev/null || echo "no attestation of $A"
T0=$(date +%s.%N)
twofold scan "$M" --json > "$OUT/scan.json" 2> "$OUT/scan.err"
T1=$(date +%s.%N)
twofold scan "$M" > "$OUT/scan.txt" 2>&1
echo "scan --json took $(echo "$T1 - $T0" | bc 2>/dev/null || python3 -c "print($T1-$T0)") s"
cat "$OUT/scan.txt"
twofold serve --listen 127.0.0.1:9464 --interval 1s --model-glob "$W/*.safetensors" > "$W/serve.log" 2>&1 & pids+=($!)
for _ in $(seq 40); do
  sleep 0.5
  python3 -c 'import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:9464/metrics", headers={"Accept": "text/plain; version=0.0.4"})).read().decode())' > "$OUT/metrics.txt" 2>/dev/null \
    && grep -q '^twofold_file_device_copy_suspected_bytes{' "$OUT/metrics.txt" && break
done
grep -E '^twofold_(gpu|gpus|file_device|file_held_bytes\{.*device)' "$OUT/metrics.txt"
python3 - "$OUT" "$A" "$B" "$U0" "$UA" "$UB" <<'PY' | tee "$OUT/check.txt"
import json, subprocess, sys
out, A, B, u0, ua, ub = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(int, sys.argv[4:7])
MIB = 1 << 20
r = json.load(open(f"{out}/scan.json"))
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                      capture_output=True, text=True).stdout
smi = {int(p): int(m) for p, m in (l.split(",") for l in apps.strip().splitlines() if l.strip())}
procs = {p["pid"]: p for p in r["processes"]}
ok = True
def info(what, detail):
    print("INFO", what, "|", detail)
def check(what, cond, detail):
    global ok
    ok &= bool(cond)
    print(("PASS" if cond else "FAIL"), what, "|", detail)
print("gpus:", json.dumps(r["gpus"]))
for pid, name, delta in ((A, "A twofold cuda-load", ua - u0), (B, "B torch load_file", ub - ua)):
    got = procs.get(pid, {}).get("gpu_memory_bytes")
    check(f"{name}: scan's device bytes = nvidia-smi's per-process used_memory (±2 MiB)",
          got is not None and pid in smi and abs(got - smi[pid] * MIB) <= 2 * MIB,
          f"scan {got} B, nvidia-smi {smi.get(pid)} MiB")
    info(f"{name}: GPU-wide memory.used grew by", f"{delta} MiB; scan's per-process {None if got is None else got / MIB:.0f} MiB")
ctx = {p["pid"]: p for p in json.load(open(f"{out}/scan-context.json"))["processes"]}
try:
    att = json.load(open(f"{out}/attestation.json"))["proof"]
    p0 = ctx.get(A, {}).get("gpu_memory_bytes")
    p1 = procs.get(A, {}).get("gpu_memory_bytes")
    info("A: device memory of its CUDA context alone (scan before the upload)", p0)
    check("A: growth of scan's device bytes over the upload = the loader's own cuMemGetInfo delta (±2 MiB)",
          p0 is not None and p1 is not None and abs((p1 - p0) - att["device_bytes"]) <= 2 * MIB,
          f"scan {p0} -> {p1} B (+{None if None in (p0, p1) else p1 - p0}), cuMemGetInfo delta {att['device_bytes']} B")
    check("A: attested allocation (cuMemGetInfo delta) holds the file (rounded up to 2 MiB)",
          att["file_bytes"] <= att["device_bytes"] <= att["file_bytes"] + 2 * MIB,
          f"file {att['file_bytes']} B, device {att['device_bytes']} B, xxh3 {att['file_xxh3']} = {att['device_xxh3']}")
except Exception as e:
    check("A: attestation present", False, repr(e))
f = r["files"][0]
dev = {d["pid"]: d for d in f["device_copies"]}
check("A's device copy is proven", dev.get(A, {}).get("proven") is True, dev.get(A))
check("B's device copy is suspected", dev.get(B, {}).get("proven") is False, dev.get(B))
rep = f["representations"]
print("representations:", json.dumps(rep))
check("the count includes the proven device copy", rep["device"] is not None and rep["device"] >= 0.99, rep["device"])
m = open(f"{out}/metrics.txt").read()
check("serve exports per-workload device memory", "twofold_gpu_process_memory_bytes{" in m, "")
check("serve exports the proven device copy as kind=device",
      any(l.startswith("twofold_file_held_bytes{") and 'kind="device"' in l and not l.endswith(" 0") for l in m.splitlines()), "")
print("ALL PASS" if ok else "SOME FAILED")
PY
