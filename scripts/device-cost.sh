#!/usr/bin/env bash
# Issue #43's GPU host: the live views' own CPU beside htop and btop (where the machine has
# them), and every snapshot's exactness, on a host of real PyTorch processes:
# 6 python3 processes, each with a 512 MiB BF16 safetensors model uploaded to the GPU (3
# with load_file(device="cuda:0"), the file mapped and closed; 3 holding a host copy
# made with read() and uploaded with .cuda()), each updating a 512 MiB device buffer every
# second and rewriting a 256 MiB host buffer at 24 MiB/s.
# Then, WINDOW s each after WARMUP s: `top --interval 1s` (in a pseudo-terminal of 160x48
# made by python's pty), htop -d 10 and btop (if installed) together; `serve --interval
# 5s` (scraped every 5 s: how many scrapes had a lower bound); `record --interval 1s` (how
# many snapshots had one). CPU = utime + stime of /proc/PID/stat over the window.
# A profile of serve's snapshots (TWOFOLD_PROFILE: gather phases, NVML, proof) is kept
# ($OUT/profile-NAME.txt).
# Run on the GPU machine from the repository root with a stripped release build of twofold
# in the folder given (default .devcarry). Results in $OUT/cost.md and $OUT/profile-NAME.txt.
# BUILDS="name:path ..." times several builds' top one after the other on the same
# processes (each window with htop and btop beside it; TOP_ONLY=1 to stop there), and
# PERF=path/to/perf (PERF_LIB: its libraries; PERF_BUILDS: which builds) adds a perf
# profile of each top alone afterwards ($OUT/perf-NAME.txt, perf-NAME-calls.txt).
set -u
BIN=$(cd "${1:-.devcarry}" && pwd)/twofold
OUT=${OUT:-./out}
WINDOW=${WINDOW:-40}
WARMUP=${WARMUP:-8}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/twofold-cost.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
export PYTHONUNBUFFERED=1
# The GPU machine's commands run with no TERM: htop then stops at once ("Error opening
# terminal"). The pseudo-terminals below are xterms.
export TERM=xterm-256color
# htop and btop, where the GPU machine has none, from the folder given (copied from a
# Debian 12 machine: /usr/bin/htop, /usr/bin/btop; htop needs libncursesw6 and libnl-3, which
# may be carried in lib/ beside them).
export PATH=$PATH:$(dirname "$BIN")
# btop updating every 1 s, as bench/host.sh runs it (its default is 2 s).
mkdir -p "$W/cfg/btop" && printf 'update_ms = 1000\n' > "$W/cfg/btop/btop.conf"
cat > "$W/load.py" <<'PY'
import os, sys, time, torch
from safetensors.torch import load_file, save_file
path, mode = sys.argv[1], sys.argv[2]
if not os.path.exists(path):
    g = torch.Generator().manual_seed(int(sys.argv[3]))
    save_file({f"w{i}": torch.randn(4096, 8192, generator=g).bfloat16() for i in range(8)}, path)
if mode == "map":
    model = load_file(path, device="cuda:0")
else:
    data = open(path, "rb").read()
    from safetensors.torch import load as load_bytes
    host = load_bytes(data)
    model = {k: v.cuda() for k, v in host.items()}
dev = torch.zeros(256 << 20, dtype=torch.int16, device="cuda:0")
buf = bytearray(256 << 20)
print("ready", flush=True)
i = 0
while True:
    t = time.monotonic()
    dev.add_(1)
    for k in range(6):  # 24 MiB a second, in 4 MiB pieces
        off = ((i * 6 + k) * (4 << 20)) % len(buf)
        buf[off:off + (4 << 20)] = os.urandom(4 << 20)
    i += 1
    torch.cuda.synchronize()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
PY
for i in 0 1 2 3 4 5; do
  mode=map; [ "$i" -ge 3 ] && mode=copy
  python3 "$W/load.py" "$W/m$i.safetensors" "$mode" "$i" > "$W/load$i.out" 2>&1 &
  PIDS+=($!)
done
for i in 0 1 2 3 4 5; do
  for _ in $(seq 600); do grep -q ready "$W/load$i.out" && break; sleep 0.2; done
done
grep -c ready "$W"/load*.out | tr '\n' ' ' > "$OUT/ready.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/nvidia-smi.txt" 2>&1

cat > "$W/ptyrun.py" <<'PY'
import fcntl, os, pty, struct, sys, termios, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
os.kill(pid, 28)  # SIGWINCH
with open(os.environ["PTY_PIDFILE"], "w") as f:
    f.write(str(pid))
tail = b""
while True:
    try:
        b = os.read(fd, 65536)
        if not b:
            break
        tail = (tail + b)[-2000:]
    except OSError:
        break
