#!/usr/bin/env bash
# Device copies II (issue 44) on a real GPU: real PyTorch loaders, one resident upload
# tracer (`record --trace-uploads`, started first), then a plain `scan` (no tracing of its
# own: it reads the tracer's ledger) in two argument orders, a plain `serve`, and a plain
# `scan` after one loader exited. Truth: what each loader holds on the device (its own
# tensors: numel x element size, and torch.cuda.memory_allocated()) and nvidia-smi
# --query-compute-apps. Run on the GPU machine from the folder holding a stripped x86-64
# release build of `twofold` (argument 1, default .devcarry); about 3 minutes.
# Results in $OUT (default ./out): table.md and table.json (case, truth, twofold),
# scans.txt (the text of the plain scans), logs.txt.
#
#  C1  torch.load(big.pt) then .cuda() of every tensor (big.safetensors and twin.safetensors
#      hold the same tensor bytes, nobody opens them): big.pt's device copy, none elsewhere;
#  C2  load_file(big.safetensors, device="cuda:0"): big.safetensors', not twin's (same bytes);
#  C3  load_file(small.safetensors, device="cuda:0"), then .clone() of every tensor on the
#      device: two device copies;
#  C4  as C3, then the clones deleted and torch.cuda.empty_cache(): one device copy again;
#  C5  load_file(f32.safetensors) on the CPU, .to("cuda", torch.bfloat16): 0.50 of the file;
#  after: C2 exits, and a plain scan shows no device copy of it any more.
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PATH=$BIN:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/twofold-dc2.XXXXXX)
export TWOFOLD_UPLOADS_DIR=$W/ledgers
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for c in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
  [ -e "$c" ] && export TWOFOLD_LIBCUDA=$c && break
