#pragma once
// Quantised K/V on the device: 8-bit codes (std::int8_t, or skim::fp8_e4m3) in a contiguous or
// paged source, with a float scale per (sequence, key block, kv head) for K and for V. The value of
// element e of key t of sequence b, head h is
//
//   scale(b, t / block_kv, h) · to_float(code[t, h, e])
//
// as on the CPU (core/quantized.hpp), with the scales addressed by three strides so that each of
// the layouts engines keep works unchanged:
//
//   per_block(codes, ks, vs, max_kv_blocks, heads_kv)  ks, vs: [batch, max_kv_blocks, heads_kv], the
//                                                      summaries' layout (fixed room per sequence,
//                                                      so a graph keeps its pointers as sequences grow)
//   per_head(codes, ks, vs)                            ks, vs: [heads_kv] (one scale per head)
//   any strides ≥ 0                                    a per-tensor scale is strides 0, 0, 0
//
// Executors that read a quantised source (cuda::decode's two split kernels, cuda::prefill's
// mma.sync kernel, cuda::token_decode, the device summaries) fold the scales into their fp32
// arithmetic; they never read a scale for a block outside the
// sequence's visible blocks. Scale content is not checked (a NaN scale gives NaN outputs, as a NaN
// key would); the arrays must hold every (b < batch, j < max_kv_blocks, h < heads_kv) entry their
// strides address.
//
//   skim::cuda::device_contiguous_kv<skim::fp8_e4m3> codes{k8, v8, token_stride, head_stride};
//   auto kv = skim::cuda::device_quantized_kv<decltype(codes)>::per_block(codes, ks, vs, max_blocks, heads_kv);
//   // a device_attention_args<bfloat16, decltype(kv), Index, bfloat16> for cuda::decode

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/core/dtypes.hpp"
#include "skim/core/status.hpp"

namespace skim::cuda {

// Codes a quantised source may hold.
template <class T>
inline constexpr bool is_device_code_v = std::is_same_v<T, std::int8_t> || std::is_same_v<T, fp8_e4m3>;
static_assert(sizeof(fp8_e4m3) == 1);

template <class Source>
struct device_quantized_kv {
  using source_type = Source;
  using value_type = typename Source::value_type;
  static_assert(is_device_code_v<value_type>, "quantised K/V codes are std::int8_t or skim::fp8_e4m3");
  static constexpr bool quantized = true;

  Source codes;                          // device_contiguous_kv<Code> or device_paged_kv<Code>
  const float* k_scales = nullptr;       // device
  const float* v_scales = nullptr;       // device
  std::int64_t scale_seq_stride = 0;     // floats between sequences
  std::int64_t scale_block_stride = 0;   // floats between key blocks of a sequence
  std::int64_t scale_head_stride = 0;    // floats between kv heads

