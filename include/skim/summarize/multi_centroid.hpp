#pragma once
// multi_centroid<M, LloydSteps>: M centroids per block; score = max over centroids of q·centroid.
// Where mean_pool blurs a block that mixes several directions into one mean, M centroids keep
// up to M of them apart.
//
// Centroids start as the means of M contiguous sub-chunks of the block: sub-chunk c holds slots
// [floor(c * block_kv / M), floor((c + 1) * block_kv / M)). Once the block is complete,
// complete_block refines them by LloydSteps Lloyd iterations (a fixed count, so the result is
// deterministic): assign every key to its nearest centroid (squared Euclidean distance, ties to
// the lower centroid), then take the mean of each cluster; a cluster left without keys keeps its
// centroid for the next assignment and is dropped from the score if it ends empty. A ragged last
// block is never refined: its centroids stay the means of its (partly filled) sub-chunks.
//
// Record [M * head_dim + M] floats: sums [M, head_dim] and counts [M]; centroid c is
// sums[c] / counts[c], present iff counts[c] > 0. While the block fills, sums/counts are the
// sub-chunk running sums (append: one add per dimension, O(head_dim)); after complete_block they
// are the sums and sizes of the final Lloyd clusters. score = max_c (q·sums[c]) / counts[c].
//
// Cost of complete_block: LloydSteps * block_kv * M * head_dim multiply-adds, i.e. amortised
// O(LloydSteps * M * head_dim) per key of the block; it rereads the block's keys through the
// accessor. Scratch: workspace_floats(head_dim) = (M + 1) * head_dim + M floats, from the caller
// (build.hpp carves it out of the workspace it is given; nothing is allocated).

#include <cstdint>

#include "skim/concepts/summarizer.hpp"
#include "skim/detail/dot.hpp"
#include "skim/detail/product.hpp"

namespace skim::summarize {

template <std::int32_t M, std::int32_t LloydSteps = 2>
struct multi_centroid {
  static_assert(M >= 1, "multi_centroid needs at least one centroid per block");
  static_assert(LloydSteps >= 0, "multi_centroid's Lloyd step count must not be negative");
  static constexpr std::int32_t centroids = M;
  static constexpr std::int32_t lloyd_steps = LloydSteps;

