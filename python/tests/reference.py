"""Test support: random block-sparse cases and a float64 PyTorch reference of skim's contract.

The contract (docs/design.md §3 to §6): sequence b owns query tokens [cu_q[b], cu_q[b+1]) and key
tokens [cu_kv[b], cu_kv[b+1]); queries and keys are cut into blocks of block_q and block_kv per
sequence (the last may be partial); an index row per (sequence, query block, kv head), numbered
row = (q_block_offset(b) + i) * heads_kv + h; under causality query i sees key j iff
j <= i + n_kv - n_q (bottom-right); a query that sees no key gets o = 0, lse = -inf.
"""

import math
from dataclasses import dataclass

import torch


def ceil_div(a, b):
    return (a + b - 1) // b


def visible_blocks(n_q, n_kv, q_block, block_q, block_kv, causal):
    """Key blocks holding a key that some query of the query block sees."""
    if not causal:
        return ceil_div(n_kv, block_kv)
    last_query = min((q_block + 1) * block_q, n_q) - 1
    keys = max(0, min(n_kv, last_query + n_kv - n_q + 1))
    return ceil_div(keys, block_kv)


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_kv: torch.Tensor
    block_q: int
    block_kv: int
    causal: bool
    rows: list  # per index row, its ascending block ids

    @property
    def heads_kv(self):
        return self.k.shape[1]

    @property
    def max_q(self):
        return int((self.cu_q[1:] - self.cu_q[:-1]).max()) if len(self.cu_q) > 1 else 0

    @property
    def max_kv(self):
        return int((self.cu_kv[1:] - self.cu_kv[:-1]).max()) if len(self.cu_kv) > 1 else 0

    def csr(self):
        counts = [len(r) for r in self.rows]
        row_ptr = torch.tensor([0] + list(torch.tensor(counts, dtype=torch.int64).cumsum(0).tolist()),
                               dtype=torch.int32)
        col_idx = torch.tensor([i for r in self.rows for i in r], dtype=torch.int32)
        return row_ptr, col_idx

    def table(self, extra_width=1):
        """Block table of width max count + extra_width, padded with -1 (never read)."""
        width = max([len(r) for r in self.rows] + [0]) + extra_width
        ids = torch.full((len(self.rows), width), -1, dtype=torch.int32)
        for n, r in enumerate(self.rows):
            ids[n, :len(r)] = torch.tensor(r, dtype=torch.int32)
        count = torch.tensor([len(r) for r in self.rows], dtype=torch.int32)
        return ids, count

    def args(self):
        """Positional arguments of torch.ops.skim.sparse_attention up to causal."""
        row_ptr, col_idx = self.csr()
        return (self.q, self.k, self.v, self.cu_q, self.cu_kv, self.max_q, self.max_kv, row_ptr, col_idx,
                self.block_q, self.block_kv, self.causal)


