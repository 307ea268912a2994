#pragma once
// max_bound: per-dimension minimum and maximum of the block's keys (Quest);
// score = Σ_i max(q_i·min_i, q_i·max_i), an upper bound of max_j q·k_j over the block.
//
// Record [2 * head_dim] floats: min[0, head_dim), then max[0, head_dim). An empty record has
// min = +inf, max = -inf (min_0 > max_0 marks it; it scores -inf).
//
// Why the bound holds in fp32, not only in exact arithmetic: for every key k and dimension i,
// q_i·k_i <= max(q_i·min_i, q_i·max_i) before rounding, and rounding to fp32 is monotone, so the
// rounded products keep the order; fp32 addition is monotone in each operand too, so summing the
// terms in index order (as detail::dot does for q·k) keeps it. Hence score >= dot(q, k) for every
// key appended, bit for bit, not merely within a tolerance. Keys holding NaN are not supported.
// The bound is loose when a block's keys spread widely: it scores the best corner of their box.

#include <cstdint>

#include "skim/concepts/summarizer.hpp"
#include "skim/detail/dot.hpp"

namespace skim::summarize {

struct max_bound {
  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return 2 * static_cast<std::int64_t>(head_dim);
  }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t) noexcept { return 0; }

  static void init(float* record, std::int32_t head_dim) noexcept {
    for (std::int32_t i = 0; i < head_dim; ++i) {
      record[i] = detail::pos_inf;
      record[head_dim + i] = detail::neg_inf;
    }
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t, std::int32_t,
                     std::int32_t head_dim) noexcept {
    float* SKIM_RESTRICT lo = record;
    float* SKIM_RESTRICT hi = record + head_dim;
    for (std::int32_t i = 0; i < head_dim; ++i) {
      const float k = to_float(key[i]);
      lo[i] = k < lo[i] ? k : lo[i];
      hi[i] = k > hi[i] ? k : hi[i];
    }
  }

  template <class Keys>
  static void complete_block(float*, const Keys&, std::int32_t, std::int32_t, float*) noexcept {}

  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    return detail::bound_score(record, record + head_dim, q, head_dim);
  }

  // score() for the four queries q + g·stride, g = 0..3, in one pass: the same operations in the
  // same order per query, so the same bits, with four independent sums in flight.
  static void score4(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim,
                     float* out) noexcept {
    detail::bound_score4(record, record + head_dim, q, stride, head_dim, out);
  }
  // score4() of B records, the queries interleaved (detail::interleave4): out[4·b + g], the same bits.
  // Eight: with AVX or AVX-512 (detail::dots4's wide vectors) 8 blocks a call score 10% faster than
  // 4; on narrower vectors as fast (their operations, not the chains' latency, bound them).
  static constexpr std::int32_t score4_blocks_per_call = 8;
  template <int B>
  static void score4_blocks(const float* const (&records)[B], const float* q4, std::int32_t head_dim,
                            float* out) noexcept {
    const float* hi[B];
    for (int b = 0; b < B; ++b) hi[b] = records[b] + head_dim;
    detail::bound_scores4<B>(records, hi, q4, head_dim, out);
  }
};
static_assert(summarizer<max_bound>);
static_assert(scores_four_blocks<max_bound>);

}  // namespace skim::summarize
