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

The shape sweep (--only sweep; --quick: three small shapes, a smoke run of about a minute):

    python3 bench/cuda/compare.py --runner build/cuda-device/skim_bench_cuda --out OUT --only sweep [--quick]
    SKIM_CUDA_BENCH_ARGS='--only sweep' scripts/cuda bench        # built, then run on the GPU machine

decode at bf16, blocks of 128, 32 query heads over 32, 8 or 4 kv heads (GQA 1, 4, 8), head dim 128 and
64, batch 1, 4, 16 (N = 32K) and 64 (N = 16K; K/V at most 17.2 GB): 24 shapes. For each: dense decode
(skim, SDPA cuDNN and flash, FlexAttention over a mask listing every block), sparse decode over 16
blocks per kv head (skim, FlexAttention with the same block mask, index sets rotated), and skim over
paged K/V (pages of 16 and 64 tokens, page table a random permutation) against skim over contiguous
K/V, dense and sparse. One FlexAttention compile per shape (dynamic=False; the dense and sparse masks
have the same tensor shapes); reps shrink with a shape's bytes. Prints one table (µs per call and in a
graph, TB/s on the K+V bytes read once; ratio: skim's speed over the peer's per call, or paged over
contiguous in a graph) and writes sweep.json into --out. Budgets: --sweep-budget (330 s: no shape
starts after it) and --flex-budget (200 s of Flex compiles: Flex is skipped after it); rows whose
bytes fit in about twice the L2 are marked "L2?".
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch._dynamo
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
        print(" ".join(cmd), "failed:", res.stderr or res.stdout, file=sys.stderr)  # a refusal is a JSON line
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


