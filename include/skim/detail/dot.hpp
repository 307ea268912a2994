#pragma once
// Small arithmetic shared by the summarizers (private: skim::summarize::detail).
//
// Dot products run in fp32 over i = 0, 1, ..., head_dim - 1 in that order, each product rounded
// to fp32 before it is added (never fused into an FMA: product() below). Both are part of the
// contract: max_bound's score is an upper bound of every key's q·k computed this way, exactly,
// because fp32 rounding is monotone (see max_bound.hpp), and every path that scores (score, score4,
// score4_blocks, the GPU router) gives the same bits in every build.

#include <cstdint>
#include <cstring>
#include <limits>

#include "skim/core/dtypes.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define SKIM_DETAIL_X86 1
#else
#define SKIM_DETAIL_X86 0
#endif
#if defined(__aarch64__)
#define SKIM_DETAIL_ARM64 1
#else
#define SKIM_DETAIL_ARM64 0
#endif

namespace skim::summarize::detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr float pos_inf = std::numeric_limits<float>::infinity();

// a·b rounded to fp32 (lane by lane for GCC's vector types) before anything adds it: never fused
// with the addition that consumes it into one FMA. Compilers fuse where the target has FMA: GCC
// across statements by default (-ffp-contract=fast, whatever -std), and in some inlined copies of a
// loop but not in others (at -O3 it vectorises dot()'s products and adds them one by one, while it
// fused dots4's); Clang within one expression, or everywhere with -ffp-contract=fast. Left to them,
// score() and score4_blocks() of one build could differ in the last bit, and the CPU and GPU
// routers with them. An empty asm statement that "changes" the product hides it from every
// optimiser (GCC 12's __builtin_assoc_barrier does not: inlined into dot4 it was fused anyway).
template <class T>
[[nodiscard]] SKIM_FORCEINLINE T product(T a, T b) noexcept {
#if !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && (SKIM_DETAIL_X86 || SKIM_DETAIL_ARM64)
  T p = a * b;
#if SKIM_DETAIL_X86
  asm("" : "+v"(p));
#else
  asm("" : "+w"(p));
#endif
  return p;
#else
  return a * b;  // elsewhere as the compiler rounds it (see docs/design.md, determinism)
#endif
}

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

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && defined(__AVX__)
}  // namespace skim::summarize::detail
#include <immintrin.h>
namespace skim::summarize::detail {
// Where the compiler targets AVX or AVX-512, dots4 and bound_dots4 put R blocks' four queries in
// the lanes of one vector (R = 2 in 32 bytes, 4 in 64), lane 4·r + g for block r and query g: a
// multiply and an add per element for 4·R sums. Each lane still runs its one sum in index order,
// lane by lane the scalar operations (the same bits). Four elements of R rows are loaded at once
// (rows) and each spread over its row's four lanes by an in-lane shuffle (spread).
#define SKIM_DETAIL_WIDE_DOTS 1
namespace wide {
#if defined(__AVX512F__)
inline constexpr int R = 4;
typedef float fv __attribute__((vector_size(64)));
typedef std::int32_t mv __attribute__((vector_size(64)));
#else
inline constexpr int R = 2;
typedef float fv __attribute__((vector_size(32)));
typedef std::int32_t mv __attribute__((vector_size(32)));
#endif

// [r[0][i, i + 4), r[1][i, i + 4), ..., r[R - 1][i, i + 4)]: one load and R - 1 loads into lanes
// (intrinsics: GCC 12 builds the same from vector-extension shuffles in twice the instructions).
SKIM_FORCEINLINE fv rows(const float* const* r, std::int32_t i) noexcept {
#if defined(__AVX512F__)
  __m512 x = _mm512_castps128_ps512(_mm_loadu_ps(r[0] + i));
  x = _mm512_insertf32x4(x, _mm_loadu_ps(r[1] + i), 1);
  x = _mm512_insertf32x4(x, _mm_loadu_ps(r[2] + i), 2);
  x = _mm512_insertf32x4(x, _mm_loadu_ps(r[3] + i), 3);
#else
  const __m256 x = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r[0] + i)), _mm_loadu_ps(r[1] + i), 1);
