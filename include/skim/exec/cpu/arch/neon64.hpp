#pragma once
// NEON on AArch64: int8, fp8 e4m3, fp16 and bf16 widened to float in registers, and 4
// accumulators per row (32 vector registers). xsimd::fma is vfmaq_f32 here already.

#include "skim/exec/cpu/arch/generic.hpp"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#include <cstring>

namespace skim::exec::simd_arch {

constexpr std::int32_t accumulators_per_row(requires_arch<xsimd::neon64>) noexcept { return 4; }

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const std::int8_t* p, requires_arch<xsimd::neon64>) noexcept {
  std::int32_t four;
  std::memcpy(&four, p, sizeof(four));  // exactly the 4 bytes of one register
  const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
}

// The exact bit conversion of generic.hpp (Armv8.0 NEON has no fp8 instruction).
template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const fp8_e4m3* p, requires_arch<xsimd::neon64>) noexcept {
  std::uint32_t four;
  std::memcpy(&four, p, sizeof(four));  // exactly the 4 bytes of one register
  const uint16x8_t wide = vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(four)));
  return fp8_e4m3_bits_to_float<Arch>(ubatch<Arch>(vmovl_u16(vget_low_u16(wide))));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const half* p, requires_arch<xsimd::neon64>) noexcept {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p))));
}

template <class Arch>
SKIM_FORCEINLINE fbatch<Arch> load_float(const bfloat16* p, requires_arch<xsimd::neon64>) noexcept {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p)), 16));
}

}  // namespace skim::exec::simd_arch
#endif
