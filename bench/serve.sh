#!/usr/bin/env bash
# `twofold serve` side by side with prometheus-node-exporter and prometheus-process-exporter
# (Debian packages), in one run, on the bench workload: one 64 MiB model mapped by 200
# `twofold __child map` readers, 300 more `__child anon --bytes 1M` processes
# (bench/spawn_readers.py), and 49 more 1 MiB model files in the page cache: 50 files.
#
# For each exporter (same machine, same moment, same client):
# - idle CPU: utime+stime from /proc/PID/stat over IDLE seconds without a scrape
#   (twofold collects every 5 s on its own; the peers collect only when scraped);
# - SCRAPES sequential scrapes, a new connection each, with Prometheus 2.42's Accept
#   header: latency p50/p99 (Python client, perf_counter around request + full body),
#   CPU per scrape = (CPU during the scrapes - idle rate x their wall time) / SCRAPES;
# - series (sample lines) and bytes of the last body;
# - cost at a 5 s scrape interval = idle rate + CPU per scrape / 5 s, in % of one core.
# process-exporter groups every process by comm (`{{.Comm}}`, like twofold's workloads).
#
# Usage: bash bench/serve.sh [IDLE_SECONDS=60] [SCRAPES=1000] [PEER_SCRAPES=SCRAPES]
# (PEER_SCRAPES: for process-exporter, whose scrapes walk /proc and take long;
#  TWOFOLD_BIN overrides the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
idle=${1:-60}
scrapes=${2:-1000}
peer_scrapes=${3:-$scrapes}
bin=${TWOFOLD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=$PWD/target/release/twofold
fi
work=$(mktemp -d /var/tmp/twofold-bench-serve.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

head -c 64M /dev/urandom >"$work/model.safetensors"
for i in $(seq -w 1 49); do head -c 1M /dev/urandom >"$work/model-$i.safetensors"; done
cat "$work"/*.safetensors >/dev/null
python3 bench/spawn_readers.py --twofold "$bin" --file "$work/model.safetensors" \
  --map 200 --anon 300 --anon-bytes 1M --ready-file "$work/ready" &
pids+=($!)
for _ in $(seq 1 1200); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || { echo "readers not ready" >&2; exit 1; }

p1=$(port) p2=$(port) p3=$(port)
"$bin" serve --listen "127.0.0.1:$p1" --interval 5s --model-glob "$work/*.safetensors" \
  >/dev/null 2>"$work/twofold.err" &
pids+=($!); s1=$!
prometheus-node-exporter --web.listen-address="127.0.0.1:$p2" >/dev/null 2>&1 &
pids+=($!); s2=$!
cat >"$work/process-exporter.yml" <<'EOF'
process_names:
  - name: "{{.Comm}}"
    cmdline: [".+"]
EOF
if command -v prometheus-process-exporter >/dev/null; then
  prometheus-process-exporter -web.listen-address "127.0.0.1:$p3" \
    -config.path "$work/process-exporter.yml" >/dev/null 2>&1 &
  pids+=($!); s3=$!
else
  echo "prometheus-process-exporter is not installed (apt-get install prometheus-process-exporter)" >&2
  s3=0
fi

python3 - "$idle" "$scrapes" "$peer_scrapes" "twofold serve:$s1:$p1" "node-exporter:$s2:$p2" \
  "process-exporter:$s3:$p3" <<'PY'
import http.client, os, sys, time

idle, n_all, n_peer = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
hz = os.sysconf("SC_CLK_TCK")
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
          "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
ex = []
for a in sys.argv[4:]:
    name, pid, port = a.rsplit(":", 2)
    if pid != "0":
        ex.append((name, int(pid), int(port)))

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz

def scrape(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("GET", "/metrics", headers={"Accept": ACCEPT})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) / 1024

# Ready: 200 from each (twofold answers 503 until its first collection is done), and
# twofold has seen the 50 files.
deadline = time.time() + 300
for name, pid, port in ex:
    while True:
        try:
            st, body = scrape(port)
            if st == 200 and (name != "twofold serve" or body.count(b"twofold_file_info{") >= 50):
                break
        except OSError:
            pass
        except http.client.HTTPException:
            pass
        if time.time() > deadline:
            sys.exit(f"{name} never became ready")
        time.sleep(0.5)
print("all ready; idle window", file=sys.stderr)
time.sleep(6)  # past a full collection interval

c0 = {pid: cpu(pid) for _, pid, _ in ex}
t0 = time.time()
time.sleep(idle)
wall_idle = time.time() - t0
rate = {pid: (cpu(pid) - c0[pid]) / wall_idle for _, pid, _ in ex}

print("| exporter | scrapes | scrape p50 | scrape p99 | CPU per scrape | idle CPU (% core) | CPU per 5 s idle | cost at 5 s scrape interval (% core) | series | body | RSS | last collection |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
for name, pid, port in ex:
    n = n_peer if name == "process-exporter" else n_all
    print(f"{n} scrapes of {name}", file=sys.stderr)
    lat = []
    c1, t1 = cpu(pid), time.time()
    for _ in range(n):
        s = time.perf_counter()
        st, body = scrape(port)
        lat.append(time.perf_counter() - s)
        assert st == 200, (name, st)
    wall = time.time() - t1
    per_scrape = max(0.0, (cpu(pid) - c1) - rate[pid] * wall) / n
    lat.sort()
    series = sum(1 for l in body.split(b"\n") if l and not l.startswith(b"#"))
    extra = ""
    if name == "twofold serve":
        for l in body.split(b"\n"):
            if l.startswith(b"twofold_collect_duration_seconds "):
                extra = f"{float(l.split()[1]) * 1000:.0f} ms"
    r = (name, lat[n // 2] * 1e3, lat[int(n * 0.99) - 1] * 1e3, per_scrape * 1e3,
         rate[pid] * 100, rate[pid] * 5 * 1e3, rate[pid] * 100 + per_scrape / 5 * 100,
         series, len(body), rss(pid), extra)
    print(f"| {r[0]} | {n} | {r[1]:.2f} ms | {r[2]:.2f} ms | {r[3]:.2f} ms | {r[4]:.2f}% | {r[5]:.0f} ms "
          f"| {r[6]:.2f}% | {r[7]} | {r[8] / 1024:.0f} KiB | {r[9]:.0f} MiB | {r[10]} |", flush=True)
print(f"\nidle window {wall_idle:.0f} s; "
      f"{sum(1 for _ in os.scandir('/proc') if _.name.isdigit())} processes on the host")
PY
