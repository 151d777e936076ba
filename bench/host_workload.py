#!/usr/bin/env python3
"""The moving inference host of bench/host.sh (issue #21), kept alive until told to stop.

Usage:
  host_workload.py --twofold BIN --dir DIR --ready-file PATH [sizes...]

Builds, under DIR (every file it writes is there):
- DAEMONS daemon-like processes, each holding its own MODEL_SIZE safetensors model:
  the even ones copy it with read() and close it (`__child copy --close`, as np.load and
  llama.cpp --load-mode none do), the odd ones map it (`__child map`); each also holds a
  KV-cache-like buffer of KV bytes rewritten KV_RATE percent per second (`--kv`);
- a fork pool: a parent that read() a POOL_SIZE model into its heap and closed it, and
  POOL_WORKERS forked workers sharing that copy copy-on-write (`__child copy --fork`);
- IDLE idle processes: FILES of them each map one small FILE_SIZE model (the 200 small
  model files), the others hold 1 MiB of anonymous memory;
- PY_SERVERS Python serving processes (`--py-server`), each holding a read() copy of its
  own MODEL_SIZE model (`open().read()`, as a loader that takes the bytes does) and a KV
  buffer it rewrites at PY_RATE bytes per second, 4 MiB at a time, every 4 MiB a new
  buffer (os.urandom) of its own mapping (MALLOC_MMAP_THRESHOLD_=131072: glibc maps and
  unmaps each one), so its mappings come and go every second as a Python server's do;
- a churn loop that starts CHURN short processes (/bin/true) per second.

Every model's bytes are pseudo-random and distinct (os.urandom), so a copy of one model
never matches another. Once every process said `ready`, it writes DIR/truth.json (for
each model path: the private copies made by construction, so the true count is the
file's page-cache resident fraction plus that number) and the pids, then --ready-file.

It stops (closing every child's stdin: EOF ends a reader and its workers; then kills and
reaps the rest) on SIGTERM, SIGINT or SIGHUP, or when its parent goes away. Children also
die with it (PR_SET_PDEATHSIG), and bench/host.sh kills whatever is left in its cgroup.
"""

import argparse
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time

stop = False


