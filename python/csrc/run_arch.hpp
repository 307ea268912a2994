#pragma once
// exec::simd<Arch> over a request. Included only by run_<arch>.cpp, each compiled with its arch's
// flags, so that every instantiation of simd<Arch> lives in the one translation unit built for it.

#include <cstdint>
#include <span>

#include <xsimd/xsimd.hpp>

#include "request.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/simd.hpp"

namespace skim_torch::detail {

template <class Arch>
[[nodiscard]] skim::status run_simd_arch(const request& r, std::int32_t threads) {
  const skim::exec::simd<Arch> exec;
  if (threads < 1) threads = 1;
  // Allocated per call (the operators are not the hot path of an engine that plans its workspace).
  skim::workspace_buffer workspace(exec.workspace_bytes(r.prob, threads));
  return visit(r, [&](const auto& args) {
    return threads == 1 ? exec.run(args, workspace.span()) : exec.run(args, workspace.span(), threads);
  });
}

}  // namespace skim_torch::detail