#endif
  return (fv)x;
}
// Element i + J of each row of rows(r, i), in all four lanes of its row.
template <int J>
SKIM_FORCEINLINE fv spread(fv x) noexcept {
#if defined(__AVX512F__)
  return __builtin_shufflevector(x, x, J, J, J, J, 4 + J, 4 + J, 4 + J, 4 + J, 8 + J, 8 + J, 8 + J, 8 + J, 12 + J,
                                 12 + J, 12 + J, 12 + J);
#else
  return __builtin_shufflevector(x, x, J, J, J, J, 4 + J, 4 + J, 4 + J, 4 + J);
#endif
}
// Element i of each row in all four lanes of its row (the elements past the last four).
SKIM_FORCEINLINE fv column(const float* const* r, std::int32_t i) noexcept {
  const float a = r[0][i], b = r[1][i];
#if defined(__AVX512F__)
  const float c = r[2][i], d = r[3][i];
  return fv{a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d};
#else
  return fv{a, a, a, a, b, b, b, b};
#endif
}
// The four queries' element i (q4i = q4 + 4·i, interleave4) in every row's four lanes: one
// broadcast load.
SKIM_FORCEINLINE fv queries(const float* q4i) noexcept {
#if defined(__AVX512F__)
  // The zero-masked form: GCC 12's plain one starts from _mm512_undefined_ps(), which -Wall flags.
  return (fv)_mm512_maskz_broadcast_f32x4(0xffff, _mm_loadu_ps(q4i));
#else
  return (fv)_mm256_broadcast_ps(reinterpret_cast<const __m128*>(q4i));
#endif
}
// max_bound's term, q·l or q·h by q's sign (bound_dots4 says why), lane by lane.
SKIM_FORCEINLINE fv bound_term(fv q, fv l, fv h) noexcept {
  const mv take_a = q < fv{};  // all ones where q < 0: there q·l >= q·h
  const fv a = product(q, l);
  const fv b = product(q, h);
  return (fv)(((mv)a & take_a) | ((mv)b & ~take_a));  // vector casts keep the bits
}
// Element i + J's terms for V vectors of rows(·, i), q4i = q4 + 4·i.
template <int J, int V>
SKIM_FORCEINLINE void add_products(fv (&acc)[V], const fv (&x)[V], const float* q4i) noexcept {
  const fv q = queries(q4i + 4 * J);
  for (int v = 0; v < V; ++v) acc[v] += product(q, spread<J>(x[v]));
}
template <int J, int V>
SKIM_FORCEINLINE void add_bounds(fv (&acc)[V], const fv (&l)[V], const fv (&h)[V], const float* q4i) noexcept {
  const fv q = queries(q4i + 4 * J);
  for (int v = 0; v < V; ++v) acc[v] += bound_term(q, spread<J>(l[v]), spread<J>(h[v]));
}
template <int N>
SKIM_FORCEINLINE void store(const fv (&acc)[N / R], float (&out)[N][4]) noexcept {
  for (int v = 0; v < N / R; ++v) {
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < 4; ++g) out[R * v + r][g] = acc[v][4 * r + g];
    }
  }
}

// dots4 of N rows, N a multiple of R.
template <int N>
SKIM_FORCEINLINE void dots4(const float* SKIM_RESTRICT q4, const float* const (&k)[N], std::int32_t head_dim,
                            float (&out)[N][4]) noexcept {
  constexpr int V = N / R;
  fv acc[V];
  for (int v = 0; v < V; ++v) acc[v] = fv{};
  std::int32_t i = 0;
  for (; i + 4 <= head_dim; i += 4) {
    fv x[V];
    for (int v = 0; v < V; ++v) x[v] = rows(k + R * v, i);
    add_products<0>(acc, x, q4 + 4 * std::int64_t{i});
    add_products<1>(acc, x, q4 + 4 * std::int64_t{i});
    add_products<2>(acc, x, q4 + 4 * std::int64_t{i});
    add_products<3>(acc, x, q4 + 4 * std::int64_t{i});
  }
  for (; i < head_dim; ++i) {
    const fv q = queries(q4 + 4 * std::int64_t{i});
    for (int v = 0; v < V; ++v) acc[v] += product(q, column(k + R * v, i));
  }
  store<N>(acc, out);
}

