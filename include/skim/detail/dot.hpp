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

}  // namespace skim::summarize::detail
