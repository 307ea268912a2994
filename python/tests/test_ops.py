"""torch.ops.skim.* on the CPU against a float64 PyTorch reference of skim's contract
(tests/reference.py), against F.scaled_dot_product_attention where PyTorch has it, and their errors."""

import math

import pytest
import torch
import torch.nn.functional as F

import skim_torch
from reference import attention_float64, random_case, token_masks

IMPLS = ["simd", "scalar", "reference"]

# (seq_q, seq_kv, heads_kv, group, head_dim, block_q, block_kv, causal): partial blocks, odd head
# dims, GQA, varlen with empty sequences, chunked prefill (n_q < n_kv), n_q > n_kv (queries that
# see no key under causality), decode-sized query blocks.
SHAPES = [
    ([37], [37], 2, 2, 16, 8, 8, True),
    ([5, 0, 19], [23, 0, 19], 1, 4, 13, 4, 8, True),
    ([16, 3], [40, 3], 2, 1, 33, 16, 4, False),
    ([9, 12], [0, 30], 3, 2, 7, 4, 16, True),
    ([21], [11], 1, 3, 64, 4, 4, True),
    ([1, 1, 1], [70, 0, 33], 2, 4, 32, 1, 8, True),
    ([0, 10], [6, 10], 1, 1, 5, 3, 2, False),
    ([48], [64], 4, 2, 128, 16, 16, True),
]

