#pragma once
// summarize::detail::wide: dots4 and bound_dots4 (dot.hpp) with R blocks' four queries in the lanes
// of one vector where the compiler targets AVX (R = 2, 32 bytes) or AVX-512 (R = 4, 64 bytes), lane
// 4·r + g for block r and query g: a multiply and an add per element for 4·R sums. Each lane still
// runs its one sum in index order, lane by lane the scalar operations (the same bits). Four elements
// of R rows are loaded into one vector (rows; 16-bit rows eight at a time, widened: rows8) and each
// spread over its row's four lanes by an in-lane shuffle (spread). Private to the summarizers: where
// it is compiled it defines SKIM_DETAIL_WIDE_DOTS, and dot.hpp calls it for N a multiple of R and
// rows it reads (reads<E>).

#include <cstdint>
#include <type_traits>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/detail/product.hpp"
#include "skim/detail/record_value.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && defined(__AVX__)
#include <immintrin.h>
#define SKIM_DETAIL_WIDE_DOTS 1

namespace skim::summarize::detail {
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

// Rows of E these paths read: float; half where the target widens fp16 in vectors (AVX-512, F16C);
// bfloat16 where it shifts 32-bit integer lanes (AVX2). Other rows take dot.hpp's 4-lane path.
#if defined(__AVX512F__) || defined(__F16C__)
inline constexpr bool widens_half = true;
#else
inline constexpr bool widens_half = false;
#endif
#if defined(__AVX2__)
inline constexpr bool widens_bfloat16 = true;
#else
inline constexpr bool widens_bfloat16 = false;
#endif
template <class E>
inline constexpr bool reads = std::is_same_v<E, float> || (std::is_same_v<E, half> && widens_half) ||
                              (std::is_same_v<E, bfloat16> && widens_bfloat16);

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
// 4·R values of a 16-bit E as floats, exactly (half: vcvtph2ps; bfloat16: the upper half of a float).
#if defined(__AVX512F__)
template <class E>
SKIM_FORCEINLINE fv widen(__m256i x) noexcept {
  if constexpr (std::is_same_v<E, half>) {
    return (fv)_mm512_maskz_cvtph_ps(0xffff, x);  // zero-masked forms: see queries()
  } else {
    static_assert(std::is_same_v<E, bfloat16>);
    return (fv)_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, x), 16);
  }
}
#else
template <class E>
SKIM_FORCEINLINE fv widen(__m128i x) noexcept {
  static_assert(reads<E> && !std::is_same_v<E, float>);
  if constexpr (std::is_same_v<E, half>) {
#if defined(__F16C__)
    return (fv)_mm256_cvtph_ps(x);
#endif
  } else {
#if defined(__AVX2__)
    return (fv)_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16);
#endif
  }
  static_cast<void>(x);
  return fv{};  // not reached: reads<E> holds
}
#endif
// Elements [i, i + 8) of a 16-bit row: one 16-byte load.
template <class E>
SKIM_FORCEINLINE __m128i eight(const E* row, std::int32_t i) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i));
}
#if defined(__AVX512F__)
// [r[0][i, i + 8), r[1][i, i + 8), r[2][i, i + 8), r[3][i, i + 8)] of a 16-bit E as 32 words.
template <class E>
SKIM_FORCEINLINE __m512i words8(const E* const* r, std::int32_t i) noexcept {
  const __m512i w = _mm512_inserti32x4(_mm512_zextsi128_si512(eight(r[0], i)), eight(r[1], i), 1);
  return _mm512_inserti32x4(_mm512_inserti32x4(w, eight(r[2], i), 2), eight(r[3], i), 3);
}
#endif
// Elements [i, i + 8) of R rows of a 16-bit E as floats: a as rows(r, i) would hold them (each row's
// first four in turn), b the same of its last four.
template <class E>
SKIM_FORCEINLINE void rows8(const E* const* r, std::int32_t i, fv& a, fv& b) noexcept {
  static_assert(reads<E> && !std::is_same_v<E, float>);
#if defined(__AVX512F__)
  // 64-bit lanes 2k and 2k + 1 hold row k's first and last four: the firsts, then the lasts.
  const __m512i w = _mm512_maskz_permutexvar_epi64(0xff, _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), words8(r, i));
  typedef long long q8 __attribute__((vector_size(64)));  // halves by shuffles: GCC 12's casts and extracts
  const q8 x = (q8)w;                                    // start from undefined values, which -Wall flags
  a = widen<E>((__m256i)__builtin_shufflevector(x, x, 0, 1, 2, 3));
  b = widen<E>((__m256i)__builtin_shufflevector(x, x, 4, 5, 6, 7));
