#pragma once
// Small arithmetic shared by the summarizers (private: skim::summarize::detail).
//
// Dot products run in fp32 over i = 0, 1, ..., head_dim - 1 in that order, each product rounded
// to fp32 before it is added (never fused into an FMA: product.hpp). Both are part of the
// contract: max_bound's score is an upper bound of every key's q·k computed this way, exactly,
// because fp32 rounding is monotone (see max_bound.hpp), and every path that scores (score, score4,
// score4_blocks, the GPU router) gives the same bits in every build.

#include <cstdint>
#include <cstring>
#include <limits>

#include "skim/core/dtypes.hpp"
#include "skim/detail/dot_wide.hpp"
#include "skim/detail/product.hpp"
#include "skim/detail/record_value.hpp"

namespace skim::summarize::detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr float pos_inf = std::numeric_limits<float>::infinity();

// q·k in fp32, summed in index order.
template <element T>
[[nodiscard]] SKIM_FORCEINLINE float dot(const float* SKIM_RESTRICT q, const T* SKIM_RESTRICT k,
                                         std::int32_t head_dim) noexcept {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < head_dim; ++i) acc += product(q[i], to_float(k[i]));
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
    a0 += product(q0[i], x);
    a1 += product(q1[i], x);
    a2 += product(q2[i], x);
    a3 += product(q3[i], x);
  }
  out[0] = a0;
  out[1] = a1;
  out[2] = a2;
  out[3] = a3;
}

// Four queries interleaved for dots4: q4[4·i + g] = (q + g·stride)[i], i < head_dim, g < 4.
SKIM_FORCEINLINE void interleave4(const float* SKIM_RESTRICT q, std::int64_t stride, std::int32_t head_dim,
                                  float* SKIM_RESTRICT q4) noexcept {
  for (std::int32_t i = 0; i < head_dim; ++i) {
    for (int g = 0; g < 4; ++g) q4[4 * i + g] = q[g * stride + i];
  }
}

// out[n][g] = dot(query g, k[n]) for n < N, g < 4, the queries interleaved as interleave4 writes
// them: each sum in index order, rounded step by step as dot() rounds it (the same bits). Where the
// compiler has GCC's vector extensions, the four queries' sums of one k[n] are the lanes of one
// 4-float vector (a multiply and an add per element for four heads, lane by lane the scalar
// operations) and the N vectors' sums run side by side; with AVX, R rows share a vector
// (dot_wide.hpp).
template <int N>
SKIM_FORCEINLINE void dots4(const float* SKIM_RESTRICT q4, const float* const (&k)[N], std::int32_t head_dim,
                            float (&out)[N][4]) noexcept {
#if defined(SKIM_DETAIL_WIDE_DOTS)
  if constexpr (N % wide::R == 0) {
    wide::dots4<N>(q4, k, head_dim, out);
    return;
  }
#endif
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  typedef float lanes __attribute__((vector_size(16)));
  lanes acc[N];
  for (int n = 0; n < N; ++n) acc[n] = lanes{0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int32_t i = 0; i < head_dim; ++i) {
    lanes qi;
    std::memcpy(&qi, q4 + 4 * std::int64_t{i}, sizeof qi);
    for (int n = 0; n < N; ++n) {
      const float x = k[n][i];
      acc[n] += product(qi, lanes{x, x, x, x});
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int g = 0; g < 4; ++g) out[n][g] = acc[n][g];
  }
#else
  for (int n = 0; n < N; ++n) {
    for (int g = 0; g < 4; ++g) out[n][g] = 0.0f;
  }
  for (std::int32_t i = 0; i < head_dim; ++i) {
    for (int n = 0; n < N; ++n) {
      const float x = k[n][i];
      for (int g = 0; g < 4; ++g) out[n][g] += product(q4[4 * i + g], x);
    }
  }
#endif
}

// out[g] = s[g] / n for g < 4: the scalar divisions' bits, as one vector division where the compiler
// has GCC's vector extensions (lane by lane IEEE division; the scalar loop compiles to four).
SKIM_FORCEINLINE void quotient4(const float* SKIM_RESTRICT s, float n, float* SKIM_RESTRICT out) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  typedef float lanes __attribute__((vector_size(16)));
  lanes x;
  std::memcpy(&x, s, sizeof x);
  x = x / lanes{n, n, n, n};
  std::memcpy(out, &x, sizeof x);
#else
  for (int g = 0; g < 4; ++g) out[g] = s[g] / n;
#endif
}

// best[g] = x > best[g] ? x : best[g] with x = s[g] / n, for g < 4: the scalar loop's bits lane by
// lane (best kept where x is NaN), one vector division and select as quotient4.
SKIM_FORCEINLINE void max_quotient4(const float* SKIM_RESTRICT s, float n, float* SKIM_RESTRICT best) noexcept {
  float q[4];
  quotient4(s, n, q);
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  typedef float lanes __attribute__((vector_size(16)));
  typedef std::int32_t mask __attribute__((vector_size(16)));
  lanes x, b;
  std::memcpy(&x, q, sizeof x);
  std::memcpy(&b, best, sizeof b);
  const mask take = x > b;  // all ones where x > b
  b = (lanes)(((mask)x & take) | ((mask)b & ~take));
  std::memcpy(best, &b, sizeof b);
#else
  for (int g = 0; g < 4; ++g) best[g] = q[g] > best[g] ? q[g] : best[g];
#endif
}

