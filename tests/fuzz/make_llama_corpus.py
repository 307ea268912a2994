#!/usr/bin/env python3
"""Writes the seed corpora of llama_model_fuzz and llama_tokenizer_fuzz.

    python3 tests/fuzz/make_llama_corpus.py     (from the repository root)

tests/fuzz/corpus/llama_model/: micro llama2.c checkpoints (28-byte header of 7 int32, then
float32 weights) that parse, and a few malformed ones. tests/fuzz/corpus/llama_tokenizer/: one
byte choosing vocab_size (250 + b, see llama_tokenizer_fuzz.cpp), then a llama2.c tokenizer file
(int32 max_token_length, then per token float score, int32 length, bytes). Every seed is under
4 KB, scripts/fuzz's -max_len.
"""
import math
import os
import struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def weight_floats(dim, hidden, layers, heads, kv_heads, vocab, seq_len):
    hd = dim // heads
    q, kv = heads * hd, kv_heads * hd
    n = abs(vocab) * dim + layers * (dim + dim * q + 2 * dim * kv + q * dim) + layers * (dim + 3 * dim * hidden)
    n += dim + seq_len * hd
    if vocab < 0:
        n += -vocab * dim
    return n


def model(header, floats=None, extra=b""):
    if floats is None:
        floats = weight_floats(*header)
    w = struct.pack("<%df" % floats, *[math.sin(i) * 0.1 for i in range(floats)])
    return struct.pack("<7i", *header) + w + extra


def tokenizer(vocab_byte, max_len, entries, extra=b""):
    out = bytes([vocab_byte]) + struct.pack("<i", max_len)
    for score, piece in entries:
        out += struct.pack("<fi", score, len(piece)) + piece
    return out + extra


def base_vocab():
    v = [(0.0, b"<unk>"), (0.0, b"\n<s>\n"), (0.0, b"\n</s>\n")]
    v += [(0.0, b"<0x%02X>" % b) for b in range(256)]
    return v


def write(target, name, data):
    assert len(data) <= 4096, (name, len(data))
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# Checkpoints that parse.
micro = (8, 12, 1, 2, 1, 5, 3)  # dim 8, hidden 12, 1 layer, 2 heads (head dim 4), 1 kv head
write("llama_model", "micro_shared.bin", model(micro))
write("llama_model", "micro_own_classifier.bin", model((8, 12, 1, 2, 1, -5, 3)))
write("llama_model", "micro_2_layers.bin", model((4, 4, 2, 2, 2, 3, 2)))
write("llama_model", "micro_mha_4_heads.bin", model((8, 4, 1, 4, 4, 2, 1)))
# Malformed ones.
write("llama_model", "header_only.bin", struct.pack("<7i", *micro))
write("llama_model", "truncated.bin", model(micro)[:600])
write("llama_model", "trailing_byte.bin", model(micro, extra=b"\0"))
write("llama_model", "odd_head_dim.bin", model((6, 4, 1, 2, 1, 2, 1)))
write("llama_model", "kv_heads_over_heads.bin", model((8, 4, 1, 2, 4, 2, 1), floats=weight_floats(8, 4, 1, 2, 2, 2, 1)))
write("llama_model", "negative_layers.bin", struct.pack("<7i", 8, 12, -1, 2, 1, 5, 3))
write("llama_model", "int_min_vocab.bin", struct.pack("<7i", 8, 12, 1, 2, 1, -2**31, 3))
# 2^62 + 1048580 floats: 28 + 4 × that wraps 64 bits to 4194348.
write("llama_model", "size_wraps_64_bits.bin", struct.pack("<7i", 1 << 20, 950273, 624268, 1 << 19, 1 << 19, 417604, 2))

# Tokenizers that parse (vocab byte 250 + b).
merges = [(-1.0, b" "), (-2.0, b"a"), (-3.0, b"b"), (-4.0, b"ab"), (-5.0, b" ab"), (-6.0, b"\xc3\xa9")]
write("llama_tokenizer", "bytes_only_259.tok", tokenizer(9, 6, base_vocab()))
write("llama_tokenizer", "merges_265.tok", tokenizer(15, 6, base_vocab() + merges))
write("llama_tokenizer", "long_max_length.tok", tokenizer(11, 64, base_vocab() + [(0.5, b"x" * 64), (-0.0, b"")]))
# Malformed ones.
nan = struct.unpack("<f", b"\0\0\xc0\x7f")[0]
write("llama_tokenizer", "vocab_258.tok", tokenizer(8, 6, base_vocab()[:258]))
write("llama_tokenizer", "nan_score.tok", tokenizer(9, 6, base_vocab()[:100] + [(nan, b"<0x61>")] + base_vocab()[101:]))
write("llama_tokenizer", "truncated.tok", tokenizer(15, 6, base_vocab() + merges)[:2000])
write("llama_tokenizer", "trailing_bytes.tok", tokenizer(9, 6, base_vocab(), extra=b"\0\0\0"))
write("llama_tokenizer", "length_over_max.tok", tokenizer(9, 5, base_vocab()))
write("llama_tokenizer", "wrong_byte_piece.tok", tokenizer(9, 6, base_vocab()[:70] + [(0.0, b"<0xff>")] + base_vocab()[71:]))
write("llama_tokenizer", "huge_vocab.tok", tokenizer(243, 6, base_vocab()[:20]))
