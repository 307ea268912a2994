#pragma once
// skim configuration: portability macros shared by every header.
//
// SKIM_HOST_DEVICE  marks functions usable from CUDA device code when compiled by nvcc.
// SKIM_ASSERT       always on; for invariants at API edges that a caller cannot violate
//                   through data (data errors are reported as skim::status values).
// SKIM_DASSERT      debug-only; for hot loops.
// SKIM_UNROLL(n)    unroll the next loop n times (hot loops whose trip count is known only at run time).

#include <cstdio>
#include <cstdlib>

#if defined(__CUDACC__)
#define SKIM_HOST_DEVICE __host__ __device__
#else
#define SKIM_HOST_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SKIM_FORCEINLINE inline __attribute__((always_inline))
#define SKIM_RESTRICT __restrict__
#define SKIM_PRAGMA(x) _Pragma(#x)
#if defined(__CUDACC__)
#define SKIM_UNROLL(n)  // nvcc's front end does not know GCC's pragma (CUDA translation units run no CPU hot loop)
#else
#define SKIM_UNROLL(n) SKIM_PRAGMA(GCC unroll n)  // the next loop, unrolled n times (GCC and Clang)
#endif
// Asks for the cache line holding address p, to read, into L2 (a hint: it never faults).
#define SKIM_PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#else
#define SKIM_FORCEINLINE inline
#define SKIM_RESTRICT
#define SKIM_UNROLL(n)
#define SKIM_PREFETCH_L2(p) ((void)(p))
#endif

#define SKIM_ASSERT(cond)                                                                        \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "skim: assertion failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

#if defined(NDEBUG)
#define SKIM_DASSERT(cond) ((void)0)
#else
#define SKIM_DASSERT(cond) SKIM_ASSERT(cond)
#endif

#define SKIM_VERSION_MAJOR 0
#define SKIM_VERSION_MINOR 1
#define SKIM_VERSION_PATCH 0
