#!/usr/bin/env python3
"""Golden vectors for formats/src/convert.rs: F32/F16/BF16 bit patterns and what NumPy
(astype(np.float16)) and PyTorch (.half(), .to(torch.bfloat16), through F32 for F16<->BF16)
make of them. NaNs are left out: the runtimes disagree on them (convert.rs says how).

Usage: python3 scripts/convert-golden.py > formats/testdata/convert-golden.json
Needs numpy; torch for the BF16 columns (else ml_dtypes, named in the output's "bf16_by").
"""
import json, struct, sys
import numpy as np

rng = np.random.default_rng(40)

def f32_edges():
    v = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 65536.0, -65520.0, 1e-8, 2.0**-24,
         2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 6.1e-5,
         3.0e38, 3.4028235e38, -3.4028235e38, float("inf"), float("-inf"), 1.0 + 2.0**-11,
         1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 0.1, -0.3, 1e-40, 1.4e-45]
    bits = [struct.unpack("<I", struct.pack("<f", x))[0] for x in v]
    # Halfway cases of both roundings, subnormal F32, the largest finite F32.
    bits += [0x3F801000, 0x3F803000, 0x3F808000, 0x3F818000, 0x00000001, 0x007FFFFF,
             0x7F7FFFFF, 0xFF7FFFFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001,
             0x387FE000, 0x38800000, 0x7F7F8000, 0x7F7F7FFF]
    r = rng.standard_normal(200).astype(np.float32) * np.float32(3)
    r = np.concatenate([r, (rng.standard_normal(100) * 1e-5).astype(np.float32),
                        (rng.standard_normal(100) * 4e4).astype(np.float32)])
    bits += [int(b) for b in r.view(np.uint32)]
    return np.array(bits, dtype=np.uint32)

def finite16(n, exclude_nan_exp):
    b = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    return b[(b & exclude_nan_exp) != exclude_nan_exp]

f32 = f32_edges()
f16 = np.concatenate([np.array([0, 0x8000, 1, 0x8001, 0x3ff, 0x400, 0x3c00, 0x7bff, 0xfbff,
                                0x7c00, 0xfc00, 0x3c01, 0x0200], dtype=np.uint16),
                      finite16(400, 0x7c00)])
bf16 = np.concatenate([np.array([0, 0x8000, 1, 0x7f7f, 0xff7f, 0x477f, 0x4780, 0x3f80, 0x7f80,
                                 0xff80, 0x3380, 0x3300, 0x3381, 0x387f, 0x0080], dtype=np.uint16),
                       finite16(400, 0x7f80)])

out = {"f32": [int(x) for x in f32], "f16": [int(x) for x in f16], "bf16": [int(x) for x in bf16]}
# NumPy: F32 -> F16, F16 -> F32.
with np.errstate(over="ignore"):
    out["f32_to_f16_numpy"] = [int(x) for x in f32.view(np.float32).astype(np.float16).view(np.uint16)]
out["f16_to_f32_numpy"] = [int(x) for x in f16.view(np.float16).astype(np.float32).view(np.uint32)]
try:
    import torch
    out["bf16_by"] = "torch " + torch.__version__
    t32 = torch.from_numpy(f32.view(np.int32).copy()).view(torch.float32)
    out["f32_to_f16_torch"] = [int(x) & 0xffff for x in t32.half().view(torch.int16).tolist()]
    out["f32_to_bf16"] = [int(x) & 0xffff for x in t32.to(torch.bfloat16).view(torch.int16).tolist()]
    t16 = torch.from_numpy(f16.view(np.int16).copy()).view(torch.float16)
    out["f16_to_bf16"] = [int(x) & 0xffff for x in t16.to(torch.bfloat16).view(torch.int16).tolist()]
    tb = torch.from_numpy(bf16.view(np.int16).copy()).view(torch.bfloat16)
    out["bf16_to_f16"] = [int(x) & 0xffff for x in tb.half().view(torch.int16).tolist()]
except Exception:  # not installed, or no usable build
    import ml_dtypes
    out["bf16_by"] = "ml_dtypes " + ml_dtypes.__version__
    b = ml_dtypes.bfloat16
    out["f32_to_bf16"] = [int(x) for x in f32.view(np.float32).astype(b).view(np.uint16)]
    out["f16_to_bf16"] = [int(x) for x in f16.view(np.float16).astype(np.float32).astype(b).view(np.uint16)]
    out["bf16_to_f16"] = [int(x) for x in bf16.view(b).astype(np.float32).astype(np.float16).view(np.uint16)]
json.dump(out, sys.stdout, separators=(",", ":"))
print()
