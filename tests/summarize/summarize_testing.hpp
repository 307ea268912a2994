#pragma once
// Shared helpers of the skim::summarize tests: seeds, random keys and queries, and a record built
// from a block of keys by calling a summarizer's steps directly (no K source involved).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/dtypes.hpp"
#include "support/seed.hpp"

namespace summarize_test {

using namespace skim;

// The test case's next seed (support/seed.hpp: replayed by SKIM_TEST_SEED), INFO'd by the caller.
inline std::uint32_t fresh_seed() { return skim::test::next_seed(); }

inline int uniform(std::mt19937& rng, int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// n values ~ offset + scale * N(0, 1), with a random offset and scale per call, so blocks are
// neither centred nor of unit spread, and many values are negative.
inline std::vector<float> random_values(std::mt19937& rng, std::size_t n) {
  const float offset = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  const float scale = std::uniform_real_distribution<float>(0.1f, 3.0f)(rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = offset + scale * normal(rng);
  return v;
}

// Values rounded through T (exact for float), so a test's fp32 copy equals what the library sees.
template <element T>
std::vector<T> to_elements(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_float<T>(v[i]);
  return out;
}
template <element T>
std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

// q·k in fp32, index order: the order the library's scores use.
inline float dot_f32(const float* q, const float* k, std::int32_t d) {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < d; ++i) acc += q[i] * k[i];
  return acc;
}
inline double dot_f64(const float* q, const double* k, std::int32_t d) {
  double acc = 0.0;
  for (std::int32_t i = 0; i < d; ++i) acc += static_cast<double>(q[i]) * k[i];
  return acc;
}

// The record of one block holding keys [len, d] (slots 0..len-1 of a block of block_kv), built by
// calling init, append in slot order and, for a complete block, complete_block.
template <summarizer S, element T>
std::vector<float> block_record(const std::vector<T>& keys, std::int32_t len, std::int32_t block_kv,
                                std::int32_t d) {
  std::vector<float> record(static_cast<std::size_t>(S::record_floats(d)));
  std::vector<float> scratch(static_cast<std::size_t>(S::workspace_floats(d)) + 1);
  S::init(record.data(), d);
  for (std::int32_t s = 0; s < len; ++s) S::append(record.data(), keys.data() + s * d, s, block_kv, d);
  if (len == block_kv) {
    auto rows = [&](std::int32_t s) { return keys.data() + s * d; };
    S::complete_block(record.data(), rows, block_kv, d, scratch.data());
  }
  return record;
}

inline constexpr std::int32_t block_sizes[] = {1, 2, 3, 7, 16, 33, 64};

// A random block: block_kv, head_dim, length (complete about half the time, else ragged).
struct block_case {
  std::int32_t block_kv = 0, d = 0, len = 0;
};
inline block_case random_block(std::mt19937& rng) {
  block_case c;
  c.block_kv = block_sizes[uniform(rng, 0, 6)];
  c.d = uniform(rng, 1, 70);
  c.len = uniform(rng, 0, 1) ? c.block_kv : uniform(rng, 1, c.block_kv);
  return c;
}

}  // namespace summarize_test
