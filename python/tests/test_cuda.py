"""torch.ops.skim.* on CUDA tensors (cuda::decode and cuda::prefill): against the float64 reference of
skim's contract, against FlexAttention over the same block mask (skim's error to the reference at
most twice Flex's, as flash-attn tests its kernels), paged K/V, bit-identical reruns, CUDA-graph
capture and replay, torch.compile, and the errors. Skipped without a GPU or without the library's
CUDA kernels (scripts/python-cuda builds them)."""

import re

import pytest
import torch

import skim_torch
from reference import attention_float64, ceil_div, padded_bhnd, paged, random_case

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and skim_torch.has_cuda_kernels()),
                                reason="no CUDA device, or the skim_torch library has no CUDA kernels")

# Bounds on o against the float64 reference (the tensor-core kernels round P to the input type before
# P·V, as FlashAttention does) and on lse (computed in fp32 from unrounded scores).
TOL = {torch.float16: 6e-3, torch.bfloat16: 3e-2}
LSE_TOL = 2e-3


def on_cuda(case, dtype):
    """The case with q, k, v rounded to dtype, on the GPU (and the rounded CPU copy for the reference)."""
    case.q, case.k, case.v = case.q.to(dtype), case.k.to(dtype), case.v.to(dtype)
    return [a.cuda() if isinstance(a, torch.Tensor) else a for a in case.args()]


def check(case, o, lse, scale=None):
    o_ref, lse_ref = attention_float64(case, scale)
    o, lse = o.cpu(), lse.cpu()
    assert o.dtype == case.q.dtype and o.shape == case.q.shape and lse.dtype == torch.float32
    none = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse) & (lse < 0), none), "rows that see no key: lse = -inf exactly there"
    assert torch.all(o[none] == 0), "rows that see no key: o = 0"
    seen = ~none
    err = (o.double() - o_ref).abs()[seen]
    bound = TOL[case.q.dtype] * (1 + o_ref.abs()[seen])
    assert torch.all(err <= bound), f"max error {err.max().item():.3g}"
    torch.testing.assert_close(lse.double()[seen], lse_ref[seen], atol=LSE_TOL, rtol=LSE_TOL)


# (seq_q, seq_kv, heads_kv, group, head_dim, block_q, block_kv, causal) for decode: 1 to 8 queries per
# sequence, empty sequences, GQA 1/4/8, head dims 64 and 128, partial blocks.
DECODE = [
    ([1, 1, 1, 1], [700, 0, 129, 1], 2, 4, 128, 1, 128, True),
    ([1, 1], [1000, 37], 8, 1, 64, 1, 64, True),
    ([4, 8, 0], [300, 81, 5], 1, 8, 128, 8, 32, True),
    ([2, 5], [16, 222], 4, 4, 64, 1, 16, False),
    ([3], [520], 2, 8, 128, 4, 128, True),
]
# For prefill: block sizes 64 and 128, chunked prefill (n_q < n_kv), varlen.
PREFILL = [
    ([300], [300], 2, 4, 128, 128, 128, True),
    ([100, 0, 257], [100, 50, 400], 1, 8, 64, 64, 64, True),
    ([130, 70], [200, 70], 4, 1, 128, 64, 128, False),
    ([129], [513], 2, 2, 64, 128, 64, True),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ["auto", "decode"])
@pytest.mark.parametrize("shape", range(len(DECODE)))
def test_decode_against_reference(dtype, impl, shape):
    gen = torch.Generator().manual_seed(300 + shape)
    case = random_case(gen, *DECODE[shape], density=0.5)
    args = on_cuda(case, dtype)
    o, lse = torch.ops.skim.sparse_attention(*args, 0.0, impl)
    check(case, o, lse)
    args[7:9] = [t.cuda() for t in case.table(extra_width=3)]
    o_t, lse_t = torch.ops.skim.sparse_attention_table(*args, 0.0, impl)
    assert torch.equal(o, o_t) and torch.equal(lse, lse_t), "CSR and table: the same bits"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ["auto", "prefill"])
