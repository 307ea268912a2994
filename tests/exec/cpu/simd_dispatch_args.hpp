#pragma once
// The arguments type and per-arch table entries of simd_dispatch_test.cpp (the dispatch pattern of
// skim/exec/cpu/dispatch.hpp: one TU per arch, compiled with its flags, exporting a plain table entry).
#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/dispatch.hpp"
#include "skim/index/causal_all.hpp"

namespace skim::test {

using dispatch_args = attention_args<half, contiguous_kv<half>, index::causal_all, float>;

exec::simd_entry<dispatch_args> simd_entry_avx2();    // simd_dispatch_avx2.cpp (-mavx2 -mfma)
exec::simd_entry<dispatch_args> simd_entry_avx512();  // simd_dispatch_avx512.cpp (-mavx512f -mavx512dq ...)

}  // namespace skim::test
