#!/usr/bin/env bash
# The H200 run behind docs/device-h200.md's "Uploads traced" part (issue 22): real
# PyTorch loaders with upload tracing on, checked against file sizes, NVML and
# torch.cuda.memory_allocated(), and the tracing overhead. Run on the GPU machine from the
# folder holding a stripped x86-64 release build of `twofold` (argument 1, default
# .devcarry). Results go to $OUT (default ./out), 7 files (the device tool brings back 8):
# replay.txt, replay.json, metrics.txt, check.txt, trace.txt, overhead.txt and logs.txt
# (loaders.json, nvidia-smi, the record and serve logs).
#
#  L1  torch.load(c.pt) + .cuda() of every tensor, the host copy kept;
#  L2  safetensors load_file(a, device="cuda:0") and load_file(b, device="cuda:0"), one process;
#  L3  b mapped zero-copy (mmap, pages touched) beside a 6 GiB KV-like device allocation;
#  L4  load_file(b) on the CPU, pin_memory(), .cuda(non_blocking=True).
# `record --trace` (every program), `serve --trace-uploads` and `trace` run beside them.
# Then: a 4 GiB load_file(device="cuda:0") and 100,000 small uploads, each in fresh
# processes: 3 untraced, 3 beside `record --trace-uploads` (the upload probes alone) and
# 3 beside `record --trace` (every program), alternating.
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PATH=$BIN:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/twofold-up.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
LIB=$(python3 -c 'import ctypes,ctypes.util,re;print(ctypes.util.find_library("cuda") or "")' 2>/dev/null)
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && LIB=$c && break
done
export TWOFOLD_LIBCUDA=$LIB
echo "libcuda: $LIB ($(readlink -f "$LIB"))" | tee "$OUT/overhead.txt"
python3 - "$W" <<'PY'
import sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(7)
r = lambda *s: torch.randn(*s, generator=g, device="cuda")
save_file({f"w{i}": r(4096, 16384).half().cpu() for i in range(8)}, f"{w}/a.safetensors")   # 1 GiB F16
save_file({f"w{i}": r(2048, 8192).bfloat16().cpu() for i in range(4)}, f"{w}/b.safetensors")  # 128 MiB BF16
torch.save({f"w{i}": r(4096, 8192).cpu() for i in range(4)}, f"{w}/c.pt")                  # 512 MiB F32
save_file({f"w{i}": r(8192, 16384).half().cpu() for i in range(16)}, f"{w}/d.safetensors") # 4 GiB F16
PY
ls -l "$W"
wait_ready() { for _ in $(seq 900); do grep -q '"ready"' "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "never ready: $1"; cat "$1"; return 1; }
frames() { ls "$1"/*/*.frames >/dev/null 2>&1 || find "$1" -name '*.frames' -size +0 2>/dev/null | grep -q .; }
wait_frame() { for _ in $(seq 600); do frames "$1" && return 0; sleep 0.1; done; echo "no frame in $1"; }
# The tracers: record --trace (snapshots every 2 s), serve --trace-uploads, and trace.
twofold record --trace --interval 2s --no-prove --store "$W/store" "$W/a.safetensors" "$W/b.safetensors" "$W/c.pt" > "$W/record.log" 2>&1 & pids+=($!); REC=$!
twofold serve --trace-uploads --listen 127.0.0.1:9464 --interval 1s --model-glob "$W/*.safetensors" --model-glob "$W/*.pt" > "$W/serve.log" 2>&1 & pids+=($!)
twofold trace --interval 10s --duration 300s --file "$W/a.safetensors" --file "$W/b.safetensors" --file "$W/c.pt" > "$OUT/trace.txt" 2>&1 & pids+=($!); TR=$!
wait_frame "$W/store"
sleep 3
cat > "$W/loader.py" <<'PY'
import json, mmap, os, sys, time, torch
from safetensors.torch import load_file
w, case = sys.argv[1], sys.argv[2]
keep = []
t0 = time.time()
files = []
if case == "L1":
    sd = torch.load(f"{w}/c.pt")
    keep += [sd, {k: v.cuda() for k, v in sd.items()}]
    files = ["c.pt"]
elif case == "L2":
    keep += [load_file(f"{w}/a.safetensors", device="cuda:0"), load_file(f"{w}/b.safetensors", device="cuda:0")]
    files = ["a.safetensors", "b.safetensors"]
elif case == "L3":
    f = open(f"{w}/b.safetensors", "rb")
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    s = sum(m[i] for i in range(0, len(m), 4096))
    keep += [f, m, torch.empty(6 << 30, dtype=torch.uint8, device="cuda")]
elif case == "L4":
    cpu = load_file(f"{w}/b.safetensors")
    pinned = {k: v.pin_memory() for k, v in cpu.items()}
    keep += [pinned, {k: v.cuda(non_blocking=True) for k, v in pinned.items()}]
    files = ["b.safetensors"]
torch.cuda.synchronize()
tensor_bytes = {n: sum(t.numel() * t.element_size() for t in (load_file(f"{w}/{n}") if n.endswith(".safetensors") else torch.load(f"{w}/{n}")).values()) for n in files}
print(json.dumps({"ready": True, "case": case, "pid": os.getpid(), "took_s": time.time() - t0,
                  "memory_allocated": torch.cuda.memory_allocated(), "tensor_bytes": tensor_bytes}), flush=True)
sys.stdin.read()
PY
for c in L1 L2 L3 L4; do
  mkfifo "$W/$c.in"
  python3 "$W/loader.py" "$W" $c < "$W/$c.in" > "$W/$c.out" 2>&1 & pids+=($!)
  eval "exec {fd_$c}> \"$W/$c.in\""
  wait_ready "$W/$c.out"
done
cat "$W"/L?.out | grep '"ready"' > "$W/loaders.json"
cat "$W/loaders.json"
sleep 5  # two more record snapshots
# serve: scrape until a fresh snapshot has the upload series of every loaded file (60 s at most).
python3 - "$W" "$OUT/metrics.txt" <<'PY'
import os, sys, time, urllib.request
w, out = sys.argv[1], sys.argv[2]
ids = {n: f"{os.major(s.st_dev)}:{os.minor(s.st_dev)}:{s.st_ino}" for n in ("a.safetensors", "b.safetensors", "c.pt") for s in [os.stat(f"{w}/{n}")]}
t0, text = time.time(), ""
while time.time() - t0 < 60:
    try:
        text = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:9464/metrics", headers={"Accept": "text/plain; version=0.0.4"})).read().decode()
    except Exception as e:
        text = f"scrape failed: {e}"
    if all(f'twofold_file_device_uploaded_bytes_total{{file_id="{i}"' in text for i in ids.values()):
        break
    time.sleep(1)
open(out, "w").write(text)
print(f"metrics after {time.time() - t0:.1f} s; file ids {ids}")
PY
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$W/smi.txt" 2>&1
kill -INT $REC; wait $REC 2>/dev/null
kill -INT $TR; wait $TR 2>/dev/null
twofold replay --store "$W/store" --json > "$OUT/replay.json" 2> "$W/replay.err"
twofold replay --store "$W/store" > "$OUT/replay.txt" 2>&1
sed -n '1,200p' "$OUT/replay.txt"
grep -E '^twofold_file_(held_bytes\{.*device|device_upload)' "$OUT/metrics.txt"
python3 - "$OUT" "$W" <<'PY' | tee "$OUT/check.txt"
import json, sys
out, w = sys.argv[1], sys.argv[2]
MIB = 1 << 20
r = json.load(open(f"{out}/replay.json"))
r = r.get("report", r)
loaders = {d["case"]: d for d in map(json.loads, open(f"{w}/loaders.json"))}
smi = {int(p): int(m) * MIB for p, m in (l.split(",") for l in open(f"{w}/smi.txt") if "," in l)}
files = {f["path"].rsplit("/", 1)[-1]: f for f in r["files"]}
procs = {p["pid"]: p for p in r["processes"]}
ok = True
def check(what, cond, detail):
    global ok
    ok &= bool(cond)
    print(("PASS" if cond else "FAIL"), what, "|", detail)
for case in ("L1", "L2", "L4"):
    L = loaders[case]; pid = L["pid"]
    total = 0
    for name, tb in L["tensor_bytes"].items():
        f = files.get(name, {})
        dev = [d for d in f.get("device_copies", []) if d["pid"] == pid]
        up = [u for u in f.get("uploads", []) if u["pid"] == pid]
        got = sum(d["attributed_bytes"] for d in dev if d["proven"])
        total += sum(d["device_bytes"] for d in dev if d["proven"])
        check(f"{case} pid {pid} {name}: proven device copy at upload = its tensor bytes",
              dev and all(d["proven"] and d["via"] == "upload" for d in dev) and got == tb,
              f"proven {got} B, tensor bytes {tb} B, file {f.get('size_bytes')} B, uploads {[(u['copies'], u['file_bytes'], u['entry']) for u in up]}")
    g = procs.get(pid, {}).get("gpu_memory_bytes")
    check(f"{case}: NVML device memory >= proven bytes, = nvidia-smi", g is not None and g >= total and abs(g - smi.get(pid, -1)) <= 2 * MIB,
          f"NVML {g} B, nvidia-smi {smi.get(pid)} B, proven {total} B")
    check(f"{case}: torch.cuda.memory_allocated() >= proven bytes (within 1%)", L["memory_allocated"] >= total and L["memory_allocated"] <= total * 1.01 + 8 * MIB if case != "L1" else L["memory_allocated"] >= total,
          f"memory_allocated {L['memory_allocated']} B, proven {total} B")
L3 = loaders["L3"]["pid"]
sus = [d for f in r["files"] for d in f.get("device_copies", []) if d["pid"] == L3]
check("L3 (mapping + 6 GiB KV-like): no device copy, proven or suspected", not sus, sus)
tp = {p["pid"]: p for p in (r["gpus"].get("uploads") or {}).get("processes", [])}
check("L3: traced from its start, not model bytes", tp.get(L3, {}).get("verdict") == "not model bytes", tp.get(L3))
import os
met = {}
for l in open(f"{out}/metrics.txt"):
    if l.startswith("twofold_file_device_uploaded_bytes_total{"):
        fid = l.split('file_id="')[1].split('"')[0]
        met[fid] = met.get(fid, 0) + float(l.rsplit(" ", 1)[1])
want = {"a.safetensors": loaders["L2"]["tensor_bytes"]["a.safetensors"],
        "b.safetensors": loaders["L2"]["tensor_bytes"]["b.safetensors"] + loaders["L4"]["tensor_bytes"]["b.safetensors"],
        "c.pt": loaders["L1"]["tensor_bytes"]["c.pt"]}
for n, tb in want.items():
    st = os.stat(f"{w}/{n}")
    fid = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}:{st.st_ino}"
    check(f"serve --trace-uploads: twofold_file_device_uploaded_bytes_total of {n} = its tensor bytes uploaded", met.get(fid) == tb, f"{met.get(fid)} vs {tb}")
b = files.get("b.safetensors", {})
print("b.safetensors representations:", json.dumps(b.get("representations")))
print("ALL PASS" if ok else "SOME FAILED")
PY
# Overhead: 3 runs without, 3 with tracing, alternating, each a fresh process.
cat > "$W/bench.py" <<'PY'
import json, sys, time, torch
from safetensors.torch import load_file
torch.cuda.init(); x = torch.empty(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter(); t = load_file(sys.argv[1], device="cuda:0"); torch.cuda.synchronize(); load = time.perf_counter() - t0
src = torch.randn(64); dst = torch.empty(64, device="cuda")
for _ in range(1000): dst.copy_(src)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(100000): dst.copy_(src)
torch.cuda.synchronize(); loop = time.perf_counter() - t0
print(json.dumps({"load_s": load, "loop_s": loop, "bytes": sum(v.numel() * v.element_size() for v in t.values())}), flush=True)
import os; time.sleep(float(os.environ.get("BENCH_LINGER", "0")))
PY
python3 "$W/bench.py" "$W/d.safetensors" > /dev/null 2>&1  # warm the page cache
for i in 1 2 3; do
  echo "untraced $(python3 "$W/bench.py" "$W/d.safetensors" 2>&1 | tail -1)" | tee -a "$OUT/overhead.txt"
  for mode in uploads all; do
    flag=--trace; [ $mode = uploads ] && flag=--trace-uploads
    # The last uploads-only run lingers 4 s under 1 s snapshots, so the store shows what the tracer saw.
    iv=60s linger=0; [ $i = 3 ] && [ $mode = uploads ] && iv=1s linger=4
    twofold record $flag --interval $iv --no-prove --store "$W/store-$mode-$i" "$W/d.safetensors" > "$W/rb.log" 2>&1 & RB=$!
    wait_frame "$W/store-$mode-$i"; sleep 1
    echo "$mode $(BENCH_LINGER=$linger python3 "$W/bench.py" "$W/d.safetensors" 2>&1 | tail -1)" | tee -a "$OUT/overhead.txt"
    kill -INT $RB; wait $RB 2>/dev/null
  done
done
twofold replay --store "$W/store-uploads-3" --json 2>/dev/null | python3 -c '
import json,sys; r=json.load(sys.stdin); r=r.get("report",r)
print("bench tracer saw:", json.dumps([{k: p[k] for k in ("pid","copies","copy_bytes","model_bytes")} for p in (r["gpus"].get("uploads") or {}).get("processes",[])]))' >> "$OUT/overhead.txt" 2>&1
python3 - "$OUT/overhead.txt" <<'PY' | tee -a "$OUT/overhead.txt"
import json, statistics, sys
rows = {"untraced": [], "uploads": [], "all": []}
for l in open(sys.argv[1]):
    k, _, j = l.partition(" ")
    if k in rows and j.strip().startswith("{"):
        rows[k].append(json.loads(j))
for what in ("load_s", "loop_s"):
    u = statistics.median(r[what] for r in rows["untraced"])
    for mode in ("uploads", "all"):
        t = statistics.median(r[what] for r in rows[mode])
        print(f"{what}: median untraced {u:.4f} s, record --trace{'-uploads' if mode == 'uploads' else ''} {t:.4f} s, overhead {100 * (t - u) / u:+.2f}%" + (f" ({(t - u) / 1e5 * 1e6:+.2f} us per upload)" if what == "loop_s" else ""))
PY
for f in loaders.json smi.txt replay.err record.log serve.log; do echo "== $f"; cat "$W/$f" 2>/dev/null; done > "$OUT/logs.txt"
