#pragma once
// summarize::detail::record_value: element i of a record's row as float (private to the summarizers).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"

#if !defined(__CUDACC__) && defined(__F16C__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

namespace skim::summarize::detail {

// Rows of E = float are read as they are. 16-bit rows (max_bound16's records) live in the float
// storage every record has: their values are copied out (memcpy), never read through an E lvalue
// into that storage, which the aliasing rules would not allow. A half is widened by the hardware
// where the target has an instruction for it (aarch64, F16C): the same value as half::to_float,
// which every half has in fp32, without its branches.
template <class E>
[[nodiscard]] SKIM_FORCEINLINE float record_value(const E* row, std::int64_t i) noexcept {
  if constexpr (std::is_same_v<E, float>) {
    return row[i];
  } else {
#if !defined(__CUDACC__) && defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if constexpr (std::is_same_v<E, half>) {
      __fp16 x;
      std::memcpy(&x, row + i, sizeof x);
      return static_cast<float>(x);
    }
#elif !defined(__CUDACC__) && defined(__F16C__) && (defined(__x86_64__) || defined(__i386__))
    if constexpr (std::is_same_v<E, half>) {
      std::uint16_t x;
      std::memcpy(&x, row + i, sizeof x);
      return _cvtsh_ss(x);
    }
#endif
    E x;
    std::memcpy(&x, row + i, sizeof x);
    return to_float(x);
  }
}

}  // namespace skim::summarize::detail
