// exec::reference (double precision), exec::scalar, and the choice of simd arch. Built with the
// baseline flags; it calls the arch translation units only for archs the CPU has.
#include <cstdint>
#include <span>

#include "request.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/dispatch.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"

namespace skim_torch {

// Defined in run_<arch>.cpp; the avx ones only where CMakeLists.txt built them (SKIM_TORCH_X86).
#if defined(SKIM_TORCH_X86)
skim::status run_simd_avx512(const request& r, std::int32_t threads);
skim::status run_simd_avx2(const request& r, std::int32_t threads);
#endif
skim::status run_simd_baseline(const request& r, std::int32_t threads);
const char* simd_baseline_name() noexcept;

namespace {

using simd_fn = skim::status (*)(const request&, std::int32_t);

struct simd_choice {
  const char* arch;
  simd_fn run;
};

// The best compiled arch this CPU runs (skim::exec::cpu_has_arch), picked once.
const simd_choice& chosen() {
  static const simd_choice choice = [] {
#if defined(SKIM_TORCH_X86)
    if (skim::exec::cpu_has_arch("avx512f")) return simd_choice{"avx512f", &run_simd_avx512};
    if (skim::exec::cpu_has_arch("avx2")) return simd_choice{"avx2", &run_simd_avx2};
#endif
    return simd_choice{simd_baseline_name(), &run_simd_baseline};
  }();
  return choice;
}

}  // namespace

skim::status run_reference(const request& r) {
  const skim::exec::reference exec;
  return visit(r, [&](const auto& args) { return exec.run(args, {}); });
}

skim::status run_scalar(const request& r) {
  const skim::exec::scalar exec;
  skim::workspace_buffer workspace(exec.workspace_bytes(r.prob));
  return visit(r, [&](const auto& args) { return exec.run(args, workspace.span()); });
}

skim::status run_simd(const request& r, std::int32_t threads) { return chosen().run(r, threads); }

const char* simd_arch() noexcept { return chosen().arch; }

}  // namespace skim_torch
