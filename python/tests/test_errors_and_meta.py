"""Bad calls raise RuntimeError with skim's message (or the operator's own, for what skim cannot
see), and the Meta kernels give the outputs' shapes for tracing."""

import re

import pytest
import torch

import skim_torch
from reference import random_case


def small_case():
    """One sequence of 5 queries and 5 keys, heads_q 2, heads_kv 1, head_dim 8, blocks of 4:
    two index rows (query blocks 0 and 1 of kv head 0), causal."""
    gen = torch.Generator().manual_seed(11)
    return random_case(gen, [5], [5], 1, 2, 8, 4, 4, True, density=1.0, empty_row_share=0.0)


def call(**changes):
    case = small_case()
    row_ptr, col_idx = case.csr()
    args = dict(q=case.q, k=case.k, v=case.v, cu_seqlens_q=case.cu_q, cu_seqlens_kv=case.cu_kv, max_seqlen_q=5,
                max_seqlen_kv=5, row_ptr=row_ptr, col_idx=col_idx, block_q=4, block_kv=4, causal=True)
    impl = changes.pop("impl", "simd")
    args.update(changes)
    return skim_torch.sparse_attention(**args, impl=impl)


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def test_the_small_case_runs():
    o, lse = call()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()


# (changes to the small case, the exact message). Messages from skim's statuses are skim's
# contract (docs/design.md §10); the others are the operator's checks.
ERRORS = [
    (dict(col_idx=i32(0, 0, 2)), "skim: block id 2 >= kv blocks 2 of sequence 0 in row 1 (position 1)"),
    (dict(col_idx=i32(0, 1, 0)), "skim: unsorted block ids in row 1: 0 at position 1 after 1"),
    (dict(row_ptr=i32(0, 1)), "skim: block_csr row_ptr has 2 entries, needs rows 2 + 1"),
    (dict(cu_seqlens_q=i32(0, 4)), "skim: Q is [5, 2, 8], expected [4, 2, 8]"),
    (dict(cu_seqlens_q=i32(0, 6, 5), cu_seqlens_kv=i32(0, 3, 5), max_seqlen_q=6),
     "skim: cu_seqlens_q[2] = 5 < cu_seqlens_q[1] = 6 (must not decrease)"),
    (dict(block_q=0), "skim: block_q 0 <= 0"),
    (dict(v=torch.randn(5, 1, 9)), "skim: V is [5, 1, 9], expected [5, 1, 8]"),
    (dict(k=torch.randn(5, 3, 8), v=torch.randn(5, 3, 8)), "skim: heads_q 2 is not a multiple of heads_kv 3"),
    (dict(scale=float("inf")), "skim: softmax_scale inf is not finite"),
    (dict(cu_seqlens_q=torch.tensor([0, 5])), "skim: cu_seqlens_q must be int32, got Long"),
    (dict(k=torch.randn(5, 1, 8).half()), "skim: q, k and v must have one dtype, got Float, Half and Float"),
    (dict(max_seqlen_q=4), "skim: max_seqlen_q = 4 < length 5 of sequence 0"),
    (dict(impl="cuda"), 'skim: impl on the CPU must be "auto", "simd", "scalar" or "reference", got "cuda"'),
    (dict(block_kv=2 ** 31), "skim: block_kv = 2147483648 does not fit in int32"),
]


@pytest.mark.parametrize("impl", ["simd", "scalar", "reference"])
@pytest.mark.parametrize("n", range(len(ERRORS)))
def test_errors_carry_the_message(impl, n):
    changes, message = ERRORS[n]
    changes = dict(changes)
    changes.setdefault("impl", impl)
    with pytest.raises(RuntimeError, match="^" + re.escape(message)):
        call(**changes)


