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

// Elements the executor reads: float, half, bfloat16, and the codes of quantised K/V, int8 and
// fp8 e4m3 (core/quantized.hpp: scaled separately).
template <class T>
concept stored_element = element<T> || std::is_same_v<T, std::int8_t> || std::is_same_v<T, fp8_e4m3>;

template <stored_element T>
SKIM_FORCEINLINE constexpr float value_of(T x) noexcept {
  if constexpr (std::is_same_v<T, std::int8_t>) return static_cast<float>(x);
  else if constexpr (std::is_same_v<T, fp8_e4m3>) return x.to_float();
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

// fp8 e4m3 bits (zero-extended in 32-bit lanes) to float, exactly, with fp8_e4m3::to_float's bits
// (NaN codes give its quiet NaN, sign kept). For the 7 bits em below the sign:
// - normal (em >= 8): em << 20 puts the exponent and the 3 mantissa bits in place; adding 120 to the
//   exponent (bias 7 -> 127) is the value, no arithmetic rounding;
// - subnormal or zero (em < 8, em is the mantissa): em · 2^-9, an integer of 3 bits converted to
//   float and multiplied by a power of two, both exact, and the result (>= 2^-9, or 0) is a float
//   normal. No float denormal is formed or read, so a caller's flush-to-zero or denormals-are-zero
//   mode (-ffast-math's startup code sets both on x86) cannot change the result, as it would for
//   the shorter float(em << 20) · 2^120 (a denormal times a power of two);
// - 0x7f: NaN. The sign is the code's top bit, ORed in last (-0 for 0x80).
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fp8_e4m3_bits_to_float(ubatch<Arch> b) noexcept {
  using ibatch = xsimd::batch<std::int32_t, Arch>;
  const ubatch<Arch> sign = (b & ubatch<Arch>(0x80u)) << 24;
  const ubatch<Arch> em = b & ubatch<Arch>(0x7fu);
  const ubatch<Arch> normal = (em << 20) + ubatch<Arch>(120u << 23);
  const fbatch<Arch> small = xsimd::to_float(xsimd::bitwise_cast<ibatch>(em)) * fbatch<Arch>(0x1p-9f);
  ubatch<Arch> bits = xsimd::select(em < ubatch<Arch>(8u), xsimd::bitwise_cast<ubatch<Arch>>(small), normal);
  bits = xsimd::select(em == ubatch<Arch>(0x7fu), ubatch<Arch>(0x7fc00000u), bits);
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
