#pragma once
// What skim::cuda::prefill's two kernels share (prefill_sm80.cuh: mma.sync; prefill_sm90.cuh:
// wgmma): the kernel arguments and the stored-index wrapper, the CTA's place in the grid, the row's
// checked block ids, and on the host the alignment contracts of their 16-byte loads and paired
// stores. Each kernel header keeps only its own tiles, pipeline and launch.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "skim/core/status.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"

namespace skim::cuda::detail::prefill_common {

inline constexpr int chunk_elems = 8;    // 16-bit elements in a 16-byte chunk
inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// The stored index (table or CSR), with its form decided at run time: it is read once per block
// id, so a uniform branch costs nothing and keeps the kernel count down (one per element type,
// K/V source and tile shape instead of four times that). The implicit indices and unions (index/cuda/device_index.cuh)
// are kernel template arguments of their own: prefill::run passes them as they are.
struct index_ref {
  skim::cuda::device_block_table table;
  skim::cuda::device_block_csr csr;
  bool is_csr = false;

  [[nodiscard]] __device__ __forceinline__ skim::cuda::device_block_table::span row(std::int64_t r) const noexcept {
    return is_csr ? csr.row(r) : table.row(r);
  }
  [[nodiscard]] __device__ __forceinline__ skim::cuda::device_span_cursor cursor(std::int64_t r,
                                                                                 const skim::cuda::device_row&) const noexcept {
    const skim::cuda::device_block_table::span s = row(r);
    return {s.first, s.first + s.n, s.clamped};
  }
  [[nodiscard]] status validate() const noexcept { return is_csr ? csr.validate() : table.validate(); }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept {
    return is_csr ? csr.max_ids() : table.max_ids();
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept {
    return is_csr ? csr.stored_rows() : table.stored_rows();
  }
};
static_assert(skim::cuda::device_block_index<index_ref>);

// What the kernel takes for a device index: index_ref for the stored forms, the index itself otherwise.
template <class Index>
using kernel_index_t = std::conditional_t<skim::cuda::is_stored_device_index_v<Index>, index_ref, Index>;

// Everything the kernel reads, by value. O is either T (o_fp32 false) or float. Index is index_ref
// (stored forms) or an implicit index / union (index/cuda/device_index.cuh).
template <class T, class KV, class Index = index_ref>
struct params {
  skim::cuda::device_problem prob;
  skim::cuda::device_view<const T> q;
  KV kv;
  Index index;
  void* o = nullptr;
  std::int64_t o_token_stride = 0;
  std::int64_t o_head_stride = 0;
  bool o_fp32 = false;
  float* lse = nullptr;
  float scale_log2 = 0.0f;  // softmax scale · log2(e): scores are kept in base-2 units
};

// ---------------------------------------------------------------------------------------------
// A row's block ids, each checked against the row's contract as it is taken: an id outside
// [0, visible_blocks) or not above the previous kept id is skipped and its bit recorded (a
// trusted cursor, one of the implicit rules or a union of them, needs no check). Every thread of
// the CTA walks the same ids (uniform loads), so every thread agrees on the tile list.
template <class Cursor>
struct checked_ids {
  Cursor c;
  std::int32_t prev = -1;
  std::int32_t visible = 0;

