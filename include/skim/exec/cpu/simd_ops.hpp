#pragma once
// The primitives exec::simd<Arch> is written in: fused multiply-add, loads that widen int8 / fp8 /
// fp16 / bf16 elements to float in registers, a horizontal sum of rows, the largest lane, and the
// register blocking. Each forwards to the best version for Arch among arch/generic.hpp (xsimd only)
// and the per-arch files, which hold every intrinsic (docs/design.md §15). An arch file's
// functions exist only in a translation unit compiled with its -m flags.

#include <cmath>
#include <cstdint>

#include "skim/config.hpp"
#include "skim/exec/cpu/arch/avx.hpp"
#include "skim/exec/cpu/arch/avx2.hpp"
#include "skim/exec/cpu/arch/avx512f.hpp"
#include "skim/exec/cpu/arch/generic.hpp"
#include "skim/exec/cpu/arch/neon64.hpp"

namespace skim::exec::simd_detail {

using simd_arch::fbatch;
using simd_arch::stored_element;
using simd_arch::value_of;
using simd_arch::width;

// Accumulator registers per row of the microkernels: 4 where the ISA has 32 vector registers.
template <class Arch>
inline constexpr std::int32_t accumulators_per_row = simd_arch::accumulators_per_row(Arch{});

// a·b + c, one rounding where the ISA has FMA.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> fmadd(fbatch<Arch> a, fbatch<Arch> b, fbatch<Arch> c) noexcept {
  return simd_arch::fmadd(a, b, c, Arch{});
}

// a·b + c for one float, rounded the same way in every inlined copy: once where the target has a
// fused multiply-add (std::fma is then one instruction), twice elsewhere (nothing to fuse into).
// Written as a·b + c, the compiler may fuse it in one copy and not in another (GCC contracts across
// statements by default, -ffp-contract=fast), and two callers of a kernel then differ in the last
// bit: the fused and per-head decode paths merge a split row's partials this way.
SKIM_FORCEINLINE float mul_add(float a, float b, float c) noexcept {
#if defined(__FP_FAST_FMAF) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// width<Arch> consecutive elements at p, as float. @pre p[0, width) is readable.
template <class Arch, stored_element T>
SKIM_FORCEINLINE fbatch<Arch> load_float(const T* p) noexcept {
  return simd_arch::load_float<Arch>(p, Arch{});
}

// The first n < width<Arch> elements at p as float, zeros after. Reads only p[0, n).
template <class Arch, stored_element T>
SKIM_FORCEINLINE fbatch<Arch> load_float_partial(const T* p, std::int32_t n) noexcept {
  alignas(64) float tmp[width<Arch>] = {};
  for (std::int32_t k = 0; k < n; ++k) tmp[k] = value_of(p[k]);
  return fbatch<Arch>::load_aligned(tmp);
}

// Lane i = sum of the lanes of row[i], for width<Arch> registers.
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> sum_rows(const fbatch<Arch>* row) noexcept {
  return simd_arch::sum_rows(row, Arch{});
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