@pytest.mark.parametrize("shape", range(len(PREFILL)))
def test_prefill_against_reference(dtype, impl, shape):
    gen = torch.Generator().manual_seed(400 + shape)
    case = random_case(gen, *PREFILL[shape], density=0.5)
    args = on_cuda(case, dtype)
    o, lse = torch.ops.skim.sparse_attention(*args, 0.0, impl)
    check(case, o, lse)
    o2, lse2 = torch.ops.skim.sparse_attention(*args, 0.0, impl)
    assert torch.equal(o, o2) and torch.equal(lse, lse2), "reruns are bit-identical"


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_paged_against_reference(layout, page_size, which):
    shapes = DECODE if which == "decode" else PREFILL
    for n, shape in enumerate(shapes):
        gen = torch.Generator().manual_seed(500 + n)
        case = random_case(gen, *shape, density=0.5)
        on_cuda(case, torch.bfloat16)
        k_pages, v_pages, indptr, indices = paged(case, page_size, layout, gen)
        ids, count = case.table()
        o, lse = skim_torch.sparse_attention_paged(
            case.q.cuda(), k_pages.cuda(), v_pages.cuda(), indptr.cuda(), indices.cuda(), case.cu_q.cuda(),
            case.cu_kv.cuda(), case.max_q, case.max_kv, ids.cuda(), count.cuda(), case.block_q, case.block_kv,
            case.causal, layout=layout, impl=which)
        check(case, o, lse)


def test_bhnd_decode():
    gen = torch.Generator().manual_seed(600)
    case = random_case(gen, [1, 1, 1], [900, 0, 333], 2, 4, 128, 1, 64, True)
    on_cuda(case, torch.bfloat16)
    k, v = padded_bhnd(case, 1024, gen)
    k_pages, v_pages, indptr, indices, layout = skim_torch.bhnd_pages(k.cuda(), v.cuda())
    ids, count = case.table()
    o, lse = skim_torch.sparse_attention_paged(case.q.cuda(), k_pages, v_pages, indptr, indices, case.cu_q.cuda(),
                                               case.cu_kv.cuda(), case.max_q, case.max_kv, ids.cuda(), count.cuda(),
                                               case.block_q, case.block_kv, case.causal, layout=layout)
    check(case, o, lse)


# --- Against FlexAttention over the same block mask -------------------------------------------------

