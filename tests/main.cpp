// The doctest main of skim_tests, the run's base seed (support/seed.hpp), and the counting global
// operator new/delete behind support/allocation_counter.hpp (they forward to malloc/free).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "support/allocation_counter.hpp"
#include "support/seed.hpp"

SKIM_TEST_SEED_LISTENER();

#if defined(SKIM_TEST_ARCH_BUILD) && defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
// A per-arch test binary (tests/CMakeLists.txt) on a CPU without its arch would die of SIGILL, and
// its first vector instruction may come before main: any static initialiser of a TU built with the
// arch's flags may use it. So this check runs first (a constructor of the highest user priority)
// and is itself compiled without AVX; where the CPU lacks the arch, it exits 77, CTest's skip.
__attribute__((constructor(101), target("no-avx"))) static void skim_test_check_compiled_arch() {
  __builtin_cpu_init();
  bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if defined(__AVX512F__)
  ok = ok && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
       __builtin_cpu_supports("avx512bw");
#endif
  if (!ok) {
    std::fputs("skim tests: this CPU lacks the arch the binary was built for; skipped\n", stdout);
    std::fflush(stdout);
    std::_Exit(77);
  }
}
#endif

// g++ 12 at -O1 and above flags free() in these replacements as "mismatched" with operator new;
// they are a matched pair here (counted_alloc allocates with malloc/aligned_alloc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
void* counted_alloc(std::size_t n, std::size_t alignment) {
  if (skim::test::counting_allocations.load(std::memory_order_relaxed)) {
    skim::test::allocations_counted.fetch_add(1, std::memory_order_relaxed);
  }
  if (n == 0) n = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(alignment, (n + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, 0); }
void* operator new[](std::size_t n) { return counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
