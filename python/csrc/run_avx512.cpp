// exec::simd<xsimd::avx512f>; built with -mavx512f -mavx512dq -mavx512bw -mfma (CMakeLists.txt).
#include "run_arch.hpp"

namespace skim_torch {
skim::status run_simd_avx512(const request& r, std::int32_t threads) {
  return detail::run_simd_arch<xsimd::avx512f>(r, threads);
}
}  // namespace skim_torch
