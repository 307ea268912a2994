#pragma once
// Element types for Q, K, V and O: float, fp16 (skim::half) and bf16 (skim::bfloat16).
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
