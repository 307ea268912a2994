#pragma once
// PTX wrappers for Hopper's warpgroup matrix multiply (wgmma, sm_90a) and the shared-memory
// barriers (mbarrier) that pipeline it: what prefill_sm90.cuh needs, nothing more.
//
// wgmma.mma_async m64nNk16 (N = 64 or 128), fp32 accumulators, bf16 or fp16 inputs:
//   mma_ss: A and B from shared memory, both K-major (no transpose);
//   mma_rs: A from registers (the mma.sync m16n8k16 A layout per warp, warp w of the warpgroup
//           holding rows 16w..16w+15), B from shared memory MN-major (transposed).
// Accumulator layout (PTX ISA, "wgmma .m64nNk16 register fragment D"): warp w of the warpgroup
// owns rows 16w + [0, 16); in it, registers 4j..4j+3 of lane l hold columns 8j + 2(l % 4) + {0, 1}
// of rows l / 4 (registers 4j, 4j + 1) and l / 4 + 8 (4j + 2, 4j + 3), as mma.sync's C tiles do.
//
// Shared-memory operands are described by 64-bit descriptors (PTX ISA, "matrix descriptor"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle (1 = 128-byte). With the 128-byte swizzle, the unit is an atom of 8 rows of 128
// bytes (1024 bytes, 1024-aligned) whose 16-byte chunk c of row r sits at chunk c ^ (r % 8):
//   K-major: rows are M/N, the 128 bytes are 64 K elements; SBO = bytes between 8-row groups,
//            LBO unused; a K step of 16 elements inside the atom adds 32 bytes to the start.
//   MN-major: rows are K, the 128 bytes are 64 M/N elements; SBO = bytes between 8-row (K)
//            groups, LBO = bytes between 64-element M/N blocks.
//
// Everything here compiles for every target; the sm_90a instructions exist only where
// __CUDA_ARCH_FEAT_SM90_ALL is defined (an sm_90a device pass), elsewhere the bodies trap, so the
// sm_80 build of a header that includes this one links and a kernel never runs them.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "skim/core/dtypes.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SKIM_WGMMA_AVAILABLE 1
#else
#define SKIM_WGMMA_AVAILABLE 0
#endif

// An sm_90a instruction; nothing where it does not exist (the kernels that use it never run there).
#if SKIM_WGMMA_AVAILABLE
#define SKIM_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define SKIM_SM90_ASM(...) ((void)0)
#endif

