#pragma once
// max_bound summaries on the device (summarize/max_bound.hpp's records, kept next to a GPU KV cache):
// per (key block, kv head) the per-dimension minimum and maximum of the block's keys.
//
//  - build(): every complete and partial block of every sequence, from K (after prefill);
//  - append_newest(): a decode step: each sequence's newest key (position seq_len_kv(b) - 1, already
//    counted by the device cu_seqlens_kv and written to K) folded into its block's min/max; slot 0 of
//    a block starts it afresh. O(heads_kv * head_dim) per sequence, one launch for the whole batch.
// Both give the bits summarize::build / append give on the CPU (min and max are exact), and folding
// the same key twice changes nothing, so replaying a step whose sequences did not grow is harmless.
//
// Layout (fixed capacity per sequence, so appending never moves a record and a CUDA graph can keep
// its pointers while the sequences grow):
//
//   lo, hi: [batch, max_kv_blocks, heads_kv, head_dim]   block j of sequence b at row b * max_kv_blocks + j
//   scale:  [batch, max_kv_blocks, heads_kv]             codes only: element record(b, j, h) / head_dim
//
// The element TS is float, or K's own type:
//  - 16-bit K (bf16, fp16): the min and max of 16-bit keys are 16-bit values, so 16-bit summaries are
//    exact and halve what routing reads (the router's main cost: 2 * head_dim elements per block and
//    kv head for every decode step);
//  - quantised K (core/cuda/quantized.cuh: 8-bit codes and a scale per block and kv head): float
//    summaries hold fp32(scale · code); summaries in the codes' own type (std::int8_t, fp8_e4m3)
//    hold the codes of least and greatest value and, in `scale`, the record's scale, a quarter of
//    float's bytes. Both bound with the same values: for scale >= 0 the least product is the product
//    of the least code (rounding to fp32 is monotone), and a negative scale swaps the two, so the
//    score kernel's fp32(scale · code) of the right end is the float summary's element (bit for bit,
//    but for the sign of a zero, which no score sees), and the scores are the same bits. NaN codes
//    (e4m3 0x7f, 0xff) are skipped by float summaries; in code summaries a dimension whose keys are
//    all NaN keeps a NaN code (its blocks score NaN, pooled as -inf), and otherwise NaN codes are
//    skipped alike.
//
// No allocation, no synchronisation: both launch one kernel on the caller's stream and can be
// captured in a CUDA graph. Device content is never trusted (core/cuda/common.cuh): a sequence longer than
// device_problem::max_seqlen_kv is skipped and reported (bad_seqlen), a key a paged source cannot
// give is skipped and reported (bad_page).

#include <cstdint>
#include <limits>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"

namespace skim::cuda {

template <class TS>
struct device_max_bound {
  static_assert(std::is_same_v<TS, float> || is_device_element_v<TS> || is_device_code_v<TS>,
                "summaries are float, half, bfloat16 or 8-bit codes (std::int8_t, fp8_e4m3)");
  using value_type = TS;
  static constexpr bool codes = is_device_code_v<TS>;

  TS* lo = nullptr;                // [batch, max_kv_blocks, heads_kv, head_dim] per-dimension minimum
  TS* hi = nullptr;                // [batch, max_kv_blocks, heads_kv, head_dim] per-dimension maximum
  std::int32_t max_kv_blocks = 0;  // room per sequence, >= device_problem::max_kv_blocks()
  float* scale = nullptr;          // codes only: [batch, max_kv_blocks, heads_kv] K's scale of each record

