#!/usr/bin/env python3
"""skim's CUDA executors against PyTorch's attention on the same GPU, in one run.

For each shape it runs bench/cuda/runner.cu's program (skim, device-event medians, index sets rotated)
and times PyTorch's peers on the same shape the same way: scaled_dot_product_attention with
enable_gqa=True on its cuDNN and flash backends (dense), and FlexAttention (compiled) with the same
block mask, built from the index sets the runner wrote. Prints one table at the end and writes
results.json into --out.

    python3 bench/cuda/compare.py --runner build/cuda-device/skim_bench_cuda --out OUT [--quick]

bf16, 32 query heads, 8 kv heads, head dim 128, blocks of 128 (the GPU shapes of docs/performance.md).
K/V are head-major for everyone: the peers take [B, H, N, D] tensors, and the runner's default
--layout hnd holds skim's K/V the same way.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

HQ, HKV, D, BLK = 32, 8, 128, 128
DT = torch.bfloat16
flex = torch.compile(flex_attention, dynamic=False)


def median_ms(fn, reps=50, warmup=3):
    """Median of device-event timings of fn(rep) after warm-up runs."""
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
    times.sort()
    return times[len(times) // 2]


def run_skim(runner, mode, out, **kw):
    index = os.path.join(out, f"index-{mode}-{kw.get('blocks', 0)}.bin")
    cmd = [runner, mode, "--index-out", index] + [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(" ".join(cmd), "failed:", res.stderr, file=sys.stderr)
        return None, None
    return json.loads(res.stdout.strip().splitlines()[-1]), index


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def peer_or_none(fn, reps=50):
    try:
        return median_ms(fn, reps)
    except Exception as e:  # a backend that refuses the shape is reported, not fatal
        print("peer failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "", file=sys.stderr)
        return None


def decode_rows(batch, n, blocks, runner, out, sets):
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, HQ, 1, D, device="cuda", dtype=DT, generator=g)
    k = torch.randn(batch, HKV, n, D, device="cuda", dtype=DT, generator=g)
    v = torch.randn(batch, HKV, n, D, device="cuda", dtype=DT, generator=g)
    kv_blocks = n // BLK
    skim, index = run_skim(runner, "decode", out, batch=batch, n=n, blocks=blocks, sets=sets)
    if blocks == 0:
        bytes_ = 2.0 * batch * HKV * n * D * 2
        peers = {"cuDNN": peer_or_none(lambda i: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, False)),
                 "flash": peer_or_none(lambda i: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, False)),
                 "Flex": peer_or_none(lambda i: flex(q, k, v, enable_gqa=True), reps=20)}
    else:
        bytes_ = 2.0 * batch * HKV * blocks * BLK * D * 2
        peers = {}
        if index:
            ids = torch.from_file(index, dtype=torch.int32, size=sets * batch * HKV * blocks).view(sets, batch, HKV, blocks)
            masks = []
            for s in range(sets):
                kv_idx = torch.zeros(batch, HQ, 1, kv_blocks, dtype=torch.int32)
                kv_idx[..., :blocks] = ids[s].repeat_interleave(HQ // HKV, dim=1).unsqueeze(2)
                num = torch.full((batch, HQ, 1), blocks, dtype=torch.int32)
                masks.append(BlockMask.from_kv_blocks(num.cuda(), kv_idx.cuda(), BLOCK_SIZE=BLK, seq_lengths=(1, n)))
            peers["Flex"] = peer_or_none(lambda i: flex(q, k, v, block_mask=masks[i % sets], enable_gqa=True))
    work = f"decode B={batch} N={n} " + ("dense" if blocks == 0 else f"{blocks} blocks/kv head")
    for name, ms in [("skim", skim["ms"] if skim else None)] + list(peers.items()):
        rows.append({"work": work, "impl": name, "ms": ms, "rate": None if ms is None else bytes_ / ms * 1e-9,
                     "unit": "TB/s"})
    if skim and "graph_ms" in skim:  # skim's launches back to back in one CUDA graph (no host launch in the time)
        rows.append({"work": work + " (graph)", "impl": "skim", "ms": skim["graph_ms"],
                     "rate": bytes_ / skim["graph_ms"] * 1e-9, "unit": "TB/s"})
    return rows


def prefill_rows(n, blocks, runner, out, sets):
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, HQ, n, D, device="cuda", dtype=DT, generator=g)
    k = torch.randn(1, HKV, n, D, device="cuda", dtype=DT, generator=g)
    v = torch.randn(1, HKV, n, D, device="cuda", dtype=DT, generator=g)
    nb = n // BLK
    # skim and its peers are timed over the same number of runs: the same skim binary measured 5-9%
    # slower over 50 runs than over 5-10 (a long run of prefills likely meets the GPU's power limit).
    reps = 20 if blocks else 10
    skim, index = run_skim(runner, "prefill", out, n=n, blocks=blocks, sets=sets, bq=BLK, bk=BLK, reps=reps)
    causal = lambda b, h, qi, ki: qi >= ki
    if blocks == 0:
        flops = 4.0 * (n * (n + 1) / 2) * D * HQ
        dense_mask = create_block_mask(causal, 1, 1, n, n, BLOCK_SIZE=BLK)
        peers = {"cuDNN": peer_or_none(lambda i: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, True), reps=reps),
                 "flash": peer_or_none(lambda i: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, True), reps=reps),
                 "Flex": peer_or_none(lambda i: flex(q, k, v, block_mask=dense_mask, enable_gqa=True), reps=reps)}
    else:
        flops = skim["flops"] if skim else None
        peers = {}
        if index:
            ids = torch.from_file(index, dtype=torch.int32, size=sets * nb * HKV * blocks).view(sets, nb, HKV, blocks)
            masks = []
            for s in range(sets):
                row = ids[s].permute(1, 0, 2).repeat_interleave(HQ // HKV, dim=0).unsqueeze(0)  # [1, HQ, nb, blocks]
                cnt = (row >= 0).sum(-1).to(torch.int32)
                diag = torch.arange(nb, dtype=torch.int32).view(1, 1, nb)
                # The query block's own (diagonal) block needs the causal mask; the others are full.
                part_idx = torch.zeros(1, HQ, nb, nb, dtype=torch.int32)
                part_idx[..., 0] = diag
                full_idx = torch.zeros(1, HQ, nb, nb, dtype=torch.int32)
                full_src = torch.where(row >= 0, row, torch.zeros_like(row))
                full_idx[..., :blocks - 1] = full_src[..., :blocks - 1]  # the runner puts the diagonal last
                full_cnt = (cnt - 1).clamp(min=0)
                # Rows with fewer than `blocks` visible blocks list all of them: ids 0..cnt-1, diagonal last.
                masks.append(BlockMask.from_kv_blocks(torch.ones(1, HQ, nb, dtype=torch.int32).cuda(), part_idx.cuda(),
                                                      full_cnt.cuda(), full_idx.cuda(), BLOCK_SIZE=BLK, mask_mod=causal,
                                                      seq_lengths=(n, n)))
            peers["Flex"] = peer_or_none(lambda i: flex(q, k, v, block_mask=masks[i % sets], enable_gqa=True), reps=reps)
    for name, ms in [("skim", skim["ms"] if skim else None)] + list(peers.items()):
        rows.append({"work": f"prefill N={n} " + ("causal dense" if blocks == 0 else f"{blocks} blocks/row"),
                     "impl": name, "ms": ms, "rate": None if ms is None or flops is None else flops / ms * 1e-9,
                     "unit": "TFLOP/s"})
    return rows


def step_rows(batch, n, blocks, runner, out):
    """A whole sparse decode step (append, route, attend) as one CUDA graph, with its stage times."""
    skim, _ = run_skim(runner, "step", out, batch=batch, n=n, blocks=blocks)
    work = f"decode step B={batch} N={n} {blocks} blocks"
    if not skim:
        return [{"work": work, "impl": "skim", "ms": None, "rate": None, "unit": ""}]
    fused = skim.get("fuse_append", 0) == 1  # the router's score kernel appends the new key
    # fuse_select: decode selects its rows itself (decode_router::routed): route is score alone
    route = ("append+score" if fused else "score") + ("" if skim.get("fuse_select", 0) == 1 else "+select")
    attend = "select+attend" if skim.get("fuse_select", 0) == 1 else "attend"
    rows = [{"work": work + " (graph)", "impl": "skim", "ms": skim["ms"], "rate": None, "unit": ""}]
    if "graph_ms" in skim:  # steps back to back in one graph: no graph launch of its own per step
        rows.append({"work": work + " (graph, back to back)", "impl": "skim", "ms": skim["graph_ms"], "rate": None,
                     "unit": ""})
        rows.append({"work": "  back to back: score alone", "impl": "skim", "ms": skim["graph_score_ms"],
                     "rate": None, "unit": ""})
        rows.append({"work": "  back to back: " + (route if fused else "append, " + route),
                     "impl": "skim", "ms": skim["graph_route_ms"], "rate": None, "unit": ""})
    if not fused:
        rows.append({"work": "  stage: append", "impl": "skim", "ms": skim["append_ms"], "rate": None, "unit": ""})
    rows += [{"work": "  stage: " + route, "impl": "skim", "ms": skim["route_ms"], "rate": None, "unit": ""},
             {"work": "  stage: " + attend, "impl": "skim", "ms": skim["attend_ms"], "rate": None, "unit": ""}]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    ap.add_argument("--only", default="decode,prefill")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    n_dec, n_pre = (16384, 8192) if args.quick else (131072, 32768)
    rows = []
    only = args.only.split(",")
    if "decode" in only:
        rows += decode_rows(8, n_dec, 0, args.runner, args.out, 1)
        rows += decode_rows(8, n_dec, 16, args.runner, args.out, 4)
        rows += step_rows(8, n_dec, 16, args.runner, args.out)
    if "prefill" in only:
        rows += prefill_rows(n_pre, 16, args.runner, args.out, 2)
        rows += prefill_rows(n_pre, 0, args.runner, args.out, 1)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'work':<40} {'impl':<6} {'ms':>9} {'rate':>9}")
    for r in rows:
        ms = "-" if r["ms"] is None else f"{r['ms']:.4f}"
        rate = "-" if r["rate"] is None else f"{r['rate']:.2f} {r['unit']}"
        print(f"{r['work']:<40} {r['impl']:<6} {ms:>9} {rate:>14}")


if __name__ == "__main__":
    main()
