// Built with -mavx2 -mfma (tests/CMakeLists.txt): the avx2 entry of the dispatch test's table.
#include "exec/cpu/simd_dispatch_args.hpp"

skim::exec::simd_entry<skim::test::dispatch_args> skim::test::simd_entry_avx2() {
  return exec::make_simd_entry<xsimd::avx2, dispatch_args>();
}