def flex_decode_mask(ids, hq, hkv, kv_blocks, n, blk):
    """FlexAttention's block mask for one query per sequence over the blocks of ids [batch, hkv, blocks]
    (a row per kv head, as the runner writes them): every query head of a GQA group reads its kv head's row."""
    batch, blocks = ids.shape[0], ids.shape[-1]
    kv_idx = torch.zeros(batch, hq, 1, kv_blocks, dtype=torch.int32)
    kv_idx[..., :blocks] = ids.repeat_interleave(hq // hkv, dim=1).unsqueeze(2)
    num = torch.full((batch, hq, 1), blocks, dtype=torch.int32)
    return BlockMask.from_kv_blocks(num.cuda(), kv_idx.cuda(), BLOCK_SIZE=blk, seq_lengths=(1, n))


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
            masks = [flex_decode_mask(ids[s], HQ, HKV, kv_blocks, n, BLK) for s in range(sets)]
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
    # fuse_select 1 or 2: decode selects its rows itself (decode_router::routed or score_routed): route
    # is score alone
    in_decode = skim.get("fuse_select", 0) >= 1
    route = ("append+score" if fused else "score") + ("" if in_decode else "+select")
    attend = "select+attend" if in_decode else "attend"
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

# --- The shape sweep (--only sweep) -----------------------------------------------------------------

L2_BYTES = 50e6  # the H200's L2: a run whose distinct bytes are within about twice this may be served from it


def runner_lines(runner, args, pages):
    """The runner's JSON line for args with --pages pages (0: contiguous K/V), by page size; a page size
    without a measurement maps to {"error": why} (a refused shape prints its reason as JSON)."""
    cmd = [runner] + [str(a) for a in args] + ["--pages", ",".join(str(p) for p in pages)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = {}
    for text in res.stdout.splitlines():
        if text.startswith("{"):
            try:
                line = json.loads(text)
            except ValueError:
                continue
            lines[line.get("page", 0)] = line
    err = res.stderr.strip().splitlines()
    out = {}
    for p in pages:
        line = lines.get(p)
        if line is None or "error" in line:
            why = (line or {}).get("error") or (err[-1] if err else f"exit status {res.returncode}, no line")
            print(" ".join(cmd), f"page {p} failed:", why, file=sys.stderr)
            line = {"error": why}
        out[p] = line
    return out


def timed_first_call(fn):
    """(seconds, ok) of fn(0): FlexAttention compiles on its first call for a shape."""
    t0 = time.time()
    try:
        fn(0)
        torch.cuda.synchronize()
    except Exception as e:  # reported as the peer's failure
        print("Flex failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "", file=sys.stderr)
        return time.time() - t0, False
    return time.time() - t0, True


def sweep_shapes(quick, dims=(128, 64)):
    """(batch, n, heads_q, heads_kv, head_dim): head dims in `dims`' order (the budgets cut from the end),
    kv heads 8, 4, 32 (GQA 4, 8, 1), batch 1..64 (N = 32K, 16K at batch 64: K/V at most 17.2 GB); quick:
    three small shapes touching every axis."""
    if quick:
        return [(1, 8192, 32, 8, 128), (4, 8192, 32, 32, 64), (16, 8192, 32, 4, 128)]
    return [(b, n, 32, hkv, d) for d in dims for hkv in (8, 4, 32)
            for b, n in ((1, 32768), (4, 32768), (16, 32768), (64, 16384))]


def sweep_shape(runner, out, shape, blocks, pages, flex_on):
    """One shape's rows: dense decode (skim, SDPA cuDNN and flash, Flex over a mask of every block),
    sparse decode over `blocks` blocks per kv head (skim, Flex with the same block mask), and skim over
    paged K/V (pages of each size in `pages`, scattered) against skim over contiguous K/V."""
    b, n, hq, hkv, d = shape
    kv_blocks = n // BLK
    blocks = min(blocks, kv_blocks)
    dense_bytes = 2.0 * b * hkv * n * d * 2
    sparse_bytes = 2.0 * b * hkv * blocks * BLK * d * 2
    # Reps: dense runs ~40 ms of launches per measure (at ~4 TB/s), 5..50 of them; sparse rotates index
    # sets over >= 256 MB of selected bytes (4..64 sets, as many reps), so that L2 holds few of a run's bytes.
    reps_dense = max(5, min(50, round(40.0 / (dense_bytes / 4e9))))
    sets = max(4, min(64, math.ceil(256e6 / sparse_bytes)))
    reps_sparse = max(50, sets)
    name = f"B={b} N={n // 1024}K {hq}/{hkv} d{d}"
    common = ["decode", "--batch", b, "--n", n, "--heads-q", hq, "--heads-kv", hkv, "--dim", d, "--bk", BLK]
    dense_args = common + ["--blocks", 0, "--sets", 1, "--reps", reps_dense]
    sparse_args = common + ["--blocks", blocks, "--sets", sets, "--reps", reps_sparse]
    index = os.path.join(out, "sweep-index.bin")
    if os.path.exists(index):
        os.remove(index)
    # One process each for dense and sparse, contiguous K/V first, then each page size.
    skim = {("dense", p): line for p, line in runner_lines(runner, dense_args, (0,) + tuple(pages)).items()}
    skim.update({("sparse", p): line for p, line in
                 runner_lines(runner, sparse_args + ["--index-out", index], (0,) + tuple(pages)).items()})
    ids = None
    if "error" not in skim[("sparse", 0)] and os.path.exists(index):
        ids = torch.from_file(index, dtype=torch.int32, size=sets * b * hkv * blocks).view(sets, b, hkv, blocks)

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=DT, generator=g)
    k = torch.randn(b, hkv, n, d, device="cuda", dtype=DT, generator=g)
    v = torch.randn(b, hkv, n, d, device="cuda", dtype=DT, generator=g)
    peers = {"dense": {"cuDNN": peer_or_none(lambda i: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, False), reps_dense),
                       "flash": peer_or_none(lambda i: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, False), reps_dense)},
             "sparse": {}}
    compile_s, why = None, {}
    if not flex_on:
        peers["dense"]["Flex"] = peers["sparse"]["Flex"] = None
        why["Flex"] = "skipped: the Flex compile budget is spent"
    else:
        # One compile per shape: the dense mask (every block) and the sparse ones have the same tensor shapes.
        every = torch.arange(kv_blocks, dtype=torch.int32).expand(b, hkv, kv_blocks)
        dense_mask = flex_decode_mask(every, hq, hkv, kv_blocks, n, BLK)
        run_dense = lambda i: flex(q, k, v, block_mask=dense_mask, enable_gqa=True)
        compile_s, ok = timed_first_call(run_dense)
        peers["dense"]["Flex"] = peer_or_none(run_dense, reps_dense) if ok else None
        if ok and ids is not None:
            masks = [flex_decode_mask(ids[s], hq, hkv, kv_blocks, n, BLK) for s in range(sets)]
            peers["sparse"]["Flex"] = peer_or_none(
                lambda i: flex(q, k, v, block_mask=masks[i % sets], enable_gqa=True), reps_sparse)
            del masks
        else:
            peers["sparse"]["Flex"] = None
            why["Flex"] = "compile or first call failed (see the log)" if not ok else "no index: skim's sparse run failed"
    del q, k, v
    torch.cuda.empty_cache()

    rows = []
    shape_d = {"batch": b, "n": n, "heads_q": hq, "heads_kv": hkv, "dim": d, "bk": BLK}
    for kind, bytes_, touched in (("dense", dense_bytes, dense_bytes),
                                  ("sparse", sparse_bytes, sparse_bytes * min(sets, reps_sparse))):
        work = "dense" if kind == "dense" else f"{blocks} blocks"
        note = "L2?" if touched < 2 * L2_BYTES else ""
        base = skim[(kind, 0)]

        def add(impl, work_, ms, graph_ms=None, ratio=None, ratio_of="", error=None):
            rows.append({"shape": name, **shape_d, "work": work_, "impl": impl, "ms": ms, "graph_ms": graph_ms,
                         "bytes": bytes_, "tb_per_s": None if ms is None else bytes_ / ms * 1e-9,
                         "graph_tb_per_s": None if graph_ms is None else bytes_ / graph_ms * 1e-9,
                         "ratio": ratio, "ratio_of": ratio_of, "note": note, "error": error})

        add("skim", work, base.get("ms"), base.get("graph_ms"), error=base.get("error"))
        for impl, ms in peers[kind].items():
            ratio = ms / base["ms"] if ms is not None and base.get("ms") else None
            add(impl, work, ms, ratio=ratio, ratio_of="skim/peer per call",
                error=None if ms is not None else why.get(impl, "failed (see the log)"))
        for p in pages:
            r = skim[(kind, p)]
            ratio = base["graph_ms"] / r["graph_ms"] if r.get("graph_ms") and base.get("graph_ms") else None
            add(f"skim p{p}", work + f" paged {p}", r.get("ms"), r.get("graph_ms"), ratio=ratio,
                ratio_of="paged/contiguous in a graph", error=r.get("error"))
    return rows, compile_s


