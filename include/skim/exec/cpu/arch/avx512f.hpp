#pragma once
// AVX-512 (avx512f and the archs derived from it; skim builds it with -mavx512dq too): fused
// multiply-add, int8 / fp8 e4m3 / fp16 / bf16 widened in registers, a horizontal sum in the
// natural lane order, and 4 accumulators per row (32 vector registers).

#include "skim/exec/cpu/arch/generic.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>

namespace skim::exec::simd_arch {

constexpr std::int32_t accumulators_per_row(requires_arch<xsimd::avx512f>) noexcept { return 4; }

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fmadd(fbatch<Arch> a, fbatch<Arch> b, fbatch<Arch> c,
                                    requires_arch<xsimd::avx512f>) noexcept {
  return _mm512_fmadd_ps(a, b, c);
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const std::int8_t* p, requires_arch<xsimd::avx512f>) noexcept {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The exact bit conversion of generic.hpp on the 16 bytes of one register.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const fp8_e4m3* p, requires_arch<xsimd::avx512f>) noexcept {
  return fp8_e4m3_bits_to_float<Arch>(ubatch<Arch>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const half* p, requires_arch<xsimd::avx512f>) noexcept {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const bfloat16* p, requires_arch<xsimd::avx512f>) noexcept {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// xsimd 8.1's avx512f haddp returns the sums in a permuted lane order: fold each register to 8
// lanes, reduce the two halves of 8 rows with the AVX haddp, and join them.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> sum_rows(const fbatch<Arch>* row, requires_arch<xsimd::avx512f>) noexcept {
  const auto fold = [](__m512 a) noexcept {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  };
  xsimd::batch<float, xsimd::avx2> lo[8], hi[8];
  for (int i = 0; i < 8; ++i) {
    lo[i] = fold(row[i]);
    hi[i] = fold(row[i + 8]);
  }
  const __m256 l = xsimd::haddp(lo), h = xsimd::haddp(hi);
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(l)), _mm256_castps_pd(h), 1));
}

}  // namespace skim::exec::simd_arch
#endif
