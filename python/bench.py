#!/usr/bin/env python3
"""skim_torch's CUDA operators against PyTorch's attention in one process, on the same tensors.

    SKIM_TORCH_LIBRARY=build/python-cuda/libskim_torch.so python3 python/bench.py [--quick]

Decode: B sequences of N keys, 32 query heads over 8 kv heads, head dim 128, bf16, blocks of 128,
K/V [B, H, N, D] (passed to skim as HND pages, skim_torch.bhnd_pages): skim's sparse_attention_paged
over 16 blocks per kv head (index sets rotated between runs) per call and in a CUDA graph, against
FlexAttention with the same block mask, and dense decode (every block) against SDPA's cuDNN and
flash backends. Prefill: one sequence of N tokens, 16 blocks per query block (the diagonal and 15
earlier ones) against Flex, and causal dense (every visible block) against SDPA. Device-event
medians; the rate is bytes of K/V selected (decode) or flops of the visible pairs (prefill).
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
import skim_torch  # noqa: E402

HQ, HKV, D, BLK = 32, 8, 128, 128
DT = torch.bfloat16
flex = torch.compile(flex_attention, dynamic=False)


def median_ms(fn, reps=30, warmup=3):
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def graph_ms(fn, reps=30):
    """Per launch of fn captured once in a CUDA graph (its inputs fixed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(0)
    return median_ms(lambda i: graph.replay(), reps)


def random_ids(gen, rows, visible, blocks, diagonal=None):
    """[rows, blocks] ascending ids: `blocks` distinct of [0, visible) per row (the diagonal kept)."""
    scores = torch.rand(rows, visible, generator=gen, device="cuda")
    if diagonal is not None:
        scores[torch.arange(rows, device="cuda"), diagonal] = 2.0
    return scores.topk(min(blocks, visible), dim=1).indices.sort(dim=1).values.to(torch.int32)


def decode_rows(batch, n, blocks, sets):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=DT, generator=gen)
    k = torch.randn(batch, HKV, n, D, device="cuda", dtype=DT, generator=gen)
    v = torch.randn(batch, HKV, n, D, device="cuda", dtype=DT, generator=gen)
    kv_blocks = n // BLK
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    cu_kv = cu_q * n
    pages = skim_torch.bhnd_pages(k, v)
    id_sets = [random_ids(gen, batch * HKV, kv_blocks, blocks) for _ in range(sets)]
    count = torch.full((batch * HKV,), blocks, dtype=torch.int32, device="cuda")
    every = torch.arange(kv_blocks, dtype=torch.int32, device="cuda").expand(batch * HKV, kv_blocks).contiguous()
    every_count = torch.full((batch * HKV,), kv_blocks, dtype=torch.int32, device="cuda")

    def skim_call(ids, cnt):
        return skim_torch.sparse_attention_paged(q, *pages[:4], cu_q, cu_kv, 1, n, ids, cnt, 1, BLK, True,
                                                 layout=pages[4])

    def flex_mask(ids):  # every query head of a GQA group reads its kv head's row
        kv_idx = torch.zeros(batch, HQ, 1, kv_blocks, dtype=torch.int32, device="cuda")
        kv_idx[..., :blocks] = ids.view(batch, HKV, blocks).repeat_interleave(HQ // HKV, dim=1).unsqueeze(2)
        num = torch.full((batch, HQ, 1), blocks, dtype=torch.int32, device="cuda")
        return BlockMask.from_kv_blocks(num, kv_idx, BLOCK_SIZE=BLK, seq_lengths=(1, n))

    q4 = q[:, :, None, :]
    masks = [flex_mask(ids) for ids in id_sets]
    sparse_bytes = 2.0 * batch * HKV * blocks * BLK * D * 2
    dense_bytes = 2.0 * batch * HKV * n * D * 2
    rows = []
    ms = median_ms(lambda i: skim_call(id_sets[i % sets], count))
    g = graph_ms(lambda i: skim_call(id_sets[0], count))
    rows.append((f"decode B={batch} N={n // 1024}K, {blocks} blocks", "skim op", ms, g, sparse_bytes))
    ms = median_ms(lambda i: flex(q4, k, v, block_mask=masks[i % sets], enable_gqa=True))
    rows.append((f"decode B={batch} N={n // 1024}K, {blocks} blocks", "Flex", ms, None, sparse_bytes))
    ms = median_ms(lambda i: skim_call(every, every_count))
    g = graph_ms(lambda i: skim_call(every, every_count))
    rows.append((f"decode B={batch} N={n // 1024}K, dense", "skim op", ms, g, dense_bytes))
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(i, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        try:
            rows.append((f"decode B={batch} N={n // 1024}K, dense", name, median_ms(sdpa), None, dense_bytes))
        except RuntimeError as e:
            print(f"{name} failed: {str(e).splitlines()[0]}", file=sys.stderr)
    return rows


def prefill_rows(n, blocks):
    """One sequence of n tokens: each query block reads its diagonal block and up to blocks - 1 earlier
    ones chosen at random per kv head; Flex gets the same blocks (the diagonal as a partial block
    under the causal mask_mod, the others as full blocks)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(n, HQ, D, device="cuda", dtype=DT)
    k = torch.randn(n, HKV, D, device="cuda", dtype=DT)
    v = torch.randn(n, HKV, D, device="cuda", dtype=DT)
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    nb, group = n // BLK, HQ // HKV
    ids = torch.full((nb * HKV, blocks), -1, dtype=torch.int32)
    count = torch.empty(nb * HKV, dtype=torch.int32)
    full_idx = torch.zeros(1, HKV, nb, nb, dtype=torch.int32)
    full_cnt = torch.zeros(1, HKV, nb, dtype=torch.int32)
    pairs = 0
    for i in range(nb):
        for h in range(HKV):
            earlier = torch.randperm(i, generator=gen)[:blocks - 1].sort().values.to(torch.int32)
            m = earlier.numel()
            ids[i * HKV + h, :m + 1] = torch.cat([earlier, torch.tensor([i], dtype=torch.int32)])
            count[i * HKV + h] = m + 1
            full_idx[0, h, i, :m] = earlier
            full_cnt[0, h, i] = m
            pairs += m * BLK * BLK + BLK * (BLK + 1) // 2
    flops = 4.0 * pairs * group * D
    part_idx = torch.zeros(1, HQ, nb, nb, dtype=torch.int32)
    part_idx[..., 0] = torch.arange(nb, dtype=torch.int32)
    mask = BlockMask.from_kv_blocks(torch.ones(1, HQ, nb, dtype=torch.int32).cuda(), part_idx.cuda(),
                                    full_cnt.repeat_interleave(group, dim=1).cuda(),
                                    full_idx.repeat_interleave(group, dim=1).cuda(), BLOCK_SIZE=BLK,
                                    mask_mod=lambda b, h, qi, ki: qi >= ki, seq_lengths=(n, n))
    ids, count = ids.cuda(), count.cuda()
    q4, k4, v4 = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    work = f"prefill N={n // 1024}K, {blocks} blocks"
    ms = median_ms(lambda i: skim_torch.sparse_attention_table(q, k, v, cu, cu, n, n, ids, count, BLK, BLK, True),
                   reps=10)
    out = [(work, "skim op", ms, None, flops)]
    ms = median_ms(lambda i: flex(q4, k4, v4, block_mask=mask, enable_gqa=True), reps=10)
    out.append((work, "Flex", ms, None, flops))
    dense = 4.0 * (n * (n + 1) / 2) * D * HQ
    every = torch.arange(nb, dtype=torch.int32).repeat(nb * HKV, 1)
    every_count = torch.arange(1, nb + 1, dtype=torch.int32).repeat_interleave(HKV)
    every, every_count = every.cuda(), every_count.cuda()
    ms = median_ms(lambda i: skim_torch.sparse_attention_table(q, k, v, cu, cu, n, n, every, every_count, BLK, BLK,
                                                               True), reps=10)
    out.append((f"prefill N={n // 1024}K, causal dense", "skim op", ms, None, dense))
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(i, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)
        try:
            out.append((f"prefill N={n // 1024}K, causal dense", name, median_ms(sdpa, reps=10), None, dense))
        except RuntimeError as e:
            print(f"{name} failed: {str(e).splitlines()[0]}", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    a = ap.parse_args()
    assert skim_torch.has_cuda_kernels(), "the loaded skim_torch library has no CUDA kernels"
    rows = decode_rows(8, 32768 if a.quick else 131072, 16, 8)
    rows += prefill_rows(8192 if a.quick else 32768, 16)
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; bf16, {HQ}/{HKV} heads, d {D}, blocks of {BLK}")
    print(f"{'work':<34} {'impl':<8} {'ms':>9} {'graph ms':>9} {'rate':>14} {'skim speed-up':>14}")
    base = {}
    for work, impl, ms, g, amount in rows:
        if impl == "skim op":
            base[work] = ms
        unit = "TFLOP/s" if work.startswith("prefill") else "TB/s"
        rate = amount / (ms * 1e-3) * 1e-12
        speed = "" if impl == "skim op" or work not in base else f"{ms / base[work]:.2f}x"
        print(f"{work:<34} {impl:<8} {ms:9.4f} {'-' if g is None else format(g, '9.4f'):>9} "
              f"{rate:8.2f} {unit:<5} {speed:>14}")


if __name__ == "__main__":
    main()
