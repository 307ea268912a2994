#pragma once
// skim::status — errors as values.
//
// Every fallible skim call returns a status. It is a small value (no allocation, safe to
// return from noexcept code) holding a code and a message that names the bad value and
// where it was found, e.g. "block id 97 >= kv blocks 96 in row 12".

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string_view>

namespace skim {

enum class status_code : std::uint8_t {
  ok = 0,
  invalid_argument,     // a scalar argument out of its domain (head_dim 0, scale NaN, ...)
  shape_mismatch,       // views or spans whose sizes disagree with the problem
  invalid_index,        // an index whose content breaks its contract (ids, counts, row_ptr)
  workspace_too_small,  // workspace span shorter than workspace_bytes()
  misaligned,           // a buffer not aligned as the callee requires
  unsupported,          // a valid request this policy does not implement
  device_error,         // the CUDA runtime reported an error (launch, memory, attribute)
};

[[nodiscard]] constexpr std::string_view to_string(status_code c) noexcept {
  switch (c) {
    case status_code::ok: return "ok";
    case status_code::invalid_argument: return "invalid_argument";
    case status_code::shape_mismatch: return "shape_mismatch";
    case status_code::invalid_index: return "invalid_index";
    case status_code::workspace_too_small: return "workspace_too_small";
    case status_code::misaligned: return "misaligned";
    case status_code::unsupported: return "unsupported";
    case status_code::device_error: return "device_error";
  }
  return "unknown";
}

class [[nodiscard]] status {
 public:
  static constexpr int max_message = 160;  // bytes, '\0' included; longer messages are cut

  constexpr status() noexcept = default;  // ok

  [[nodiscard]] static constexpr status success() noexcept { return status{}; }

  // printf-style message; the code must not be ok.
  [[nodiscard]] static status error(status_code code, const char* fmt, ...) noexcept
#if defined(__GNUC__) || defined(__clang__)
      __attribute__((format(printf, 2, 3)))
#endif
  {
    status s;
    s.code_ = code;
    std::va_list args;
    va_start(args, fmt);
    std::vsnprintf(s.message_, max_message, fmt, args);
    va_end(args);
    return s;
  }

  [[nodiscard]] constexpr bool ok() const noexcept { return code_ == status_code::ok; }
  [[nodiscard]] constexpr status_code code() const noexcept { return code_; }
  // "ok" for success, otherwise the message given to error().
  [[nodiscard]] constexpr const char* message() const noexcept { return ok() ? "ok" : message_; }

 private:
  status_code code_ = status_code::ok;
  char message_[max_message] = {};
};

}  // namespace skim

// Returns from the enclosing function if `expr` yields a failed status.
#define SKIM_TRY(expr)                        \
  do {                                        \
    ::skim::status skim_try_status_ = (expr); \
    if (!skim_try_status_.ok()) return skim_try_status_; \
  } while (0)
