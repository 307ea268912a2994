#pragma once
// The host side of running skim's kernels: CUDA errors as skim::status, what run() asks of the
// current device (queried once per device), and kernel launches through cudaLaunchKernelEx with
// the attributes skim uses (thread block clusters). core/cuda/common.cuh includes it.

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <utility>

#include "skim/core/status.hpp"

namespace skim::cuda {

// ---------------------------------------------------------------------------------------------
// Errors

// status for a CUDA runtime result; `where` names the call ("cudaMemsetAsync in decode::run").
[[nodiscard]] inline status check(cudaError_t e, const char* where) noexcept {
  if (e == cudaSuccess) return status::success();
  return status::error(status_code::device_error, "%s: %s (%s)", where, cudaGetErrorName(e), cudaGetErrorString(e));
}

// status of the launch just made (configuration errors surface here, not at the launch).
[[nodiscard]] inline status check_launch(const char* kernel) noexcept {
  return check(cudaGetLastError(), kernel);
}

// ---------------------------------------------------------------------------------------------
// What the executors' run() asks of the current device on every call, queried once per device
// (attribute queries and cudaFuncSetAttribute cost host microseconds per call otherwise: a few
// per layer and step for an engine that does not capture graphs). Thread-safe; devices numbered
// from max_devices on are queried each time.

inline constexpr int max_devices = 64;

// query(value) once per device: the value and the CUDA error of the first call are kept and copied
// out on every later call for that device (call_once: thread-safe). Each call site's Query is a
// lambda of its own type, so each keeps its own cache. Devices from max_devices on run query each time.
template <class Value, class Query>
[[nodiscard]] inline cudaError_t once_per_device(int device, Value& out, Query&& query) noexcept {
  if (device < 0 || device >= max_devices) return query(out);
  static Value values[max_devices];
  static cudaError_t errors[max_devices];
  static std::once_flag once[max_devices];
  std::call_once(once[device], [&] { errors[device] = query(values[device]); });
  out = values[device];
  return errors[device];
}

struct device_facts {
  int device = 0;
  int major = 0;       // compute capability
  int minor = 0;
  int smem_optin = 0;  // bytes of dynamic shared memory a block may opt in to
  int l2_bytes = 0;    // the L2 cache's size
};

// Whether a launch that reads `bytes` once should mark them evict-first in L2 (ptx.cuh, l2_policy): it
// reads at least half of L2, so its lines would not outlive it, and the small tensors the next launch
// reads first (sequence lengths, index rows, Q) should. A smaller launch leaves L2's policy alone: its
// bytes may still be there when the same launch runs again (a decode step at small batch, re-read by
// the next token's step when nothing larger ran between).
[[nodiscard]] inline bool streams_past_l2(std::size_t bytes, const device_facts& d) noexcept {
  return d.l2_bytes > 0 && bytes >= static_cast<std::size_t>(d.l2_bytes) / 2;
}

// The current device's facts.
[[nodiscard]] inline status current_device(device_facts& out, const char* where) noexcept {
  int device = 0;
  SKIM_TRY(check(cudaGetDevice(&device), where));
  return check(once_per_device(device, out,
                               [device](device_facts& f) {
                                 f.device = device;
                                 cudaError_t e = cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device);
                                 if (e == cudaSuccess) {
                                   e = cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device);
                                 }
                                 if (e == cudaSuccess) {
                                   e = cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                              device);
                                 }
                                 if (e == cudaSuccess) {
                                   e = cudaDeviceGetAttribute(&f.l2_bytes, cudaDevAttrL2CacheSize, device);
                                 }
                                 return e;
                               }),
               where);
}

// streams_past_l2 for the current device: `out` says whether a launch reading `bytes` once should mark
// them evict-first.
[[nodiscard]] inline status streams_past_l2(std::size_t bytes, bool& out, const char* where) noexcept {
  device_facts d;
  SKIM_TRY(current_device(d, where));
  out = streams_past_l2(bytes, d);
  return status::success();
}

