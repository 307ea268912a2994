// cuda::prefill over a gpu::request (cuda_request.hpp), for run_cuda.cu. nvcc only.
#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "cuda_args.cuh"
#include "cuda_request.hpp"
#include "skim/exec/cuda/prefill.cuh"

namespace skim_torch::gpu {

skim::status run_prefill(const request& r, std::span<std::byte> workspace, cudaStream_t stream) noexcept {
  const skim::cuda::prefill pre;
  return detail::with_args(r, [&](const auto& a) { return pre.run(a, workspace, stream); });
}

}  // namespace skim_torch::gpu