def random_case(gen, seq_q, seq_kv, heads_kv, group, head_dim, block_q, block_kv, causal, dtype=torch.float32,
                density=0.6, empty_row_share=0.2):
    """Random Q/K/V (normal) and a random index: each row keeps each visible block with probability
    `density`, and is left empty with probability `empty_row_share`."""
    heads_q = heads_kv * group
    cu_q = torch.tensor([0] + list(torch.tensor(seq_q).cumsum(0).tolist()), dtype=torch.int32)
    cu_kv = torch.tensor([0] + list(torch.tensor(seq_kv).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(int(cu_kv[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(int(cu_kv[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    rows = []
    for n_q, n_kv in zip(seq_q, seq_kv):
        for i in range(ceil_div(n_q, block_q)):
            visible = visible_blocks(n_q, n_kv, i, block_q, block_kv, causal)
            for _ in range(heads_kv):
                if torch.rand(1, generator=gen).item() < empty_row_share:
                    rows.append([])
                    continue
                keep = torch.rand(visible, generator=gen) < density
                rows.append([j for j in range(visible) if keep[j]])
    return Case(q, k, v, cu_q, cu_kv, block_q, block_kv, causal, rows)


def token_masks(case):
    """Per sequence, the boolean mask [heads_q, n_q, n_kv]: query (h, i) attends key j."""
    heads_q, heads_kv = case.q.shape[1], case.heads_kv
    group = heads_q // heads_kv
    masks = []
    q_block_offset = 0
    for b in range(len(case.cu_q) - 1):
        n_q = int(case.cu_q[b + 1] - case.cu_q[b])
        n_kv = int(case.cu_kv[b + 1] - case.cu_kv[b])
        mask = torch.zeros(heads_q, n_q, n_kv, dtype=torch.bool)
        for i in range(n_q):
            qb = i // case.block_q
            for h in range(heads_q):
                row = (q_block_offset + qb) * heads_kv + h // group
                for j in case.rows[row]:
                    mask[h, i, j * case.block_kv:min((j + 1) * case.block_kv, n_kv)] = True
        if case.causal:
            i = torch.arange(n_q).unsqueeze(1)
            j = torch.arange(n_kv).unsqueeze(0)
            mask &= (j <= i + n_kv - n_q).unsqueeze(0)
        masks.append(mask)
        q_block_offset += ceil_div(n_q, case.block_q)
    return masks


def attention_float64(case, scale=None):
    """(o, lse) of the masked softmax in float64: o [tokens_q, heads_q, head_dim], lse [tokens_q, heads_q]."""
    heads_q, heads_kv, d = case.q.shape[1], case.heads_kv, case.q.shape[2]
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = torch.zeros(case.q.shape, dtype=torch.float64)
    lse = torch.full(case.q.shape[:2], -math.inf, dtype=torch.float64)
    for b, mask in enumerate(token_masks(case)):
        q0, q1 = int(case.cu_q[b]), int(case.cu_q[b + 1])
        k0, k1 = int(case.cu_kv[b]), int(case.cu_kv[b + 1])
        q = case.q[q0:q1].double().transpose(0, 1)                                   # [Hq, n_q, d]
        k = case.k[k0:k1].double().transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, n_kv, d]
        v = case.v[k0:k1].double().transpose(0, 1).repeat_interleave(group, dim=0)
        s = (scale * q @ k.transpose(1, 2)).masked_fill(~mask, -math.inf)
        row_lse = torch.logsumexp(s, dim=2)                                          # -inf where no key
        p = torch.where(mask, torch.exp(s - row_lse.unsqueeze(2)), torch.zeros((), dtype=torch.float64))
        o[q0:q1] = (p @ v).transpose(0, 1)
        lse[q0:q1] = row_lse.transpose(0, 1)
    return o, lse


def paged(case, page_size, layout, gen, spare_pages=3):
    """case's K/V as sparse_attention_paged's pages: each sequence's keys on its own pages, the pages
    in a random order in a pool with `spare_pages` pages of random values no sequence owns (never to
    be read). Returns (k_pages, v_pages, page_indptr, page_indices), layout "NHD" or "HND"."""
    heads_kv, d = case.k.shape[1], case.k.shape[2]
    lengths = (case.cu_kv[1:] - case.cu_kv[:-1]).tolist()
    counts = [ceil_div(n, page_size) for n in lengths]
    total = sum(counts) + spare_pages
    order = torch.randperm(total, generator=gen).to(torch.int32)
    k_pages = torch.randn(total, page_size, heads_kv, d, generator=gen).to(case.k.dtype)
    v_pages = torch.randn(total, page_size, heads_kv, d, generator=gen).to(case.k.dtype)
    indptr, indices, used = [0], [], 0
    for b, n in enumerate(lengths):
        k0 = int(case.cu_kv[b])
        for p in range(counts[b]):
            page = int(order[used])
            used += 1
            indices.append(page)
            t0, t1 = p * page_size, min((p + 1) * page_size, n)
            k_pages[page, :t1 - t0] = case.k[k0 + t0:k0 + t1]
            v_pages[page, :t1 - t0] = case.v[k0 + t0:k0 + t1]
        indptr.append(len(indices))
    if layout == "HND":
        k_pages = k_pages.transpose(1, 2).contiguous()
        v_pages = v_pages.transpose(1, 2).contiguous()
    return (k_pages, v_pages, torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32))


def padded_bhnd(case, n, gen):
    """case's K/V as [B, heads_kv, n, head_dim] tensors (sequence b's keys first, random values after
    them: never to be read), n >= every sequence's key count."""
    batch, heads_kv, d = len(case.cu_kv) - 1, case.k.shape[1], case.k.shape[2]
    k = torch.randn(batch, heads_kv, n, d, generator=gen).to(case.k.dtype)
    v = torch.randn(batch, heads_kv, n, d, generator=gen).to(case.k.dtype)
    for b in range(batch):
        k0, k1 = int(case.cu_kv[b]), int(case.cu_kv[b + 1])
        k[b, :, :k1 - k0] = case.k[k0:k1].transpose(0, 1)
        v[b, :, :k1 - k0] = case.v[k0:k1].transpose(0, 1)
    return k, v
