#pragma once
// PTX wrappers the CUDA kernels share (prefill_sm80.cuh, decode_simt.cuh, decode_mma.cuh, the routed
// score kernel): cp.async copies and loads under an L2 policy, ldmatrix, movmatrix, mma.sync m16n8k16,
// ex2.approx, 16-bit packing, and a compile-time unrolled loop. sm_80 and later.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "skim/core/dtypes.hpp"

namespace skim::cuda::ptx {

[[nodiscard]] __device__ __forceinline__ std::uint32_t smem_u32(const void* p) noexcept {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, asynchronously (complete after cp_async_commit + cp_async_wait).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) noexcept {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) noexcept { cp_async_16(smem_u32(dst), src); }
// An L2 cache policy (createpolicy, sm_80 and later) for bytes a launch reads once (K/V, summary
// records): evict_first marks their lines as the first to go, so that the small tensors every launch
// reads first (sequence lengths, index rows, Q) are still in L2 at the next launch rather than
// flushed by the stream (launch.cuh: streams_past_l2 decides); else evict_normal, as a plain load.
// Created once per thread and passed to the copies below.
[[nodiscard]] __device__ __forceinline__ std::uint64_t l2_policy(bool evict_first) noexcept {
  std::uint64_t first, normal;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(first));
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(normal));
  return evict_first ? first : normal;
}
// cp_async_16 under an L2 policy (l2_policy).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, std::uint64_t policy) noexcept {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy)
               : "memory");
}
// 16 bytes global → registers under an L2 policy: a plain, coherent load (the bytes may have been
// written earlier in the same kernel, before a barrier). volatile keeps it after that barrier; with no
// memory clobber the compiler may still schedule other loads around it.
[[nodiscard]] __device__ __forceinline__ uint4 ld_16(const void* src, std::uint64_t policy) noexcept {
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src), "l"(policy));
  return v;
}
// 8 bytes global → shared (through L1: .cg takes 16-byte copies only).
__device__ __forceinline__ void cp_async_8(void* dst, const void* src) noexcept {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() noexcept { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() noexcept {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void zero_16(std::uint32_t dst) noexcept {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) noexcept {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) noexcept {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The 8 x 8 16-bit matrix held one 32-bit pair per lane (lane l: row l / 4, columns 2 (l % 4) and
// + 1, the lower column in the low half), transposed, in the same layout. sm_75 and later.
[[nodiscard]] __device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) noexcept {
  std::uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// c += a · b on one 16x8x16 tile, fp32 accumulation.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) noexcept {
  if constexpr (std::is_same_v<T, skim::bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// f(std::integral_constant<int, 0>{}) ... f(std::integral_constant<int, N - 1>{}): unrolled, with
// the index usable as a template argument.
template <class F, int... I>
__device__ __forceinline__ void static_for_each(F& f, std::integer_sequence<int, I...>) noexcept {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) noexcept {
  static_for_each(f, std::make_integer_sequence<int, N>{});
}

// 2^x; ex2.approx(-inf) = +0, which masked scores rely on.
[[nodiscard]] __device__ __forceinline__ float exp2_approx(float x) noexcept {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to T, lo in the low half (the lower column of a fragment pair).
template <class T>
[[nodiscard]] __device__ __forceinline__ std::uint32_t pack2(float lo, float hi) noexcept {
  if constexpr (std::is_same_v<T, skim::bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

}  // namespace skim::cuda::ptx
