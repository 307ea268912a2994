#pragma once
// What the run_cuda*.cu files share: a gpu::request (cuda_request.hpp) as skim's
// device_problem, K/V source, Q and O views and device_attention_args, for each element type, K/V
// kind and index kind. nvcc only.

#include <cstdint>
#include <type_traits>

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

template <class T>
sc::device_view<const T> q_view(const request& r) noexcept {
  return {static_cast<const T*>(r.q.data), r.q.token_stride, r.q.head_stride};
}
template <class T>
sc::device_view<T> o_view(const request& r) noexcept {
  return sc::device_view<T>::token_major(static_cast<T*>(r.o), r.heads_q, r.head_dim);
}

// Calls f(kv) with r's K/V source over element type T: paged, or contiguous (one stride pair for K
// and V: ops_cuda.cpp checked that they are the same).
template <class T, class F>
skim::status with_source(const request& r, F&& f) {
  if (r.kv == kv_kind::paged) {
    const page_pool& g = r.pages.pool;
    return f(sc::device_paged_kv<T>{.k_pages = static_cast<const T*>(g.k_pages),
                                    .v_pages = static_cast<const T*>(g.v_pages),
                                    .num_pages = g.num_pages,
                                    .page_size = g.page_size,
                                    .page_stride = g.page_stride,
                                    .token_stride = g.token_stride,
                                    .head_stride = g.head_stride,
                                    .page_indptr = r.pages.page_indptr,
                                    .page_indices = r.pages.page_indices});
  }
  return f(sc::device_contiguous_kv<T>{.k = static_cast<const T*>(r.k.data),
                                       .v = static_cast<const T*>(r.v.data),
                                       .token_stride = r.k.token_stride,
                                       .head_stride = r.k.head_stride});
}

// Calls f(static_cast<T*>(nullptr)) for r's element type T (skim::half or skim::bfloat16); float32
// is refused, with `what` naming the caller.
template <class F>
skim::status with_element(const request& r, const char* what, F&& f) {
  switch (r.type) {
    case element_type::f16: return f(static_cast<skim::half*>(nullptr));
    case element_type::bf16: return f(static_cast<skim::bfloat16*>(nullptr));
    case element_type::f32: break;
  }
  return skim::status::error(skim::status_code::unsupported, "%s take float16 or bfloat16 q, k and v, not float32",
                             what);
}

// Calls f(args) with the device_attention_args of r: its element type, K/V kind and index kind.
template <class F>
skim::status with_args(const request& r, F&& f) {
  return with_element(r, "the CUDA executors", [&]<class T>(T*) {
    return with_source<T>(r, [&](const auto& kv) -> skim::status {
      using KV = std::decay_t<decltype(kv)>;
      const sc::device_problem p = problem_of(r);
      if (r.index == index_kind::block_csr) {
        return f(sc::device_attention_args<T, KV, sc::device_block_csr, T>{
            .prob = p, .q = q_view<T>(r), .kv = kv, .index = {r.row_ptr, r.col_idx, r.nnz, r.rows}, .o = o_view<T>(r),
            .lse = r.lse});
      }
      return f(sc::device_attention_args<T, KV, sc::device_block_table, T>{
          .prob = p, .q = q_view<T>(r), .kv = kv, .index = {r.ids, r.count, r.width, r.rows}, .o = o_view<T>(r),
          .lse = r.lse});
    });
  });
}

// The most ids a valid row holds: a table's width, or (CSR) the visible blocks of the longest sequence.
inline std::int32_t max_selected(const request& r, const sc::device_problem& p) noexcept {
  if (r.index == index_kind::block_table) return r.width;
  const std::int64_t n = r.nnz < p.max_kv_blocks() ? r.nnz : p.max_kv_blocks();
  return static_cast<std::int32_t>(n < 0 ? 0 : n);
}

}  // namespace skim_torch::gpu::detail
