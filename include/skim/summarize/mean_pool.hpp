#pragma once
// mean_pool: the block's mean key c = s / r from a running sum s and count r; score = q·c.
//
// Record [head_dim + 1] floats: s[0, head_dim) the sum of the keys appended so far (fp32, in
// slot order), then r, their count. Appending a key is one add per dimension.
// score = (q·s) / r, the same value as q·(s / r) up to rounding, with one division instead of d.
// Cheapest summary; a needle (one key far from the rest) is diluted by 1 / r.

#include <cstdint>

#include "skim/concepts/summarizer.hpp"
#include "skim/detail/dot.hpp"

namespace skim::summarize {

struct mean_pool {
  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return static_cast<std::int64_t>(head_dim) + 1;
  }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t) noexcept { return 0; }

  static void init(float* record, std::int32_t head_dim) noexcept {
    for (std::int32_t i = 0; i <= head_dim; ++i) record[i] = 0.0f;
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t, std::int32_t,
                     std::int32_t head_dim) noexcept {
    for (std::int32_t i = 0; i < head_dim; ++i) record[i] += to_float(key[i]);
    record[head_dim] += 1.0f;  // exact up to 2^24 keys per block
  }

  template <class Keys>
  static void complete_block(float*, const Keys&, std::int32_t, std::int32_t, float*) noexcept {}

  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    const float count = record[head_dim];
    if (count == 0.0f) return detail::neg_inf;
    return detail::dot(q, record, head_dim) / count;
  }
  // score() for the queries q + g·stride, g = 0..3, the same bits, four sums side by side.
  static void score4(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim,
                     float* out) noexcept {
    const float count = record[head_dim];
    if (count == 0.0f) {
      for (int g = 0; g < 4; ++g) out[g] = detail::neg_inf;
      return;
    }
    float s[4];
    detail::dot4(q, stride, record, head_dim, s);
    detail::quotient4(s, count, out);
  }
  // score4() of B records, the queries interleaved (detail::interleave4): out[4·b + g], the same bits.
  // One chain a block (with AVX, several blocks' chains share a vector: detail::dots4): 8 blocks a
  // call keep the vector units busy through the chains' latency.
  static constexpr std::int32_t score4_blocks_per_call = 8;
  template <int B>
  static void score4_blocks(const float* const (&records)[B], const float* q4, std::int32_t head_dim,
                            float* out) noexcept {
    float s[B][4];
    detail::dots4<B>(q4, records, head_dim, s);
    for (int b = 0; b < B; ++b) {
      const float count = records[b][head_dim];
      if (count == 0.0f) {
        for (int g = 0; g < 4; ++g) out[4 * b + g] = detail::neg_inf;
      } else {
        detail::quotient4(s[b], count, out + 4 * b);
      }
    }
  }
};
static_assert(summarizer<mean_pool>);
static_assert(scores_four_blocks<mean_pool>);

}  // namespace skim::summarize
