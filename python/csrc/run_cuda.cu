// skim_torch's CUDA path: the choice of executor, and cuda::decode over a gpu::request
// (cuda_request.hpp); cuda::prefill's instantiations are in run_cuda_prefill.cu (compiled in
// parallel). Compiled by nvcc without any PyTorch header; ops_cuda.cpp is the PyTorch side.
#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "cuda_args.cuh"
#include "cuda_request.hpp"
#include "skim/exec/cuda/decode.cuh"
#include "skim/exec/cuda/prefill.cuh"

namespace skim_torch::gpu {

// run_cuda_prefill.cu
skim::status run_prefill(const request& r, std::span<std::byte> workspace, cudaStream_t stream) noexcept;

skim::status plan(const request& r, executor& chosen, std::size_t& workspace_bytes) noexcept {
  workspace_bytes = 0;
  const skim::cuda::device_problem p = detail::problem_of(r);
  if (r.exec == executor::decode || r.exec == executor::automatic) {
    const skim::cuda::decode dec;
    const skim::status s = dec.can_implement(p);
    if (s.ok()) {
      chosen = executor::decode;
      workspace_bytes = dec.workspace_bytes(p, detail::max_selected(r, p));
      return skim::status::success();
    }
    if (r.exec == executor::decode) return s;
  }
  SKIM_TRY(skim::cuda::prefill{}.can_implement(p));
  chosen = executor::prefill;
  return skim::status::success();
}

skim::status run(const request& r, executor chosen, void* workspace, std::size_t workspace_bytes,
                 cudaStream_t stream) noexcept {
  const std::span<std::byte> ws{static_cast<std::byte*>(workspace), workspace_bytes};
  if (chosen != executor::decode) return run_prefill(r, ws, stream);
  const skim::cuda::decode dec;
  return detail::with_args(r, [&](const auto& a) { return dec.run(a, detail::max_selected(r, a.prob), ws, stream); });
}

}  // namespace skim_torch::gpu
