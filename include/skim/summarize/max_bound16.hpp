#pragma once
// max_bound16<R>: max_bound (max_bound.hpp) with its records in a 16-bit type R, half or bfloat16:
// half of max_bound's bytes, which are what a router reads most every decode step.
//
// Record: 2 * head_dim values of R in record_floats(head_dim) = head_dim floats: min[0, head_dim),
// then max[0, head_dim); an empty record has min = +inf, max = -inf (min_0 > max_0 marks it; it
// scores -inf).
//  - Keys of type R: their minimum and maximum are R values, so the record holds max_bound's values
//    exactly and every score is max_bound's, bit for bit (and cuda::device_max_bound<R>'s, which keeps
//    a 16-bit K's summaries in K's type for the same reason).
//  - Other keys (float, or the other 16-bit type) are rounded outward, the minimum down and the
//    maximum up to the nearest R value: the record still holds every key in its box, so the score
//    is still an upper bound of the block's q·k (max_bound.hpp says why rounding keeps it), looser by
//    at most one step of R per dimension. A key beyond R's range widens its bound to an infinity.
// Keys holding NaN are not supported.
//
// The R values live in the float storage the pipeline keeps records in; they are copied in and
// out (memcpy, vector loads), never read or written through an R lvalue into that storage.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/detail/dot.hpp"
#include "skim/detail/record_value.hpp"

namespace skim::summarize {

template <class R>
struct max_bound16 {
  static_assert(std::is_same_v<R, half> || std::is_same_v<R, bfloat16>, "max_bound16 records are half or bfloat16");

  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return static_cast<std::int64_t>(head_dim);  // 2 * head_dim values of 2 bytes
  }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t) noexcept { return 0; }

  static void init(float* record, std::int32_t head_dim) noexcept {
    const R lo = R::from_bits(std::is_same_v<R, half> ? 0x7c00u : 0x7f80u);  // +inf
    const R hi = R::from_bits(std::is_same_v<R, half> ? 0xfc00u : 0xff80u);  // -inf
    for (std::int32_t i = 0; i < head_dim; ++i) {
      put(record, i, lo);
      put(record, head_dim + i, hi);
    }
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t, std::int32_t,
                     std::int32_t head_dim) noexcept {
    for (std::int32_t i = 0; i < head_dim; ++i) {
      const float k = to_float(key[i]);
      const float lo = detail::record_value(lows(record), i);
      const float hi = detail::record_value(highs(record, head_dim), i);
      if constexpr (std::is_same_v<T, R>) {  // an R key is its own bound
        if (k < lo) put(record, i, key[i]);
        if (k > hi) put(record, head_dim + i, key[i]);
      } else {
        if (k < lo) put(record, i, round_down(k));
        if (k > hi) put(record, head_dim + i, round_up(k));
      }
    }
  }

  template <class Keys>
  static void complete_block(float*, const Keys&, std::int32_t, std::int32_t, float*) noexcept {}

  // max_bound::score and score4 over the record's values (the same operations in the same order).
  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    return detail::bound_score(lows(record), highs(record, head_dim), q, head_dim);
  }
  static void score4(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim,
                     float* out) noexcept {
    detail::bound_score4(lows(record), highs(record, head_dim), q, stride, head_dim, out);
  }

  // score4() of B records, the queries interleaved (detail::interleave4): out[4·b + g], the same bits,
  // by max_bound's vector paths (detail::bound_dots4), which widen the R values as they load them.
  static constexpr std::int32_t score4_blocks_per_call = 8;
  template <int B>
  static void score4_blocks(const float* const (&records)[B], const float* q4, std::int32_t head_dim,
                            float* out) noexcept {
    const R* lo[B];
    const R* hi[B];
    for (int b = 0; b < B; ++b) {
      lo[b] = lows(records[b]);
      hi[b] = highs(records[b], head_dim);
    }
    detail::bound_scores4<B>(lo, hi, q4, head_dim, out);
  }

  // The nearest R value at or below x (round_down) and at or above it (round_up); x not NaN.
  [[nodiscard]] static R round_down(float x) noexcept {
    const R r = R::from_float(x);  // the nearest
    return to_float(r) > x ? step(r, false) : r;
  }
  [[nodiscard]] static R round_up(float x) noexcept {
    const R r = R::from_float(x);
    return to_float(r) < x ? step(r, true) : r;
  }

 private:
  [[nodiscard]] static const R* lows(const float* record) noexcept { return reinterpret_cast<const R*>(record); }
  [[nodiscard]] static const R* highs(const float* record, std::int32_t head_dim) noexcept {
    return reinterpret_cast<const R*>(record) + head_dim;
  }
  static void put(float* record, std::int32_t at, R x) noexcept {
    std::memcpy(reinterpret_cast<char*>(record) + static_cast<std::int64_t>(at) * sizeof(R), &x, sizeof x);
  }
  // The next R value up (up) or down from r, a non-NaN value that is not already the infinity that
  // way: both types order their bits as sign and magnitude, so a step is one unit of the magnitude.
  [[nodiscard]] static R step(R r, bool up) noexcept {
    const std::uint16_t b = r.bits;
    const bool negative = (b & 0x8000u) != 0;
    if ((b & 0x7fffu) == 0) return R::from_bits(up ? 0x0001u : 0x8001u);  // from a zero: the least subnormal
    return R::from_bits(static_cast<std::uint16_t>(negative == up ? b - 1u : b + 1u));
  }
};
static_assert(summarizer<max_bound16<half>>);
static_assert(scores_four_blocks<max_bound16<half>>);
static_assert(summarizer<max_bound16<bfloat16>>);

}  // namespace skim::summarize
