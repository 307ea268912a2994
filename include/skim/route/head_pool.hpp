#pragma once
// head_pool: how a shared selection pools the scores of a query block's index heads into the one row
// it selects from (sparse_attention::share_heads on the CPU, decode_router::share_heads on the GPU;
// both compute these values bit for bit).
//
//   relative  pooled[j] = max over heads h of (score_h[j] − best_h), best_h the head's largest finite
//             score over the row's visible blocks (0 when it has none): every head's best block at 0,
//             so heads whose scores differ in scale count alike;
//   max       pooled[j] = max over heads of score_h[j] (a loud head can take the budget).
//
// The maximum runs over the heads in order h = 0, 1, ...: a NaN loses to any other value and never
// hides one (selectors rank NaN last).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/config.hpp"

namespace skim {

enum class head_pool : std::uint8_t {
  relative,  // max over heads of (score − the head's best score in the row): scores ≤ 0, each head's best at 0
  max,       // max over heads of the raw scores
};

// What `pool` subtracts from a head's visible scores: their largest finite value under relative
// (0 when none is finite), 0 under max.
[[nodiscard]] inline float head_pool_offset(head_pool pool, std::span<const float> visible) noexcept {
  if (pool != head_pool::relative) return 0.0f;
  float best = -std::numeric_limits<float>::infinity();
  for (const float x : visible) best = std::isfinite(x) && x > best ? x : best;
  return std::isfinite(best) ? best : 0.0f;
}

// One block's pooled value after head `head`'s offset score x: x for head 0, else the larger of x
// and the value so far, a NaN losing. The GPU router's select kernel folds with it too.
[[nodiscard]] SKIM_HOST_DEVICE inline float pool_fold(std::int32_t head, float x, float so_far) noexcept {
  return head == 0 || x > so_far || so_far != so_far ? x : so_far;
}

// Folds head `head`'s visible scores into pooled[0, visible.size()) (head 0 initialises it).
inline void pool_head_scores(head_pool pool, std::int32_t head, std::span<const float> visible,
                             std::span<float> pooled) noexcept {
  const float offset = head_pool_offset(pool, visible);
  for (std::size_t j = 0; j < visible.size(); ++j) pooled[j] = pool_fold(head, visible[j] - offset, pooled[j]);
}

}  // namespace skim
