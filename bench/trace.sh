#!/usr/bin/env bash
# Tracing overhead: how much slower two fault-heavy workloads run while `twofold trace`
# (or bpftrace counting the same tracepoints into per-pid maps) is attached, and how long
# twofold takes to attach. Run as root. Usage: bash bench/trace.sh [ROUNDS] [SIZE]
#
# Workloads (each timed from 'go' to 'ready' of a `twofold __child ... --go` process, so
# only the work itself is measured, not exec or exit):
#   anon  write-touch SIZE of anonymous memory, one fault per 4 KiB page
#   map   read-fault every page of a SIZE MAP_SHARED mapping of a cached file
# Tracers: none, `twofold trace --interval 1s` (all its programs), bpftrace with the same
# tracepoints counted per pid. Each round starts each tracer afresh, in turn, so slow
# drift of the (shared) machine spreads over all three.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
size=${2:-1G}
[ "$(id -u)" = 0 ] || { echo "bench/trace.sh: run as root" >&2; exit 2; }
command -v bpftrace >/dev/null || { echo "bench/trace.sh: needs bpftrace" >&2; exit 2; }
cargo build --release --quiet
bin=$PWD/target/release/twofold
work=$(mktemp -d /var/tmp/twofold-bench-trace.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
"$bin" __bench write-model "$work/model.safetensors" "$size" >/dev/null
cat "$work/model.safetensors" >/dev/null # cached

python3 - "$bin" "$work/model.safetensors" "$rounds" "$size" <<'PY'
import json, os, statistics, subprocess, sys, threading, time

bin, model, rounds, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

BPFTRACE = r"""
BEGIN { printf("started\n"); }
tracepoint:exceptions:page_fault_user { @faults[pid, args->error_code & 3] = count(); }
tracepoint:exceptions:page_fault_kernel /args->address <= 0x00ffffffffffffff/ { @kfaults[pid, args->error_code & 3] = count(); }
tracepoint:filemap:mm_filemap_fault { @ff[pid] = count(); @ffile[args->s_dev, args->i_ino] = count(); }
tracepoint:filemap:mm_filemap_map_pages { @fa[pid] = count(); @fafile[args->s_dev, args->i_ino] = sum(args->last_index - args->index + 1); }
tracepoint:filemap:mm_filemap_add_to_page_cache { @added[args->s_dev, args->i_ino] = sum(1 << args->order); }
tracepoint:filemap:mm_filemap_delete_from_page_cache { @evicted[args->s_dev, args->i_ino] = sum(1 << args->order); }
tracepoint:vmscan:mm_vmscan_direct_reclaim_begin, tracepoint:vmscan:mm_vmscan_memcg_reclaim_begin { @rs[tid] = nsecs; }
tracepoint:vmscan:mm_vmscan_direct_reclaim_end, tracepoint:vmscan:mm_vmscan_memcg_reclaim_end /@rs[tid]/ { @reclaim[pid] = hist((nsecs - @rs[tid]) / 1000); delete(@rs[tid]); }
tracepoint:oom:mark_victim { @oom[args->pid] = count(); }
tracepoint:syscalls:sys_enter_read, tracepoint:syscalls:sys_enter_pread64, tracepoint:syscalls:sys_enter_readv, tracepoint:syscalls:sys_enter_preadv { @rfd[tid] = args->fd; }
tracepoint:syscalls:sys_exit_read, tracepoint:syscalls:sys_exit_pread64, tracepoint:syscalls:sys_exit_readv, tracepoint:syscalls:sys_exit_preadv /@rfd[tid]/ { if (args->ret > 0) { @read[pid] = sum(args->ret); } delete(@rfd[tid]); }
tracepoint:syscalls:sys_enter_mmap { @mmap[pid, args->flags & 3] = count(); }
"""

def drain(stream):
    threading.Thread(target=lambda: stream.read(), daemon=True).start()

def start_tracer(kind):
    """Starts a tracer; returns (process, seconds to attach, twofold's own attach_ms)."""
    t = time.perf_counter()
    if kind == "none":
        return None, 0.0, None
    if kind == "twofold":
        p = subprocess.Popen([bin, "trace", "--json", "--interval", "1s"],
                             stdout=subprocess.PIPE, text=True)
        first = json.loads(p.stdout.readline())
        assert first["type"] == "attached" and not first["data"]["unavailable"], first
        wall = time.perf_counter() - t
        drain(p.stdout)
        return p, wall, first["data"]["attach_ms"]
    p = subprocess.Popen(["bpftrace", "-e", BPFTRACE], stdout=subprocess.PIPE, text=True)
    while p.stdout.readline().strip() != "started":
        pass
    wall = time.perf_counter() - t
    drain(p.stdout)
    return p, wall, None

def stop_tracer(p):
    if p is not None:
        p.terminate()
        p.wait()

def workload(kind):
    args = [bin, "__child", "anon", "--bytes", size] if kind == "anon" else [bin, "__child", "map", model]
    p = subprocess.Popen(args + ["--go"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "armed"
    t = time.perf_counter()
    p.stdin.write("\n"); p.stdin.flush()
    assert p.stdout.readline().strip() == "ready"
    dt = time.perf_counter() - t
    p.stdin.close()
    _, _, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    # CPU time of the whole child (startup included, a constant): unlike wall time it
    # does not count the time other jobs on the shared machine take the CPU away.
    return dt, ru.ru_utime + ru.ru_stime

tracers = ["none", "twofold", "bpftrace"]
works = ["anon", "map"]
times = {(t, w): [] for t in tracers for w in works}
attach = {"twofold": [], "bpftrace": []}
attach_ms = []
for r in range(rounds):
    for tr in tracers:
        p, wall, ams = start_tracer(tr)
        if tr != "none":
            attach[tr].append(wall)
        if ams is not None:
            attach_ms.append(ams)
        time.sleep(0.5)
        for w in works:
            times[(tr, w)].append(workload(w))
        stop_tracer(p)
    print(f"round {r + 1}/{rounds} done", file=sys.stderr)

def fmt(v): return f"{v * 1e3:.1f} ms"
for idx, what in [(0, "wall time, go to ready"), (1, "CPU time of the workload process")]:
    print(f"\n{what}:\n")
    print(f"| workload ({size}) | tracer | median | min | max | slowdown (median) | slowdown (min) |")
    print("|---|---|---|---|---|---|---|")
    for w in works:
        base = [x[idx] for x in times[("none", w)]]
        base_med, base_min = statistics.median(base), min(base)
        for tr in tracers:
            v = [x[idx] for x in times[(tr, w)]]
            med, mn = statistics.median(v), min(v)
            sd = "" if tr == "none" else f"{(med / base_med - 1) * 100:+.1f}%"
            sm = "" if tr == "none" else f"{(mn / base_min - 1) * 100:+.1f}%"
            print(f"| {w} | {tr} | {fmt(med)} | {fmt(mn)} | {fmt(max(v))} | {sd} | {sm} |")
print()
print("| attach | median | min | max |")
print("|---|---|---|---|")
print(f"| twofold: load + attach (its own attach_ms) | {statistics.median(attach_ms):.0f} ms | {min(attach_ms):.0f} ms | {max(attach_ms):.0f} ms |")
a = attach["twofold"]
print(f"| twofold trace: start to first record (incl. the /proc scan) | {fmt(statistics.median(a))} | {fmt(min(a))} | {fmt(max(a))} |")
a = attach["bpftrace"]
print(f"| bpftrace: start to BEGIN | {fmt(statistics.median(a))} | {fmt(min(a))} | {fmt(max(a))} |")
print()
print("raw (wall s, cpu s):", json.dumps({f"{t}/{w}": [[round(a, 4), round(b, 4)] for a, b in v] for (t, w), v in times.items()}))
PY
