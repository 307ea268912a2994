// exec::simd<xsimd::default_arch> for the compiler's baseline flags (sse2 on x86-64, neon64 on
// aarch64): the arch every CPU the extension is built for runs.
#include "run_arch.hpp"

namespace skim_torch {
skim::status run_simd_baseline(const request& r, std::int32_t threads) {
  return detail::run_simd_arch<xsimd::default_arch>(r, threads);
}
const char* simd_baseline_name() noexcept { return xsimd::default_arch::name(); }
}  // namespace skim_torch
