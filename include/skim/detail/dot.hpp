#pragma once
// Small arithmetic shared by the summarizers (private: skim::summarize::detail).
//
// Dot products run in fp32 over i = 0, 1, ..., head_dim - 1 in that order. The order is part of
// the contract: max_bound's score is an upper bound of every key's q·k computed in this order,
// exactly, because fp32 rounding is monotone (see max_bound.hpp).

#include <cstdint>
#include <limits>

#include "skim/core/dtypes.hpp"

namespace skim::summarize::detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr float pos_inf = std::numeric_limits<float>::infinity();

// q·k in fp32, summed in index order.
template <element T>
[[nodiscard]] SKIM_FORCEINLINE float dot(const float* SKIM_RESTRICT q, const T* SKIM_RESTRICT k,
                                         std::int32_t head_dim) noexcept {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < head_dim; ++i) acc += q[i] * to_float(k[i]);
  return acc;
}

// dot(q + g·stride, k) for g = 0..3 into out[0..3]: each in index order, the four sums side by side.
template <element T>
SKIM_FORCEINLINE void dot4(const float* SKIM_RESTRICT q, std::int64_t stride, const T* SKIM_RESTRICT k,
                           std::int32_t head_dim, float* SKIM_RESTRICT out) noexcept {
  const float* q0 = q;
  const float* q1 = q + stride;
  const float* q2 = q + 2 * stride;
  const float* q3 = q + 3 * stride;
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (std::int32_t i = 0; i < head_dim; ++i) {
    const float x = to_float(k[i]);
    a0 += q0[i] * x;
    a1 += q1[i] * x;
    a2 += q2[i] * x;
    a3 += q3[i] * x;
  }
  out[0] = a0;
  out[1] = a1;
  out[2] = a2;
  out[3] = a3;
}

}  // namespace skim::summarize::detail