// bound_dots4 of N blocks, N a multiple of R.
template <int N>
SKIM_FORCEINLINE void bound_dots4(const float* SKIM_RESTRICT q4, const float* const (&lo)[N],
                                  const float* const (&hi)[N], std::int32_t head_dim, float (&out)[N][4]) noexcept {
  constexpr int V = N / R;
  fv acc[V];
  for (int v = 0; v < V; ++v) acc[v] = fv{};
  std::int32_t i = 0;
  for (; i + 4 <= head_dim; i += 4) {
    fv l[V], h[V];
    for (int v = 0; v < V; ++v) {
      l[v] = rows(lo + R * v, i);
      h[v] = rows(hi + R * v, i);
    }
    add_bounds<0>(acc, l, h, q4 + 4 * std::int64_t{i});
    add_bounds<1>(acc, l, h, q4 + 4 * std::int64_t{i});
    add_bounds<2>(acc, l, h, q4 + 4 * std::int64_t{i});
    add_bounds<3>(acc, l, h, q4 + 4 * std::int64_t{i});
  }
  for (; i < head_dim; ++i) {
    const fv q = queries(q4 + 4 * std::int64_t{i});
    for (int v = 0; v < V; ++v) acc[v] += bound_term(q, column(lo + R * v, i), column(hi + R * v, i));
  }
  store<N>(acc, out);
}
}  // namespace wide
#endif

// out[n][g] = dot(query g, k[n]) for n < N, g < 4, the queries interleaved as interleave4 writes
// them: each sum in index order, rounded step by step as dot() rounds it (the same bits). Where the
// compiler has GCC's vector extensions, the four queries' sums of one k[n] are the lanes of one
// 4-float vector (a multiply and an add per element for four heads, lane by lane the scalar
// operations) and the N vectors' sums run side by side; with AVX, R rows share a vector (wide).
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
// as the scalar loop; vectors as in dots4. The vectors pick the larger product by q's sign, one test
// per element for all N blocks instead of a compare each. Rounding is monotone, so q·hi >= q·lo
// where q >= 0 and q·lo >= q·hi where q < 0; where q is NaN both are NaN and the scalar takes q·hi,
// as here. Where q < 0 and the two tie as zeros of opposite signs, the vectors take the other zero
// than the scalar, which adds the same: a sum that starts at +0 never becomes -0 under
// round-to-nearest.
template <int N>
SKIM_FORCEINLINE void bound_dots4(const float* SKIM_RESTRICT q4, const float* const (&lo)[N],
                                  const float* const (&hi)[N], std::int32_t head_dim, float (&out)[N][4]) noexcept {
#if defined(SKIM_DETAIL_WIDE_DOTS)
  if constexpr (N % wide::R == 0) {
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
    const mask take_a = qi < lanes{0.0f, 0.0f, 0.0f, 0.0f};  // all ones where q < 0: there a >= b
    for (int n = 0; n < N; ++n) {
      const float l = lo[n][i], h = hi[n][i];
      const lanes a = product(qi, lanes{l, l, l, l});
      const lanes b = product(qi, lanes{h, h, h, h});
      acc[n] += (lanes)(((mask)a & take_a) | ((mask)b & ~take_a));  // vector casts keep the bits
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
        const float a = product(q4[4 * i + g], lo[n][i]), b = product(q4[4 * i + g], hi[n][i]);
        out[n][g] += a > b ? a : b;
      }
    }
  }
#endif
}

}  // namespace skim::summarize::detail
