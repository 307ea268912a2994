#pragma once
// skim_torch's call into skim, free of PyTorch: what ops.cpp takes from the tensors it has checked
// (dtype, device, rank, shapes it can see, a contiguous head dimension) and hands to an executor.
// skim checks everything else (cu_seqlens, views against the problem, the index, overlaps) and
// answers with a status whose message ops.cpp raises as a RuntimeError.
//
// Compiled into several translation units: ops.cpp (PyTorch), run_portable.cpp (exec::reference,
// exec::scalar, the choice of simd arch) and one run_<arch>.cpp per simd arch, built with that
// arch's flags and including no PyTorch header.

#include <cstdint>
#include <span>

#include "kinds.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"

namespace skim_torch {

// One [tokens, heads, head_dim] tensor: element (t, h, d) at data[t·token_stride + h·head_stride + d].
struct tensor_view {
  const void* data = nullptr;
  std::int32_t tokens = 0, heads = 0, head_dim = 0;
  std::int64_t token_stride = 0, head_stride = 0;  // in elements
};

// Paged K/V: key t of sequence b in page page_indices[page_indptr[b] + t / page_size] of the pool,
// slot t % page_size.
struct pages_view {
  page_pool pool;
  std::span<const std::int32_t> page_indptr, page_indices;
};

struct request {
  skim::problem prob;                   // cu_seqlens spans point into the caller's int32 tensors
  element_type type = element_type::f32;  // of Q, K, V and O
  tensor_view q, k, v;                  // k, v: kv_kind::contiguous
  kv_kind kv = kv_kind::contiguous;
  pages_view pages;                     // kv_kind::paged
  void* o = nullptr;                    // [tokens_q, heads_q, head_dim], densely packed, of `type`
  std::span<float> lse;                 // [tokens_q · heads_q], token-major
  index_kind index = index_kind::block_csr;
  std::span<const std::int32_t> row_ptr, col_idx;  // index_kind::block_csr
  std::span<const std::int32_t> ids, count;        // index_kind::block_table, ids [rows, width]
  std::int32_t width = 0;
};

// Each runs one executor over the request and returns its status (ok, or skim's error).
[[nodiscard]] skim::status run_reference(const request& r);
[[nodiscard]] skim::status run_scalar(const request& r);
// exec::simd for the best arch this CPU runs among those compiled (simd_arch()), on `threads`
// threads (<= 1: the calling thread only). Results do not depend on `threads`.
[[nodiscard]] skim::status run_simd(const request& r, std::int32_t threads);
// The xsimd arch run_simd uses on this CPU: "avx512f", "avx2" or the baseline arch's
// xsimd name ("sse2" on x86-64).
[[nodiscard]] const char* simd_arch() noexcept;

// Calls f(args) with the skim::attention_args of the request's K/V source over element type T
// and the request's index kind.
template <class T, class KV, class F>
[[nodiscard]] skim::status visit_index(const request& r, const KV& kv, F&& f) {
  const skim::strided_view<const T> q{static_cast<const T*>(r.q.data), r.q.tokens,       r.q.heads,
                                      r.q.head_dim,                    r.q.token_stride, r.q.head_stride};
  const auto o = skim::strided_view<T>::token_major(static_cast<T*>(r.o), r.q.tokens, r.q.heads, r.q.head_dim);
  if (r.index == index_kind::block_csr) {
    const skim::attention_args<T, KV, skim::index::block_csr, T> a{
        .prob = r.prob, .q = q, .kv = kv, .index = {r.row_ptr, r.col_idx}, .o = o, .lse = r.lse};
    return f(a);
  }
  const skim::attention_args<T, KV, skim::index::block_table, T> a{
      .prob = r.prob, .q = q, .kv = kv, .index = {r.ids, r.count, r.width}, .o = o, .lse = r.lse};
  return f(a);
}

// Calls f(args) with the skim::attention_args of the request's element type T, K/V kind and index kind.
template <class T, class F>
[[nodiscard]] skim::status visit_typed(const request& r, F&& f) {
  if (r.kv == kv_kind::paged) {
    const page_pool& p = r.pages.pool;
    const skim::paged_kv<T> kv{.k_pages = static_cast<const T*>(p.k_pages),
                               .v_pages = static_cast<const T*>(p.v_pages),
                               .num_pages = p.num_pages,
                               .page_size = p.page_size,
                               .page_stride = p.page_stride,
                               .token_stride = p.token_stride,
                               .head_stride = p.head_stride,
                               .page_indptr = r.pages.page_indptr,
                               .page_indices = r.pages.page_indices};
    return visit_index<T>(r, kv, f);
  }
  const auto input = [](const tensor_view& t) {
    return skim::strided_view<const T>{static_cast<const T*>(t.data), t.tokens,     t.heads,
                                       t.head_dim,                     t.token_stride, t.head_stride};
  };
  return visit_index<T>(r, skim::contiguous_kv<T>{.k = input(r.k), .v = input(r.v)}, f);
}

template <class F>
[[nodiscard]] skim::status visit(const request& r, F&& f) {
  switch (r.type) {
    case element_type::f32: return visit_typed<float>(r, f);
    case element_type::f16: return visit_typed<skim::half>(r, f);
    case element_type::bf16: return visit_typed<skim::bfloat16>(r, f);
  }
  return skim::status::error(skim::status_code::invalid_argument, "unknown element type %d",
                             static_cast<int>(r.type));
}

}  // namespace skim_torch