def on_signal(_signum, _frame):
    global stop
    stop = True


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def write_safetensors(path: str, nbytes: int) -> None:
    """A safetensors file of F16 tensors of at most 8 MiB each, pseudo-random data.

    The data goes through one buffer, read into from /dev/urandom and written unbuffered,
    that is zeroed afterwards: this process keeps no copy of any model (freed heap memory
    would still hold one, and twofold would rightly count it).
    """
    tensor = max(2048, min(8 << 20, nbytes) // 2048 * 2048)
    n = max(1, nbytes // tensor)
    meta = {"__metadata__": {"format": "pt", "generator": "twofold bench/host.sh"}}
    for i in range(n):
        meta[f"layers.{i}.weight"] = {
            "dtype": "F16",
            "shape": [tensor // 2048, 1024],
            "data_offsets": [i * tensor, (i + 1) * tensor],
        }
    header = json.dumps(meta).encode()
    header += b" " * (-(8 + len(header)) % 8)
    buf = bytearray(tensor)
    view = memoryview(buf)
    with open("/dev/urandom", "rb", buffering=0) as rnd, open(path, "xb", buffering=0) as f:
        f.write(len(header).to_bytes(8, "little") + header)
        for _ in range(n):
            got = 0
            while got < tensor:
                got += rnd.readinto(view[got:])
            done = 0
            while done < tensor:
                done += f.write(view[done:])
    view[:] = bytes(tensor)
    view.release()


def churn(rate: float) -> int:
    """Starts `rate` /bin/true per second (in 10 ms ticks) until the parent goes away."""
    parent = os.getppid()
    true = "/bin/true"
    start, started = time.monotonic(), 0
    while not stop and os.getppid() == parent:
        due = int((time.monotonic() - start) * rate)
        while started < due:
            try:
                os.posix_spawn(true, [true], os.environ)
            except OSError:
                pass
            started += 1
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.01)
    return 0


def py_server(path: str, kv: int, rate: float) -> int:
    """A Python serving process: a read() copy of `path`, a KV buffer rewritten at `rate`
    bytes/s in 4 MiB writes, each from a newly allocated (and mapped) buffer. Says `ready`,
    then runs until its stdin closes."""
    with open(path, "rb") as f:
        model = f.read()
    buf = bytearray(kv) if kv else bytearray(1)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    step = 4 << 20
    period = step / rate if rate > 0 else 3600.0
    poll = select.poll()
    poll.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
    at, due = 0, time.monotonic()
    while not stop:
        due += period
        if poll.poll(max(0, int((due - time.monotonic()) * 1000))):
            break  # stdin closed (or written): the workload is ending
        if kv:
            n = min(step, len(buf) - at)
            chunk = os.urandom(n)
            buf[at:at + n] = chunk
            del chunk
            at = (at + n) % len(buf)
    del model
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--twofold")
    ap.add_argument("--dir")
    ap.add_argument("--ready-file")
    ap.add_argument("--model-size", type=size, default=size("1G"))
    ap.add_argument("--daemons", type=int, default=4)
    ap.add_argument("--kv", type=size, default=size("512M"))
    ap.add_argument("--kv-rate", type=float, default=10.0)
    ap.add_argument("--pool-size", type=size, default=size("512M"))
    ap.add_argument("--pool-workers", type=int, default=7)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--file-size", type=size, default=size("1M"))
    ap.add_argument("--churn", type=float, default=200.0)
    ap.add_argument("--py-servers", type=int, default=0)
    ap.add_argument("--py-rate", type=size, default=size("52M"))
    ap.add_argument("--churn-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--py-server", nargs=3, metavar=("MODEL", "KV", "RATE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    if args.churn_only:
        return churn(args.churn)
    if args.py_server:
        m, kv, rate = args.py_server
        return py_server(m, int(kv), float(rate))

    want = 2 * (args.daemons + 1 + max(args.idle, args.files)) + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    models, small = os.path.join(args.dir, "models"), os.path.join(args.dir, "small")
    os.makedirs(models)
    os.makedirs(small)
    truth: dict[str, int] = {}
    specs: list[tuple[str, list[str]]] = []  # (role, args after `__child`)
    for i in range(args.daemons):
        p = os.path.join(models, f"daemon-{i}.safetensors")
        write_safetensors(p, args.model_size)
        kv = ["--kv", str(args.kv), "--kv-rate", str(args.kv_rate)]
        if i % 2 == 0:
            specs.append((f"daemon-{i} copy", ["copy", p, "--close", *kv]))
            truth[p] = 1
        else:
            specs.append((f"daemon-{i} map", ["map", p, *kv]))
            truth[p] = 0
    py = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072"}
    for i in range(args.py_servers):
        p = os.path.join(models, f"py-server-{i}.safetensors")
        write_safetensors(p, args.model_size)
        specs.append((f"py-server-{i}", ["--python", p, str(args.kv), str(args.py_rate)]))
        truth[p] = 1
    if args.pool_size > 0:
        p = os.path.join(models, "pool.safetensors")
        write_safetensors(p, args.pool_size)
        specs.append(("pool", ["copy", p, "--close", "--fork", str(args.pool_workers)]))
        truth[p] = 1
    for i in range(max(args.idle, args.files)):
        if i < args.files:
            p = os.path.join(small, f"small-{i:04}.safetensors")
            write_safetensors(p, args.file_size)
            specs.append(("idle map", ["map", p]))
            truth[p] = 0
        else:
            specs.append(("idle anon", ["anon", "--bytes", "1M"]))

    parent = os.getppid()
    children: list[subprocess.Popen] = []
    churner = None

    def cleanup() -> None:
        if churner:
            churner.terminate()
        for c in children:
            try:
                if c.stdin:
                    c.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for c in children:
            try:
                c.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()

    try:
        for _role, a in specs:
            if stop:
                return 1
            if a[0] == "--python":
                cmd, env = [sys.executable, __file__, "--py-server", *a[1:]], py
            else:
                cmd, env = [args.twofold, "__child", *a], None
            children.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             close_fds=True, env=env))
        pending = {c.stdout.fileno(): c for c in children}
        poll = select.poll()  # select() stops at fd 1024
        for fd in pending:
            poll.register(fd, select.POLLIN)
        deadline = time.monotonic() + args.timeout
        while pending and not stop:
            if time.monotonic() > deadline:
                print(f"host_workload: {len(pending)} processes not ready", file=sys.stderr)
                return 1
            for fd, _ev in poll.poll(1000):
                poll.unregister(fd)
                c = pending.pop(fd)
                line = os.read(fd, 64)
                if not line.startswith(b"ready"):
                    print(f"host_workload: pid {c.pid} said {line!r} (rc {c.poll()})",
                          file=sys.stderr)
                    return 1
                c.stdout.close()
        if stop:
            return 1
        if args.churn > 0:
            churner = subprocess.Popen([sys.executable, __file__, "--churn-only",
                                        "--churn", str(args.churn)])
            children.append(churner)
        with open(os.path.join(args.dir, "truth.json"), "w") as f:
            json.dump({"copies": truth,
                       "pids": {role: c.pid for (role, _), c in zip(specs, children)
                                if not role.startswith("idle")}}, f)
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{len(children)}\n")
        os.rename(tmp, args.ready_file)
        while not stop and os.getppid() == parent:
            time.sleep(0.2)
        return 0
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
