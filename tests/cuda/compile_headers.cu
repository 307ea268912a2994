// Compile-only: skim's headers, included through skim/cuda.cuh, build as CUDA C++20 for
// every architecture in tests/cuda/CMakeLists.txt (host and device passes), and a
// SKIM_HOST_DEVICE function is callable from a kernel. Nothing here runs.
#include <skim/cuda.cuh>

namespace skim_cuda_check {

// Constant evaluation of skim code inside a .cu translation unit.
static_assert(skim::half::from_float(1.0f).bits == 0x3c00);
static_assert(skim::bfloat16::from_float(1.0f).bits == 0x3f80);

SKIM_HOST_DEVICE inline float twice(float x) { return 2.0f * x; }

__global__ void twice_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = twice(in[i]);
}

}  // namespace skim_cuda_check
