"""Holds memory that is, or is not, a form of a model, for the unexplained-memory tests;
prints one JSON line with what it holds (bytes, by its own measure) and waits for stdin
to close.

    python3 unexplained.py MODE FILE
MODE:
  xor       read() the file, keep its bytes XOR-ed with 0x5a (an unknown transform)
  permute   read() the file, keep its bytes permuted within each 64-byte block
  random    map the file (MAP_SHARED, touched) and hold random bytes of its size
  kv        map the file and hold an F16 buffer of its size rewritten every second with
            new activations (a KV cache in use)
  mmap      map the file only (zero-copy)
  ort-prepack, ort-noprepack
            an onnxruntime InferenceSession of FILE (an ONNX model), with prepacking on
            or off (session.disable_prepacking), run once; RssAnon before and after.
"""
import json
import mmap
import os
import sys
import threading

import numpy as np


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


mode, path = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
out = {"size": size}
keep = []
if mode in ("xor", "permute"):
    fd = open(path, "rb")  # held open: the process is a holder of the file
    data = np.frombuffer(fd.read(), dtype=np.uint8)
    n = len(data) // 64 * 64
    if mode == "xor":
        held = data ^ np.uint8(0x5A)
    else:
        perm = np.random.default_rng(3).permutation(64)
        held = np.ascontiguousarray(data[:n].reshape(-1, 64)[:, perm]).reshape(-1)
    del data
    keep.append((fd, held))
    out["held_bytes"] = int(held.nbytes)
elif mode in ("random", "kv", "mmap"):
    fd = open(path, "rb")
    m = mmap.mmap(fd.fileno(), 0, prot=mmap.PROT_READ)
    view = np.frombuffer(m, dtype=np.uint8)
    out["touched"] = int(view[::4096].astype(np.uint64).sum())
    keep.append((fd, m, view))
    if mode == "random":
        held = np.frombuffer(np.random.default_rng(5).bytes(size), dtype=np.uint8).copy()
        keep.append(held)
        out["held_bytes"] = int(held.nbytes)
    elif mode == "kv":
        kv = np.empty(size // 2, dtype=np.float16)
        rng = np.random.default_rng(9)

        def rewrite():
            # Activations of order 1 (keys and values of attention), rewritten each second.
            kv[:] = rng.standard_normal(kv.shape, dtype=np.float32)
            t = threading.Timer(1.0, rewrite)
            t.daemon = True
            t.start()

        rewrite()
        keep.append(kv)
        out["held_bytes"] = int(kv.nbytes)
elif mode in ("ort-prepack", "ort-noprepack"):
    import onnxruntime

    before = rss_anon()
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry(
        "session.disable_prepacking", "1" if mode == "ort-noprepack" else "0"
    )
    s = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]
    s.run(None, {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)})
    keep.append(s)
    out["anon_growth_bytes"] = rss_anon() - before
else:
    sys.exit(f"unknown mode {mode!r}")
print(json.dumps(out), flush=True)
sys.stdin.read()
