"""Loads a model file the way a real runtime does, then reports where each array's bytes
live and waits for stdin to close.

    python3 load.py MODE FILE
MODE: np-copy (np.load), np-mmap (np.load(mmap_mode="r")), st-load
(safetensors.numpy.load_file), st-load-write (the same, then one array written in place).
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
