#pragma once
// AVX2: int8, fp8 e4m3, fp16 and bf16 widened to float in registers (xsimd 8.1 has no such
// conversions). fp16 uses F16C's vcvtph2ps where compiled with -mf16c, else the exact bit
// conversion; fp8 the exact bit conversion of generic.hpp (AVX2 has no fp8 instruction).

#include "skim/exec/cpu/arch/generic.hpp"

#if defined(__AVX2__)
#include <immintrin.h>

namespace skim::exec::simd_arch {

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const std::int8_t* p, requires_arch<xsimd::avx2>) noexcept {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Reads exactly the 8 bytes of one register.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const fp8_e4m3* p, requires_arch<xsimd::avx2>) noexcept {
  return fp8_e4m3_bits_to_float<Arch>(ubatch<Arch>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const bfloat16* p, requires_arch<xsimd::avx2>) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const half* p, requires_arch<xsimd::avx2>) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#if defined(__F16C__)
  return _mm256_cvtph_ps(raw);
#else
  return half_bits_to_float<Arch>(ubatch<Arch>(_mm256_cvtepu16_epi32(raw)));
#endif
}

}  // namespace skim::exec::simd_arch
#endif
