#!/usr/bin/env python3
"""A small Llama in PyTorch whose attention is skim's operators: kcode18M (or any llama2.c v0
checkpoint) from its llama2.c file, the prompt's attention through torch.ops.skim, and checks that it
is the model.

    PYTHONPATH=python python3 python/examples/llama.py check  [--tokens 512]
    PYTHONPATH=python python3 python/examples/llama.py needle [--length 3000] [--needles 4] [--budget 0.125]

check: logits over held-out text with attention = skim's sparse_attention_table over every causal
block, against the same model with a plain PyTorch attention (float32); prints the largest logit
difference and whether the greedy next tokens agree. needle: plants `#define KEY_xxxx "value"` in
held-out kernel code (as skim-llama's needle test does), prefills with skim over every causal block,
then decodes greedily with skim's decode over (a) every block, (b) a routed selection of `budget` of
the blocks: the sink block, the two newest, and the best by a max-bound score of each block's keys
(per-dimension min and max, the bound of q·k over the block), chosen here in Python, one row per kv
head, and (c) the sliding window at the same budget (the sink block and the newest ones). Models:
../shared/models or $SKIM_MODELS_DIR. It runs in float32 on the CPU (skim's CUDA kernels take 16-bit
tensors; this example does not cast).
"""
import argparse
import heapq
import math
import os
import random
import struct
import sys
from pathlib import Path

import torch

import skim_torch

MODELS = Path(os.environ.get("SKIM_MODELS_DIR", Path(__file__).resolve().parents[3] / "shared" / "models"))


# --- llama2.c's checkpoint and tokenizer -----------------------------------------------------------

class Model:
    """llama2.c v0 checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    seq_len), then float32 weights in llama2.c's order; a negative vocab_size means an unshared classifier."""

    def __init__(self, path, device):
        raw = Path(path).read_bytes()
        dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
        shared = vocab > 0
        vocab = abs(vocab)
        self.dim, self.layers, self.heads, self.kv_heads, self.vocab = dim, layers, heads, kv_heads, vocab
        self.head_dim = dim // heads
        w = torch.frombuffer(bytearray(raw[28:]), dtype=torch.float32)
        at = 0

        def take(*shape):
            nonlocal at
            n = math.prod(shape)
            t = w[at:at + n].view(*shape)
            at += n
            return t.to(device)

        kv_dim = kv_heads * self.head_dim
        self.embed = take(vocab, dim)
        self.rms_att, self.wq = take(layers, dim), take(layers, dim, dim)
        self.wk, self.wv, self.wo = take(layers, kv_dim, dim), take(layers, kv_dim, dim), take(layers, dim, dim)
        self.rms_ffn = take(layers, dim)
        self.w1, self.w2, self.w3 = take(layers, hidden, dim), take(layers, dim, hidden), take(layers, hidden, dim)
        self.rms_final = take(dim)
        at += seq_len * self.head_dim  # the legacy RoPE tables (recomputed below)
        self.cls = self.embed if shared else take(vocab, dim)
        pairs = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
        self.freq = (1.0 / (10000.0 ** pairs)).to(device)  # RoPE on interleaved pairs, theta 10000


class Tokenizer:
    """llama2.c's BPE: a dummy " " prefix, code points whole or as byte tokens (ids 3..258), then the
    best-scoring adjacent merge first (leftmost on ties), with candidates in a heap."""

    def __init__(self, path, vocab):
        raw = Path(path).read_bytes()
        self.max_len = struct.unpack_from("<i", raw, 0)[0]
        at, self.pieces, self.scores = 4, [], []
        for _ in range(vocab):
            score, n = struct.unpack_from("<fi", raw, at)
            self.pieces.append(raw[at + 8:at + 8 + n])
            self.scores.append(score)
            at += 8 + n
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        self.newline = self.ids.get(b"\n", ord("\n") + 3)

    def encode(self, text, bos=True):
        ids = [1] if bos else []
        data = text.encode()
        if data and b" " in self.ids:
            ids.append(self.ids[b" "])
        for ch in text:
            piece = ch.encode()
            ids += [self.ids[piece]] if piece in self.ids else [b + 3 for b in piece]
        return self._merge(ids)

    def _merge(self, ids):
        n, nxt, prv, heap = len(ids), list(range(1, len(ids) + 1)), list(range(-1, len(ids) - 1)), []

        def push(l, r):
            if l < 0 or r >= n:
                return
            merged = self.ids.get(self.pieces[ids[l]] + self.pieces[ids[r]])
            if merged is not None and self.scores[merged] > -1e10:
                heapq.heappush(heap, (-self.scores[merged], l, r, ids[l], ids[r], merged))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, l, r, lid, rid, merged = heapq.heappop(heap)
            if ids[l] != lid or ids[r] != rid or nxt[l] != r:
                continue  # stale
            ids[l], ids[r] = merged, -1
            nxt[l] = nxt[r]
            if nxt[l] < n:
                prv[nxt[l]] = l
            push(prv[l], l)
            push(l, nxt[l])
        return [i for i in ids if i >= 0]

    def decode(self, ids):
        out = b""
        for i in ids:
            p = self.pieces[i]
            out += bytes([int(p[3:5], 16)]) if p.startswith(b"<0x") and len(p) == 6 else p
        return out.decode(errors="replace")


