"""torch.ops.skim.sparse_attention_paged on the CPU: paged K/V (NHD and HND, pages in a random order
in a pool with pages no sequence owns) and [B, H, N, D] caches against the float64 reference, the
same outputs as over contiguous K/V, and its errors."""

import re

import pytest
import torch

import skim_torch
from reference import padded_bhnd, paged, random_case
from test_ops import IMPLS, SHAPES, check_against_reference


def paged_args(case, page_size, layout, gen):
    k_pages, v_pages, indptr, indices = paged(case, page_size, layout, gen)
    ids, count = case.table()
    return (case.q, k_pages, v_pages, indptr, indices, case.cu_q, case.cu_kv, case.max_q, case.max_kv, ids, count,
            case.block_q, case.block_kv, case.causal)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_paged_matches_reference_and_contiguous(impl, layout, page_size):
    for shape in range(len(SHAPES)):
        gen = torch.Generator().manual_seed(9000 + 10 * shape + page_size)
        case = random_case(gen, *SHAPES[shape])
        o, lse = skim_torch.sparse_attention_paged(*paged_args(case, page_size, layout, gen), layout=layout,
                                                   impl=impl)
        check_against_reference(case, o, lse)
        args = list(case.args())
        args[7:9] = case.table()
        o_c, lse_c = skim_torch.sparse_attention_table(*args, impl=impl)
        torch.testing.assert_close(o, o_c, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse, lse_c, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_half_types(dtype):
    gen = torch.Generator().manual_seed(9100)
    case = random_case(gen, *SHAPES[1], dtype=dtype)
    o, lse = skim_torch.sparse_attention_paged(*paged_args(case, 4, "HND", gen), layout="HND")
    check_against_reference(case, o, lse)


def test_bhnd_cache_as_pages():
    # Decode over a padded [B, H, N, D] cache: sequence lengths below N, the slots past them random.
    gen = torch.Generator().manual_seed(9200)
    case = random_case(gen, [1, 1, 1], [70, 0, 33], 2, 4, 32, 1, 8, True)
    k, v = padded_bhnd(case, 80, gen)
    k_pages, v_pages, indptr, indices, layout = skim_torch.bhnd_pages(k, v)
    ids, count = case.table()
    o, lse = skim_torch.sparse_attention_paged(case.q, k_pages, v_pages, indptr, indices, case.cu_q, case.cu_kv,
                                               case.max_q, case.max_kv, ids, count, case.block_q, case.block_kv,
                                               case.causal, layout=layout)
    check_against_reference(case, o, lse)


def test_paged_meta():
    gen = torch.Generator().manual_seed(9300)
    case = random_case(gen, *SHAPES[0], dtype=torch.bfloat16)
    args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in paged_args(case, 4, "NHD", gen)]
    o, lse = torch.ops.skim.sparse_attention_paged(*args)
    assert o.device.type == "meta" and o.shape == case.q.shape and o.dtype == torch.bfloat16
    assert lse.shape == case.q.shape[:2] and lse.dtype == torch.float32


def test_paged_errors():
    gen = torch.Generator().manual_seed(9400)
    case = random_case(gen, [5], [9], 1, 2, 8, 4, 4, True, density=1.0, empty_row_share=0.0)
    args = list(paged_args(case, 4, "NHD", gen))

    def fails(message, layout="NHD", **changes):
        a = list(args)
        names = {"k_pages": 1, "v_pages": 2, "page_indptr": 3, "page_indices": 4}
        for name, value in changes.items():
            a[names[name]] = value
        with pytest.raises(RuntimeError, match=re.escape(message)):
            skim_torch.sparse_attention_paged(*a, layout=layout)

    fails('skim: layout must be "NHD" or "HND", got "NDH"', layout="NDH")
    fails("skim: k_pages must be [num_pages, page_size, heads_kv, head_dim], got 3 dimensions",
          k_pages=args[1][0], v_pages=args[2][0])
    fails("skim: v_pages must have k_pages' shape and strides", v_pages=args[2].transpose(1, 2).contiguous())
    bad = args[4].clone()
    bad[1] = args[1].shape[0]
    fails(f"skim: page_indices[1] = {args[1].shape[0]} out of [0, {args[1].shape[0]})", page_indices=bad)
    fails("skim: sequence 0 has 2 pages, needs 3 for 9 keys", page_indptr=torch.tensor([0, 2], dtype=torch.int32))
    fails("skim: k_pages' head_dim 4 is not q's 8", k_pages=args[1][..., :4].contiguous(),
          v_pages=args[2][..., :4].contiguous())
