#!/usr/bin/env python3
"""`twofold serve` under descriptor exhaustion and slow clients (issue #41), and its scrape
latency: run one binary, print one JSON line.

    bench/serve_limits.py BINARY [--nofile 1024] [--idle 1100] [-- SERVE FLAGS...]

Starts `BINARY serve --no-prove --interval 5s` under `prlimit --nofile=N:N`, in a PID
namespace of its own (root; the collection sees the exporter alone), waits for the
first collection, then measures:
- p50/p99 of 1,000 sequential scrapes of /metrics (a new connection each, as curl does)
  and of 50 concurrent scrapers, 40 scrapes each, from bench/scrape_latency.rs (compiled
  here with rustc -O);
- the exporter's RSS (VmRSS) after those;
- with IDLE idle connections open: whether a fresh scrape answers (status, or the error),
  and serve's fd count; after closing them: whether scrapes and /healthz answer, the fd
  count, RSS.
"""

import json
import os
import resource
import socket
import subprocess
import sys
import time


def scrape(port, path="/metrics", timeout=10.0):
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    finally:
        s.close()
    code = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return code, time.perf_counter() - t0


def body(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    return data.split(b"\r\n\r\n", 1)[1]


def try_scrape(port, path="/metrics"):
    try:
        return scrape(port, path, timeout=5.0)[0]
    except OSError as e:
        return f"error: {e}"


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    binary = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    client = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"scrape_latency-{os.getpid()}")
    subprocess.check_call(["rustc", "-O", "-o", client, os.path.join(here, "scrape_latency.rs")])
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    nofile = int(sys.argv[sys.argv.index("--nofile") + 1]) if "--nofile" in sys.argv else 1024
    idle = int(sys.argv[sys.argv.index("--idle") + 1]) if "--idle" in sys.argv else 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # In a PID namespace of its own: the collection sees only the exporter, so a hung
    # file system elsewhere on the host cannot hold up the first collection.
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "prlimit",
         f"--nofile={nofile}:{nofile}", binary, "serve", "--listen",
         f"127.0.0.1:{port}", "--interval", "5s", "--no-prove"] + extra,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    out = {"binary": binary, "nofile": nofile, "idle": idle}
    pid = None
    try:
        until = time.time() + 10
        while pid is None:
            kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
            if kids and "serve" in open(f"/proc/{kids[0]}/cmdline").read():
                pid = int(kids[0])
            assert time.time() < until, "no exporter"
            time.sleep(0.05)
        until = time.time() + 120
        while try_scrape(port) != 200:
            assert time.time() < until, "never ready"
            time.sleep(0.2)
        for name, threads, each in [("seq", 1, 1000), ("conc50", 50, 40)]:
            p50, p99, errors = subprocess.check_output(
                [client, str(port), str(threads), str(each)], text=True).split()
            out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = float(p50), float(p99)
            out[f"{name}_errors"] = int(errors)
        out["rss_kib"] = rss_kib(pid)
        out["fds_before"] = fds(pid)
        conns = []
        for _ in range(idle):
            try:
                conns.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError as e:
                out.setdefault("connect_errors", str(e))
        time.sleep(1)
        out["fds_with_idle"] = fds(pid)
        out["scrape_with_idle"] = try_scrape(port)
        for c in conns:
            c.close()
        time.sleep(2)
        out["scrape_after"] = try_scrape(port)
        out["healthz_after"] = try_scrape(port, "/healthz")
        out["fds_after"] = fds(pid)
        out["rss_kib_after"] = rss_kib(pid)
        out["alive"] = p.poll() is None
        try:
            out["body_bytes"] = len(body(port))
        except OSError as e:
            out["body_bytes"] = f"error: {e}"
    finally:
        if pid is not None:
            os.kill(pid, 15)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        os.unlink(client)
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    out["stderr"] = sorted(set(err))[:5]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
