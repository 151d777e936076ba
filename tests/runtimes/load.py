"""Loads a model file the way a real runtime does, then reports where each array's bytes
live and waits for stdin to close.

    python3 load.py MODE FILE
MODE: np-copy (np.load), np-mmap (np.load(mmap_mode="r")), np-mmap-heap (the same, with
a heap twice the file's size of unrelated data), st-load (safetensors.numpy.load_file),
st-load-write (the same, then one array written in place), st-safe-open (safetensors
safe_open, tensors read through the mapping), ort (an onnxruntime InferenceSession).
Prints one JSON line {name: address of the array's data}.
"""
import json
import sys

import numpy as np

mode, path = sys.argv[1], sys.argv[2]
if mode == "np-copy":
    arrays = {"array": np.load(path)}
elif mode == "np-mmap":
    arrays = {"array": np.load(path, mmap_mode="r")}
elif mode == "np-mmap-heap":
    import os

    arrays = {"array": np.load(path, mmap_mode="r")}
    heap = np.random.default_rng(7).random(2 * os.path.getsize(path) // 8)
elif mode == "st-safe-open":
    from safetensors import safe_open

    handle = safe_open(path, framework="np")
    arrays = {k: handle.get_tensor(k) for k in handle.keys()}
elif mode == "ort":
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    arrays = {}
elif mode in ("st-load", "st-load-write"):
    from safetensors.numpy import load_file

    arrays = load_file(path)
    if mode == "st-load-write":
        first = sorted(arrays)[0]
        a = arrays[first]
        if not a.flags.writeable:
            a = arrays[first] = a.copy()
        a += 1
else:
    sys.exit(f"unknown mode {mode!r}")
# Touch every byte, as inference would.
for a in arrays.values():
    float(np.asarray(a, dtype=np.float64).sum())
print(json.dumps({k: int(a.__array_interface__["data"][0]) for k, a in arrays.items()}), flush=True)
sys.stdin.read()