  // Scales [batch, max_kv_blocks, heads_kv] (max_kv_blocks >= device_problem::max_kv_blocks()).
  [[nodiscard]] static constexpr device_quantized_kv per_block(const Source& s, const float* ks, const float* vs,
                                                               std::int32_t max_kv_blocks,
                                                               std::int32_t heads_kv) noexcept {
    return {s, ks, vs, static_cast<std::int64_t>(max_kv_blocks) * heads_kv, heads_kv, 1};
  }
  // Scales [heads_kv]: one per kv head for every block of every sequence.
  [[nodiscard]] static constexpr device_quantized_kv per_head(const Source& s, const float* ks,
                                                              const float* vs) noexcept {
    return {s, ks, vs, 0, 0, 1};
  }

  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t scale_index(std::int32_t b, std::int32_t j,
                                                                    std::int32_t h) const noexcept {
    return b * scale_seq_stride + j * scale_block_stride + h * scale_head_stride;
  }
};

template <class S>
inline constexpr bool is_device_quantized_kv_v = requires { requires S::quantized; };

template <class Source>
[[nodiscard]] inline status validate(const device_quantized_kv<Source>& s, const device_problem& p) noexcept {
  SKIM_TRY(validate(s.codes, p));
  if (s.scale_seq_stride < 0 || s.scale_block_stride < 0 || s.scale_head_stride < 0) {
    return status::error(status_code::invalid_argument, "quantised K/V scale strides (sequence %lld, block %lld, "
                         "head %lld) are negative", static_cast<long long>(s.scale_seq_stride),
                         static_cast<long long>(s.scale_block_stride), static_cast<long long>(s.scale_head_stride));
  }
  if (p.batch > 0 && (s.k_scales == nullptr || s.v_scales == nullptr)) {
    return status::error(status_code::invalid_argument, "quantised K/V scales are null");
  }
  return status::success();
}

// Eight codes (8 bytes, lowest address first) to floats, exactly: int8 by conversion, e4m3 through
// fp16 (every e4m3 value is an fp16 value; cvt.rn.f16x2.e4m3x2 on sm_89 and later).
template <class T>
__device__ __forceinline__ void widen8_codes(uint2 w, float* f) noexcept {
  if constexpr (std::is_same_v<T, std::int8_t>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[i] = static_cast<float>(static_cast<std::int8_t>(w.x >> (8 * i)));
      f[4 + i] = static_cast<float>(static_cast<std::int8_t>(w.y >> (8 * i)));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t word = i < 2 ? w.x : w.y;
      const auto pair = static_cast<__nv_fp8x2_storage_t>(word >> (16 * (i % 2)));
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      __half2 h;
      static_assert(sizeof h == sizeof raw);
      memcpy(&h, &raw, sizeof raw);
      const float2 v = __half22float2(h);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

// Two codes (the low 16 bits of `codes`, the first in the low byte) to two values of the 16-bit
// type T16 (half or bfloat16), exactly, packed as T16x2 (the first in the low half). Every int8 and
// e4m3 value is a half and a bfloat16 value. int8 → half: the byte biased by 128 into the low
// mantissa of 1024 (prmt) minus 1152; int8 → bfloat16: the same into 2^23 in fp32, minus 2^23 +
// 128, then packed; e4m3 → half: cvt.rn.f16x2.e4m3x2; e4m3 → bfloat16: through fp32.
template <class T16, class Code>
[[nodiscard]] __device__ __forceinline__ std::uint32_t widen2(std::uint32_t codes) noexcept {
  std::uint32_t pair;
  if constexpr (std::is_same_v<Code, std::int8_t>) {
    const std::uint32_t x = codes ^ 0x8080u;  // b + 128 in each byte
    if constexpr (std::is_same_v<T16, half>) {
      const std::uint32_t biased = __byte_perm(x, 0x64646464u, 0x4140u);
      __half2 h;
      memcpy(&h, &biased, sizeof h);
      h = __hsub2(h, __floats2half2_rn(1152.0f, 1152.0f));
      memcpy(&pair, &h, sizeof pair);
    } else {
      const float a = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7540u)) - 8388736.0f;
      const float b = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7541u)) - 8388736.0f;
      const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
      memcpy(&pair, &v, sizeof pair);
    }
  } else {
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
    if constexpr (std::is_same_v<T16, half>) {
      memcpy(&pair, &raw, sizeof pair);
    } else {
      __half2 h;
      memcpy(&h, &raw, sizeof h);
      const __nv_bfloat162 v = __float22bfloat162_rn(__half22float2(h));
      memcpy(&pair, &v, sizeof pair);
    }
  }
  return pair;
}

// Sixteen codes (one 16-byte chunk) to sixteen values of T16, exactly (widen2), as two 16-byte
// chunks of 8 (the 16-bit tiles of prefill's mma.sync kernel; decode's tensor-core kernel widens
// codes in its fragments with widen2).
template <class T16, class Code>
__device__ __forceinline__ void widen16_codes(const uint4& w, uint4& lo, uint4& hi) noexcept {
  const std::uint32_t in[4] = {w.x, w.y, w.z, w.w};
  std::uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = widen2<T16, Code>(in[i]);
    out[2 * i + 1] = widen2<T16, Code>(in[i] >> 16);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// One code to float (the summaries' per-element reads).
[[nodiscard]] __device__ __forceinline__ float to_float(std::int8_t x) noexcept { return static_cast<float>(x); }
[[nodiscard]] __device__ __forceinline__ float to_float(fp8_e4m3 x) noexcept {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(x.bits, __NV_E4M3);
  return __half2float(__half(raw));
}

}  // namespace skim::cuda