// Lets Kernel launch with up to all the dynamic shared memory the device allows (its opt-in limit
// less the kernel's static shared memory), once per kernel and device. The attribute is a cap, not
// a reservation: occupancy still follows each launch's own size.
template <auto Kernel>
[[nodiscard]] inline status allow_dynamic_smem(const device_facts& d, const char* where) noexcept {
  bool done = false;
  return check(once_per_device(d.device, done,
                               [&d](bool& set) {
                                 cudaFuncAttributes attr{};
                                 cudaError_t e = cudaFuncGetAttributes(&attr, Kernel);
                                 const int room = d.smem_optin - static_cast<int>(attr.sharedSizeBytes);
                                 if (e == cudaSuccess) {
                                   e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, room);
                                 }
                                 set = e == cudaSuccess;
                                 return e;
                               }),
               where);
}

// ---------------------------------------------------------------------------------------------
// Launches

// How a kernel is launched beyond its grid, block and dynamic shared memory.
struct launch_shape {
  dim3 grid{1, 1, 1};
  dim3 block{1, 1, 1};
  std::size_t smem = 0;
  unsigned cluster_x = 1;  // > 1: CTAs x·c .. x·c + c - 1 of a (y, z) are one thread block cluster (sm_90+)
};

// kernel(args...) on `stream` as `shape` says, by cudaLaunchKernelEx; `where` names it in errors.
template <class... Params, class... Args>
[[nodiscard]] inline status launch(void (*kernel)(Params...), const launch_shape& shape, cudaStream_t stream,
                                   const char* where, Args&&... args) noexcept {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = shape.cluster_x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem;
  config.stream = stream;
  config.attrs = shape.cluster_x > 1 ? &cluster : nullptr;
  config.numAttrs = shape.cluster_x > 1 ? 1 : 0;
  SKIM_TRY(check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), where));
  return check_launch(where);
}

// How many thread block clusters of shape.cluster_x CTAs of Kernel can run at once on the device
// (cudaOccupancyMaxActiveClusters; 0 when none can), for cluster sizes up to 8. Queried once per
// kernel and device, with the block and shared memory of the first call: a later call with other
// sizes gets that answer (callers use it to choose between two correct launches, never for
// correctness). @pre allow_dynamic_smem<Kernel> was called
template <auto Kernel>
[[nodiscard]] inline status max_active_clusters(const device_facts& d, const launch_shape& shape, int& out) noexcept {
  constexpr unsigned max_size = 8;
  out = 0;
  if (shape.cluster_x < 1 || shape.cluster_x > max_size || d.major < 9) return status::success();
  struct fits {
    int clusters[max_size + 1] = {};
  };
  fits f;
  SKIM_TRY(check(once_per_device(d.device, f,
                                 [&shape](fits& r) {
                                   for (unsigned c = 1; c <= max_size; ++c) {
                                     cudaLaunchAttribute attr{};
                                     attr.id = cudaLaunchAttributeClusterDimension;
                                     attr.val.clusterDim.x = c;
                                     attr.val.clusterDim.y = 1;
                                     attr.val.clusterDim.z = 1;
                                     cudaLaunchConfig_t config{};
                                     config.gridDim = dim3(c, 1, 1);
                                     config.blockDim = shape.block;
                                     config.dynamicSmemBytes = shape.smem;
                                     config.attrs = &attr;
                                     config.numAttrs = 1;
                                     const cudaError_t e = cudaOccupancyMaxActiveClusters(&r.clusters[c], Kernel, &config);
                                     if (e != cudaSuccess) return e;
                                   }
                                   return cudaSuccess;
                                 }),
                 "cudaOccupancyMaxActiveClusters"));
  out = f.clusters[shape.cluster_x];
  return status::success();
}

}  // namespace skim::cuda