TOL = {  # (atol, rtol) of o against the float64 reference, by dtype (o is rounded to it)
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def check_against_reference(case, o, lse, scale=None):
    o_ref, lse_ref = attention_float64(case, scale)
    atol, rtol = TOL[case.q.dtype]
    assert o.dtype == case.q.dtype and o.shape == case.q.shape
    assert lse.dtype == torch.float32 and lse.shape == case.q.shape[:2]
    torch.testing.assert_close(o.double(), o_ref, atol=atol, rtol=rtol)
    none = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse) & (lse < 0), none), "rows that see no key: lse = -inf exactly there"
    assert torch.all(o[none] == 0), "rows that see no key: o = 0"
    torch.testing.assert_close(lse.double()[~none], lse_ref[~none], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_matches_float64_reference(impl, shape):
    gen = torch.Generator().manual_seed(1000 + shape)
    case = random_case(gen, *SHAPES[shape])
    o, lse = torch.ops.skim.sparse_attention(*case.args(), 0.0, impl)
    check_against_reference(case, o, lse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("impl", IMPLS)
def test_half_types_match_reference(dtype, impl):
    for shape in (0, 1, 3, 7):
        gen = torch.Generator().manual_seed(2000 + shape)
        case = random_case(gen, *SHAPES[shape], dtype=dtype)
        o, lse = torch.ops.skim.sparse_attention(*case.args(), 0.0, impl)
        check_against_reference(case, o, lse)


def test_explicit_scale():
    gen = torch.Generator().manual_seed(3)
    case = random_case(gen, *SHAPES[1])
    o, lse = skim_torch.sparse_attention(*case.args(), scale=0.37)
    check_against_reference(case, o, lse, scale=0.37)


def test_dense_index_some_rows_without_keys():
    # Every visible block selected; with n_q > n_kv the first queries see no key under causality.
    gen = torch.Generator().manual_seed(4)
    case = random_case(gen, [21], [11], 1, 3, 64, 4, 4, True, density=1.0, empty_row_share=0.0)
    o, lse = skim_torch.sparse_attention(*case.args())
    check_against_reference(case, o, lse)
    assert torch.isinf(lse[:10]).all() and torch.all(o[:10] == 0)
    assert torch.isfinite(lse[10:]).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_block_table_equals_csr(impl):
    for shape in range(len(SHAPES)):
        gen = torch.Generator().manual_seed(5000 + shape)
        case = random_case(gen, *SHAPES[shape])
        o_csr, lse_csr = skim_torch.sparse_attention(*case.args(), impl=impl)
        ids, count = case.table(extra_width=2)
        args = list(case.args())
        args[7:9] = [ids, count]
        o_tab, lse_tab = skim_torch.sparse_attention_table(*args, impl=impl)
        assert torch.equal(o_csr, o_tab) and torch.equal(lse_csr, lse_tab)


def test_simd_is_the_same_at_any_thread_count():
    gen = torch.Generator().manual_seed(6)
    case = random_case(gen, *SHAPES[7])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        o1, lse1 = skim_torch.sparse_attention(*case.args())
        torch.set_num_threads(2)
        o2, lse2 = skim_torch.sparse_attention(*case.args())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)


def test_head_major_and_strided_inputs():
    # q, k, v as views of [heads, tokens, dim] storage (head-major), and a q sliced out of a wider
    # tensor: any strides skim accepts, with the head dimension contiguous.
    gen = torch.Generator().manual_seed(7)
    case = random_case(gen, *SHAPES[0])
    o_ref, lse_ref = skim_torch.sparse_attention(*case.args())
    args = list(case.args())
    args[0] = case.q.transpose(0, 1).contiguous().transpose(0, 1)
    args[1] = case.k.transpose(0, 1).contiguous().transpose(0, 1)
    wide = torch.randn(case.v.shape[0], case.v.shape[1] + 3, case.v.shape[2], generator=gen)
    wide[:, 1:1 + case.v.shape[1]] = case.v
    args[2] = wide[:, 1:1 + case.v.shape[1]]
    assert args[0].stride(0) == case.q.shape[2] and args[2].stride(0) == wide.stride(0)
    o, lse = skim_torch.sparse_attention(*args)
    torch.testing.assert_close(o, o_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, lse_ref, atol=1e-6, rtol=1e-6)


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


@pytest.mark.skipif(not HAS_SDPA, reason=f"PyTorch {torch.__version__} has no "
                    "F.scaled_dot_product_attention (it arrived in PyTorch 2.0)")
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_matches_sdpa_with_the_token_mask(shape):
    gen = torch.Generator().manual_seed(8000 + shape)
    case = random_case(gen, *SHAPES[shape])
    o, _ = skim_torch.sparse_attention(*case.args())
    group = case.q.shape[1] // case.heads_kv
    # skim's default scale and SDPA's are both 1/sqrt(head_dim).
    for b, mask in enumerate(token_masks(case)):
        q0, q1 = int(case.cu_q[b]), int(case.cu_q[b + 1])
        k0, k1 = int(case.cu_kv[b]), int(case.cu_kv[b + 1])
        if q1 == q0:
            continue
        got = o[q0:q1].double()
        seen = mask.any(dim=2).transpose(0, 1)  # [n_q, heads_q]; SDPA gives NaN where a query sees no key
        if k1 == k0:
            assert torch.all(got == 0)
            continue
        q = case.q[q0:q1].double().transpose(0, 1).unsqueeze(0)                              # [1, Hq, n_q, d]
        k = case.k[k0:k1].double().transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)  # [1, Hq, n_kv, d]
        v = case.v[k0:k1].double().transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(0))[0].transpose(0, 1)
        torch.testing.assert_close(got[seen], ref[seen], atol=2e-5, rtol=1e-4)
        assert torch.all(got[~seen] == 0)


def test_simd_arch_names_an_arch():
    assert skim_torch.simd_arch() in {"avx512f", "avx2", "sse2", "neon64", "neon"}


@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_sink_and_window(shape):
    # skim's sink and sliding-window rules as a block table: the rows list exactly the first and the
    # newest visible blocks, and the operators attend over them.
    gen = torch.Generator().manual_seed(9500 + shape)
    case = random_case(gen, *SHAPES[shape])
    ids, count = skim_torch.sink_window_table(case.cu_q, case.cu_kv, case.block_q, case.block_kv, case.heads_kv,
                                              1, 2, case.causal)
    full = random_case(torch.Generator().manual_seed(9500 + shape), *SHAPES[shape], density=1.0, empty_row_share=0.0)
    expected = [sorted(set(r[:1]) | set(r[-2:])) for r in full.rows]  # full.rows: every visible block
    assert [ids[r, :int(count[r])].tolist() for r in range(ids.shape[0])] == expected
    case.rows = expected
    args = list(case.args())
    args[7:9] = [ids, count]
    o, lse = skim_torch.sparse_attention_table(*args)
    check_against_reference(case, o, lse)