  // First element of record (sequence b, block j, kv head h) in lo and hi.
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t record(const device_problem& p, std::int32_t b,
                                                               std::int32_t j, std::int32_t h) const noexcept {
    return ((static_cast<std::int64_t>(b) * max_kv_blocks + j) * p.heads_kv + h) * p.head_dim;
  }
  // Elements lo (and hi) must hold.
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t elements(const device_problem& p) const noexcept {
    return static_cast<std::int64_t>(p.batch) * max_kv_blocks * p.heads_kv * p.head_dim;
  }
  // Floats scale must hold (codes; 0 otherwise).
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t scales(const device_problem& p) const noexcept {
    return codes ? static_cast<std::int64_t>(p.batch) * max_kv_blocks * p.heads_kv : 0;
  }
};

// Host checks of the summaries' scalars against p (the sizes of lo and hi cannot be seen: they must
// hold elements(p) each).
template <class TS>
[[nodiscard]] status validate(const device_max_bound<TS>& s, const device_problem& p) noexcept {
  if (s.max_kv_blocks < p.max_kv_blocks()) {
    return status::error(status_code::shape_mismatch,
                         "max_bound summaries hold %d blocks per sequence, max_seqlen_kv %d needs %d (block_kv %d)",
                         s.max_kv_blocks, p.max_seqlen_kv, p.max_kv_blocks(), p.block_kv);
  }
  if (s.elements(p) > 0 && (s.lo == nullptr || s.hi == nullptr)) {
    return status::error(status_code::invalid_argument, "max_bound summaries lo/hi are null");
  }
  if (s.scales(p) > 0 && s.scale == nullptr) {
    return status::error(status_code::invalid_argument, "max_bound summaries of codes: scale is null");
  }
  return status::success();
}

namespace detail::summarize_impl {

inline constexpr int threads = 128;
inline constexpr float pos_inf = std::numeric_limits<float>::infinity();

// Key (sequence b, token t, kv head h) of a source as floats: key(d) is element d, times the key
// block's scale for a quantised source (fp32(scale · value), the values a CPU summary of the
// dequantised keys reads; 1 · x is x otherwise). row is nullptr where a paged source has no page.
template <class T>
struct key_ref {
  const T* row = nullptr;
  float scale = 1.0f;
  [[nodiscard]] __device__ __forceinline__ float operator()(std::int32_t d) const noexcept {
    return scale * skim::cuda::to_float(row[d]);
  }
};
template <class T>
[[nodiscard]] __device__ __forceinline__ key_ref<T> key_row(const device_problem&, const device_contiguous_kv<T>& s,
                                                            const device_row& r, std::int32_t b, std::int32_t t,
                                                            std::int32_t h) noexcept {
  return {s.k_row(r, b, t, h)};
}
template <class T>
[[nodiscard]] __device__ __forceinline__ key_ref<T> key_row(const device_problem&, const device_paged_kv<T>& s,
                                                            const device_row&, std::int32_t b, std::int32_t t,
                                                            std::int32_t h) noexcept {
  const std::int64_t o = s.offset(b, t, h);
  return {o < 0 ? nullptr : s.k_pages + o};
}
template <class Source>
[[nodiscard]] __device__ __forceinline__ auto key_row(const device_problem& p, const device_quantized_kv<Source>& s,
                                                      const device_row& r, std::int32_t b, std::int32_t t,
                                                      std::int32_t h) noexcept {
  auto k = key_row(p, s.codes, r, b, t, h);
  k.scale = s.k_scales[s.scale_index(b, t / p.block_kv, h)];
  return k;
}

// One dimension's bounds while a block's keys are folded in, key by key, as summarize::max_bound's
// append folds them (a NaN never replaces a bound). Float and 16-bit summaries compare the keys'
// values and start from the infinities; code summaries compare the codes' own values, keep the codes,
// and start from the block's first code (codes have no infinity): a NaN bound there gives way to the
// next code, so NaN codes are skipped unless all of a dimension's are NaN.
template <class TS>
struct running_bounds {
  float lo = pos_inf, hi = neg_inf;  // the values compared
  TS lo_code{}, hi_code{};           // code summaries: the codes of lo and hi
  bool seeded = !is_device_code_v<TS>;

