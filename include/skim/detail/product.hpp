#pragma once
// summarize::detail::product: a multiply the compiler may not fuse with the addition that consumes
// it (private to the summarizers; docs/design.md §9).

#include "skim/config.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define SKIM_DETAIL_X86 1
#else
#define SKIM_DETAIL_X86 0
#endif
#if defined(__aarch64__)
#define SKIM_DETAIL_ARM64 1
#else
#define SKIM_DETAIL_ARM64 0
#endif

namespace skim::summarize::detail {

// a·b rounded to fp32 (lane by lane for GCC's vector types) before anything adds it: never fused
// with the addition that consumes it into one FMA. Compilers fuse where the target has FMA: GCC
// across statements by default (-ffp-contract=fast, whatever -std), and in some inlined copies of a
// loop but not in others (at -O3 it vectorises dot()'s products and adds them one by one, while it
// fused dots4's); Clang within one expression, or everywhere with -ffp-contract=fast. Left to them,
// score() and score4_blocks() of one build could differ in the last bit, and the CPU and GPU
// routers with them. An empty asm statement that "changes" the product hides it from every
// optimiser (GCC 12's __builtin_assoc_barrier does not: inlined into dot4 it was fused anyway).
template <class T>
[[nodiscard]] SKIM_FORCEINLINE T product(T a, T b) noexcept {
#if !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && (SKIM_DETAIL_X86 || SKIM_DETAIL_ARM64)
  T p = a * b;
#if SKIM_DETAIL_X86
  asm("" : "+v"(p));
#else
  asm("" : "+w"(p));
#endif
  return p;
#else
  return a * b;  // elsewhere as the compiler rounds it (see docs/design.md, determinism)
#endif
}

}  // namespace skim::summarize::detail
