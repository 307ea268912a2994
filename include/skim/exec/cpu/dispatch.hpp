#pragma once
// Opt-in runtime dispatch of exec::simd<Arch>: pick the best arch the CPU has among those the
// program was compiled for. Static dispatch (exec::simd<xsimd::avx2> in a TU built with -mavx2 -mfma)
// stays the default; this is for binaries that must run on CPUs older than their best code path.
//
// The pattern: one translation unit per arch, compiled with that arch's flags, exports a plain
// function table (simd_entry) through a function with C++ linkage that is NOT inline:
//
//   // attention_avx512.cpp, compiled with -mavx512f -mavx512dq -mavx512bw -mfma
//   #include "skim/exec/cpu/dispatch.hpp"
//   skim::exec::simd_entry<my_args> my_attention_avx512() { return skim::exec::make_simd_entry<xsimd::avx512f, my_args>(); }
//
//   // attention_avx2.cpp, compiled with -mavx2 -mfma: the same with xsimd::avx2.
//
//   // engine.cpp, compiled with the baseline flags
//   skim::exec::simd_entry<my_args> my_attention_avx512();
//   skim::exec::simd_entry<my_args> my_attention_avx2();
//   const skim::exec::simd_entry<my_args> table[] = {my_attention_avx512(), my_attention_avx2()};
//   const skim::exec::simd_dispatch<my_args> attention{table};   // picks once, here
//   attention.run(args, workspace, threads);
//
// CMake: set_source_files_properties(attention_avx512.cpp PROPERTIES COMPILE_OPTIONS
//   "-mavx512f;-mavx512dq;-mavx512bw;-mfma") (tests/CMakeLists.txt does exactly this for
// skim_tests, see tests/exec/simd_dispatch_*.cpp).
//
// One-definition rule: every function of simd<Arch> is a member or template on Arch, so each arch
// TU instantiates its own symbols and the table points at them; only the baseline TU calls
// xsimd::available_architectures() (simd_dispatch::select). What the arch TUs still share with the
// rest of the program are skim's non-template inline helpers (validate, check_args, status) and the
// standard library: compiled with the arch flags they are equivalent code of which the linker keeps
// one copy. GNU ld keeps the first object's, so link the baseline objects before the arch ones (a
// target's sources are linked in the order listed: list the arch TUs last). This is the residual
// hazard of every -m-flag-per-TU scheme; a CPU without the arch could otherwise meet a VEX/EVEX
// encoded copy of such a helper.
//
// The table must outlive the simd_dispatch built on it (a static array, as above).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <xsimd/xsimd.hpp>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/exec/cpu/simd.hpp"

namespace skim::exec {

// One compiled arch of simd<Arch> for one arguments type.
template <class Args>
struct simd_entry {
  const char* arch = nullptr;  // xsimd arch name: "avx512f", "avx2", "neon64", "sse2", ...
  unsigned version = 0;        // xsimd's arch version: higher is better
  std::size_t (*workspace_bytes)(const problem&, std::int32_t threads) = nullptr;
  std::int64_t (*item_count)(const problem&) = nullptr;
  status (*run)(const Args&, std::span<std::byte>, std::int32_t threads) = nullptr;
};

namespace simd_dispatch_detail {

template <class Arch>
std::size_t workspace_bytes(const problem& p, std::int32_t threads) {
  return simd<Arch>{}.workspace_bytes(p, threads);
}
template <class Arch>
std::int64_t item_count(const problem& p) {
  return simd<Arch>{}.item_count(p);
}
template <class Arch, class Args>
status run(const Args& a, std::span<std::byte> workspace, std::int32_t threads) {
  return threads <= 1 ? simd<Arch>{}.run(a, workspace) : simd<Arch>{}.run(a, workspace, threads);
}

}  // namespace simd_dispatch_detail

// The table entry of simd<Arch> for Args. Call it only in a TU compiled for Arch.
template <class Arch, class Args>
[[nodiscard]] simd_entry<Args> make_simd_entry() noexcept {
  return {Arch::name(), Arch::version(), &simd_dispatch_detail::workspace_bytes<Arch>,
          &simd_dispatch_detail::item_count<Arch>, &simd_dispatch_detail::run<Arch, Args>};
}

// Whether this CPU runs code compiled for the xsimd arch `name` with the flags the pattern above
// uses (avx2 with fma, avx512f with dq). Unknown names: false.
[[nodiscard]] inline bool cpu_has_arch(const char* name) noexcept {
  const auto cpu = xsimd::available_architectures();
  const auto is = [&](const char* n) { return std::strcmp(name, n) == 0; };
  if (is("avx512bw")) return cpu.avx512bw && cpu.avx512dq && cpu.avx512f;
  if (is("avx512dq")) return cpu.avx512dq && cpu.avx512f;
  if (is("avx512f") || is("avx512cd")) return cpu.avx512f && cpu.avx512dq;
  if (is("fma3+avx2") || is("avx2")) return cpu.avx2 && cpu.fma3_avx2;
  if (is("fma3+avx") || is("avx")) return cpu.avx;
  if (is("sse4.2") || is("fma3+sse4.2")) return cpu.sse4_2;
  if (is("sse4.1")) return cpu.sse4_1;
  if (is("ssse3")) return cpu.ssse3;
  if (is("sse3")) return cpu.sse3;
  if (is("sse2")) return cpu.sse2;
  if (is("neon64")) return cpu.neon64;
  if (is("neon")) return cpu.neon;
  return false;
}

// Picks, once (at construction), the entry with the highest version that the CPU supports.
template <class Args>
class simd_dispatch {
 public:
  explicit simd_dispatch(std::span<const simd_entry<Args>> entries) noexcept : chosen_(select(entries)) {}

  [[nodiscard]] static const simd_entry<Args>* select(std::span<const simd_entry<Args>> entries) noexcept {
    const simd_entry<Args>* best = nullptr;
    for (const simd_entry<Args>& e : entries) {
      if (e.run == nullptr || !cpu_has_arch(e.arch)) continue;
      if (best == nullptr || e.version > best->version) best = &e;
    }
    return best;
  }

  // The chosen entry, null when no entry runs on this CPU.
  [[nodiscard]] const simd_entry<Args>* chosen() const noexcept { return chosen_; }
  [[nodiscard]] const char* arch() const noexcept { return chosen_ != nullptr ? chosen_->arch : "none"; }

  [[nodiscard]] std::size_t workspace_bytes(const problem& p, std::int32_t threads = 1) const noexcept {
    return chosen_ != nullptr ? chosen_->workspace_bytes(p, threads) : 0;
  }
  [[nodiscard]] status run(const Args& a, std::span<std::byte> workspace, std::int32_t threads = 1) const noexcept {
    if (chosen_ == nullptr) return status::error(status_code::unsupported, "no compiled simd arch runs on this CPU");
    return chosen_->run(a, workspace, threads);
  }

 private:
  const simd_entry<Args>* chosen_ = nullptr;
};

}  // namespace skim::exec