// out[n][g] = the sum over i in index order of max(q_g[i]·lo_n[i], q_g[i]·hi_n[i]) (as `a > b ? a : b`:
// the second product where they tie or one is NaN), n < N, g < 4, the queries interleaved as
// interleave4 writes them: max_bound's score term, rounded step by step, the same bits lane by lane
// as the scalar loop; vectors as in dots4. The vectors pick the bound by q's sign before one
// multiply, one test per element for all N blocks instead of two products and a compare each.
// Rounding is monotone, so q·hi >= q·lo where q >= 0 and q·lo >= q·hi where q < 0; where q is NaN
// both products are NaN and the scalar takes q·hi, as here. Where q < 0 and the two tie as zeros of
// opposite signs, the vectors take the other zero than the scalar, which adds the same: a sum that
// starts at +0 never becomes -0 under round-to-nearest. E: the records' element, float or a 16-bit
// type (max_bound16), read as record_value reads it.
template <int N, class E>
SKIM_FORCEINLINE void bound_dots4(const float* SKIM_RESTRICT q4, const E* const (&lo)[N], const E* const (&hi)[N],
                                  std::int32_t head_dim, float (&out)[N][4]) noexcept {
#if defined(SKIM_DETAIL_WIDE_DOTS)
  if constexpr (N % wide::R == 0 && wide::reads<E>) {
    wide::bound_dots4<N>(q4, lo, hi, head_dim, out);
    return;
  }
#endif
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  typedef float lanes __attribute__((vector_size(16)));
  typedef std::int32_t mask __attribute__((vector_size(16)));
  lanes acc[N];
  for (int n = 0; n < N; ++n) acc[n] = lanes{0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int32_t i = 0; i < head_dim; ++i) {
    lanes qi;
    std::memcpy(&qi, q4 + 4 * std::int64_t{i}, sizeof qi);
    const mask take_l = qi < lanes{0.0f, 0.0f, 0.0f, 0.0f};  // all ones where q < 0: there q·l >= q·h
    for (int n = 0; n < N; ++n) {
      const float l = record_value(lo[n], i), h = record_value(hi[n], i);
      // l where q < 0, else h (vector casts keep the bits)
      const lanes x = (lanes)(((mask)lanes{l, l, l, l} & take_l) | ((mask)lanes{h, h, h, h} & ~take_l));
      acc[n] += product(qi, x);
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int g = 0; g < 4; ++g) out[n][g] = acc[n][g];
  }
#else
  for (int n = 0; n < N; ++n) {
    for (int g = 0; g < 4; ++g) out[n][g] = 0.0f;
  }
  for (std::int32_t i = 0; i < head_dim; ++i) {
    for (int n = 0; n < N; ++n) {
      for (int g = 0; g < 4; ++g) {
        const float a = product(q4[4 * i + g], record_value(lo[n], i));
        const float b = product(q4[4 * i + g], record_value(hi[n], i));
        out[n][g] += a > b ? a : b;
      }
    }
  }
#endif
}

// max_bound's scores over a record's rows lo and hi of E (max_bound's floats, max_bound16's 16-bit
// values), read as record_value reads them: bound_score is max_bound::score, bound_score4 its score4
// (queries q + g·stride, four sums side by side, each in score()'s order) and bound_scores4 its
// score4_blocks (bound_dots4). A record whose first minimum exceeds its first maximum holds no key:
// -inf for every query.
template <class E>
[[nodiscard]] SKIM_FORCEINLINE bool bound_empty(const E* lo, const E* hi, std::int32_t head_dim) noexcept {
  return head_dim > 0 && record_value(lo, 0) > record_value(hi, 0);
}
template <class E>
[[nodiscard]] float bound_score(const E* lo, const E* hi, const float* q, std::int32_t head_dim) noexcept {
  if (bound_empty(lo, hi, head_dim)) return neg_inf;
  float acc = 0.0f;
  for (std::int32_t i = 0; i < head_dim; ++i) {
    const float a = product(q[i], record_value(lo, i));
    const float b = product(q[i], record_value(hi, i));
    acc += a > b ? a : b;
  }
  return acc;
}
template <class E>
void bound_score4(const E* lo, const E* hi, const float* q, std::int64_t stride, std::int32_t head_dim,
                  float* out) noexcept {
  if (bound_empty(lo, hi, head_dim)) {
    for (int g = 0; g < 4; ++g) out[g] = neg_inf;
    return;
  }
  const float* q0 = q;
  const float* q1 = q + stride;
  const float* q2 = q + 2 * stride;
  const float* q3 = q + 3 * stride;
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (std::int32_t i = 0; i < head_dim; ++i) {
    const float l = record_value(lo, i), h = record_value(hi, i);
    const float x0 = product(q0[i], l), y0 = product(q0[i], h);
    const float x1 = product(q1[i], l), y1 = product(q1[i], h);
    const float x2 = product(q2[i], l), y2 = product(q2[i], h);
    const float x3 = product(q3[i], l), y3 = product(q3[i], h);
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
template <int B, class E>
void bound_scores4(const E* const (&lo)[B], const E* const (&hi)[B], const float* q4, std::int32_t head_dim,
                   float* out) noexcept {
  float s[B][4];
  bound_dots4<B>(q4, lo, hi, head_dim, s);
  for (int b = 0; b < B; ++b) {
    const bool empty = bound_empty(lo[b], hi[b], head_dim);
    for (int g = 0; g < 4; ++g) out[4 * b + g] = empty ? neg_inf : s[b][g];
  }
}

}  // namespace skim::summarize::detail