def flex_error_pair(n_q, n_kv, batch, heads_kv, group, head_dim, block_q, block_kv, dtype, seed):
    """(skim's, Flex's) largest error against the float64 reference, on equal-length sequences."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    gen = torch.Generator().manual_seed(seed)
    case = random_case(gen, [n_q] * batch, [n_kv] * batch, heads_kv, group, head_dim, block_q, block_kv, True,
                       density=0.4, empty_row_share=0.0)
    args = on_cuda(case, dtype)
    o, _ = torch.ops.skim.sparse_attention(*args)
    o_ref, lse_ref = attention_float64(case)
    seen = ~torch.isinf(lse_ref)

    q_blocks, kv_blocks, heads_q = ceil_div(n_q, block_q), ceil_div(n_kv, block_kv), heads_kv * group
    blocks = torch.zeros(batch, heads_kv, q_blocks, kv_blocks, dtype=torch.bool)
    for b in range(batch):
        for i in range(q_blocks):
            for h in range(heads_kv):
                blocks[b, h, i, case.rows[(b * q_blocks + i) * heads_kv + h]] = True
    blocks = blocks.cuda()

    def mask_mod(b, h, q_idx, kv_idx):
        return blocks[b, h // group, q_idx // block_q, kv_idx // block_kv] & (kv_idx <= q_idx + (n_kv - n_q))

    mask = create_block_mask(mask_mod, batch, heads_q, n_q, n_kv, device="cuda")
    q = case.q.view(batch, n_q, heads_q, head_dim).transpose(1, 2).cuda()
    k = case.k.view(batch, n_kv, heads_kv, head_dim).transpose(1, 2).contiguous().cuda()
    v = case.v.view(batch, n_kv, heads_kv, head_dim).transpose(1, 2).contiguous().cuda()
    flex = torch.compile(flex_attention)(q.contiguous(), k, v, block_mask=mask, enable_gqa=True)
    o_flex = flex.transpose(1, 2).reshape(batch * n_q, heads_q, head_dim).cpu()
    err = lambda x: (x.double() - o_ref).abs()[seen].max().item()
    return err(o.cpu()), err(o_flex)


@pytest.mark.parametrize("dtype", [torch.bfloat16])  # one Flex compile per shape and dtype: bf16 only
@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_error_at_most_twice_flex(dtype, which):
    if which == "decode":
        skim_err, flex_err = flex_error_pair(1, 4096, 4, 8, 4, 128, 1, 128, dtype, 700)
    else:
        skim_err, flex_err = flex_error_pair(1024, 1024, 2, 2, 4, 128, 128, 128, dtype, 701)
    print(f"{which} {dtype}: skim {skim_err:.3g}, Flex {flex_err:.3g}")
    assert skim_err <= 2 * flex_err + 1e-5


# --- CUDA graphs and torch.compile ------------------------------------------------------------------

def test_cuda_graph_replay_follows_new_contents():
    gen = torch.Generator().manual_seed(800)
    shape = ([1, 1, 1], [600, 90, 333], 2, 4, 128, 1, 64, True)
    width = ceil_div(600, 64)  # every visible block: any later selection fits

    def table(c):
        return c.table(extra_width=width - max(len(r) for r in c.rows))

    case = random_case(gen, *shape, density=0.5, empty_row_share=0.0)
    args = on_cuda(case, torch.bfloat16)
    ids, count = [t.cuda() for t in table(case)]
    args[7:9] = [ids, count]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.skim.sparse_attention_table(*args)  # warm-up off the default stream, as capture asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = torch.ops.skim.sparse_attention_table(*args)
    for step in range(3):
        args[0].copy_(torch.randn(args[0].shape, generator=gen).to(torch.bfloat16))
        new_ids, new_count = table(random_case(gen, *shape, density=0.3 + 0.2 * step))
        ids.copy_(new_ids)
        count.copy_(new_count)
        graph.replay()
        o_eager, lse_eager = torch.ops.skim.sparse_attention_table(*args)
        assert torch.equal(o, o_eager) and torch.equal(lse, lse_eager)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile arrived in PyTorch 2.0")
def test_torch_compile_on_cuda():
    gen = torch.Generator().manual_seed(900)
    case = random_case(gen, *DECODE[0])
    args = on_cuda(case, torch.bfloat16)
    eager = torch.ops.skim.sparse_attention(*args)

    def attend(q, k, v, cu_q, cu_kv, row_ptr, col_idx):
        o, lse = torch.ops.skim.sparse_attention(q, k, v, cu_q, cu_kv, args[5], args[6], row_ptr, col_idx,
                                                 args[9], args[10], True)
        return o.float() * 2, lse

    compiled = torch.compile(attend, fullgraph=True)
    o, lse = compiled(*args[:5], args[7], args[8])
    assert torch.equal(o, eager[0].float() * 2) and torch.equal(lse, eager[1])


# --- Errors ---------------------------------------------------------------------------------------------

def test_cuda_errors():
    gen = torch.Generator().manual_seed(1000)
    case = random_case(gen, [1, 1], [200, 50], 2, 4, 128, 1, 64, True)
    args = on_cuda(case, torch.bfloat16)

    def fails(message, impl="auto", **changes):
        a = list(args)
        for i, value in changes.items():
            a[int(i[1:])] = value
        with pytest.raises(RuntimeError, match=re.escape(message)):
            torch.ops.skim.sparse_attention(*a, 0.0, impl)

    fails("skim: the CUDA executors take float16 or bfloat16 q, k and v, not float32",
          a0=args[0].float(), a1=args[1].float(), a2=args[2].float())
    fails("skim: cu_seqlens_q must be on cuda:0 (q's device), got cpu", a3=args[3].cpu())
    fails('skim: impl on CUDA must be "auto", "decode" or "prefill", got "simd"', impl="simd")
    fails("skim: cuda::decode: max_seqlen_q 100 > max_queries 8 (prefill rows)", impl="decode", a5=100)
    fails("skim: prefill: block_q 1 is not 64 or 128", impl="prefill")
    fails("skim: on CUDA, k and v must have one shape and the same strides",
          a2=args[2].transpose(0, 1).contiguous().transpose(0, 1))
    odd = random_case(gen, [1], [100], 1, 2, 96, 1, 64, True)
    odd_args = on_cuda(odd, torch.bfloat16)
    with pytest.raises(RuntimeError, match=re.escape("skim: prefill: head_dim 96 is not 64 or 128")):
        torch.ops.skim.sparse_attention(*odd_args)


# --- The routed decode step -------------------------------------------------------------------------

def step_inputs(gen, lengths, heads_kv=2, group=4, d=128, block_kv=64, dtype=torch.bfloat16):
    """q [batch, heads_q, d] and varlen K/V for sequences of `lengths` keys; the key block 3 of
    sequence 0, kv head 0 (far from the sink and the newest blocks) made to answer its group's queries."""
    heads_q = heads_kv * group
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(len(lengths), heads_q, d, generator=gen)
    k = torch.randn(int(cu[-1]), heads_kv, d, generator=gen)
    v = torch.randn(int(cu[-1]), heads_kv, d, generator=gen)
    k[3 * block_kv:4 * block_kv, 0] = 2.0 * q[0, :group].mean(0)  # sequence 0 starts at token 0
    return q.to(dtype), k.to(dtype), v.to(dtype), cu


