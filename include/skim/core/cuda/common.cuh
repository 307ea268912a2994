#pragma once
// What every skim CUDA kernel shares: the device-side problem, K/V sources and indices, 16-bit
// loads, the device error word (CUDA errors as skim::status, device facts and launches: core/cuda/launch.cuh).
//
// Device-resident geometry. Sequence lengths (cu_seqlens), page tables and indices live in device
// memory, so one decode step can be captured in a CUDA graph and replayed while the sequences
// grow. The host knows only bounds (batch, max lengths) and checks those; kernels never trust the
// device-side content: a length past its bound, a block id outside its row's visible blocks, an
// unsorted or repeated id, or a page outside the pool is skipped (nothing is read through it) and
// reported by setting bits in an optional device error word (`device_problem::error`), which the
// caller reads when it wants to (tests always do). Nothing in a kernel can read another sequence's
// K/V: every row address is derived from the sequence's own [cu_seqlens_kv[b], cu_seqlens_kv[b+1])
// or its own page list.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/index/cuda/device_index.cuh"
#include "skim/core/cuda/launch.cuh"

namespace skim::cuda {

namespace detail {
inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr unsigned full_mask = 0xffffffffu;  // every lane of a warp (shuffles, votes, matches)
}  // namespace detail

// Bits of the device error word. Kernels OR them in with atomicOr; 0 means no bad content seen.
enum device_error_bits : std::uint32_t {
  bad_seqlen = 1u << 0,    // a sequence longer than the host's bound, or cu_seqlens decreasing
  bad_block_id = 1u << 1,  // an id outside [0, visible_blocks) of its row
  bad_order = 1u << 2,     // ids of a row not strictly increasing (a repeat would count a block twice)
  bad_count = 1u << 3,     // a count outside [0, width], or a row_ptr range outside col_idx
  bad_page = 1u << 4,      // a page id outside [0, num_pages), or a page list too short for the sequence
};

// Reads (and clears) the error word after synchronising `stream`; a nonzero word becomes
// status_code::invalid_index (or invalid_argument for lengths) naming the bits.
[[nodiscard]] inline status read_device_error(std::uint32_t* error, cudaStream_t stream) noexcept {
  if (error == nullptr) return status::success();
  std::uint32_t bits = 0;
  SKIM_TRY(check(cudaMemcpyAsync(&bits, error, sizeof bits, cudaMemcpyDeviceToHost, stream), "read_device_error"));
  SKIM_TRY(check(cudaStreamSynchronize(stream), "read_device_error"));
  if (bits == 0) return status::success();
  SKIM_TRY(check(cudaMemsetAsync(error, 0, sizeof bits, stream), "read_device_error"));
  return status::error(bits == bad_seqlen ? status_code::invalid_argument : status_code::invalid_index,
                       "device-side input rejected (bits 0x%x:%s%s%s%s%s)", bits,
                       bits & bad_seqlen ? " seqlen" : "", bits & bad_block_id ? " block_id" : "",
                       bits & bad_order ? " order" : "", bits & bad_count ? " count" : "",
                       bits & bad_page ? " page" : "");
}

// ---------------------------------------------------------------------------------------------
// Problem

// skim::problem with its sequence lengths on the device. The bounds are the host's promise: grids
// are sized from them, and a sequence longer than them is rejected on the device (bad_seqlen).
struct device_problem {
  std::int32_t batch = 0;
  std::int32_t heads_q = 0;
  std::int32_t heads_kv = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_q = 64;
  std::int32_t block_kv = 64;
  mask_kind mask = mask_kind::causal;
  float softmax_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  index_scope scope = index_scope::kv_head;
  const std::int32_t* cu_seqlens_q = nullptr;   // device [batch + 1]
  const std::int32_t* cu_seqlens_kv = nullptr;  // device [batch + 1]
  std::int32_t max_seqlen_q = 0;                // bound on every seq_len_q(b)
  std::int32_t max_seqlen_kv = 0;               // bound on every seq_len_kv(b)
  std::uint32_t* error = nullptr;               // optional device error word (device_error_bits)

  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t group_size() const noexcept { return heads_q / heads_kv; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t index_heads() const noexcept {
    return scope == index_scope::kv_head ? heads_kv : heads_q;
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_q_blocks() const noexcept {
    return (max_seqlen_q + block_q - 1) / block_q;
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_kv_blocks() const noexcept {
    return (max_seqlen_kv + block_kv - 1) / block_kv;
  }
  [[nodiscard]] float scale() const noexcept {
    return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
};

// Host checks of everything the host can see (no device memory is read).
[[nodiscard]] inline status validate(const device_problem& p) noexcept {
  if (p.batch < 0) return status::error(status_code::invalid_argument, "batch %d < 0", p.batch);
  SKIM_TRY(skim::detail::validate_shape(p));
  if (p.max_seqlen_q < 0 || p.max_seqlen_kv < 0) {
    return status::error(status_code::invalid_argument, "max_seqlen_q %d / max_seqlen_kv %d < 0", p.max_seqlen_q,
                         p.max_seqlen_kv);
  }
  if (p.batch > 0 && (p.cu_seqlens_q == nullptr || p.cu_seqlens_kv == nullptr)) {
    return status::error(status_code::invalid_argument, "cu_seqlens_q/kv are null with batch %d", p.batch);
  }
  return status::success();
}

// Row geometry on the device: device_row (index/cuda/device_index.cuh), the same numbers as skim::make_row_info.

__device__ inline void report(const device_problem& p, std::uint32_t bits) noexcept {
  if (p.error != nullptr) atomicOr(p.error, bits);
}

// Geometry of query block i of sequence b. A block past the sequence's queries has q_begin >= q_end.
[[nodiscard]] __device__ inline device_row make_device_row(const device_problem& p, std::int32_t b,
                                                           std::int32_t i) noexcept {
  device_row r;
  r.q_offset = p.cu_seqlens_q[b];
  r.kv_offset = p.cu_seqlens_kv[b];
  const std::int32_t n_q = p.cu_seqlens_q[b + 1] - r.q_offset;
  r.kv_len = p.cu_seqlens_kv[b + 1] - r.kv_offset;
  if (n_q < 0 || r.kv_len < 0 || n_q > p.max_seqlen_q || r.kv_len > p.max_seqlen_kv) {
    report(p, bad_seqlen);
    return r;
  }
  r.q_begin = i * p.block_q;
  r.q_end = r.q_begin + p.block_q < n_q ? r.q_begin + p.block_q : n_q;
  if (r.q_begin >= r.q_end) return r;  // no query here (ok stays false, nothing to report)
  const std::int32_t kv_blocks = (r.kv_len + p.block_kv - 1) / p.block_kv;
  const std::int32_t complete = r.kv_len / p.block_kv;
  if (p.mask == mask_kind::none) {
    r.visible_blocks = kv_blocks;
    r.full_blocks = complete;
  } else {
    r.causal_offset = r.kv_len - n_q;
    const std::int32_t last_visible = r.visible_keys(r.q_end - 1, p.mask);
    const std::int32_t first_visible = r.visible_keys(r.q_begin, p.mask);
    r.visible_blocks = (last_visible + p.block_kv - 1) / p.block_kv;
    const std::int32_t full = first_visible / p.block_kv;
    r.full_blocks = full < complete ? full : complete;
  }
  r.ok = true;
  return r;
}

// First query block of sequence b in the batch-wide numbering (Σ_{s<b} q_blocks(s)). O(b); for
// decode (one query per sequence) it is b.
[[nodiscard]] __device__ inline std::int64_t q_block_offset(const device_problem& p, std::int32_t b) noexcept {
  std::int64_t n = 0;
  for (std::int32_t s = 0; s < b; ++s) {
    const std::int32_t len = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    n += len > 0 ? (len + p.block_q - 1) / p.block_q : 0;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Elements

template <class T>
inline constexpr bool is_device_element_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// skim::half / skim::bfloat16 are 16-bit storage with the IEEE / bfloat16 layouts of __half and
// __nv_bfloat16; kernels reinterpret them.
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

[[nodiscard]] __device__ __forceinline__ float to_float(half x) noexcept { return __half2float(__ushort_as_half(x.bits)); }
[[nodiscard]] __device__ __forceinline__ float to_float(bfloat16 x) noexcept {
  return __uint_as_float(static_cast<std::uint32_t>(x.bits) << 16);
}
[[nodiscard]] __device__ __forceinline__ float to_float(float x) noexcept { return x; }

// Two packed 16-bit elements (one 32-bit word) to float2.
template <class T>
[[nodiscard]] __device__ __forceinline__ float2 to_float2(std::uint32_t w) noexcept {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    static_assert(sizeof h == sizeof w);
    memcpy(&h, &w, sizeof w);
    return __half22float2(h);
  }
}

template <class T>
[[nodiscard]] __device__ __forceinline__ T from_float_device(float f) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
  } else {
    return half{__half_as_ushort(__float2half_rn(f))};
  }
}

// ---------------------------------------------------------------------------------------------
// K/V sources. A source maps (sequence, token within it, kv head) to the row of head_dim elements.

// Packed varlen K/V with strides (head_dim contiguous), token-major [tokens_kv, heads_kv, head_dim]
// or head-major [heads_kv, tokens_kv, head_dim] (then a key block of one head is one contiguous
// run of memory: the layout to choose for per-head sparse reads); sequence b owns tokens
// [cu_seqlens_kv[b], cu_seqlens_kv[b + 1]).
template <class T>
struct device_contiguous_kv {
  using value_type = T;
  const T* k = nullptr;
  const T* v = nullptr;
  std::int64_t token_stride = 0;  // elements between tokens
  std::int64_t head_stride = 0;   // elements between heads

  // @pre 0 <= t < seq_len_kv(b) (the kernel checked it against device_row::kv_len)
  [[nodiscard]] __device__ __forceinline__ const T* k_row(const device_row& r, std::int32_t /*b*/, std::int32_t t,
                                                          std::int32_t h) const noexcept {
    return k + (static_cast<std::int64_t>(r.kv_offset) + t) * token_stride + h * head_stride;
  }
  [[nodiscard]] __device__ __forceinline__ const T* v_row(const device_row& r, std::int32_t /*b*/, std::int32_t t,
                                                          std::int32_t h) const noexcept {
    return v + (static_cast<std::int64_t>(r.kv_offset) + t) * token_stride + h * head_stride;
  }
};

// Paged K/V: pages of page_size tokens with strides, token-major [pages, page_size, heads_kv,
// head_dim] or head-major [pages, heads_kv, page_size, head_dim]; sequence b owns pages
// page_indices[page_indptr[b], page_indptr[b + 1]) in token order.
template <class T>
struct device_paged_kv {
  using value_type = T;
  const T* k_pages = nullptr;
  const T* v_pages = nullptr;
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int64_t page_stride = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  const std::int32_t* page_indptr = nullptr;   // device [batch + 1]
  const std::int32_t* page_indices = nullptr;  // device [page_indptr[batch]]

  // Element offset of (b, t, h), or -1 when b's page list does not cover t or names a page
  // outside the pool (the kernel then skips the row and reports bad_page).
  [[nodiscard]] __device__ __forceinline__ std::int64_t offset(std::int32_t b, std::int32_t t,
                                                               std::int32_t h) const noexcept {
    const std::int32_t slot = page_indptr[b] + t / page_size;
    if (slot >= page_indptr[b + 1]) return -1;
    const std::int32_t page = page_indices[slot];
    if (page < 0 || page >= num_pages) return -1;
    return page * page_stride + (t % page_size) * token_stride + h * head_stride;
  }
};

// Host checks of a source's scalars (device content is checked where it is read).
template <class T>
[[nodiscard]] inline status validate(const device_contiguous_kv<T>& s, const device_problem& p) noexcept {
  if (p.batch > 0 && (s.k == nullptr || s.v == nullptr)) {
    return status::error(status_code::invalid_argument, "contiguous K/V pointers are null");
  }
  // Rows apart (core/views.hpp); a head stride shorter than the sequences' tokens is not seen here.
  if (!kv_rows_apart(s.token_stride, s.head_stride, 1, p.head_dim, p.heads_kv)) {
    return status::error(status_code::invalid_argument, "K/V strides (token %lld, head %lld) overlap rows of "
                         "head_dim %d, heads_kv %d", static_cast<long long>(s.token_stride),
                         static_cast<long long>(s.head_stride), p.head_dim, p.heads_kv);
  }
  return status::success();
}
template <class T>
[[nodiscard]] inline status validate(const device_paged_kv<T>& s, const device_problem& p) noexcept {
  if (s.page_size <= 0) return status::error(status_code::invalid_argument, "page_size %d <= 0", s.page_size);
  if (s.num_pages < 0) return status::error(status_code::invalid_argument, "num_pages %d < 0", s.num_pages);
  if (!kv_rows_apart(s.token_stride, s.head_stride, s.page_size, p.head_dim, p.heads_kv) ||
      s.page_stride < kv_page_extent(s.token_stride, s.head_stride, s.page_size, p.heads_kv)) {
    return status::error(status_code::invalid_argument, "paged K/V strides (page %lld, token %lld, head %lld) overlap",
                         static_cast<long long>(s.page_stride), static_cast<long long>(s.token_stride),
                         static_cast<long long>(s.head_stride));
  }
  if (p.batch > 0 && (s.page_indptr == nullptr || s.page_indices == nullptr)) {
    return status::error(status_code::invalid_argument, "page_indptr/page_indices are null with batch %d", p.batch);
  }
  if (s.num_pages > 0 && (s.k_pages == nullptr || s.v_pages == nullptr)) {
    return status::error(status_code::invalid_argument, "paged K/V pages are null with num_pages %d", s.num_pages);
  }
  return status::success();
}

// Indices on the device (device_block_table, device_block_csr, the implicit rules and unions):
// index/cuda/device_index.cuh.

// ---------------------------------------------------------------------------------------------
// Q and O on the device: element (token, head, d) at data[token * token_stride + head * head_stride + d].
template <class T>
struct device_view {
  T* data = nullptr;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE T* row(std::int64_t token, std::int32_t head) const noexcept {
    return data + token * token_stride + head * head_stride;
  }
  // Token-major [tokens, heads, head_dim], densely packed.
  [[nodiscard]] static constexpr device_view token_major(T* data, std::int32_t heads, std::int32_t head_dim) noexcept {
    return {data, static_cast<std::int64_t>(heads) * head_dim, head_dim};
  }
};

// What a CUDA executor's run() takes: the device counterpart of skim::attention_args.
// lse (optional, [tokens_q, heads_q] token-major floats) gets m + log l, -inf for a row that saw no key.
template <class TQ, class KV, class Index, class TO>
struct device_attention_args {
  device_problem prob;
  device_view<const TQ> q;  // [tokens_q, heads_q, head_dim]
  KV kv;                    // device_contiguous_kv or device_paged_kv
  Index index;              // a device index (index/cuda/device_index.cuh); decode takes the stored forms only
  device_view<TO> o;        // [tokens_q, heads_q, head_dim]
  float* lse = nullptr;
};

// Host checks shared by the executors: problem, source scalars, views, and the index's own
// checks (pointers, negative sizes: Index::validate).
template <class TQ, class KV, class Index, class TO>
[[nodiscard]] status check_args(const device_attention_args<TQ, KV, Index, TO>& a) noexcept {
  SKIM_TRY(validate(a.prob));
  SKIM_TRY(validate(a.kv, a.prob));
  SKIM_TRY(a.index.validate());  // its scalars are checked even with no sequence (a negative sink)
  const auto& p = a.prob;
  SKIM_TRY(check_index_heads(a.index, p.index_heads()));  // a shared row per query block is laid out for p
  if (p.batch == 0) return status::success();
  for (auto [data, ts, hs, name] : {std::tuple{static_cast<const void*>(a.q.data), a.q.token_stride, a.q.head_stride, "Q"},
                                    std::tuple{static_cast<const void*>(a.o.data), a.o.token_stride, a.o.head_stride, "O"}}) {
    if (data == nullptr) return status::error(status_code::invalid_argument, "%s is null", name);
    // Rows of head_dim elements: token-major views step heads by >= head_dim, head-major ones step
    // tokens by >= head_dim (and a head-major view of no token may have head stride 0).
    if (hs < p.head_dim && ts < p.head_dim) {
      return status::error(status_code::invalid_argument, "%s strides (token %lld, head %lld) < head_dim %d", name,
                           static_cast<long long>(ts), static_cast<long long>(hs), p.head_dim);
    }
    if (ts < 0 || hs < 0) return status::error(status_code::invalid_argument, "%s has a negative stride", name);
  }
  return status::success();
}

// Ceil division for grid sizes.
[[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return (a + b - 1) / b;
}

}  // namespace skim::cuda
