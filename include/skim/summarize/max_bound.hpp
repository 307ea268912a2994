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
#include "skim/detail/product.hpp"

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
    const float* lo = record;
    const float* hi = record + head_dim;
    if (head_dim > 0 && lo[0] > hi[0]) return detail::neg_inf;  // no key yet
    float acc = 0.0f;
    for (std::int32_t i = 0; i < head_dim; ++i) {
      const float a = detail::product(q[i], lo[i]);
      const float b = detail::product(q[i], hi[i]);
      acc += a > b ? a : b;
    }
    return acc;
  }

  // score() for the four queries q + g·stride, g = 0..3, in one pass: the same operations in the
  // same order per query, so the same bits, with four independent sums in flight.
  static void score4(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim,
                     float* out) noexcept {
    const float* lo = record;
    const float* hi = record + head_dim;
    if (head_dim > 0 && lo[0] > hi[0]) {
      for (int g = 0; g < 4; ++g) out[g] = detail::neg_inf;
      return;
    }
    const float* q0 = q;
    const float* q1 = q + stride;
    const float* q2 = q + 2 * stride;
    const float* q3 = q + 3 * stride;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (std::int32_t i = 0; i < head_dim; ++i) {
      const float l = lo[i], h = hi[i];
      const float x0 = detail::product(q0[i], l), y0 = detail::product(q0[i], h);
      const float x1 = detail::product(q1[i], l), y1 = detail::product(q1[i], h);
      const float x2 = detail::product(q2[i], l), y2 = detail::product(q2[i], h);
      const float x3 = detail::product(q3[i], l), y3 = detail::product(q3[i], h);
      a0 += x0 > y0 ? x0 : y0;
      a1 += x1 > y1 ? x1 : y1;
      a2 += x2 > y2 ? x2 : y2;
      a3 += x3 > y3 ? x3 : y3;
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
  }
  // score4() of B records, the queries interleaved (detail::interleave4): out[4·b + g], the same bits.
  // Eight: with AVX or AVX-512 (detail::dots4's wide vectors) 8 blocks a call score 10% faster than
  // 4; on narrower vectors as fast (their operations, not the chains' latency, bound them).
  static constexpr std::int32_t score4_blocks_per_call = 8;
  template <int B>
  static void score4_blocks(const float* const (&records)[B], const float* q4, std::int32_t head_dim,
                            float* out) noexcept {
    const float* const(&lo)[B] = records;
    const float* hi[B];
    for (int b = 0; b < B; ++b) hi[b] = records[b] + head_dim;
    float s[B][4];
    detail::bound_dots4<B>(q4, lo, hi, head_dim, s);
    for (int b = 0; b < B; ++b) {
      const bool empty = head_dim > 0 && lo[b][0] > hi[b][0];  // no key yet
      for (int g = 0; g < 4; ++g) out[4 * b + g] = empty ? detail::neg_inf : s[b][g];
    }
  }
};
static_assert(summarizer<max_bound>);
static_assert(scores_four_blocks<max_bound>);

}  // namespace skim::summarize
