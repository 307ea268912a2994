#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "skim/summarize/max_bound.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::max_bound;

TEST_CASE("summarize::max_bound record holds per-dimension min and max; score is the box's best corner") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    const block_case c = random_block(rng);
    INFO("iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
    const std::vector<float> record = block_record<max_bound>(keys, c.len, c.block_kv, c.d);
    REQUIRE(record.size() == 2 * static_cast<std::size_t>(c.d));
    float want = 0.0f;
    for (std::int32_t i = 0; i < c.d; ++i) {
      float lo = keys[i], hi = keys[i];
      for (std::int32_t s = 1; s < c.len; ++s) {
        lo = std::min(lo, keys[s * c.d + i]);
        hi = std::max(hi, keys[s * c.d + i]);
      }
      CHECK(record[i] == lo);
      CHECK(record[c.d + i] == hi);
      want += std::max(q[i] * lo, q[i] * hi);
    }
    CHECK(max_bound::score(record.data(), q.data(), c.d) == want);
  }
}

// The bound holds bit for bit in fp32 (monotone rounding), not just within a tolerance.
template <element T>
void check_upper_bound(std::mt19937& rng, int iters) {
  for (int iter = 0; iter < iters; ++iter) {
    const block_case c = random_block(rng);
    INFO(element_name<T> << " iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const auto keys = to_elements<T>(random_values(rng, static_cast<std::size_t>(c.len) * c.d));
    const std::vector<float> kf = to_floats(keys);
    const std::vector<float> record = block_record<max_bound>(keys, c.len, c.block_kv, c.d);
    for (int query = 0; query < 8; ++query) {
      const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
      float best = -std::numeric_limits<float>::infinity();
      for (std::int32_t s = 0; s < c.len; ++s) best = std::max(best, dot_f32(q.data(), kf.data() + s * c.d, c.d));
      const float bound = max_bound::score(record.data(), q.data(), c.d);
      INFO("query " << query << " bound " << bound << " best " << best);
      CHECK(bound >= best);
      if (c.len == 1) CHECK(bound == best);  // a one-key box is the key itself
    }
  }
}

TEST_CASE("summarize::max_bound is never below the block's best q·k") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_upper_bound<float>(rng, 300);
  check_upper_bound<half>(rng, 100);
  check_upper_bound<bfloat16>(rng, 100);
}

TEST_CASE("summarize::max_bound: an empty record scores -inf") {
  std::vector<float> record(max_bound::record_floats(3), 1.0f);
  max_bound::init(record.data(), 3);
  const float q[3] = {0.0f, -2.0f, 0.5f};  // a zero q_i must not turn 0 * inf into NaN
  CHECK(max_bound::score(record.data(), q, 3) == -std::numeric_limits<float>::infinity());
}