# --- The forward pass --------------------------------------------------------------------------------

def rope(x, positions, freq):
    """Rotates interleaved pairs (x[2i], x[2i+1]) of [tokens, heads, head_dim] by position · freq[i]."""
    angle = positions[:, None].double() * freq[None, :]
    cos, sin = angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def dense_attention(q, k, v):
    """Plain PyTorch causal attention of the new queries (the last of the keys), GQA, float32."""
    group, n_q, n_kv = q.shape[1] // k.shape[1], q.shape[0], k.shape[0]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    causal = torch.arange(n_kv, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None] + n_kv - n_q
    s = s.masked_fill(~causal, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


def every_block_table(n_q, n_kv, heads_kv, block, device):
    """A block table of every causally visible block of each (query block, kv head) row."""
    q_blocks, kv_blocks = -(-n_q // block), -(-n_kv // block)
    ids = torch.arange(kv_blocks, dtype=torch.int32).repeat(q_blocks * heads_kv, 1)
    last = torch.arange(q_blocks) * block + block - 1  # the query block's last query
    visible = ((torch.clamp(last, max=n_q - 1) + n_kv - n_q) // block + 1).to(torch.int32)
    return ids.to(device), visible.repeat_interleave(heads_kv).to(device)


class Attend:
    """Attention through skim's operators: every causal block (select=None), or per decode step the
    blocks select(q, k) returns."""

    def __init__(self, block=64, select=None):
        self.block, self.select = block, select

    def __call__(self, q, k, v):
        n_q, n_kv = q.shape[0], k.shape[0]
        cu_q = torch.tensor([0, n_q], dtype=torch.int32, device=q.device)
        cu_kv = torch.tensor([0, n_kv], dtype=torch.int32, device=q.device)
        if self.select is not None and n_q == 1:
            ids, count = self.select(q, k, self.block)
        else:
            ids, count = every_block_table(n_q, n_kv, k.shape[1], self.block, q.device)
        o, _ = skim_torch.sparse_attention_table(q, k, v, cu_q, cu_kv, n_q, n_kv, ids, count, self.block,
                                                 self.block, True)
        return o


def forward(m, tokens, cache, attend):
    """Logits of `tokens` appended after the cache's keys; cache: per layer [k, v] ([tokens, heads, d])."""
    start = cache[0][0].shape[0] if cache[0][0] is not None else 0
    positions = torch.arange(start, start + len(tokens), device=m.embed.device)
    x = m.embed[torch.tensor(tokens, device=m.embed.device)]
    for l in range(m.layers):
        h = rmsnorm(x, m.rms_att[l])
        q = rope((h @ m.wq[l].T).view(-1, m.heads, m.head_dim), positions, m.freq)
        k = rope((h @ m.wk[l].T).view(-1, m.kv_heads, m.head_dim), positions, m.freq)
        v = (h @ m.wv[l].T).view(-1, m.kv_heads, m.head_dim)
        if cache[l][0] is not None:
            k, v = torch.cat((cache[l][0], k)), torch.cat((cache[l][1], v))
        cache[l] = [k, v]
        x = x + attend(q.contiguous(), k, v).reshape(-1, m.dim) @ m.wo[l].T
        h = rmsnorm(x, m.rms_ffn[l])
        x = x + (torch.nn.functional.silu(h @ m.w1[l].T) * (h @ m.w3[l].T)) @ m.w2[l].T
    return rmsnorm(x, m.rms_final) @ m.cls.T


def new_cache(m):
    return [[None, None] for _ in range(m.layers)]


# --- Routing for decode, in Python: a max-bound score per block ---------------------------------------

def max_bound_selector(budget, sink=1, local=2):
    """Per kv head: block 0, the `local` newest blocks, and the best others by the largest over the
    group's query heads of sum_d max(q_d · min_d, q_d · max_d) (an upper bound of q·k over the block),
    `budget` of the blocks in all (at least sink + local)."""

    def select(q, k, block):
        n, heads_kv = k.shape[0], k.shape[1]
        blocks = -(-n // block)
        pad = blocks * block - n
        kp = torch.cat((k, k[-1:].expand(pad, -1, -1))) if pad else k  # the last key repeated: no new bound
        kb = kp.view(blocks, block, heads_kv, -1)
        lo, hi = kb.amin(1), kb.amax(1)                                   # [blocks, heads_kv, d]
        qg = q[0].view(heads_kv, -1, q.shape[-1])                         # [heads_kv, group, d]
        bound = torch.maximum(qg[None] * lo[:, :, None], qg[None] * hi[:, :, None]).sum(-1).amax(-1)  # [blocks, hkv]
        keep = max(sink + local, math.ceil(budget * blocks))
        reserved = torch.zeros(blocks, dtype=torch.bool, device=k.device)
        reserved[:sink] = True
        reserved[max(0, blocks - local):] = True
        score = bound.T.masked_fill(reserved[None], float("inf"))        # [hkv, blocks]
        ids = score.topk(min(keep, blocks), dim=1).indices.sort(dim=1).values.to(torch.int32)
        return ids.contiguous(), torch.full((heads_kv,), ids.shape[1], dtype=torch.int32, device=k.device)

    return select


def window_selector(budget, sink=1):
    """The baseline at the same budget: block 0 and the newest blocks (a sliding window)."""

    def select(q, k, block):
        blocks, heads_kv = -(-k.shape[0] // block), k.shape[1]
        keep = min(blocks, max(sink + 1, math.ceil(budget * blocks)))
        ids = torch.cat((torch.arange(min(sink, blocks)), torch.arange(max(sink, blocks - (keep - sink)), blocks)))
        ids = ids.to(torch.int32).to(k.device).repeat(heads_kv, 1)
        return ids.contiguous(), torch.full((heads_kv,), ids.shape[1], dtype=torch.int32, device=k.device)

    return select


# --- Held-out text and needles (as skim-llama's needle test builds them) -----------------------------

def held_out_files():
    text = (MODELS / "kernel_val.c.txt").read_text(errors="replace")
    return [f for f in text.split("\f\n") if f.strip()]


def needle_prompt(tok, files, length, rng):
    """(prompt ids, value): `#define KEY_xxxx "value"` planted at a third of a run of held-out code (one
    file, from a random line start), the line's prefix repeated at the end: `length` tokens in all."""
    key = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(4))
    value = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(8))

    def line(text):  # the tokens of a line as they appear after a newline
        ids = tok.encode("x\n" + text, bos=False)
        return ids[ids.index(tok.newline) + 1:]

    needle = line(f'#define KEY_{key} "{value}"') + [tok.newline]
    question = line(f'#define KEY_{key} "')
    size = length - len(needle) - len(question) - 2
    while True:  # a run of `size` tokens of one file, from a line start
        f = rng.choice([f for f in files if len(f) > 2 * size])
        ids = tok.encode(f)
        starts = [i + 1 for i in range(len(ids) - size) if ids[i] == tok.newline]
        if starts:
            start = rng.choice(starts)
            hay = ids[start:start + size]
            break
    p = len(hay) // 3
    while p < len(hay) and hay[p - 1] != tok.newline:
        p += 1
    return [1] + hay[:p] + needle + hay[p:] + [tok.newline] + question, value


def answers(m, tok, prompt, attends, steps=10):
    """The greedy continuation of `prompt` under each decode attention of `attends` (name -> Attend),
    after one prefill over every causal block (the decode steps append to their own copy of its cache)."""
    prefill = new_cache(m)
    first = int(forward(m, prompt, prefill, Attend())[-1].argmax())
    out = {}
    for name, attend in attends.items():
        cache, ids = [list(kv) for kv in prefill], [first]  # forward replaces a layer's tensors, never writes them
        for _ in range(steps - 1):
            ids.append(int(forward(m, [ids[-1]], cache, attend)[-1].argmax()))
        out[name] = tok.decode(ids)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["check", "needle"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--length", type=int, default=3000)
    ap.add_argument("--needles", type=int, default=4)
    ap.add_argument("--budget", type=float, default=0.125)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    m = Model(MODELS / "kcode18M.bin", "cpu")
    tok = Tokenizer(MODELS / "tok_kbpe.bin", m.vocab)
    rng = random.Random(a.seed)
    if a.mode == "check":
        ids = tok.encode(rng.choice(held_out_files())[:40000])[:a.tokens]
        with torch.no_grad():
            ours = forward(m, ids, new_cache(m), Attend())
            plain = forward(m, ids, new_cache(m), dense_attention)
        diff = (ours - plain).abs().max().item()
        agree = (ours.argmax(-1) == plain.argmax(-1)).float().mean().item()
        loss = torch.nn.functional.cross_entropy(ours[:-1], torch.tensor(ids[1:])).item()
        print(f"{len(ids)} tokens: largest logit difference {diff:.3g}, greedy tokens agree {agree:.4f}, "
              f"loss {loss:.3f} nats/token")
        return 0 if diff < 1e-3 and agree == 1.0 else 1
    files = held_out_files()
    attends = {"dense": Attend(), f"routed {a.budget:g}": Attend(select=max_bound_selector(a.budget)),
               f"window {a.budget:g}": Attend(select=window_selector(a.budget))}
    hits = {name: 0 for name in attends}
    for i in range(a.needles):
        prompt, value = needle_prompt(tok, files, a.length, rng)
        with torch.no_grad():
            got = answers(m, tok, prompt, attends)
        for name, answer in got.items():
            hits[name] += answer.startswith(value + '"')
        print(f"needle {i}: {len(prompt)} tokens, value {value!r}: " +
              ", ".join(f"{k} {v!r}" for k, v in got.items()), flush=True)
    print(", ".join(f"{k}: {v}/{a.needles}" for k, v in hits.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