# What it printed last (why a view stopped early), control bytes escaped.
with open(os.environ["PTY_PIDFILE"] + ".tail", "w") as f:
    f.write(repr(tail))
PY
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
faults() { awk '{ print $10 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
row() { # name pid t0 t1
  awk -v n="$1" -v a="$3" -v b="$4" -v s="$WINDOW" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "| %s | %.2f%% |\n", n, 100 * (b - a) / hz / s }'
}
{
  echo "# twofold's live views on the GPU host ($(nproc) cores, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  echo
  echo "| tool | CPU % of one core |"
  echo "|---|---|"
} > "$OUT/cost.md"

# One top window: top, htop and btop side by side (NAME labels top's row; BIN_ its build).
top_window() { # NAME BIN_
  local name=$1 bin=$2 k q tool args
  declare -A pid t0 t1 f0 f1
  rm -f "$W"/pid.*
  # top's own profile of each snapshot (TWOFOLD_PROFILE) goes to a file, not its screen.
  PTY_PIDFILE="$W/pid.top" python3 "$W/ptyrun.py" sh -c 'TWOFOLD_PROFILE=1 exec "$0" "$@" 2> "'"$OUT"'/top-profile-'"$name"'.txt"' \
    "$bin" top --interval 1s "$W" > /dev/null 2>&1 &
  PIDS+=($!)
  for tool in htop btop; do
    if command -v $tool > /dev/null; then
      args=(-d 10); [ $tool = btop ] && args=(--utf-force)
      XDG_CONFIG_HOME=$W/cfg PTY_PIDFILE="$W/pid.$tool" python3 "$W/ptyrun.py" $tool "${args[@]}" > /dev/null 2>&1 &
      PIDS+=($!)
    fi
  done
  for _ in $(seq 100); do [ -s "$W/pid.top" ] && break; sleep 0.2; done
  sleep 2
  for tool in top htop btop; do [ -s "$W/pid.$tool" ] && pid[$tool]=$(cat "$W/pid.$tool"); done
  [ -n "${pid[top]:-}" ] || echo "| twofold top ($name) | did not start (no pid from its pseudo-terminal) |" >> "$OUT/cost.md"
  sleep "$WARMUP"
  for k in "${!pid[@]}"; do t0[$k]=$(ticks "${pid[$k]}"); f0[$k]=$(faults "${pid[$k]}"); done
  # The window in quarters (does a view's cost settle?), and top's threads at its end.
  for q in 1 2 3 4; do
    sleep "$((WINDOW / 4))"
    echo "$name quarter $q: $(for k in "${!pid[@]}"; do echo -n "$k $(ticks "${pid[$k]}") "; done)" >> "$OUT/quarters.txt"
  done
  for k in "${!pid[@]}"; do t1[$k]=$(ticks "${pid[$k]}"); f1[$k]=$(faults "${pid[$k]}"); done
  if [ -n "${pid[top]:-}" ]; then
    for t in /proc/${pid[top]}/task/*; do echo "$(cat "$t/comm") $(awk '{ print $14 + $15 }' "$t/stat")"; done > "$OUT/top-threads-$name.txt" 2>&1
    echo "$name: top's minor faults $((f1[top] - f0[top])) in $WINDOW s; RSS $(awk '/VmRSS/ { print $2, $3 }' /proc/${pid[top]}/status)" >> "$OUT/faults.txt"
  fi
  for k in htop btop; do [ -f "$W/pid.$k.tail" ] && cp "$W/pid.$k.tail" "$OUT/$k-tail.txt"; done
  for k in top htop btop; do
    if [ -n "${pid[$k]:-}" ] && ! kill -0 "${pid[$k]}" 2>/dev/null; then
      echo "| $k | exited before the window ended (no CPU to report) |" >> "$OUT/cost.md"; continue
    fi
    local label=$k
    [ $k = top ] && label="top ($name)"
    [ $k = btop ] && label="btop (update_ms 1000)"
    [ -n "${pid[$k]:-}" ] && row "$label" "${pid[$k]}" "${t0[$k]}" "${t1[$k]}" >> "$OUT/cost.md"
  done
  for k in "${!pid[@]}"; do kill "${pid[$k]}" 2>/dev/null; done
  sleep 1
}
# A profile of top alone (PERF: a perf binary; its libraries in PERF_LIB), WINDOW s.
top_perf() { # NAME BIN_
  local name=$1 bin=$2
  rm -f "$W/pid.top"
  PTY_PIDFILE="$W/pid.top" python3 "$W/ptyrun.py" "$bin" top --interval 1s "$W" > /dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [ -s "$W/pid.top" ] && break; sleep 0.2; done
  sleep "$WARMUP"
  local p
  p=$(cat "$W/pid.top")
  LD_LIBRARY_PATH=${PERF_LIB:-} "$PERF" record -F 997 -g -p "$p" -o "$W/perf-$name.data" -- sleep "$WINDOW" > /dev/null 2>&1
  for mode in --no-children --children; do
    LD_LIBRARY_PATH=${PERF_LIB:-} "$PERF" report -i "$W/perf-$name.data" --stdio $mode --percent-limit 0.7 -g none 2>&1 | head -120
  done > "$OUT/perf-$name.txt"
  LD_LIBRARY_PATH=${PERF_LIB:-} "$PERF" report -i "$W/perf-$name.data" --stdio --no-children --percent-limit 2 -g caller,0.5,callee --max-stack 14 2>&1 | head -600 > "$OUT/perf-$name-calls.txt"
  kill "$p" 2>/dev/null
  sleep 1
}
# htop's libraries where the GPU image lacks them (libnl, ncurses: carried in lib/).
[ -d "$(dirname "$BIN")/lib" ] && export LD_LIBRARY_PATH=$(dirname "$BIN")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# BUILDS="name:path ...": several builds' top windows one after the other, on the same
# processes (top only); default: the one build given.
for b in ${BUILDS:-top:$BIN}; do top_window "${b%%:*}" "${b#*:}"; done
if [ -n "${PERF:-}" ]; then
  for b in ${PERF_BUILDS:-${BUILDS:-top:$BIN}}; do top_perf "${b%%:*}" "${b#*:}"; done
fi
command -v htop > /dev/null || echo "| htop | not installed here |" >> "$OUT/cost.md"
command -v btop > /dev/null || echo "| btop | not installed here |" >> "$OUT/cost.md"
# TOP_ONLY=1: the live views' window only (no serve, no record).
[ "${TOP_ONLY:-0}" = 1 ] && { cat "$OUT/cost.md"; exit 0; }

# serve, scraped every 5 s; SERVE_BUILDS="name:path ..." times several builds' serve one
# after the other (default: the build given).
serve_window() { # NAME BIN_
  local name=$1 bin=$2 PORT=19777 SP a b low=0 n=0 end body
  TWOFOLD_PROFILE=1 "$bin" serve --listen 127.0.0.1:$PORT --interval 5s --model-glob "$W/*.safetensors" > /dev/null 2> "$OUT/profile-$name.txt" &
  SP=$!
  PIDS+=($SP)
  sleep "$WARMUP"
  a=$(ticks $SP)
  end=$((SECONDS + WINDOW))
  while [ $SECONDS -lt $end ]; do
    body=$(curl -s 127.0.0.1:$PORT/metrics 2>/dev/null || python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" 2>/dev/null)
    n=$((n + 1))
    echo "$body" | grep -q '^twofold_file_copies_lower_bound{[^}]*} 1' && low=$((low + 1))
    sleep 5
  done
  b=$(ticks $SP)
  row "twofold serve --interval 5s ($name)" $SP "$a" "$b" >> "$OUT/cost.md"
  echo "$body" | grep '^twofold_file_copies{' > "$OUT/serve-last-$name.txt"
  kill -INT $SP 2>/dev/null
  wait $SP 2>/dev/null
  echo "serve ($name): $low of $n scrapes had a count marked lower bound" >> "$OUT/serve-low.txt"
}
for b in ${SERVE_BUILDS:-serve:$BIN}; do serve_window "${b%%:*}" "${b#*:}"; done

# record.
"$BIN" record --store "$W/store" --interval 1s "$W" > /dev/null 2>&1 &
RP=$!
PIDS+=($RP)
sleep "$WARMUP"
a=$(ticks $RP)
sleep "$WINDOW"
b=$(ticks $RP)
row "twofold record --interval 1s" $RP "$a" "$b" >> "$OUT/cost.md"
kill -INT $RP 2>/dev/null
wait $RP 2>/dev/null
"$BIN" dump --store "$W/store" --format json > "$W/dump.jsonl" 2>/dev/null
python3 - "$W/dump.jsonl" >> "$OUT/cost.md" <<'PY'
import json, sys
snaps = {}
for line in open(sys.argv[1]):
    d = json.loads(line)["data"]
    snaps[d["at"]] = snaps.get(d["at"], False) or d["lower_bound"]
print(f"\nrecord: {sum(snaps.values())} of {len(snaps)} snapshots had a count marked lower bound")
PY
cat "$OUT/serve-low.txt" >> "$OUT/cost.md"
"$BIN" scan "$W" > "$OUT/scan.txt" 2>&1
cat "$OUT/cost.md"