#else
  const __m128i x0 = eight(r[0], i), x1 = eight(r[1], i);
  a = widen<E>(_mm_unpacklo_epi64(x0, x1));
  b = widen<E>(_mm_unpackhi_epi64(x0, x1));
#endif
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
// Element i of each row in all four lanes of its row (the elements past the last four, or eight).
template <class E>
SKIM_FORCEINLINE fv column(const E* const* r, std::int32_t i) noexcept {
  const float a = record_value(r[0], i), b = record_value(r[1], i);
#if defined(__AVX512F__)
  const float c = record_value(r[2], i), d = record_value(r[3], i);
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
  const __m128 q = _mm_loadu_ps(q4i);
  return (fv)_mm256_set_m128(q, q);  // one vbroadcastf128 from memory, which needs no alignment
#endif
}
// max_bound's term by q's sign (bound_dots4 says why), lane by lane: q·l where q < 0, else q·h,
// element i + J of rows(lo, i) (l) and rows(hi, i) (h). The bound is chosen before the one multiply:
// the same bits as choosing between the two products. With AVX-512 one two-source shuffle spreads
// the element and chooses the bound at once (its indices: from l where q < 0, else from h).
#if defined(__AVX512F__)
// A permute's indices: from_l in the lanes where q < 0, from_l + to_h in the others.
SKIM_FORCEINLINE __m512i pick_index(fv q, __m512i from_l, int to_h) noexcept {
  const __m512i from_h = _mm512_add_epi32(from_l, _mm512_set1_epi32(to_h));
  return _mm512_mask_mov_epi32(from_h, _mm512_cmp_ps_mask((__m512)q, _mm512_setzero_ps(), _CMP_LT_OQ), from_l);
}
#endif
template <int J>
struct bound_pick {
#if defined(__AVX512F__)
  __m512i index;
  SKIM_FORCEINLINE explicit bound_pick(fv q) noexcept
      : index(pick_index(q,
                         _mm512_setr_epi32(J, J, J, J, 4 + J, 4 + J, 4 + J, 4 + J, 8 + J, 8 + J, 8 + J, 8 + J, 12 + J,
                                           12 + J, 12 + J, 12 + J),
                         16)) {}
  SKIM_FORCEINLINE fv operator()(fv l, fv h) const noexcept {
    return (fv)_mm512_permutex2var_ps((__m512)l, index, (__m512)h);
  }
#else
  mv take_l;  // all ones where q < 0
  SKIM_FORCEINLINE explicit bound_pick(fv q) noexcept : take_l(q < fv{}) {}
  SKIM_FORCEINLINE fv operator()(fv l, fv h) const noexcept {
    return (fv)(((mv)spread<J>(l) & take_l) | ((mv)spread<J>(h) & ~take_l));  // vector casts keep the bits
  }
#endif
};
// Element i + J's terms for V vectors of rows(·, i), q4i = q4 + 4·i.
template <int J, int V>
SKIM_FORCEINLINE void add_products(fv (&acc)[V], const fv (&x)[V], const float* q4i) noexcept {
  const fv q = queries(q4i + 4 * J);
  for (int v = 0; v < V; ++v) acc[v] += product(q, spread<J>(x[v]));
}
template <int J, int V>
SKIM_FORCEINLINE void add_bounds(fv (&acc)[V], const fv (&l)[V], const fv (&h)[V], const float* q4i) noexcept {
  const fv q = queries(q4i + 4 * J);
  const bound_pick<J> pick(q);
  for (int v = 0; v < V; ++v) acc[v] += product(q, pick(l[v], h[v]));
}
#if defined(__AVX512BW__)
// bfloat16 rows with AVX-512 BW. A float whose low 16 bits are zero is a bfloat16 widened, so one
// zero-masked two-source word permute spreads element i + J (J < 8) of words8(lo, i) or of
// words8(hi, i) over its row's four lanes, picks the bound by q's sign and widens it.
inline constexpr bool picks_words = true;
template <int J>
struct word_pick {
  __m512i index;  // lane 4·r + g's upper word: word 8·r + J of l where q < 0, else of h (32 more)
  static constexpr int a = J << 16, b = (8 + J) << 16, c = (16 + J) << 16, d = (24 + J) << 16;
  SKIM_FORCEINLINE explicit word_pick(fv q) noexcept
      : index(pick_index(q, _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d), 32 << 16)) {}
  SKIM_FORCEINLINE fv operator()(__m512i l, __m512i h) const noexcept {
    return (fv)_mm512_maskz_permutex2var_epi16(0xaaaaaaaau, l, index, h);  // lower words zero
  }
};
template <int J, int V>
SKIM_FORCEINLINE void add_word_bounds(fv (&acc)[V], const __m512i (&l)[V], const __m512i (&h)[V],
                                      const float* q4i) noexcept {
  const fv q = queries(q4i + 4 * J);
  const word_pick<J> pick(q);
  for (int v = 0; v < V; ++v) acc[v] += product(q, pick(l[v], h[v]));
}
#else
inline constexpr bool picks_words = false;
#endif
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

