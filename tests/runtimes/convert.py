"""Writes a model file, or holds it converted to another dtype the way a real runtime does,
for tests/exact/convert.rs.

    python3 convert.py write DTYPE FILE SEED   F32 | F16 | BF16 safetensors of 12 tensors
    python3 convert.py hold MODE FILE          maps FILE and converts tensors (MODE below)

MODE: np-f16 (NumPy: every F32 tensor .astype(np.float16)), torch-half (torch: every BF16
tensor .half()), torch-bf16 (torch: every F32 tensor .to(torch.bfloat16)), mld-half and
mld-bf16 (the same with ml_dtypes, the bfloat16 NumPy type of JAX: .astype), np-f32-part
(NumPy: every other F16 tensor .astype(np.float32)), random (the file mapped and read, and
random F16 arrays as large as the file: no copy of it). The mapping stays.
Prints one JSON line: {"arrays": [[address, bytes], ...], "rss_anon_growth": bytes} (the
converted arrays, and how much RssAnon grew while they were made), then waits for stdin
to close.
"""
import json
import mmap
import struct
import sys

import numpy as np


def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon")


def write(dtype, path, seed):
    rng = np.random.default_rng(seed)
    # Sizes within 3x of each other: every tensor is long enough for the sampled proof's
    # guaranteed run (the smallest tensors of a file holding under 1% of its indexed bytes
    # are found only where a sample falls on them).
    elems = [(1 << 17) + i * 24_000 for i in range(12)]
    header, blobs, at = {}, [], 0
    for i, n in enumerate(elems):
        v = (rng.standard_normal(n) * 0.05).astype(np.float32)
        if dtype == "F32":
            raw = v.tobytes()
        elif dtype == "F16":
            raw = v.astype(np.float16).tobytes()
        else:  # BF16: the top half of each F32, rounded to nearest even
            b = v.view(np.uint32).astype(np.uint64)
            b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
            raw = b.astype(np.uint16).tobytes()
        header[f"layers.{i}.weight"] = {"dtype": dtype, "shape": [n], "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def tensors(path):
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    out = []
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        a, b = header[name]["data_offsets"]
        out.append((name, header[name]["dtype"], 8 + n + a, b - a))
    return mm, out


def hold(mode, path):
    mm, ts = tensors(path)
    whole = np.frombuffer(mm, dtype=np.uint8)
    float(whole.sum())  # every page of the file cached and mapped
    torch_mode = mode in ("torch-half", "torch-bf16")
    if torch_mode:
        import warnings

        import torch

        warnings.filterwarnings("ignore")  # frombuffer of a read-only mapping
        src = torch.bfloat16 if mode == "torch-half" else torch.float32
        dst = torch.float16 if mode == "torch-half" else torch.bfloat16
        torch.zeros(1024, dtype=src).to(dst)  # torch's own start-up, before the measure
    if mode in ("mld-half", "mld-bf16"):
        import ml_dtypes  # loaded before the measure, as torch is

        np.zeros(1024, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float16)
    before = rss_anon()
    kept = []
    if torch_mode:
        for _, _, off, n in ts:
            t = torch.frombuffer(mm, dtype=src, count=n // src.itemsize, offset=off)
            c = t.to(dst)
            kept.append((c, c.data_ptr(), c.numel() * c.element_size()))
    else:
        for i, (_, dtype, off, n) in enumerate(ts):
            if mode == "np-f16":
                c = whole[off:off + n].view(np.float32).astype(np.float16)
            elif mode in ("mld-half", "mld-bf16"):
                if mode == "mld-half":
                    src, dst = whole[off:off + n].view(ml_dtypes.bfloat16), np.float16
                else:
                    src, dst = whole[off:off + n].view(np.float32), ml_dtypes.bfloat16
                # In parts: .astype of a whole tensor goes through an F32 temporary as
                # large as it, which stays in the heap (RssAnon) after it is freed.
                c = np.empty(src.size, dtype=dst)
                for i in range(0, src.size, 1 << 14):
                    c[i:i + (1 << 14)] = src[i:i + (1 << 14)].astype(dst)
            elif mode == "np-f32-part":
                if i % 2:
                    continue
                c = whole[off:off + n].view(np.float16).astype(np.float32)
            elif mode == "random":
                c = np.random.default_rng(i).standard_normal(n // 2).astype(np.float16)
            else:
                raise SystemExit(f"unknown mode {mode}")
            kept.append((c, c.ctypes.data, c.nbytes))
    growth = rss_anon() - before
    print(json.dumps({"arrays": [[a, n] for _, a, n in kept], "rss_anon_growth": growth}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        hold(sys.argv[2], sys.argv[3])
