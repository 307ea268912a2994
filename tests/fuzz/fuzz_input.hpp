#pragma once
// Helpers shared by the libFuzzer targets (tests/fuzz/*_fuzz.cpp, built by scripts/fuzz).
//
// fuzz_input turns the fuzzer's bytes into small, mostly sensible values with a steady share of
// hostile ones (-1, one past the end, INT_MAX, NaN, ...): a shape a few blocks big, ids a little
// outside the valid range. Reading past the end yields zeros, so every input is a complete case.
//
// fuzz_check() stops the run with a message: libFuzzer records the input as a crash.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "skim/core/problem.hpp"

namespace skim::fuzz {

#define SKIM_FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d): ", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fprintf(stderr, "\n");                                                          \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

class fuzz_input {
 public:
  fuzz_input(const std::uint8_t* data, std::size_t size) noexcept : p_(data), n_(size) {}

  [[nodiscard]] std::uint8_t u8() noexcept { return n_ == 0 ? 0 : (--n_, *p_++); }
  [[nodiscard]] std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  [[nodiscard]] std::uint64_t u64() noexcept {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(u8()) << (8 * i);
    return v;
  }
  [[nodiscard]] bool flag(int one_in = 2) noexcept { return u8() % one_in == 0; }
  [[nodiscard]] std::size_t left() const noexcept { return n_; }

  // An int in [lo, hi] (hi - lo < 256 keeps it uniform enough).
  [[nodiscard]] std::int32_t in(std::int32_t lo, std::int32_t hi) noexcept {
    return lo + static_cast<std::int32_t>(u8() % static_cast<std::uint32_t>(hi - lo + 1));
  }

  // A block id or count: mostly in [-2, 21], sometimes an extreme.
  [[nodiscard]] std::int32_t id() noexcept {
    const std::uint8_t v = u8();
    if (v < 240) return static_cast<std::int32_t>(v % 24) - 2;
    constexpr std::int32_t special[] = {std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::min(),
                                        -1, 63, 64, 65, 127, 128, 1 << 20, -(1 << 20), 255, 256, 1000, 31, 32, 33};
    return special[v - 240];
  }

  // A float score / parameter: small integers and halves, and every hostile value.
  [[nodiscard]] float score() noexcept {
    const std::uint8_t v = u8();
    if (v < 200) return static_cast<float>(static_cast<int>(v % 40) - 20) * 0.5f;
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float special[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e30f, -1e30f,
                             std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min(), 1e-30f, 0.3f, 1.0f, 0.999999f, 1.0000001f,
                             0.5f, 2.0f, -std::numeric_limits<float>::quiet_NaN(), 88.0f, -88.0f, 100.0f};
    return special[(v - 200) % (sizeof special / sizeof special[0])];
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

// A small problem described by the input, usually valid (sizes of a few blocks), sometimes broken
// in one field. The cu_seqlens live in the caller's vectors.
inline problem read_problem(fuzz_input& in, std::vector<std::int32_t>& cu_q, std::vector<std::int32_t>& cu_kv) {
  problem p;
  const std::uint8_t shape = in.u8();
  p.heads_kv = 1 + shape % 2;
  p.heads_q = p.heads_kv * (1 + (shape >> 1) % 3);
  p.head_dim = in.in(1, 5);
  p.block_q = in.in(1, 6);
  p.block_kv = in.in(1, 6);
  p.mask = (shape & 8) ? mask_kind::none : mask_kind::causal;
  p.scope = (shape & 16) ? index_scope::query_head : index_scope::kv_head;
  const std::int32_t batch = in.in(1, 3);
  cu_q.assign(1, 0);
  cu_kv.assign(1, 0);
  for (std::int32_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + in.in(0, 12));
    cu_kv.push_back(cu_kv.back() + in.in(0, 16));
  }
  // One broken field in 8 inputs (validate(problem) must catch it; nothing may read with it).
  if ((shape & 0xe0) == 0xe0) {
    switch (in.u8() % 8) {
      case 0: p.heads_q += 1; break;            // not a multiple of heads_kv (when heads_kv 2)
      case 1: p.heads_kv = 0; break;
      case 2: p.block_kv = -p.block_kv; break;
      case 3: p.head_dim = 0; break;
      case 4: cu_q.back() = cu_q.size() > 2 ? cu_q[cu_q.size() - 2] - 1 : -1; break;  // decreasing
      case 5: cu_kv.pop_back(); break;          // batch mismatch
      case 6: p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); break;
      default: cu_kv[0] = 1; break;
    }
  }
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_kv = cu_kv;
  return p;
}

// A size near `n`: n most of the time, else n - 1, n + 1 or 0.
[[nodiscard]] inline std::size_t near_size(fuzz_input& in, std::int64_t n) {
  const std::uint8_t v = in.u8();
  std::int64_t s = n;
  if (v >= 232) s = v % 4 == 0 ? n - 1 : v % 4 == 1 ? n + 1 : v % 4 == 2 ? 0 : n + 3;
  return s < 0 ? 0 : static_cast<std::size_t>(s);
}

}  // namespace skim::fuzz
