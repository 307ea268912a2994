#pragma once
// The portable primitives of exec::simd<Arch>, in xsimd only: what every arch has. An arch file
// (avx.hpp, avx2.hpp, avx512f.hpp, neon64.hpp) overrides one by declaring the same function with
// its own tag: simd_ops.hpp calls each with an Arch{} argument, and overload resolution prefers
// the tag nearest Arch in xsimd's arch hierarchy (avx512bw → … → avx512f → generic), as xsimd's
// own kernels dispatch. Adding an arch is one new file, included by simd_ops.hpp.
//
// Every function is a template on Arch, so translation units built with different -m flags
// instantiate distinct symbols (no one-definition-rule clash, docs/design.md §15).

#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"

namespace skim::exec::simd_arch {

template <class Arch>
using fbatch = xsimd::batch<float, Arch>;
template <class Arch>
using ubatch = xsimd::batch<std::uint32_t, Arch>;

// The tag argument of an arch's version: binds to any Arch derived from A.
template <class A>
using requires_arch = const A&;

// Floats per register.
template <class Arch>
inline constexpr std::int32_t width = static_cast<std::int32_t>(fbatch<Arch>::size);

// Elements the executor reads: float, half, bfloat16, and int8 (quantised K/V, scaled separately).
template <class T>
concept stored_element = element<T> || std::is_same_v<T, std::int8_t>;

template <stored_element T>
SKIM_FORCEINLINE constexpr float value_of(T x) noexcept {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<float>(x);
  else return to_float(x);
}

// Accumulator registers per row of the FMA microkernels (simd_kernels.hpp): 2 fit 16 registers.
constexpr std::int32_t accumulators_per_row(requires_arch<xsimd::generic>) noexcept { return 2; }

// a·b + c (xsimd::fma: one rounding where the ISA has FMA, mul + add on SSE).
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fmadd(fbatch<Arch> a, fbatch<Arch> b, fbatch<Arch> c,
                                    requires_arch<xsimd::generic>) noexcept {
  return xsimd::fma(a, b, c);
}

// fp16 bits (zero-extended in 32-bit lanes) to float, exactly: normals and subnormals by a
// rescaling multiply, infinities and NaN by forcing the exponent. For ISAs without F16C.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> half_bits_to_float(ubatch<Arch> h) noexcept {
  const ubatch<Arch> sign = (h & ubatch<Arch>(0x8000u)) << 16;
  const ubatch<Arch> magnitude = h & ubatch<Arch>(0x7fffu);
  const fbatch<Arch> scaled = xsimd::bitwise_cast<fbatch<Arch>>(magnitude << 13) * fbatch<Arch>(0x1p112f);
  const ubatch<Arch> special = (magnitude << 13) | ubatch<Arch>(0x7f800000u);  // inf, NaN (payload kept)
  const ubatch<Arch> bits = xsimd::select(magnitude >= ubatch<Arch>(0x7c00u), special, xsimd::bitwise_cast<ubatch<Arch>>(scaled));
  return xsimd::bitwise_cast<fbatch<Arch>>(bits | sign);
}

// width<Arch> consecutive elements at p, as float. @pre p[0, width) is readable. Float is a plain
// load on every arch; the other types go through memory here.
template <class Arch, stored_element T>
SKIM_FORCEINLINE fbatch<Arch> load_float(const T* p, requires_arch<xsimd::generic>) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return fbatch<Arch>::load_unaligned(p);
  } else {
    alignas(64) float tmp[width<Arch>];
    for (std::int32_t k = 0; k < width<Arch>; ++k) tmp[k] = value_of(p[k]);
    return fbatch<Arch>::load_aligned(tmp);
  }
}

// Lane i = sum of the lanes of row[i], for width<Arch> registers.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> sum_rows(const fbatch<Arch>* row, requires_arch<xsimd::generic>) noexcept {
  return xsimd::haddp(row);
}

}  // namespace skim::exec::simd_arch