  // The next valid id, or -1 when the row is exhausted.
  [[nodiscard]] __device__ __forceinline__ std::int32_t next(std::uint32_t& bits) noexcept {
    if constexpr (Cursor::trusted) {
      if (c.done()) return -1;
      const std::int32_t id = c.id();
      c.next();
      return id;
    } else {
      while (!c.done()) {
        const std::int32_t id = c.id();
        c.next();
        if (id < 0 || id >= visible) {
          bits |= skim::cuda::bad_block_id;
        } else if (id <= prev) {
          bits |= skim::cuda::bad_order;
        } else {
          prev = id;
          return id;
        }
      }
      return -1;
    }
  }
};

// The (query head h, sequence b, query block i) of this CTA in both prefill kernels' grid: head
// fastest (the heads of a GQA group read the same K/V tiles close together in time, from L2), query
// blocks from the last one down (causal rows with more tiles start first).
struct cta_coords_t {
  std::int32_t h, b, i;
};
[[nodiscard]] __device__ __forceinline__ cta_coords_t cta_coords(const skim::cuda::device_problem& p) noexcept {
  const std::uint32_t flat = blockIdx.x;
  const std::int32_t h = static_cast<std::int32_t>(flat % static_cast<std::uint32_t>(p.heads_q));
  const std::uint32_t rest = flat / static_cast<std::uint32_t>(p.heads_q);
  const std::int32_t b = static_cast<std::int32_t>(rest % static_cast<std::uint32_t>(p.batch));
  const std::int32_t i = p.max_q_blocks() - 1 - static_cast<std::int32_t>(rest / static_cast<std::uint32_t>(p.batch));
  return {h, b, i};
}

// The checked ids of the index row of (sequence b, query block i, query head h), for both prefill
// kernels. A row number outside the index, or a count/range outside its storage, is clamped by the
// cursor and reported in `bits`.
template <class Index>
[[nodiscard]] __device__ __forceinline__ auto row_ids(const Index& index, const skim::cuda::device_problem& p,
                                                      std::int32_t b, std::int32_t i, std::int32_t h,
                                                      const skim::cuda::device_row& row, std::uint32_t& bits) noexcept {
  const std::int32_t index_head = p.scope == index_scope::kv_head ? h / p.group_size() : h;
  const std::int64_t index_row = (skim::cuda::q_block_offset(p, b) + i) * p.index_heads() + index_head;
  auto c = index.cursor(index_row, row);
  if (c.malformed()) bits |= skim::cuda::bad_count;
  return checked_ids<decltype(c)>{c, -1, row.visible_blocks};
}

// ---------------------------------------------------------------------------------------------
// Host side: the alignment contracts of the kernels' 16-byte loads and paired stores, and the
// kernel arguments.

[[nodiscard]] inline bool aligned(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// 16-byte rows: pointers on 16 bytes, strides in whole 16-byte chunks (8 elements of a 16-bit
// source, 16 codes of a quantised one). A stride never multiplied by a nonzero index (one head) is
// not checked.
template <class T>
[[nodiscard]] status check_alignment(const skim::cuda::device_contiguous_kv<T>& kv,
                                     const skim::cuda::device_problem& p) noexcept {
  constexpr std::int64_t elems = 16 / sizeof(T);
  if (!aligned(kv.k, 16) || !aligned(kv.v, 16) || kv.token_stride % elems != 0 ||
      (p.heads_kv > 1 && kv.head_stride % elems != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: K %p, V %p not 16-byte aligned, or K/V strides (token %lld, head %lld) not "
                         "multiples of %lld", static_cast<const void*>(kv.k),
                         static_cast<const void*>(kv.v), static_cast<long long>(kv.token_stride),
                         static_cast<long long>(kv.head_stride), static_cast<long long>(elems));
  }
  return status::success();
}
template <class T>
[[nodiscard]] status check_alignment(const skim::cuda::device_paged_kv<T>& kv,
                                     const skim::cuda::device_problem& p) noexcept {
  constexpr std::int64_t elems = 16 / sizeof(T);
  if (!aligned(kv.k_pages, 16) || !aligned(kv.v_pages, 16) || kv.page_stride % elems != 0 ||
      kv.token_stride % elems != 0 || (p.heads_kv > 1 && kv.head_stride % elems != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: K/V pages %p, %p not 16-byte aligned, or strides (page %lld, token %lld, head "
                         "%lld) not multiples of %lld",
                         static_cast<const void*>(kv.k_pages), static_cast<const void*>(kv.v_pages),
                         static_cast<long long>(kv.page_stride), static_cast<long long>(kv.token_stride),
                         static_cast<long long>(kv.head_stride), static_cast<long long>(elems));
  }
  return status::success();
}
template <class Source>
[[nodiscard]] status check_alignment(const skim::cuda::device_quantized_kv<Source>& kv,
                                     const skim::cuda::device_problem& p) noexcept {
  return check_alignment(kv.codes, p);  // the codes move in 16-byte copies of 16
}


// Q, K/V and O views meet the contracts: Q and K/V rows start on 16 bytes (base pointers aligned,
// strides in whole 8-element chunks), O rows on 2 · sizeof(TO) (strides even).
template <class TQ, class KV, class Index, class TO>
[[nodiscard]] status check_views(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a) noexcept {
  const skim::cuda::device_problem& p = a.prob;
  if (!aligned(a.q.data, 16) || a.q.token_stride % chunk_elems != 0 ||
      (p.heads_q > 1 && a.q.head_stride % chunk_elems != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: Q %p not 16-byte aligned, or Q strides (token %lld, head %lld) not multiples "
                         "of 8", static_cast<const void*>(a.q.data),
                         static_cast<long long>(a.q.token_stride), static_cast<long long>(a.q.head_stride));
  }
  SKIM_TRY(check_alignment(a.kv, p));
  if (!aligned(a.o.data, 2 * sizeof(TO)) || a.o.token_stride % 2 != 0 ||
      (p.heads_q > 1 && a.o.head_stride % 2 != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: O %p not %zu-byte aligned, or O strides (token %lld, head %lld) not even",
                         static_cast<const void*>(a.o.data), 2 * sizeof(TO), static_cast<long long>(a.o.token_stride),
                         static_cast<long long>(a.o.head_stride));
  }
  return status::success();
}

// The kernel arguments of `a` (Params: params<...> or a type derived from it).
template <class Params, class TQ, class KV, class Index, class TO>
void fill_params(Params& prm, const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a) noexcept {
  prm.prob = a.prob;
  prm.q = a.q;
  prm.kv = a.kv;
  if constexpr (std::is_same_v<Index, skim::cuda::device_block_csr>) {
    prm.index.csr = a.index;
    prm.index.is_csr = true;
  } else if constexpr (std::is_same_v<Index, skim::cuda::device_block_table>) {
    prm.index.table = a.index;
  } else {
    prm.index = a.index;  // implicit rule or union: its own kernel
  }
  prm.o = a.o.data;
  prm.o_token_stride = a.o.token_stride;
  prm.o_head_stride = a.o.head_stride;
  prm.o_fp32 = std::is_same_v<TO, float>;
  prm.lse = a.lse;
  prm.scale_log2 = a.prob.scale() * log2e;
}

}  // namespace skim::cuda::detail::prefill_common
