#pragma once
// AVX (and the AVX2 that derives from it) compiled with -mfma: a fused multiply-add, which xsimd
// 8.1 does not emit for batch<float, avx>. Without __FMA__ the generic xsimd::fma (mul + add) stays.

#include "skim/exec/cpu/arch/generic.hpp"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>

namespace skim::exec::simd_arch {

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fmadd(fbatch<Arch> a, fbatch<Arch> b, fbatch<Arch> c, requires_arch<xsimd::avx>) noexcept {
  return _mm256_fmadd_ps(a, b, c);
}

}  // namespace skim::exec::simd_arch
#endif
