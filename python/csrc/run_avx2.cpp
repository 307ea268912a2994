// exec::simd<xsimd::avx2>; built with -mavx2 -mfma (CMakeLists.txt).
#include "run_arch.hpp"

namespace skim_torch {
skim::status run_simd_avx2(const request& r, std::int32_t threads) {
  return detail::run_simd_arch<xsimd::avx2>(r, threads);
}
}  // namespace skim_torch
