#pragma once
// Element types for Q, K, V and O: float, fp16 (skim::half) and bf16 (skim::bfloat16); and
// fp8 e4m3 (skim::fp8_e4m3), a code of quantised K/V only (core/quantized.hpp).
//
// half and bfloat16 are storage types: 16 raw bits, converted to float for arithmetic
// (skim always accumulates in float). Conversions from float round to nearest, ties to
// even, keep infinities, keep NaN a NaN (quiet), and produce subnormal halves correctly.

#include <bit>
#include <concepts>
#include <cstdint>

#include "skim/config.hpp"

namespace skim {

struct half {
  std::uint16_t bits = 0;

  [[nodiscard]] static constexpr half from_bits(std::uint16_t b) noexcept { return half{b}; }

  [[nodiscard]] static constexpr half from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or NaN
      const std::uint16_t nan_bit = abs > 0x7f800000u ? 0x0200u : 0u;
      return half{static_cast<std::uint16_t>(sign | 0x7c00u | nan_bit)};
    }
    if (abs >= 0x477ff000u) {  // >= 65520: rounds to inf
      return half{static_cast<std::uint16_t>(sign | 0x7c00u)};
    }
    if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
      if (abs < 0x33000000u) return half{sign};  // < 2^-25 (half of the least subnormal): zero
      const std::uint32_t exp = abs >> 23;       // 102..112
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - exp;    // 14..24
      std::uint32_t h = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
      return half{static_cast<std::uint16_t>(sign | h)};
    }
    // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits.
    std::uint32_t h = ((abs >> 13) - (112u << 10));
    const std::uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach inf: correct
    return half{static_cast<std::uint16_t>(sign | h)};
  }

  [[nodiscard]] constexpr float to_float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exp = (bits >> 10) & 0x1fu;
    std::uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      if (mant == 0) return std::bit_cast<float>(sign);
      // Subnormal half: normalise into a float.
      std::uint32_t e = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      mant &= 0x3ffu;
      return std::bit_cast<float>(sign | (e << 23) | (mant << 13));
    }
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  }

  friend constexpr bool operator==(half, half) = default;
};

struct bfloat16 {
  std::uint16_t bits = 0;

  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept { return bfloat16{b}; }

  [[nodiscard]] static constexpr bfloat16 from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload bit
      return bfloat16{static_cast<std::uint16_t>((x >> 16) | 0x0040u)};
    }
    const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);  // ties to even
    return bfloat16{static_cast<std::uint16_t>((x + rounding) >> 16)};
  }

  [[nodiscard]] constexpr float to_float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }

  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

// fp8 e4m3 as quantised KV caches store it (the OCP "E4M3FN" code, CUDA's __nv_fp8_e4m3): sign,
// 4 exponent bits (bias 7), 3 mantissa bits; subnormals; no infinities; 0x7f and 0xff are NaN;
// the largest finite magnitude is 448. from_float rounds to nearest, ties to even, saturates
// magnitudes beyond 448 (infinities included) to ±448 (CUDA's __NV_SATFINITE) and maps NaN to 0x7f.
// Not an `element`: Q and O are never fp8, and K/V codes are read with their scales.
struct fp8_e4m3 {
  std::uint8_t bits = 0;

  [[nodiscard]] static constexpr fp8_e4m3 from_bits(std::uint8_t b) noexcept { return fp8_e4m3{b}; }

  [[nodiscard]] static constexpr fp8_e4m3 from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return fp8_e4m3{0x7f};                              // NaN
    if (abs >= 0x43e00000u) return fp8_e4m3{static_cast<std::uint8_t>(sign | 0x7eu)};  // >= 448: saturate
    if (abs < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9, rounded
      const float r = std::bit_cast<float>(abs) * 512.0f;  // exact (a power of two, no underflow)
      auto n = static_cast<std::uint32_t>(r);
      const float frac = r - static_cast<float>(n);
      if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;  // n may become 8: the smallest normal, correct
      return fp8_e4m3{static_cast<std::uint8_t>(sign | n)};
    }
    // Normal: rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits (< 448: no overflow).
    std::uint32_t h = (abs >> 20) - (120u << 3);
    const std::uint32_t rem = abs & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (h & 1u))) ++h;
    return fp8_e4m3{static_cast<std::uint8_t>(sign | h)};
  }

  [[nodiscard]] constexpr float to_float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x80u) << 24;
    const std::uint32_t exp = (bits >> 3) & 0xfu;
    const std::uint32_t mant = bits & 0x7u;
    if (exp == 0xfu && mant == 0x7u) return std::bit_cast<float>(sign | 0x7fc00000u);
    if (exp == 0) return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(static_cast<float>(mant) * 0.001953125f));
    return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
  }

  friend constexpr bool operator==(fp8_e4m3, fp8_e4m3) = default;
};

// Element types skim reads and writes.
template <class T>
concept element = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;

template <element T>
[[nodiscard]] SKIM_FORCEINLINE constexpr float to_float(T x) noexcept {
  if constexpr (std::same_as<T, float>) {
    return x;
  } else {
    return x.to_float();
  }
}

template <element T>
[[nodiscard]] SKIM_FORCEINLINE constexpr T from_float(float x) noexcept {
  if constexpr (std::same_as<T, float>) {
    return x;
  } else {
    return T::from_float(x);
  }
}

template <element T>
inline constexpr const char* element_name = std::same_as<T, float> ? "fp32"
                                            : std::same_as<T, half> ? "fp16"
                                                                    : "bf16";

}  // namespace skim
