#pragma once
// summarize::detail::record_value: element i of a record's row as float (private to the summarizers).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"

namespace skim::summarize::detail {

// Rows of E = float are read as they are. 16-bit rows (max_bound16's records) live in the float
// storage every record has: their values are copied out (memcpy), never read through an E lvalue
// into that storage, which the aliasing rules would not allow.
template <class E>
[[nodiscard]] SKIM_FORCEINLINE float record_value(const E* row, std::int64_t i) noexcept {
  if constexpr (std::is_same_v<E, float>) {
    return row[i];
  } else {
    E x;
    std::memcpy(&x, row + i, sizeof x);
    return to_float(x);
  }
}

}  // namespace skim::summarize::detail