  template <class K>
  __device__ __forceinline__ void fold(const K& k, std::int32_t d) noexcept {
    if constexpr (is_device_code_v<TS>) {
      const TS c = k.row[d];
      const float x = skim::cuda::to_float(c);
      if (!seeded || x < lo || isnan(lo)) lo = x, lo_code = c;
      if (!seeded || x > hi || isnan(hi)) hi = x, hi_code = c;
      seeded = true;
    } else {
      const float x = k(d);
      lo = x < lo ? x : lo;
      hi = x > hi ? x : hi;
    }
  }
  // The bounds record element `at` holds.
  __device__ __forceinline__ void load(const device_max_bound<TS>& s, std::int64_t at) noexcept {
    if constexpr (is_device_code_v<TS>) lo_code = s.lo[at], hi_code = s.hi[at];
    lo = skim::cuda::to_float(s.lo[at]);
    hi = skim::cuda::to_float(s.hi[at]);
    seeded = true;
  }
  __device__ __forceinline__ void store(const device_max_bound<TS>& s, std::int64_t at) const noexcept {
    if constexpr (is_device_code_v<TS>) {
      s.lo[at] = lo_code;
      s.hi[at] = hi_code;
    } else {
      s.lo[at] = from_float_device<TS>(lo);  // exact: a key's value or an infinity
      s.hi[at] = from_float_device<TS>(hi);
    }
  }
};

// Keys of sequence b (kv_offset, kv_len); ok is false, and bad_seqlen reported, past the bound.
[[nodiscard]] __device__ __forceinline__ device_row key_range(const device_problem& p, std::int32_t b) noexcept {
  device_row r;
  r.kv_offset = p.cu_seqlens_kv[b];
  r.kv_len = p.cu_seqlens_kv[b + 1] - r.kv_offset;
  r.ok = r.kv_len >= 0 && r.kv_len <= p.max_seqlen_kv;
  if (!r.ok && threadIdx.x == 0) report(p, bad_seqlen);
  return r;
}

// Grid (block j, kv head h, sequence b); threads over the head dimension.
template <class TS, class KV>
__global__ void __launch_bounds__(threads)
    max_bound_build_kernel(device_problem p, KV kv, device_max_bound<TS> s) {
  const std::int32_t j = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t h = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.z);
  const device_row r = key_range(p, b);
  if (!r.ok) return;
  const std::int32_t first = j * p.block_kv;
  if (first >= r.kv_len) return;  // past the sequence: left for append_newest to start
  const std::int32_t last = min(first + p.block_kv, r.kv_len);
  const std::int64_t rec = s.record(p, b, j, h);
  if constexpr (device_max_bound<TS>::codes) {
    if (threadIdx.x == 0) s.scale[rec / p.head_dim] = key_row(p, kv, r, b, first, h).scale;  // the block's
  }
  for (std::int32_t d = static_cast<std::int32_t>(threadIdx.x); d < p.head_dim; d += threads) {
    running_bounds<TS> x;  // summarize::max_bound::init, then its append, key by key
    for (std::int32_t t = first; t < last; ++t) {
      const auto k = key_row(p, kv, r, b, t, h);
      if (k.row == nullptr) {
        report(p, bad_page);
        continue;
      }
      x.fold(k, d);
    }
    x.store(s, rec + d);
  }
}

// Folds the newest key of sequence b (r: its key_range, r.ok, r.kv_len > 0) into kv head h's record:
// threads `thread` of `nthreads` of the caller stride over the head dimension. Appending the same key
// twice, or from two CTAs at once, writes the same values (min and max are idempotent).
template <class TS, class KV>
__device__ __forceinline__ void append_key(const device_problem& p, const KV& kv, const device_max_bound<TS>& s,
                                           const device_row& r, std::int32_t b, std::int32_t h, int thread,
                                           int nthreads) noexcept {
  const std::int32_t t = r.kv_len - 1;
  const auto k = key_row(p, kv, r, b, t, h);
  if (k.row == nullptr) {
    if (thread == 0) report(p, bad_page);
    return;
  }
  const bool fresh = t % p.block_kv == 0;  // slot 0: the block's record starts from this key
  const std::int64_t rec = s.record(p, b, t / p.block_kv, h);
  if constexpr (device_max_bound<TS>::codes) {
    if (thread == 0) s.scale[rec / p.head_dim] = k.scale;
  }
  for (std::int32_t d = thread; d < p.head_dim; d += nthreads) {
    running_bounds<TS> x;
    if (!fresh) x.load(s, rec + d);
    x.fold(k, d);
    x.store(s, rec + d);
  }
}

// Grid (kv head h, sequence b); threads over the head dimension.
template <class TS, class KV>
__global__ void __launch_bounds__(threads)
    max_bound_append_kernel(device_problem p, KV kv, device_max_bound<TS> s) {
  const std::int32_t h = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.y);
  const device_row r = key_range(p, b);
  if (!r.ok || r.kv_len == 0) return;
  append_key(p, kv, s, r, b, h, static_cast<int>(threadIdx.x), threads);
}

template <class TS, class KV>
[[nodiscard]] status check_summarize(const device_problem& p, const KV& kv, const device_max_bound<TS>& s) noexcept {
  static_assert(std::is_same_v<TS, float> || std::is_same_v<TS, typename KV::value_type>,
                "16-bit summaries need keys of the same type (then min/max are exact), code summaries codes of "
                "the same type");
  static_assert(!is_device_code_v<TS> || is_device_quantized_kv_v<KV>, "code summaries need a quantised source");
  SKIM_TRY(validate(p));
  SKIM_TRY(validate(kv, p));
  SKIM_TRY(validate(s, p));
  if (p.batch > 65535 || p.heads_kv > 65535) {
    return status::error(status_code::unsupported, "max_bound summaries: batch %d or heads_kv %d > 65535 (grid)",
                         p.batch, p.heads_kv);
  }
  return status::success();
}

}  // namespace detail::summarize_impl

// Summarises every key block (complete or partial) of every sequence and kv head of K.
// Records of blocks past a sequence's keys are not written.
template <class TS, class KV>
[[nodiscard]] status build(const device_problem& p, const KV& kv, const device_max_bound<TS>& s,
                           cudaStream_t stream) noexcept {
  namespace impl = detail::summarize_impl;
  SKIM_TRY(impl::check_summarize(p, kv, s));
  if (p.batch == 0 || p.max_kv_blocks() == 0) return status::success();
  const dim3 grid(static_cast<unsigned>(p.max_kv_blocks()), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  impl::max_bound_build_kernel<TS, KV><<<grid, impl::threads, 0, stream>>>(p, kv, s);
  return check_launch("max_bound_build_kernel");
}

// Decode step: folds the newest key of every sequence with keys into its block's record (every kv
// head). @pre the records of the sequence's earlier keys are there (build() of the shorter prefix,
// or earlier steps), and the new key is in K.
template <class TS, class KV>
[[nodiscard]] status append_newest(const device_problem& p, const KV& kv, const device_max_bound<TS>& s,
                                   cudaStream_t stream) noexcept {
  namespace impl = detail::summarize_impl;
  SKIM_TRY(impl::check_summarize(p, kv, s));
  if (p.batch == 0) return status::success();
  const dim3 grid(static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
  impl::max_bound_append_kernel<TS, KV><<<grid, impl::threads, 0, stream>>>(p, kv, s);
  return check_launch("max_bound_append_kernel");
}

}  // namespace skim::cuda