// bound_dots4 of N blocks, N a multiple of R, rows of E (reads<E>).
template <int N, class E>
SKIM_FORCEINLINE void bound_dots4(const float* SKIM_RESTRICT q4, const E* const (&lo)[N], const E* const (&hi)[N],
                                  std::int32_t head_dim, float (&out)[N][4]) noexcept {
  constexpr int V = N / R;
  fv acc[V];
  for (int v = 0; v < V; ++v) acc[v] = fv{};
  std::int32_t i = 0;
  if constexpr (std::is_same_v<E, float>) {
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
  } else if constexpr (std::is_same_v<E, bfloat16> && picks_words) {
#if defined(__AVX512BW__)
    for (; i + 8 <= head_dim; i += 8) {
      __m512i l[V], h[V];
      for (int v = 0; v < V; ++v) {
        l[v] = words8(lo + R * v, i);
        h[v] = words8(hi + R * v, i);
      }
      const float* q4i = q4 + 4 * std::int64_t{i};
      add_word_bounds<0>(acc, l, h, q4i);
      add_word_bounds<1>(acc, l, h, q4i);
      add_word_bounds<2>(acc, l, h, q4i);
      add_word_bounds<3>(acc, l, h, q4i);
      add_word_bounds<4>(acc, l, h, q4i);
      add_word_bounds<5>(acc, l, h, q4i);
      add_word_bounds<6>(acc, l, h, q4i);
      add_word_bounds<7>(acc, l, h, q4i);
    }
#endif
  } else {
    for (; i + 8 <= head_dim; i += 8) {
      fv l[V], h[V], l4[V], h4[V];  // elements [i, i + 4) and [i + 4, i + 8)
      for (int v = 0; v < V; ++v) {
        rows8(lo + R * v, i, l[v], l4[v]);
        rows8(hi + R * v, i, h[v], h4[v]);
      }
      const float* q4i = q4 + 4 * std::int64_t{i};
      add_bounds<0>(acc, l, h, q4i);
      add_bounds<1>(acc, l, h, q4i);
      add_bounds<2>(acc, l, h, q4i);
      add_bounds<3>(acc, l, h, q4i);
      add_bounds<0>(acc, l4, h4, q4i + 16);
      add_bounds<1>(acc, l4, h4, q4i + 16);
      add_bounds<2>(acc, l4, h4, q4i + 16);
      add_bounds<3>(acc, l4, h4, q4i + 16);
    }
  }
  for (; i < head_dim; ++i) {
    const fv q = queries(q4 + 4 * std::int64_t{i});
    const mv take_l = q < fv{};
    for (int v = 0; v < V; ++v) {
      acc[v] += product(q, (fv)(((mv)column(lo + R * v, i) & take_l) | ((mv)column(hi + R * v, i) & ~take_l)));
    }
  }
  store<N>(acc, out);
}
}  // namespace wide
}  // namespace skim::summarize::detail

#endif
