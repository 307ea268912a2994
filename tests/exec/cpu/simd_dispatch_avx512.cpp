// Built with -mavx512f -mavx512dq -mavx512bw -mfma (tests/CMakeLists.txt): the avx512f entry.
#include "exec/cpu/simd_dispatch_args.hpp"

skim::exec::simd_entry<skim::test::dispatch_args> skim::test::simd_entry_avx512() {
  return exec::make_simd_entry<xsimd::avx512f, dispatch_args>();
}
