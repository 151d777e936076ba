"""Copies a .npy model into the heap (np.load), then shares it with worker processes by
fork, as gunicorn --preload, multiprocessing 'fork' and DataLoader workers do; the workers
only read it. Waits for stdin to close, then ends every worker.

    python3 fork.py MODE FILE N
MODE: fork (N children by os.fork), pool (a multiprocessing 'fork' Pool of N workers).
Prints one JSON line {"addr": data address, "len": bytes, "pids": [parent, workers...]}.
With FORK_PY_RUN_AS=UID (started as root), it becomes that user (and group) once its modules
are loaded, before it reads FILE: for an interpreter other users cannot reach (a pyenv under
a private /root), and its memory stays readable by that user (dumpable).
"""
import json
import os
import signal
import sys

import numpy as np

mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

if os.environ.get("FORK_PY_RUN_AS"):
    import ctypes

    uid = int(os.environ["FORK_PY_RUN_AS"])
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1)


def die_with_parent():
    # A worker ends when the parent does, even if the parent is killed (SIGKILL).
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(0)

array = np.load(path)
total = float(array.sum())


def work(_):
    # Read every page of the shared copy; write nothing to it.
    assert float(array.sum()) == total
    return os.getpid()


children = []
if mode == "fork":
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            os.close(r)
            work(0)
            os.write(w, b"x")
            # Wait until the parent ends us.
            while True:
                signal.pause()
        os.close(w)
        os.read(r, 1)
        os.close(r)
        children.append(pid)
elif mode == "pool":
    import multiprocessing

    pool = multiprocessing.get_context("fork").Pool(n, initializer=die_with_parent)
    # Every worker reads the copy once (one task each, as many tasks as workers).
    seen = set()
    while len(seen) < n:
        seen.update(pool.map(work, range(4 * n), chunksize=1))
    children = [p.pid for p in pool._pool]
else:
    sys.exit(f"unknown mode '{mode}'")

print(
    json.dumps(
        {"addr": array.ctypes.data, "len": array.nbytes, "pids": [os.getpid()] + children}
    ),
    flush=True,
)
sys.stdin.read()
if mode == "fork":
    for pid in children:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
else:
    pool.terminate()
    pool.join()
