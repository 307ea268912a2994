#pragma once
// What run_cuda.cu and run_cuda_prefill.cu share: a gpu::request (cuda_request.hpp) as skim's
// device_attention_args, for each element type, K/V kind and index kind. nvcc only.

#include <cstdint>

#include "cuda_request.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/index/cuda/device_index.cuh"

namespace skim_torch::gpu::detail {

namespace sc = skim::cuda;

inline sc::device_problem problem_of(const request& r) noexcept {
  return {.batch = r.batch,
          .heads_q = r.heads_q,
          .heads_kv = r.heads_kv,
          .head_dim = r.head_dim,
          .block_q = r.block_q,
          .block_kv = r.block_kv,
          .mask = r.causal ? skim::mask_kind::causal : skim::mask_kind::none,
          .softmax_scale = r.scale,
          .scope = skim::index_scope::kv_head,
          .cu_seqlens_q = r.cu_seqlens_q,
          .cu_seqlens_kv = r.cu_seqlens_kv,
          .max_seqlen_q = r.max_seqlen_q,
          .max_seqlen_kv = r.max_seqlen_kv,
          .error = nullptr};
}

// Calls f(args) with the device_attention_args of r over element type T, its K/V kind and index kind.
template <class T, class KV, class F>
skim::status with_index(const request& r, const KV& kv, F&& f) {
  const sc::device_problem p = problem_of(r);
  const sc::device_view<const T> q{static_cast<const T*>(r.q.data), r.q.token_stride, r.q.head_stride};
  const auto o = sc::device_view<T>::token_major(static_cast<T*>(r.o), r.heads_q, r.head_dim);
  if (r.index == index_kind::block_csr) {
    const sc::device_attention_args<T, KV, sc::device_block_csr, T> a{
        .prob = p, .q = q, .kv = kv, .index = {r.row_ptr, r.col_idx, r.nnz, r.rows}, .o = o, .lse = r.lse};
    return f(a);
  }
  const sc::device_attention_args<T, KV, sc::device_block_table, T> a{
      .prob = p, .q = q, .kv = kv, .index = {r.ids, r.count, r.width, r.rows}, .o = o, .lse = r.lse};
  return f(a);
}

template <class T, class F>
skim::status with_typed(const request& r, F&& f) {
  if (r.kv == kv_kind::paged) {
    const device_pages& g = r.pages;
    const sc::device_paged_kv<T> kv{.k_pages = static_cast<const T*>(g.k_pages),
                                    .v_pages = static_cast<const T*>(g.v_pages),
                                    .num_pages = g.num_pages,
                                    .page_size = g.page_size,
                                    .page_stride = g.page_stride,
                                    .token_stride = g.token_stride,
                                    .head_stride = g.head_stride,
                                    .page_indptr = g.page_indptr,
                                    .page_indices = g.page_indices};
    return with_index<T>(r, kv, f);
  }
  // One stride pair for K and V: ops_cuda.cpp checked that they are the same.
  const sc::device_contiguous_kv<T> kv{.k = static_cast<const T*>(r.k.data),
                                       .v = static_cast<const T*>(r.v.data),
                                       .token_stride = r.k.token_stride,
                                       .head_stride = r.k.head_stride};
  return with_index<T>(r, kv, f);
}

template <class F>
skim::status with_args(const request& r, F&& f) {
  switch (r.type) {
    case element_type::f16: return with_typed<skim::half>(r, f);
    case element_type::bf16: return with_typed<skim::bfloat16>(r, f);
    case element_type::f32: break;
  }
  return skim::status::error(skim::status_code::unsupported,
                             "the CUDA executors take float16 or bfloat16 q, k and v, not float32");
}

// The most ids a valid row holds: a table's width, or (CSR) the visible blocks of the longest sequence.
inline std::int32_t max_selected(const request& r, const sc::device_problem& p) noexcept {
  if (r.index == index_kind::block_table) return r.width;
  const std::int64_t n = r.nnz < p.max_kv_blocks() ? r.nnz : p.max_kv_blocks();
  return static_cast<std::int32_t>(n < 0 ? 0 : n);
}

}  // namespace skim_torch::gpu::detail
