// skim_torch's routed decode step: skim::cuda::decode_step over a gpu::step_request
// (cuda_request.hpp). nvcc only; ops_cuda.cpp is the PyTorch side.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda_args.cuh"
#include "cuda_request.hpp"
#include "skim/core/cuda/launch.cuh"
#include "skim/decode_step.cuh"

namespace skim_torch::gpu {
namespace {

namespace sc = skim::cuda;

sc::decode_step_config config_of(const step_request& r) noexcept {
  return {.prob = detail::problem_of(r.attention),
          .top_k = r.top_k,
          .sink_blocks = r.sink_blocks,
          .local_blocks = r.local_blocks};
}

// f(step, kv, q, o) with the planned decode_step of r's element type and its K/V source.
template <class F>
skim::status with_step(const step_request& r, F&& f) {
  return detail::with_element(r.attention, "the CUDA decode step's kernels", [&]<class T>(T*) {
    sc::decode_step<T> step;
    SKIM_TRY(step.plan(config_of(r), {static_cast<std::byte*>(r.state), r.state_bytes}));
    return detail::with_source<T>(r.attention, [&](const auto& kv) {
      return f(step, kv, detail::q_view<T>(r.attention), detail::o_view<T>(r.attention));
    });
  });
}

}  // namespace

skim::status step_state_bytes(const step_request& r, std::size_t& bytes) noexcept {
  const sc::decode_step_config c = config_of(r);
  bytes = 0;
  sc::decode_step<skim::bfloat16> step;  // the layout does not depend on the element type of Q and O
  bytes = step.device_bytes(c);
  if (bytes == 0) {  // plan() on no memory names what it refuses
    const skim::status s = step.plan(c, {});
    return s.ok() ? skim::status::error(skim::status_code::invalid_argument, "decode step: no state to plan") : s;
  }
  return skim::status::success();
}

skim::status step_width(const step_request& r, std::int32_t& width) noexcept {
  return with_step(r, [&](const auto& step, const auto&, const auto&, const auto&) {
    width = step.table().width;
    return skim::status::success();
  });
}

skim::status step_prefill(const step_request& r, cudaStream_t stream) noexcept {
  return with_step(r, [&](const auto& step, const auto& kv, const auto&, const auto&) { return step.prefill(kv, stream); });
}

skim::status step_run(const step_request& r, std::int32_t* ids, std::int32_t* count, std::int32_t& width,
                      cudaStream_t stream) noexcept {
  return with_step(r, [&](const auto& step, const auto& kv, const auto& q, const auto& o) {
    SKIM_TRY(step.run(q, kv, o, r.attention.lse, stream));
    const sc::device_block_table t = step.table();
    width = t.width;
    SKIM_TRY(sc::check(cudaMemcpyAsync(ids, t.ids, sizeof(std::int32_t) * t.rows * t.width, cudaMemcpyDeviceToDevice,
                                       stream), "decode step: copy of the selected ids"));
    return sc::check(cudaMemcpyAsync(count, t.count, sizeof(std::int32_t) * t.rows, cudaMemcpyDeviceToDevice, stream),
                     "decode step: copy of the counts");
  });
}

}  // namespace skim_torch::gpu