  // Sub-chunk of slot s: the largest c with floor(c * block_kv / M) <= s.
  [[nodiscard]] static constexpr std::int32_t sub_chunk(std::int32_t slot, std::int32_t block_kv) noexcept {
    return static_cast<std::int32_t>(((static_cast<std::int64_t>(slot) + 1) * M - 1) / block_kv);
  }

  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return static_cast<std::int64_t>(M) * head_dim + M;
  }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t head_dim) noexcept {
    return (static_cast<std::int64_t>(M) + 1) * head_dim + M;
  }

  static void init(float* record, std::int32_t head_dim) noexcept {
    const std::int64_t n = record_floats(head_dim);
    for (std::int64_t i = 0; i < n; ++i) record[i] = 0.0f;
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t slot,
                     std::int32_t block_kv, std::int32_t head_dim) noexcept {
    const std::int32_t c = sub_chunk(slot, block_kv);
    float* SKIM_RESTRICT sum = record + static_cast<std::int64_t>(c) * head_dim;
    for (std::int32_t i = 0; i < head_dim; ++i) sum[i] += to_float(key[i]);
    counts(record, head_dim)[c] += 1.0f;
  }

  // @pre slots [0, block_kv) were appended in order; keys(s) -> const T* [head_dim] is slot s's key;
  // scratch is [workspace_floats(head_dim)].
  template <class Keys>
  static void complete_block(float* SKIM_RESTRICT record, const Keys& keys, std::int32_t block_kv,
                             std::int32_t head_dim, float* SKIM_RESTRICT scratch) noexcept {
    float* SKIM_RESTRICT sums = record;
    float* SKIM_RESTRICT count = counts(record, head_dim);
    float* SKIM_RESTRICT centroid = scratch;                                       // [M, head_dim]
    float* SKIM_RESTRICT key = scratch + static_cast<std::int64_t>(M) * head_dim;  // [head_dim], as fp32
    float* SKIM_RESTRICT live = key + head_dim;                                    // [M], 1 = has a centroid
    for (std::int32_t c = 0; c < M; ++c) {
      live[c] = count[c] > 0.0f ? 1.0f : 0.0f;
      update_centroid(sums, count, centroid, c, head_dim);
    }
    for (std::int32_t step = 0; step < LloydSteps; ++step) {
      for (std::int64_t i = 0; i < static_cast<std::int64_t>(M) * head_dim + M; ++i) record[i] = 0.0f;
      for (std::int32_t s = 0; s < block_kv; ++s) {
        const auto* row = keys(s);
        for (std::int32_t i = 0; i < head_dim; ++i) key[i] = to_float(row[i]);
        std::int32_t nearest = -1;
        float nearest_d2 = 0.0f;
        for (std::int32_t c = 0; c < M; ++c) {
          if (live[c] == 0.0f) continue;
          const float* ctr = centroid + static_cast<std::int64_t>(c) * head_dim;
          float d2 = 0.0f;
          for (std::int32_t i = 0; i < head_dim; ++i) {
            const float e = key[i] - ctr[i];
            d2 += detail::product(e, e);  // never fused: the GPU's summaries assign by the same bits
          }
          if (nearest < 0 || d2 < nearest_d2) {  // strict: ties go to the lower centroid
            nearest = c;
            nearest_d2 = d2;
          }
        }
        SKIM_DASSERT(nearest >= 0);  // a complete block has at least one non-empty sub-chunk
        float* sum = sums + static_cast<std::int64_t>(nearest) * head_dim;
        for (std::int32_t i = 0; i < head_dim; ++i) sum[i] += key[i];
        count[nearest] += 1.0f;
      }
      if (step + 1 < LloydSteps) {
        for (std::int32_t c = 0; c < M; ++c) update_centroid(sums, count, centroid, c, head_dim);
      }
    }
  }

  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    const float* count = record + static_cast<std::int64_t>(M) * head_dim;
    float best = detail::neg_inf;
    for (std::int32_t c = 0; c < M; ++c) {
      if (!(count[c] > 0.0f)) continue;
      const float s = detail::dot(q, record + static_cast<std::int64_t>(c) * head_dim, head_dim) / count[c];
      best = s > best ? s : best;
    }
    return best;
  }
  // score() for the queries q + g·stride, g = 0..3, the same bits, four sums side by side.
  static void score4(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim,
                     float* out) noexcept {
    const float* count = record + static_cast<std::int64_t>(M) * head_dim;
    for (int g = 0; g < 4; ++g) out[g] = detail::neg_inf;
    for (std::int32_t c = 0; c < M; ++c) {
      if (!(count[c] > 0.0f)) continue;
      float s[4];
      detail::dot4(q, stride, record + static_cast<std::int64_t>(c) * head_dim, head_dim, s);
      detail::max_quotient4(s, count[c], out);
    }
  }
  // score4() of B records, the queries interleaved (detail::interleave4): out[4·b + g], the same
  // bits; the B·M clusters' sums run side by side: about 8 of them a call (more spill registers).
  static constexpr std::int32_t score4_blocks_per_call = M >= 8 ? 1 : 8 / M;
  template <int B>
  static void score4_blocks(const float* const (&records)[B], const float* q4, std::int32_t head_dim,
                            float* out) noexcept {
    const float* sums[B * M];
    for (int b = 0; b < B; ++b) {
      for (std::int32_t c = 0; c < M; ++c) sums[b * M + c] = records[b] + static_cast<std::int64_t>(c) * head_dim;
    }
    float s[B * M][4];
    detail::dots4<B * M>(q4, sums, head_dim, s);
    for (int b = 0; b < B; ++b) {
      const float* count = records[b] + static_cast<std::int64_t>(M) * head_dim;
      for (int g = 0; g < 4; ++g) out[4 * b + g] = detail::neg_inf;
      for (std::int32_t c = 0; c < M; ++c) {
        if (count[c] > 0.0f) detail::max_quotient4(s[b * M + c], count[c], out + 4 * b);
      }
    }
  }

 private:
  [[nodiscard]] static float* counts(float* record, std::int32_t head_dim) noexcept {
    return record + static_cast<std::int64_t>(M) * head_dim;
  }
  // centroid[c] = sums[c] / count[c] if the cluster has keys; otherwise it keeps its last value.
  static void update_centroid(const float* sums, const float* count, float* centroid, std::int32_t c,
                              std::int32_t head_dim) noexcept {
    if (!(count[c] > 0.0f)) return;
    const float inv = 1.0f / count[c];
    const float* sum = sums + static_cast<std::int64_t>(c) * head_dim;
    float* ctr = centroid + static_cast<std::int64_t>(c) * head_dim;
    for (std::int32_t i = 0; i < head_dim; ++i) ctr[i] = sum[i] * inv;
  }
};
static_assert(summarizer<multi_centroid<4>>);
static_assert(scores_four_blocks<multi_centroid<2>>);

}  // namespace skim::summarize