def test_operator_checks():
    case = small_case()
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16, got Double"):
        call(q=case.q.double(), k=case.k.double(), v=case.v.double())
    with pytest.raises(RuntimeError, match=re.escape("q must have a contiguous head dimension (stride(2) == 1)")):
        call(q=case.q.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(RuntimeError, match=re.escape("q must be [tokens, heads, head_dim], got 4 dimensions")):
        call(q=case.q[None])
    with pytest.raises(RuntimeError, match="col_idx must be contiguous"):
        call(col_idx=i32(0, 9, 0, 9, 1, 9)[::2])


def test_block_table_errors():
    case = small_case()
    args = list(case.args())
    args[7:9] = [torch.tensor([[0, -1], [0, 1]], dtype=torch.int32), i32(1, 3)]
    with pytest.raises(RuntimeError, match="^" + re.escape("skim: count 3 > width 2 in row 1")):
        skim_torch.sparse_attention_table(*args)
    args[7:9] = [i32(0, 0, 1), i32(1, 2)]
    with pytest.raises(RuntimeError, match=re.escape("skim: ids must have 2 dimension(s), got 1")):
        skim_torch.sparse_attention_table(*args)


def test_meta_tensors_give_shapes():
    case = random_case(torch.Generator().manual_seed(12), [7, 0, 9], [7, 3, 12], 2, 3, 16, 4, 4, True,
                       dtype=torch.bfloat16)
    args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in case.args()]
    o, lse = torch.ops.skim.sparse_attention(*args)
    assert o.device.type == "meta" and o.shape == case.q.shape and o.dtype == torch.bfloat16
    assert lse.device.type == "meta" and lse.shape == case.q.shape[:2] and lse.dtype == torch.float32
    ids, count = case.table()
    args[7:9] = [ids.to("meta"), count.to("meta")]
    o, lse = torch.ops.skim.sparse_attention_table(*args)
    assert o.shape == case.q.shape and lse.shape == case.q.shape[:2]


def test_meta_kernel_refuses_mixed_devices():
    args = list(small_case().args())
    args[0] = args[0].to("meta")
    with pytest.raises(RuntimeError, match="the Meta kernel takes meta tensors only, got one on cpu"):
        torch.ops.skim.sparse_attention(*args)


def test_fake_tensor_mode():
    from torch._subclasses import FakeTensorMode

    case = small_case()
    real = case.args()
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in real]
        o, lse = torch.ops.skim.sparse_attention(*args)
    assert o.shape == case.q.shape and o.dtype == case.q.dtype and lse.shape == case.q.shape[:2]


def test_make_fx_traces_the_operator():
    from torch.fx.experimental.proxy_tensor import make_fx

    case = small_case()

    def attend(q, k, v, cu_q, cu_kv, row_ptr, col_idx):
        o, lse = torch.ops.skim.sparse_attention(q, k, v, cu_q, cu_kv, 5, 5, row_ptr, col_idx, 4, 4, True)
        return o * 2, lse

    inputs = (case.q, case.k, case.v, case.cu_q, case.cu_kv, *case.csr())
    graph = make_fx(attend, tracing_mode="fake")(*inputs)
    assert "torch.ops.skim.sparse_attention.default" in graph.code
    o, lse = graph(*inputs)
    o_eager, lse_eager = attend(*inputs)
    assert torch.equal(o, o_eager) and torch.equal(lse, lse_eager)


@pytest.mark.skipif(not hasattr(torch, "compile"),
                    reason=f"PyTorch {torch.__version__} has no torch.compile (it arrived in PyTorch 2.0)")
def test_torch_compile():
    case = small_case()
    o_eager, lse_eager = torch.ops.skim.sparse_attention(*case.args())
    compiled = torch.compile(lambda *a: torch.ops.skim.sparse_attention(*a), fullgraph=True)
    o, lse = compiled(*case.args())
    assert torch.equal(o, o_eager) and torch.equal(lse, lse_eager)


def test_decode_step_meta_shapes():
    # The decode step's Meta kernel: o like q, lse, and its table of batch * heads_kv rows, each as wide
    # as reserved<top_k> can fill from the longest sequence (sink 1 + local 2 + top 3 of 15 blocks: 6).
    meta = dict(device="meta")
    q = torch.empty(3, 8, 64, dtype=torch.bfloat16, **meta)
    k = torch.empty(1000, 2, 64, dtype=torch.bfloat16, **meta)
    cu = torch.empty(4, dtype=torch.int32, **meta)
    state = torch.empty(1 << 20, dtype=torch.uint8, **meta)
    o, lse, ids, count = torch.ops.skim.decode_step(state, q, k, k, cu, 900, 64, 3, 1, 2)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (3, 8) and lse.dtype == torch.float32
    assert ids.shape == (6, 6) and ids.dtype == torch.int32 and count.shape == (6,)
    _, _, ids, _ = torch.ops.skim.decode_step(state, q, k, k, cu, 100, 64, 3, 1, 8)
    assert ids.shape == (6, 2), "no row sees more than its 2 blocks"
    pages = torch.empty(70, 2, 16, 64, dtype=torch.bfloat16, **meta)  # HND: 2 kv heads
    indptr, indices = torch.empty(4, dtype=torch.int32, **meta), torch.empty(70, dtype=torch.int32, **meta)
    _, _, ids, count = torch.ops.skim.decode_step(state, q, pages, pages, cu, 900, 64, 3, 1, 2, indptr, indices, "HND")
    assert ids.shape == (6, 6) and count.shape == (6,)
    assert torch.ops.skim.decode_step_prefill(state, q, k, k, cu, 900, 64, 3) is None