def sweep(runner, out, quick, budget_s, flex_budget_s, dims=(128, 64)):
    """The shape sweep: rows for every shape, printed as one table and written to OUT/sweep.json."""
    for limit in ("recompile_limit", "cache_size_limit"):  # a compile per shape; past the limit Dynamo would run eager
        if hasattr(torch._dynamo.config, limit):
            try:
                setattr(torch._dynamo.config, limit, 256)
            except Exception:
                pass
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):  # an error (reported), never eager timings
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    shapes, pages, blocks = sweep_shapes(quick, dims), (16, 64), 16
    start, flex_s, rows, done, skipped = time.time(), 0.0, [], [], []
    for i, shape in enumerate(shapes):
        elapsed = time.time() - start
        if elapsed > budget_s:
            skipped.append(shape)
            continue
        flex_on = flex_s <= flex_budget_s
        print(f"sweep {i + 1}/{len(shapes)}: B={shape[0]} N={shape[1]} heads {shape[2]}/{shape[3]} d{shape[4]} "
              f"(at {elapsed:.0f} s{'' if flex_on else ', Flex skipped: compile budget spent'})", flush=True)
        t0 = time.time()
        try:
            shape_rows, compile_s = sweep_shape(runner, out, shape, blocks, pages, flex_on)
        except Exception as e:  # one shape that fails (out of memory, say) leaves the others to run
            print("sweep shape failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "", file=sys.stderr)
            torch.cuda.empty_cache()
            b, n, hq, hkv, d = shape
            shape_rows, compile_s = [{"shape": f"B={b} N={n // 1024}K {hq}/{hkv} d{d}", "batch": b, "n": n,
                                      "heads_q": hq, "heads_kv": hkv, "dim": d, "bk": BLK, "work": "-", "impl": "-",
                                      "ms": None, "graph_ms": None, "bytes": None, "tb_per_s": None,
                                      "graph_tb_per_s": None, "ratio": None, "ratio_of": "", "note": "",
                                      "error": f"{type(e).__name__}: {e}".splitlines()[0]}], None
        flex_s += compile_s or 0.0
        rows += shape_rows
        done.append({"shape": list(shape), "seconds": time.time() - t0, "flex_compile_s": compile_s})
    total = time.time() - start
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16", "bk": BLK,
                   "sparse_blocks": blocks, "pages": list(pages), "seconds": total, "flex_compile_s": flex_s,
                   "shapes": done, "skipped": [list(s) for s in skipped], "rows": rows}, f, indent=1)
    fmt = lambda x, spec: "-" if x is None else format(x, spec)
    print(f"\n{'shape':<22} {'work':<20} {'impl':<8} {'µs':>9} {'TB/s':>6} {'graph µs':>9} {'TB/s':>6} {'ratio':>6}")
    for r in rows:
        ms, gms = r["ms"], r["graph_ms"]
        print(f"{r['shape']:<22} {r['work']:<20} {r['impl']:<8} {fmt(None if ms is None else ms * 1e3, '.1f'):>9} "
              f"{fmt(r['tb_per_s'], '.2f'):>6} {fmt(None if gms is None else gms * 1e3, '.1f'):>9} "
              f"{fmt(r['graph_tb_per_s'], '.2f'):>6} {fmt(r['ratio'], '.2f'):>6}"
              + (f"  {r['note']}" if r["note"] else "") + (f"  error: {r['error']}" if r["error"] else ""))
    print("\nratio: skim/peer speed per call on the peers' rows; paged/contiguous speed in a graph on the paged rows."
          "\nshape: batch, keys per sequence, query heads / kv heads, head dim (bf16, blocks of 128, K/V [B, H, N, D])."
          "\nTB/s: the selected K+V bytes once; L2?: the bytes a run touches fit in about twice the L2.")
    print(f"sweep: {len(done)} shapes in {total:.0f} s (Flex compiles {flex_s:.0f} s)"
          + (f"; skipped past the {budget_s:.0f} s budget: {skipped}" if skipped else ""))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    ap.add_argument("--only", default="decode,prefill", help="decode, prefill, sweep (comma-separated)")
    ap.add_argument("--sweep-dims", default="128,64",
                    help="sweep: head dims, in order (one call per head dim halves a call's time)")
    ap.add_argument("--sweep-budget", type=float, default=330.0,
                    help="sweep: seconds after which no further shape starts")
    ap.add_argument("--flex-budget", type=float, default=200.0,
                    help="sweep: seconds of FlexAttention compiles after which Flex is skipped")
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
    if "decode" in only or "prefill" in only:
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(rows, f, indent=1)
        print(f"\n{'work':<40} {'impl':<6} {'ms':>9} {'rate':>9}")
        for r in rows:
            ms = "-" if r["ms"] is None else f"{r['ms']:.4f}"
            rate = "-" if r["rate"] is None else f"{r['rate']:.2f} {r['unit']}"
            print(f"{r['work']:<40} {r['impl']:<6} {ms:>9} {rate:>14}")
    if "sweep" in only:
        sweep(args.runner, args.out, args.quick, args.sweep_budget, args.flex_budget,
              tuple(int(d) for d in args.sweep_dims.split(",")))


if __name__ == "__main__":
    main()
