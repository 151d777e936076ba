"""A small llama-architecture GGUF with random weights, for tests/exact/llama.rs.

    tiny_llama.py write OUT.gguf SEED [tied]
                                        F16 matmul weights, F32 norms, a minimal SPM vocab;
                                        `tied`: no output.weight (token_embd serves as both)
    tiny_llama.py tensors FILE          one JSON line: [[name, type, offset, bytes], ...]

gguf-py, the package of the llama.cpp source tree, is used as a library: the llama.cpp
cache (scripts/llama-cache.sh) is named by TWOFOLD_LLAMA_CACHE, or found beside this
checkout in target/llama-cache. gguf-py needs numpy and pyyaml.

Shapes (all deterministic from SEED): hidden 1024, 16 heads, FFN 4096, 8 layers, vocab
4096, an output.weight of its own unless `tied`. Every matmul weight has rows divisible by
8 and columns by 256, so llama.cpp's CPU repack applies to Q4_0 (q4_0_8x8) and Q4_K
(q4_K_8x8) alike. The F16 file is about 272 MiB; its Q4_0 or Q4_K quantization (--pure)
76.7 MiB (74.4 MiB tied).
"""

import json
import os
import sys
from pathlib import Path

HIDDEN = 1024
HEADS = 16
FFN = 4096
LAYERS = 8
VOCAB = 4096
CONTEXT = 2048


def gguf_module():
    cache = os.environ.get("TWOFOLD_LLAMA_CACHE")
    if not cache:
        cache = Path(__file__).resolve().parents[2] / "target" / "llama-cache"
    sys.path.insert(0, str(Path(cache) / "src" / "llama.cpp" / "gguf-py"))
    import gguf  # noqa: E402  (from the cache's source tree)

    return gguf


def vocab():
    """SPM tokens: <unk>, <s>, </s>, the 256 byte tokens, then word pieces up to VOCAB."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    pieces = []
    for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'":
        pieces += [c, "\u2581" + c]
    letters = "etaoinshrdlucmfwypvbgk"
    for a in letters:
        for b in letters:
            pieces += [a + b, "\u2581" + a + b]
    i = 0
    while len(tokens) + len(pieces) < VOCAB:
        pieces.append(f"\u2581w{i}")
        i += 1
    tokens += pieces[: VOCAB - len(tokens)]
    types += [1] * (VOCAB - len(types))  # NORMAL
    # Longer pieces score higher, as a trained SPM model's merges would.
    scores = [0.0] * 259 + [-1000.0 + len(t) for t in tokens[259:]]
    return tokens, scores, types


def write(out, seed, tied=False):
    import numpy as np

    gguf = gguf_module()
    rng = np.random.default_rng(seed)

    def weight(rows, cols):
        w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
        return w.astype(np.float16)

    def norm():
        return (1.0 + 0.01 * rng.standard_normal(HIDDEN, dtype=np.float32)).astype(np.float32)

    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    # numpy shape (rows, cols) is ggml's ne = [cols, rows]
    w.add_tensor("token_embd.weight", weight(VOCAB, HIDDEN))
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm())
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(b + t + ".weight", weight(HIDDEN, HIDDEN))
        w.add_tensor(b + "ffn_norm.weight", norm())
        w.add_tensor(b + "ffn_gate.weight", weight(FFN, HIDDEN))
        w.add_tensor(b + "ffn_up.weight", weight(FFN, HIDDEN))
        w.add_tensor(b + "ffn_down.weight", weight(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", norm())
    if not tied:
        w.add_tensor("output.weight", weight(VOCAB, HIDDEN))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensors(path):
    gguf = gguf_module()
    r = gguf.GGUFReader(path)
    out = [
        [t.name, t.tensor_type.name, int(t.data_offset), int(t.n_bytes)]
        for t in r.tensors
    ]
    print(json.dumps(out))


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["tied"])
    elif cmd == "tensors":
        tensors(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