namespace skim::cuda::wgmma {

// Descriptor of a 128-byte-swizzled operand starting at shared address `addr` (16-byte units are
// taken; the atom the address lies in must be 1024-aligned).
[[nodiscard]] __device__ __forceinline__ std::uint64_t desc_sw128(std::uint32_t addr, std::uint32_t lbo,
                                                                  std::uint32_t sbo) noexcept {
  return static_cast<std::uint64_t>((addr >> 4) & 0x3fffu) |
         (static_cast<std::uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (std::uint64_t{1} << 62);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void fence() noexcept { SKIM_SM90_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() noexcept { SKIM_SM90_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() noexcept {
  SKIM_SM90_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator register across a wgmma boundary.
__device__ __forceinline__ void pin(float& x) noexcept { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(std::uint32_t& x) noexcept { asm volatile("" : "+r"(x)::"memory"); }

// Shared memory written through the generic proxy (st.shared, cp.async) becomes visible to the
// async proxy (wgmma operand reads) after this fence in the writing thread.
__device__ __forceinline__ void fence_proxy_async() noexcept {
  SKIM_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Register budget of this warpgroup (sm_90a; needs a register cap at kernel entry).
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() noexcept {
  SKIM_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() noexcept {
  SKIM_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

// ---------------------------------------------------------------------------------------------
// mbarrier (sm_80 and later), CTA scope.

__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) noexcept {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrive (release: this thread's earlier writes are visible to a thread that waits on the phase).
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) noexcept {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) noexcept {
  asm volatile(
      "{\n.reg .pred done;\n"
      "skim_mbar_wait:\n"  // labels are local to the { } block
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra skim_mbar_wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arrive and raise the phase's expected transaction bytes (the bulk copies that complete on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) noexcept {
  SKIM_SM90_ASM("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
                "r"(bytes)
                : "memory");
}

// Tensor copy (TMA, sm_90) of the box at coordinates (c0, c1, c2) of the 3-d tensor map `map` (a
// __grid_constant__ kernel parameter) into shared memory at `dst`, completing on mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(std::uint32_t dst, const void* map, std::int32_t c0, std::int32_t c1,
                                            std::int32_t c2, std::uint32_t bar) noexcept {
  SKIM_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// 16 bytes global → shared, asynchronously; src_bytes 0 reads nothing and writes zeros.
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, std::uint32_t src_bytes) noexcept {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async m64nNk16, d (+)= a · b; scale_d 0 overwrites d. T is skim::bfloat16 or skim::half.
// Inline PTX spells every accumulator register: the lists are written once here, and one macro
// builds each instruction from its shape, input type, operand numbers and flags.

#define SKIM_WGMMA_D32_REGS "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SKIM_WGMMA_D64_REGS SKIM_WGMMA_D32_REGS ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SKIM_WGMMA_D32_ARGS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SKIM_WGMMA_D64_ARGS(d) \
  SKIM_WGMMA_D32_ARGS(d), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
// SHAPE "m64nNk16", TYPE "bf16"/"f16", D the accumulator list, AB the A and B operands, SCALE the
// scale_d operand (a predicate: 0 overwrites d), FLAGS the immediate scales (and transposes).
#define SKIM_WGMMA(SHAPE, TYPE, D, AB, SCALE, FLAGS)                                            \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                          \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" D "}, " AB ", p, " FLAGS ";\n}\n"

// The instruction for T's input type, accumulating into the N (32 or 64) floats of d; the inputs
// follow the flags as asm operands.
#define SKIM_WGMMA_FOR(T, d, N, SHAPE, AB, SCALE, FLAGS, ...)                                                    \
  if constexpr (std::is_same_v<T, skim::bfloat16>) {                                                            \
    asm volatile(SKIM_WGMMA(SHAPE, "bf16", SKIM_WGMMA_D##N##_REGS, AB, SCALE, FLAGS) : SKIM_WGMMA_D##N##_ARGS(d) \
                 : __VA_ARGS__);                                                                                \
  } else {                                                                                                      \
    asm volatile(SKIM_WGMMA(SHAPE, "f16", SKIM_WGMMA_D##N##_REGS, AB, SCALE, FLAGS) : SKIM_WGMMA_D##N##_ARGS(d)  \
                 : __VA_ARGS__);                                                                                \
  }

// Where wgmma does not exist (sm_80, the host pass) the wrappers trap; they are never launched there.
template <class... Operands>
__device__ __forceinline__ void wgmma_unavailable(const Operands&...) noexcept {
  __trap();
}

// R = 32 accumulators per thread is m64n64k16, R = 64 is m64n128k16.
template <int R>
inline constexpr bool wgmma_accumulators = R == 32 || R == 64;

// A and B from shared memory (descriptors), both K-major: flags scale-a 1, scale-b 1, no transposes.
template <class T, int R>
__device__ __forceinline__ void mma_ss(float (&d)[R], std::uint64_t a, std::uint64_t b, std::uint32_t scale_d) noexcept {
  static_assert(wgmma_accumulators<R>);
#if SKIM_WGMMA_AVAILABLE
  if constexpr (R == 32) {
    SKIM_WGMMA_FOR(T, d, 32, "m64n64k16", "%32, %33", "%34", "1, 1, 0, 0", "l"(a), "l"(b), "r"(scale_d))
  } else {
    SKIM_WGMMA_FOR(T, d, 64, "m64n128k16", "%64, %65", "%66", "1, 1, 0, 0", "l"(a), "l"(b), "r"(scale_d))
  }
#else
  wgmma_unavailable(d, a, b, scale_d);
#endif
}

// A from registers (4 words of the thread's fragment), B from shared memory MN-major: flags
// scale-a 1, scale-b 1, B transposed.
template <class T, int R>
__device__ __forceinline__ void mma_rs(float (&d)[R], const std::uint32_t (&a)[4], std::uint64_t b, std::uint32_t scale_d) noexcept {
  static_assert(wgmma_accumulators<R>);
#if SKIM_WGMMA_AVAILABLE
#define SKIM_WGMMA_A_ARGS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
  if constexpr (R == 32) {
    SKIM_WGMMA_FOR(T, d, 32, "m64n64k16", "{%32, %33, %34, %35}, %36", "%37", "1, 1, 1", SKIM_WGMMA_A_ARGS, "l"(b), "r"(scale_d))
  } else {
    SKIM_WGMMA_FOR(T, d, 64, "m64n128k16", "{%64, %65, %66, %67}, %68", "%69", "1, 1, 1", SKIM_WGMMA_A_ARGS, "l"(b), "r"(scale_d))
  }
#undef SKIM_WGMMA_A_ARGS
#else
  wgmma_unavailable(d, a, b, scale_d);
#endif
}

#undef SKIM_WGMMA_FOR
#undef SKIM_SM90_ASM
#undef SKIM_WGMMA
#undef SKIM_WGMMA_D64_ARGS
#undef SKIM_WGMMA_D32_ARGS
#undef SKIM_WGMMA_D64_REGS
#undef SKIM_WGMMA_D32_REGS

}  // namespace skim::cuda::wgmma