def step_case(q, k, v, cu, ids, count, block_kv):
    """The reference's Case of one query per sequence over the step's selected blocks."""
    rows = [ids[r, :int(count[r])].tolist() for r in range(ids.shape[0])]
    cu_q = torch.arange(len(cu), dtype=torch.int32)
    from reference import Case
    return Case(q, k, v, cu_q, cu, 1, block_kv, True, rows)


def test_decode_step_routes_and_attends():
    gen = torch.Generator().manual_seed(1100)
    lengths, bk, top_k, sink, local = [900, 130, 327, 1, 64 * 6], 64, 3, 1, 2
    q, k, v, cu = step_inputs(gen, lengths, block_kv=bk)
    g = [t.cuda() for t in (q, k, v)]
    args = (max(lengths), bk, top_k, sink, local)
    state = skim_torch.decode_step_state(g[0], g[1], g[2], cu.cuda(), *args)
    skim_torch.decode_step_prefill(state, g[0], g[1], g[2], cu.cuda(), *args)
    o, lse, ids, count = skim_torch.decode_step(state, g[0], g[1], g[2], cu.cuda(), *args)
    ids, count = ids.cpu(), count.cpu()
    heads_kv = k.shape[1]
    for r in range(ids.shape[0]):
        visible = -(-lengths[r // heads_kv] // bk)
        row = ids[r, :int(count[r])].tolist()
        assert int(count[r]) == min(sink + local + top_k, visible)
        assert row == sorted(set(row)) and all(0 <= j < visible for j in row)
        assert 0 in row and all(j in row for j in range(max(0, visible - local), visible))
    assert 3 in ids[0, :int(count[0])].tolist(), "the block that answers the query is routed"
    check(step_case(q, k, v, cu, ids, count, bk), o, lse)
    again = skim_torch.decode_step(state, g[0], g[1], g[2], cu.cuda(), *args)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip((o, lse, ids, count), again)), "bit-identical rerun"


def test_decode_step_appends_the_newest_key():
    # Summaries of all but each sequence's newest key (K packed without them), then a step whose newest
    # key (sequence 0's key 899, in block 14) answers the query strongest, then a step 61 keys later,
    # when block 14 is no longer the newest (the newest block is always kept): only block 14's summary,
    # as the first step appended it, can route it. Without that step, the control routes another block.
    gen = torch.Generator().manual_seed(1150)
    bk, lengths = 64, [961, 610]
    q, k, v, cu = step_inputs(gen, lengths, block_kv=bk)
    # A partial block's clusters are not refined: the key may share its cluster with a random one, so
    # it outweighs block 3's keys (step_inputs) eightfold.
    k[899, 0] = 16.0 * q[0, :4].float().mean(0).to(k.dtype)

    def packed(n0, n1):  # sequence 0's first n0 keys and sequence 1's first n1
        rows = torch.cat((torch.arange(n0), 961 + torch.arange(n1)))
        return k[rows].cuda(), v[rows].cuda(), torch.tensor([0, n0, n0 + n1], dtype=torch.int32).cuda()

    args = (961, bk, 1, 1, 0)  # sink 1, no local block beyond the newest, top-1
    qd = q.cuda()

    def row0(steps):
        k0, v0, cu0 = packed(899, 609)
        state = skim_torch.decode_step_state(qd, k0, v0, cu0, *args)
        skim_torch.decode_step_prefill(state, qd, k0, v0, cu0, *args)
        for n0 in steps:
            kk, vv, cc = packed(n0, 610)
            _, _, ids, count = skim_torch.decode_step(state, qd, kk, vv, cc, *args)
        return ids[0, :int(count[0])].tolist()

    assert row0([900, 961]) == [0, 14, 15]
    assert row0([961]) != [0, 14, 15], "the control: without the first step block 14 is not routed"


def test_decode_step_paged_equals_contiguous():
    gen = torch.Generator().manual_seed(1200)
    lengths, bk = [700, 65, 300], 64
    q, k, v, cu = step_inputs(gen, lengths, block_kv=bk)
    case = random_case(gen, [1] * 3, lengths, 2, 4, 128, 1, bk, True)
    case.k, case.v, case.cu_kv = k, v, cu
    k_pages, v_pages, indptr, indices = paged(case, 16, "HND", gen)
    args = (max(lengths), bk, 4, 1, 2)
    g = [t.cuda() for t in (q, k, v)]
    state = skim_torch.decode_step_state(g[0], g[1], g[2], cu.cuda(), *args)
    skim_torch.decode_step_prefill(state, g[0], g[1], g[2], cu.cuda(), *args)
    contiguous = skim_torch.decode_step(state, g[0], g[1], g[2], cu.cuda(), *args)
    pages = dict(page_indptr=indptr.cuda(), page_indices=indices.cuda(), layout="HND")
    kp, vp = k_pages.cuda(), v_pages.cuda()
    state_p = skim_torch.decode_step_state(g[0], kp, vp, cu.cuda(), *args, **pages)
    skim_torch.decode_step_prefill(state_p, g[0], kp, vp, cu.cuda(), *args, **pages)
    paged_out = skim_torch.decode_step(state_p, g[0], kp, vp, cu.cuda(), *args, **pages)
    assert all(torch.equal(a, b) for a, b in zip(contiguous, paged_out))


def test_decode_step_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(1300)
    lengths, bk = [500, 260], 64
    q, k, v, cu = step_inputs(gen, lengths, block_kv=bk)
    g = [t.cuda() for t in (q, k, v)]
    cu_d = cu.cuda()
    args = (max(lengths), bk, 2, 1, 2)
    state = skim_torch.decode_step_state(g[0], g[1], g[2], cu_d, *args)
    skim_torch.decode_step_prefill(state, g[0], g[1], g[2], cu_d, *args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        skim_torch.decode_step(state, g[0], g[1], g[2], cu_d, *args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skim_torch.decode_step(state, g[0], g[1], g[2], cu_d, *args)
    for _ in range(3):
        g[0].copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        graph.replay()
        eager = skim_torch.decode_step(state, g[0], g[1], g[2], cu_d, *args)
        assert all(torch.equal(a, b) for a, b in zip(out, eager))


def test_decode_step_errors():
    gen = torch.Generator().manual_seed(1400)
    q, k, v, cu = step_inputs(gen, [200], block_kv=64)
    g = [t.cuda() for t in (q, k, v)]
    state = skim_torch.decode_step_state(g[0], g[1], g[2], cu.cuda(), 200, 64, 2)
    with pytest.raises(RuntimeError, match=re.escape("skim: state has 16 bytes, this decode step needs")):
        skim_torch.decode_step(state[:16], g[0], g[1], g[2], cu.cuda(), 200, 64, 2)
    with pytest.raises(RuntimeError, match=re.escape("skim: decode_step: top_k -1, sink_blocks 1, local_blocks 8 < 0")):
        skim_torch.decode_step_state(g[0], g[1], g[2], cu.cuda(), 200, 64, -1)
    with pytest.raises(RuntimeError, match=re.escape("skim: q has 2 tokens, the decode step one per sequence: 1")):
        skim_torch.decode_step(state, torch.cat((g[0], g[0])), g[1], g[2], cu.cuda(), 200, 64, 2)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile arrived in PyTorch 2.0")
def test_decode_step_under_torch_compile():
    # The step mutates its state (schema Tensor(a!)): a compiled function that runs two steps and
    # post-processes the output must leave the state and the results as eager calls do.
    gen = torch.Generator().manual_seed(1500)
    lengths, bk = [640, 300], 64
    q, k, v, cu = step_inputs(gen, lengths, block_kv=bk)
    g = [t.cuda() for t in (q, k, v)]
    cu_d = cu.cuda()
    args = (max(lengths), bk, 2, 1, 2)

    def fresh_state():
        state = skim_torch.decode_step_state(g[0], g[1], g[2], cu_d, *args)
        skim_torch.decode_step_prefill(state, g[0], g[1], g[2], cu_d, *args)
        return state

    def two_steps(state, q, k, v, cu):
        skim_torch.decode_step(state, q, k, v, cu, *args)
        o, lse, ids, count = skim_torch.decode_step(state, q, k, v, cu, *args)
        return o.float() * 2, lse, ids, count

    eager_state, compiled_state = fresh_state(), fresh_state()
    eager = two_steps(eager_state, *g, cu_d)
    compiled = torch.compile(two_steps, fullgraph=True)(compiled_state, *g, cu_d)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    # The state's workspaces are scratch: what matters is that a further step reads equal summaries.
    after = [skim_torch.decode_step(s, *g, cu_d, *args) for s in (eager_state, compiled_state)]
    assert all(torch.equal(a, b) for a, b in zip(*after)), "the compiled steps updated the state as eager ones"
