"""skim's block-sparse attention as PyTorch operators (torch.ops.skim.*), on the CPU and, where the
library was built with its CUDA kernels (scripts/python-cuda), on CUDA tensors.

Importing the package loads the compiled operator library (libskim_torch.so), found in this
order: the path in $SKIM_TORCH_LIBRARY, this package's directory, then build/python/ of the skim
checkout the package lives in (where scripts/python-test builds it).

The functions below call the operators; their contract is in python/csrc/ops.cpp and
python/README.md.
"""

import os
from pathlib import Path

import torch

_LIBRARY_NAME = "libskim_torch.so"


def library_path():
    """The operator library this package loads, or None where none is found."""
    env = os.environ.get("SKIM_TORCH_LIBRARY")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for candidate in (here / _LIBRARY_NAME, here.parent.parent / "build" / "python" / _LIBRARY_NAME):
        if candidate.is_file():
            return candidate
    return None


def _load():
    path = library_path()
    if path is None or not path.is_file():
        raise ImportError(
            f"skim_torch: no {_LIBRARY_NAME} (set SKIM_TORCH_LIBRARY, or build it: scripts/python-test)"
        )
    torch.ops.load_library(str(path))


_load()


def sparse_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, row_ptr, col_idx,
                     block_q, block_kv, causal=True, scale=None, impl="auto"):
    """Block-sparse attention over a block CSR index; returns (o, lse).

    q [tokens_q, heads_q, head_dim], k and v [tokens_kv, heads_kv, head_dim] (packed varlen, int32
    cu_seqlens of batch + 1 entries); row_ptr and col_idx: int32, one row per (sequence, query
    block, kv head); scale None for 1/sqrt(head_dim). impl on the CPU: "auto" (= "simd"), "simd",
    "scalar" or "reference"; on CUDA: "auto" (decode for 1 to 8 queries per sequence, else
    prefill), "decode" or "prefill".
    """
    return torch.ops.skim.sparse_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                                           row_ptr, col_idx, block_q, block_kv, causal,
                                           0.0 if scale is None else float(scale), impl)


def sparse_attention_table(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, ids, count,
                           block_q, block_kv, causal=True, scale=None, impl="auto"):
    """As sparse_attention, over a block table: ids int32 [rows, width], count int32 [rows]."""
    return torch.ops.skim.sparse_attention_table(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                                 max_seqlen_kv, ids, count, block_q, block_kv, causal,
                                                 0.0 if scale is None else float(scale), impl)


def sparse_attention_paged(q, k_pages, v_pages, page_indptr, page_indices, cu_seqlens_q, cu_seqlens_kv,
                           max_seqlen_q, max_seqlen_kv, ids, count, block_q, block_kv, causal=True, scale=None,
                           layout="NHD", impl="auto"):
    """As sparse_attention_table, over paged K/V: k_pages and v_pages [num_pages, page_size,
    heads_kv, head_dim] (layout "NHD") or [num_pages, heads_kv, page_size, head_dim] ("HND");
    sequence b's key t in page page_indices[page_indptr[b] + t // page_size]; cu_seqlens_kv gives
    each sequence's key count."""
    return torch.ops.skim.sparse_attention_paged(q, k_pages, v_pages, page_indptr, page_indices, cu_seqlens_q,
                                                 cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, ids, count, block_q,
                                                 block_kv, causal, 0.0 if scale is None else float(scale), layout,
                                                 impl)


def bhnd_pages(k, v):
    """A [B, H, N, D] K/V cache as sparse_attention_paged's arguments: (k_pages, v_pages, page_indptr,
    page_indices, layout), page b holding sequence b's N key slots (layout "HND"). Sequence b's key
    count, at most N, comes from cu_seqlens_kv."""
    batch = k.shape[0]
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=k.device)
    indices = torch.arange(batch, dtype=torch.int32, device=k.device)
    return k, v, indptr, indices, "HND"


