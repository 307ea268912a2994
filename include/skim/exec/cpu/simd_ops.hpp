#pragma once
// Per-arch primitives of exec::simd<Arch>: fused multiply-add, and loads that widen fp16 / bf16
// elements to float in registers.
//
// The generic versions use xsimd only; the x86 and NEON sections override them where xsimd 8.1
// does not reach the instruction (it has no fma for batch<float, avx2> or avx512f, and no fp16/bf16
// conversion). Every function is a template on Arch, so translation units built with different -m
// flags instantiate distinct symbols (no one-definition-rule clash, docs/design.md §15).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace skim::exec::simd_detail {

template <class Arch>
using fbatch = xsimd::batch<float, Arch>;

// Floats per register.
template <class Arch>
inline constexpr std::int32_t width = static_cast<std::int32_t>(fbatch<Arch>::size);

template <class Arch, class Base>
inline constexpr bool derives = std::is_base_of_v<Base, Arch>;

// a·b + c, one rounding where the ISA has FMA.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fmadd(fbatch<Arch> a, fbatch<Arch> b, fbatch<Arch> c) noexcept {
#if defined(__AVX512F__)
  if constexpr (derives<Arch, xsimd::avx512f>) return _mm512_fmadd_ps(a, b, c);
#endif
#if defined(__AVX__) && defined(__FMA__)
  if constexpr (width<Arch> == 8 && derives<Arch, xsimd::avx>) return _mm256_fmadd_ps(a, b, c);
#endif
  return xsimd::fma(a, b, c);  // NEON: vfmaq_f32; SSE: mul + add
}

// fp16 bits (zero-extended in 32-bit lanes) to float, exactly: normals and subnormals by a
// rescaling multiply, infinities and NaN by forcing the exponent. For ISAs without F16C.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> half_bits_to_float(xsimd::batch<std::uint32_t, Arch> h) noexcept {
  using ub = xsimd::batch<std::uint32_t, Arch>;
  const ub sign = (h & ub(0x8000u)) << 16;
  const ub magnitude = h & ub(0x7fffu);
  const fbatch<Arch> scaled = xsimd::bitwise_cast<fbatch<Arch>>(magnitude << 13) * fbatch<Arch>(0x1p112f);
  const ub special = (magnitude << 13) | ub(0x7f800000u);  // inf, NaN (payload kept)
  const ub bits = xsimd::select(magnitude >= ub(0x7c00u), special, xsimd::bitwise_cast<ub>(scaled));
  return xsimd::bitwise_cast<fbatch<Arch>>(bits | sign);
}

// Elements the executor reads: float, half, bfloat16, and int8 (quantised K/V, scaled separately).
template <class T>
concept stored_element = element<T> || std::is_same_v<T, std::int8_t>;

template <stored_element T>
SKIM_FORCEINLINE constexpr float value_of(T x) noexcept {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<float>(x);
  else return to_float(x);
}

// width<Arch> consecutive elements at p, as float. @pre p[0, width) is readable.
template <class Arch, stored_element T>
SKIM_FORCEINLINE fbatch<Arch> load_float(const T* p) noexcept {
  constexpr std::int32_t w = width<Arch>;
  if constexpr (std::is_same_v<T, float>) {
    return fbatch<Arch>::load_unaligned(p);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
#if defined(__AVX512F__)
    if constexpr (derives<Arch, xsimd::avx512f>) {
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__AVX2__)
    if constexpr (w == 8 && derives<Arch, xsimd::avx2>) {
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    }
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    if constexpr (derives<Arch, xsimd::neon64>) {
      std::int32_t four;
      std::memcpy(&four, p, sizeof(four));  // exactly the 4 bytes of one register
      const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
      return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
    }
#endif
    alignas(64) float tmp[w];
    for (std::int32_t k = 0; k < w; ++k) tmp[k] = static_cast<float>(p[k]);
    return fbatch<Arch>::load_aligned(tmp);
  } else {
#if defined(__AVX512F__)
    if constexpr (derives<Arch, xsimd::avx512f>) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (std::is_same_v<T, half>) return _mm512_cvtph_ps(raw);
      else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
#endif
#if defined(__AVX2__)
    if constexpr (w == 8 && derives<Arch, xsimd::avx2>) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if constexpr (std::is_same_v<T, bfloat16>) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
      } else {
#if defined(__F16C__)
        return _mm256_cvtph_ps(raw);
#else
        return half_bits_to_float<Arch>(xsimd::batch<std::uint32_t, Arch>(_mm256_cvtepu16_epi32(raw)));
#endif
      }
    }
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    if constexpr (derives<Arch, xsimd::neon64>) {
      const uint16x4_t raw = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
      if constexpr (std::is_same_v<T, half>) return vcvt_f32_f16(vreinterpret_f16_u16(raw));
      else return vreinterpretq_f32_u32(vshll_n_u16(raw, 16));
    }
#endif
    alignas(64) float tmp[w];
    for (std::int32_t k = 0; k < w; ++k) tmp[k] = to_float(p[k]);
    return fbatch<Arch>::load_aligned(tmp);
  }
}

// The first n < width<Arch> elements at p as float, zeros after. Reads only p[0, n).
template <class Arch, stored_element T>
SKIM_FORCEINLINE fbatch<Arch> load_float_partial(const T* p, std::int32_t n) noexcept {
  alignas(64) float tmp[width<Arch>] = {};
  for (std::int32_t k = 0; k < n; ++k) tmp[k] = value_of(p[k]);
  return fbatch<Arch>::load_aligned(tmp);
}

// Lane i = sum of the lanes of row[i], for width<Arch> registers (xsimd::haddp, whose avx512f
// version in xsimd 8.1 returns the sums in a permuted lane order: fold to two halves of 8 instead).
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> sum_rows(const fbatch<Arch>* row) noexcept {
#if defined(__AVX512F__)
  if constexpr (derives<Arch, xsimd::avx512f>) {
    using half_batch = xsimd::batch<float, xsimd::avx2>;
    half_batch lo[8], hi[8];
    for (int i = 0; i < 8; ++i) {
      const __m512 a = row[i], b = row[i + 8];
      lo[i] = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
      hi[i] = _mm256_add_ps(_mm512_castps512_ps256(b), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
    }
    const __m256 l = xsimd::haddp(lo), h = xsimd::haddp(hi);
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(l)), _mm256_castps_pd(h), 1));
  }
#endif
  return xsimd::haddp(row);
}

// Largest lane.
template <class Arch>
SKIM_FORCEINLINE float reduce_max(fbatch<Arch> x) noexcept {
  alignas(64) float tmp[width<Arch>];
  x.store_aligned(tmp);
  float m = tmp[0];
  for (std::int32_t k = 1; k < width<Arch>; ++k) m = tmp[k] > m ? tmp[k] : m;
  return m;
}

}  // namespace skim::exec::simd_detail