done
T0=$(date +%s)
echo "libcuda: ${TWOFOLD_LIBCUDA:-?}; libcufile: $(ls /usr/local/cuda/lib64/libcufile.so* 2>/dev/null | head -1)" > "$W/log.txt"
python3 - "$W" <<'PY'
import shutil, sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(44)
r = lambda *s: torch.randn(*s, generator=g, device="cuda")
big = {f"w{i}": r(4096, 8192).half().cpu() for i in range(8)}                  # 512 MiB F16
save_file(big, f"{w}/big.safetensors")
torch.save(big, f"{w}/big.pt")                                                  # the same tensor bytes
shutil.copyfile(f"{w}/big.safetensors", f"{w}/twin.safetensors")                # the same file bytes
save_file({f"w{i}": r(4096, 4096).half().cpu() for i in range(4)}, f"{w}/small.safetensors")  # 128 MiB F16
save_file({f"w{i}": r(4096, 4096).cpu() for i in range(4)}, f"{w}/f32.safetensors")          # 256 MiB F32
PY
ls -l "$W" >> "$W/log.txt"
FILES=("$W/big.safetensors" "$W/big.pt" "$W/twin.safetensors" "$W/small.safetensors" "$W/f32.safetensors")
# The resident tracer, started before any load (it names the files: it matches uploads
# against the files it knows).
twofold record --trace-uploads --interval 2s --no-prove --store "$W/store" "${FILES[@]}" > "$W/record.log" 2>&1 & pids+=($!); REC=$!
for _ in $(seq 600); do ls "$TWOFOLD_UPLOADS_DIR"/*.json >/dev/null 2>&1 && break; sleep 0.1; done
ls "$TWOFOLD_UPLOADS_DIR" >> "$W/log.txt" 2>&1
cat > "$W/loader.py" <<'PY'
import json, os, sys, time, torch
from safetensors.torch import load_file
case, path = sys.argv[1], sys.argv[2]   # the command line names the file it loads
keep, truth = [], {}
nbytes = lambda d: sum(t.numel() * t.element_size() for t in d.values())
name = os.path.basename(path)
if case == "C1":
    sd = torch.load(path)
    dev = {k: v.cuda() for k, v in sd.items()}
    keep += [sd, dev]; truth[name] = nbytes(dev)
elif case == "C2":
    dev = load_file(path, device="cuda:0")
    keep.append(dev); truth[name] = nbytes(dev)
elif case in ("C3", "C4"):
    dev = load_file(path, device="cuda:0")
    clones = {k: v.clone() for k, v in dev.items()}
    torch.cuda.synchronize()
    keep.append(dev); truth[name] = nbytes(dev) + nbytes(clones)
    if case == "C4":
        del clones
        torch.cuda.synchronize(); torch.cuda.empty_cache()
        truth[name] = nbytes(dev)
    else:
        keep.append(clones)
elif case == "C5":
    cpu = load_file(path)
    dev = {k: v.to("cuda", torch.bfloat16) for k, v in cpu.items()}
    keep += [cpu, dev]; truth[name] = nbytes(dev)
torch.cuda.synchronize()
print(json.dumps({"ready": True, "case": case, "pid": os.getpid(), "truth_device_bytes": truth,
                  "memory_allocated": torch.cuda.memory_allocated()}), flush=True)
sys.stdin.read()
PY
wait_ready() { for _ in $(seq 1200); do grep -q '"ready"' "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "never ready: $1"; cat "$1"; return 1; }
declare -A FILE=([C1]=big.pt [C2]=big.safetensors [C3]=small.safetensors [C4]=small.safetensors [C5]=f32.safetensors)
for c in C1 C2 C3 C4 C5; do
  mkfifo "$W/$c.in"
  python3 "$W/loader.py" $c "$W/${FILE[$c]}" < "$W/$c.in" > "$W/$c.out" 2>&1 & pids+=($!)
  eval "exec {fd_$c}> \"$W/$c.in\""
  wait_ready "$W/$c.out"
done
grep -h '"ready"' "$W"/C?.out > "$W/loaders.json"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$W/smi.txt" 2>&1
sleep 2  # the ledger is rewritten within 0.5 s of a change
# Plain scans (no tracing of their own), both argument orders.
twofold scan "${FILES[@]}" --json > "$W/scan1.json" 2> "$W/scan1.err"
REV=(); for ((i=${#FILES[@]}-1; i>=0; i--)); do REV+=("${FILES[$i]}"); done
twofold scan "${REV[@]}" --json > "$W/scan2.json" 2> "$W/scan2.err"
twofold scan "${FILES[@]}" > "$OUT/scans.txt" 2>&1
# A plain serve reads the same ledger.
twofold serve --listen 127.0.0.1:9466 --interval 2s --model-glob "$W/*.safetensors" --model-glob "$W/*.pt" > "$W/serve.log" 2>&1 & pids+=($!); SRV=$!
python3 - "$W/metrics.txt" <<'PY'
import sys, time, urllib.request
t0, text = time.time(), ""
while time.time() - t0 < 60:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9466/metrics").read().decode()
        if 'kind="device"' in text and "twofold_file_copies" in text:
            break
    except Exception as e:
        text = f"scrape failed: {e}"
    time.sleep(1)
open(sys.argv[1], "w").write(text)
PY
kill -INT $SRV; wait $SRV 2>/dev/null
# C2 exits: a plain scan shows no device copy of it any more.
C2PID=$(python3 -c 'import json,sys; print([d["pid"] for d in map(json.loads, open(sys.argv[1])) if d["case"]=="C2"][0])' "$W/loaders.json")
# (Closing its fifo is not enough: the loaders started after C2 inherited the fifo's write
# end, so C2 never reads EOF. The 2026-12-06 run did that, and scan rightly still showed C2's
# device copy: C2 was alive with 1.0 GiB on the GPU.)
exec {fd_C2}>&-
kill -TERM "$C2PID" 2>/dev/null
for _ in $(seq 300); do kill -0 "$C2PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$C2PID" 2>/dev/null && echo "C2 (pid $C2PID) did not exit in 30 s" >> "$W/log.txt"
twofold scan "${FILES[@]}" --json > "$W/scan3.json" 2> "$W/scan3.err"
{ echo; echo "== after C2 (pid $C2PID) exited"; twofold scan "${FILES[@]}" 2>&1; } >> "$OUT/scans.txt"
kill -INT $REC; wait $REC 2>/dev/null
ls "$TWOFOLD_UPLOADS_DIR" >> "$W/log.txt" 2>&1
echo "ledger files after record stopped: $(ls "$TWOFOLD_UPLOADS_DIR" 2>/dev/null | wc -l)" >> "$W/log.txt"
python3 - "$W" "$OUT" "$C2PID" <<'PY'
import json, os, sys
w, out, c2 = sys.argv[1], sys.argv[2], int(sys.argv[3])
MIB = 1 << 20
load = lambda p: (lambda r: r.get("report", r))(json.load(open(p)))
s1, s2, s3 = (load(f"{w}/scan{i}.json") for i in (1, 2, 3))
loaders = {d["case"]: d for d in map(json.loads, open(f"{w}/loaders.json"))}
smi = {int(p): int(m) * MIB for p, m in (l.split(",") for l in open(f"{w}/smi.txt") if "," in l)}
def files(r): return {f["path"].rsplit("/", 1)[-1]: f for f in r["files"]}
def dev(r, name, pid):
    f = files(r).get(name, {})
    return sum(d["device_bytes"] for d in f.get("device_copies", []) if d["pid"] == pid and d["proven"])
def notes(r, name, pid):
    f = files(r).get(name, {})
    return "; ".join(f"{d['via']}: {d.get('note') or ''}" for d in f.get("device_copies", []) if d["pid"] == pid)
size = {n: os.path.getsize(f"{w}/{n}") for n in ("big.safetensors", "big.pt", "twin.safetensors", "small.safetensors", "f32.safetensors")}
rows, ok = [], True
def row(case, file, truth_b, got_b, detail):
    global ok
    t, g = truth_b / size[file], got_b / size[file]
    good = abs(t - g) <= 0.02
    ok &= good
    rows.append({"case": case, "file": file, "truth": round(t, 4), "twofold": round(g, 4), "pass": good,
                 "truth_bytes": truth_b, "twofold_bytes": got_b, "detail": detail})
for case, L in sorted(loaders.items()):
    pid = L["pid"]
    for name, tb in L["truth_device_bytes"].items():
        order = dev(s1, name, pid) == dev(s2, name, pid)
        row(case, name, tb, dev(s1, name, pid),
            f"nvidia-smi {smi.get(pid, 0) // MIB} MiB, memory_allocated {L['memory_allocated'] // MIB} MiB; "
            f"same in both argument orders: {order}; {notes(s1, name, pid)}")
        if not order:
            ok = False
    for other in ("big.safetensors", "big.pt", "twin.safetensors"):
        if other not in L["truth_device_bytes"] and case in ("C1", "C2"):
            row(case, other, 0, max(dev(s1, other, pid), dev(s2, other, pid)), "no relation: no device copy here")
row("after C2 exited", "big.safetensors", 0, dev(s3, "big.safetensors", c2), "its rows are gone from the ledger")
u = s1["gpus"].get("uploads") or {}
tracer = u.get("tracer")
gds = u.get("gds")
met = {}
for l in open(f"{w}/metrics.txt"):
    if l.startswith("twofold_file_held_bytes{") and 'kind="device"' in l:
        met[l.split('file_id="')[1].split('"')[0]] = float(l.rsplit(" ", 1)[1])
serve = []
for name in size:
    st = os.stat(f"{w}/{name}")
    fid = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}:{st.st_ino}"
    want = sum(L["truth_device_bytes"].get(name, 0) for L in loaders.values())
    got = met.get(fid)
    good = got is not None and abs(got - want) <= 0.02 * size[name]
    ok &= good
    serve.append({"file": name, "truth_bytes": want, "serve_bytes": got, "pass": good})
res = {"rows": rows, "serve": serve, "tracer": tracer, "gds": gds, "all_pass": ok}
json.dump(res, open(f"{out}/table.json", "w"), indent=1)
with open(f"{out}/table.md", "w") as f:
    f.write(f"uploads traced by {tracer}\n\nGPUDirect Storage: {gds}\n\n")
    f.write("| case | file | truth | twofold | pass | detail |\n|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['case']} | {r['file']} | {r['truth']:.2f} | {r['twofold']:.2f} | {'PASS' if r['pass'] else 'FAIL'} | {r['detail']} |\n")
    f.write("\n| serve (plain, reading the ledger) | truth bytes | twofold_file_held_bytes{kind=\"device\"} | pass |\n|---|---|---|---|\n")
    for r in serve:
        f.write(f"| {r['file']} | {r['truth_bytes']} | {r['serve_bytes']} | {'PASS' if r['pass'] else 'FAIL'} |\n")
    f.write(f"\n{'ALL PASS' if ok else 'SOME FAILED'}\n")
print(open(f"{out}/table.md").read())
PY
echo "took $(( $(date +%s) - T0 )) s" >> "$W/log.txt"
for f in log.txt loaders.json smi.txt record.log serve.log scan1.err scan2.err scan3.err; do echo "== $f"; cat "$W/$f" 2>/dev/null; done > "$OUT/logs.txt"