def sink_window_table(cu_seqlens_q, cu_seqlens_kv, block_q, block_kv, heads_kv, sink_blocks, window_blocks,
                      causal=True):
    """(ids, count) of the block table that reads, for each (sequence, query block, kv head) row, the
    first `sink_blocks` key blocks and the `window_blocks` newest ones the row sees (skim's sink and
    sliding-window rules, the rows numbered as every operator numbers them), on cu_seqlens_q's device.
    Built on the host from the sequence lengths (one device-to-host copy for CUDA tensors): once per
    batch of sequences, outside captured graphs."""
    cu_q, cu_kv = cu_seqlens_q.cpu().tolist(), cu_seqlens_kv.cpu().tolist()
    rows = []
    for b in range(len(cu_q) - 1):
        n_q, n_kv = cu_q[b + 1] - cu_q[b], cu_kv[b + 1] - cu_kv[b]
        for i in range(-(-n_q // block_q)):
            if causal:
                last = min((i + 1) * block_q, n_q) - 1  # the query block's last query
                seen = max(0, min(n_kv, last + n_kv - n_q + 1))
            else:
                seen = n_kv
            visible = -(-seen // block_kv)
            ids = sorted(set(range(min(sink_blocks, visible))) | set(range(max(0, visible - window_blocks), visible)))
            rows += [ids] * heads_kv
    width = max([len(r) for r in rows] + [1])
    table = torch.full((len(rows), width), -1, dtype=torch.int32)
    for r, ids in enumerate(rows):
        table[r, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
    count = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    return table.to(cu_seqlens_q.device), count.to(cu_seqlens_q.device)


def decode_step_state(q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks=1, local_blocks=8,
                      page_indptr=None, page_indices=None, layout="NHD"):
    """The device memory of a routed decode step (CUDA): a uint8 tensor to keep between steps, holding
    skim's block summaries (its default multi-centroid ones), the selection table and the workspaces.
    Arguments as decode_step's; the same ones at every step of the state."""
    n = torch.ops.skim.decode_step_state_bytes(q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks,
                                               local_blocks, page_indptr, page_indices, layout)
    return torch.empty(n, dtype=torch.uint8, device=q.device)


def decode_step_prefill(state, q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks=1,
                        local_blocks=8, page_indptr=None, page_indices=None, layout="NHD"):
    """Summarises every key of every sequence into `state` (after prefill)."""
    torch.ops.skim.decode_step_prefill(state, q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks,
                                       local_blocks, page_indptr, page_indices, layout)


def decode_step(state, q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks=1, local_blocks=8,
                page_indptr=None, page_indices=None, layout="NHD", scale=None):
    """One routed decode step on CUDA, as skim::cuda::decode_step runs it: each sequence's newest key
    (position cu_seqlens_kv[b + 1] - cu_seqlens_kv[b] - 1, already in K/V) is appended to its block's
    summary, every block is scored against q [batch, heads_q, head_dim] (one query per sequence),
    the sink_blocks first, local_blocks newest and top_k best blocks per kv head are kept, and q
    attends over them. K/V: [tokens, heads_kv, head_dim], or pages with page_indptr / page_indices
    in `layout`. Returns (o, lse, ids [batch * heads_kv, width], count [batch * heads_kv])."""
    return torch.ops.skim.decode_step(state, q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks,
                                      local_blocks, page_indptr, page_indices, layout,
                                      0.0 if scale is None else float(scale))


def has_cuda_kernels():
    """Whether the loaded library has the operators' CUDA kernels (built by scripts/python-cuda)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("skim::sparse_attention", "CUDA")
    except (AttributeError, RuntimeError):
        return False


def simd_arch():
    """The xsimd arch impl="simd" runs on this CPU ("avx512f", "avx2", "sse2", ...)."""
    return torch.ops.skim.simd_arch()


__all__ = ["library_path", "sparse_attention", "sparse_attention_table", "sparse_attention_paged", "bhnd_pages",
           "sink_window_table", "decode_step_state", "decode_step_prefill", "decode_step", "has_cuda_kernels",
           "simd_arch"]
