#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "skim/summarize/mean_pool.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::mean_pool;

TEST_CASE("summarize::mean_pool record is the running sum and count, score the mean's dot") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 200; ++iter) {
    const block_case c = random_block(rng);
    INFO("iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
    const std::vector<float> record = block_record<mean_pool>(keys, c.len, c.block_kv, c.d);
    REQUIRE(record.size() == static_cast<std::size_t>(c.d) + 1);

    std::vector<double> mean(c.d, 0.0);
    for (std::int32_t i = 0; i < c.d; ++i) {
      float sum = 0.0f;  // the record's own order: slot by slot
      for (std::int32_t s = 0; s < c.len; ++s) {
        sum += keys[s * c.d + i];
        mean[i] += keys[s * c.d + i];
      }
      CHECK(record[i] == sum);
      mean[i] /= c.len;
    }
    CHECK(record[c.d] == static_cast<float>(c.len));

    const double want = dot_f64(q.data(), mean.data(), c.d);
    double magnitude = 1.0;
    for (std::int32_t i = 0; i < c.d; ++i) magnitude += std::abs(q[i] * mean[i]) + std::abs(q[i]) * 3.0;
    CHECK(std::abs(mean_pool::score(record.data(), q.data(), c.d) - want) <= 1e-5 * magnitude);
  }
}

TEST_CASE("summarize::mean_pool reads fp16 and bf16 keys as their fp32 values") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 50; ++iter) {
    const block_case c = random_block(rng);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const auto kh = to_elements<half>(keys);
    const auto kb = to_elements<bfloat16>(keys);
    CHECK(block_record<mean_pool>(kh, c.len, c.block_kv, c.d) ==
          block_record<mean_pool>(to_floats(kh), c.len, c.block_kv, c.d));
    CHECK(block_record<mean_pool>(kb, c.len, c.block_kv, c.d) ==
          block_record<mean_pool>(to_floats(kb), c.len, c.block_kv, c.d));
  }
}

TEST_CASE("summarize::mean_pool: an empty record scores -inf") {
  std::vector<float> record(mean_pool::record_floats(5), 7.0f);
  mean_pool::init(record.data(), 5);
  const float q[5] = {1.0f, -2.0f, 0.5f, 3.0f, -1.0f};
  CHECK(mean_pool::score(record.data(), q, 5) == -std::numeric_limits<float>::infinity());
}
