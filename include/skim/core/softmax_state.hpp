#pragma once
// Online-softmax state of one query row, and the public merge of partial states.
//
// The state of a row after some tiles is (m, l, u): running max of the scaled scores, sum of
// exp(s - m), and the unnormalised output u = Σ exp(s - m) v. Merging two states of disjoint
// key sets (docs/design.md §8):
//   m' = max(m_a, m_b),  l' = e^(m_a - m')·l_a + e^(m_b - m')·l_b,  u' likewise.
// The result is o = u / l and lse = m + log l. A row that saw no key has m = -inf, l = 0 and
// finishes as o = 0, lse = -inf — never NaN.
//
// Engines that run branches separately (e.g. a sparse branch and a sliding-window branch over
// disjoint blocks) combine finished outputs with merge_outputs(), which needs only (o, lse).

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/config.hpp"

namespace skim {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

struct softmax_state {
  float m = neg_inf;  // running max of scores
  float l = 0.0f;     // Σ exp(score - m)

  [[nodiscard]] SKIM_HOST_DEVICE bool empty() const noexcept { return l == 0.0f; }
  [[nodiscard]] float lse() const noexcept { return l > 0.0f ? m + std::log(l) : neg_inf; }
};

// Merges state b (with unnormalised output ub) into state a (with ua). Both cover disjoint keys.
// @pre ua.size() == ub.size()
inline void merge(softmax_state& a, std::span<float> ua, const softmax_state& b,
                  std::span<const float> ub) noexcept {
  if (b.l == 0.0f) return;  // nothing on b's side (also avoids -inf - -inf)
  if (a.l == 0.0f) {
    a = b;
    for (std::size_t i = 0; i < ua.size(); ++i) ua[i] = ub[i];
    return;
  }
  const float m = a.m > b.m ? a.m : b.m;
  const float ca = std::exp(a.m - m);
  const float cb = std::exp(b.m - m);
  a.m = m;
  a.l = ca * a.l + cb * b.l;
  for (std::size_t i = 0; i < ua.size(); ++i) ua[i] = ca * ua[i] + cb * ub[i];
}

// Writes o = u / l (0 for an empty row) and returns the row's lse (-inf for an empty row).
inline float finish(const softmax_state& s, std::span<const float> u, std::span<float> o) noexcept {
  if (s.l == 0.0f) {
    for (float& x : o) x = 0.0f;
    return neg_inf;
  }
  const float inv = 1.0f / s.l;
  for (std::size_t i = 0; i < o.size(); ++i) o[i] = u[i] * inv;
  return s.lse();
}

// Combines two normalised outputs of disjoint key sets: o_a, lse_a ← merge(o_a, lse_a; o_b, lse_b).
// A side with lse = -inf contributes nothing; two such sides give o = 0, lse = -inf.
inline void merge_outputs(std::span<float> o_a, float& lse_a, std::span<const float> o_b, float lse_b) noexcept {
  if (lse_b == neg_inf) return;
  if (lse_a == neg_inf) {
    for (std::size_t i = 0; i < o_a.size(); ++i) o_a[i] = o_b[i];
    lse_a = lse_b;
    return;
  }
  const float m = lse_a > lse_b ? lse_a : lse_b;
  const float wa = std::exp(lse_a - m);
  const float wb = std::exp(lse_b - m);
  const float inv = 1.0f / (wa + wb);
  for (std::size_t i = 0; i < o_a.size(); ++i) o_a[i] = (wa * o_a[i] + wb * o_b[i]) * inv;
  lse_a = m + std::log(wa + wb);
}

}  // namespace skim
