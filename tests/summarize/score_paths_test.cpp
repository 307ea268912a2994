// Every path that scores a record gives score()'s bits: score4 (four queries side by side) and
// score4_blocks<B> (B records a call; with AVX or AVX-512 several records share a vector), for the
// summarizers that define them, on random records and queries. Part of the arch suites too
// (tests/CMakeLists.txt: the AVX2 and AVX-512 builds, and the NEON one under qemu), where the
// compiler may fuse a multiply and an add into an FMA: the scores must not depend on where it does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/max_bound16.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"

namespace {

using namespace skim;

// Keys of one block: normal values with exact zeros of both signs here and there, so that products
// tie and q·lo, q·hi meet at ±0 (max_bound's select).
std::vector<std::vector<float>> random_keys(std::mt19937& rng, std::int32_t n, std::int32_t d) {
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<std::vector<float>> keys(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(d)));
  for (auto& key : keys) {
    for (float& x : key) {
      const int c = pick(rng);
      x = c == 0 ? 0.0f : c == 1 ? -0.0f : normal(rng);
    }
  }
  return keys;
}

template <class S>
std::vector<float> random_record(std::mt19937& rng, std::int32_t block_kv, std::int32_t n_keys, std::int32_t d) {
  std::vector<float> record(static_cast<std::size_t>(S::record_floats(d)));
  std::vector<float> scratch(static_cast<std::size_t>(std::max<std::int64_t>(S::workspace_floats(d), 1)));
  const auto keys = random_keys(rng, n_keys, d);
  S::init(record.data(), d);
  for (std::int32_t t = 0; t < n_keys; ++t) S::append(record.data(), keys[static_cast<std::size_t>(t)].data(), t, block_kv, d);
  if (n_keys == block_kv) {
    S::complete_block(record.data(), [&](std::int32_t slot) { return keys[static_cast<std::size_t>(slot)].data(); },
                      block_kv, d, scratch.data());
  }
  return record;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class S, int B>
void check_blocks(std::mt19937& rng, std::int32_t d) {
  constexpr std::int32_t block_kv = 5;
  std::uniform_int_distribution<int> keys(0, block_kv);  // 0: an empty record; block_kv: a complete one
  std::vector<float> records[B];
  const float* pointers[B];
  for (int b = 0; b < B; ++b) {
    records[b] = random_record<S>(rng, block_kv, keys(rng), d);
    pointers[b] = records[b].data();
  }
  const auto q = random_keys(rng, 4, d);  // four query heads
  std::vector<float> flat(static_cast<std::size_t>(4 * d)), q4(static_cast<std::size_t>(4 * d));
  for (int g = 0; g < 4; ++g) std::copy(q[static_cast<std::size_t>(g)].begin(), q[static_cast<std::size_t>(g)].end(), flat.begin() + g * d);
  summarize::detail::interleave4(flat.data(), d, d, q4.data());

  float blocks[4 * B];
  S::template score4_blocks<B>(pointers, q4.data(), d, blocks);
  for (int b = 0; b < B; ++b) {
    float four[4];
    S::score4(pointers[b], flat.data(), d, d, four);
    for (int g = 0; g < 4; ++g) {
      const float want = S::score(pointers[b], flat.data() + g * d, d);
      INFO("head_dim " << d << ", " << B << " blocks a call, block " << b << ", query " << g << ": score " << want
                       << ", score4 " << four[g] << ", score4_blocks " << blocks[4 * b + g]);
      CHECK(same_bits(four[g], want));
      CHECK(same_bits(blocks[4 * b + g], want));
    }
  }
}

template <class S, int... B>
void check_summarizer(std::integer_sequence<int, B...>) {
  std::mt19937 rng(20261207);
  for (const std::int32_t d : {1, 3, 4, 7, 13, 64, 128}) {
    for (int trial = 0; trial < 4; ++trial) (check_blocks<S, B>(rng, d), ...);
  }
}

}  // namespace

TEST_CASE("summarize: score4 and score4_blocks give score()'s bits on random records, whatever the build fuses") {
  using blocks = std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 8>;
  SUBCASE("max_bound") { check_summarizer<summarize::max_bound>(blocks{}); }
  SUBCASE("max_bound16<half>") { check_summarizer<summarize::max_bound16<half>>(blocks{}); }
  SUBCASE("max_bound16<bfloat16>") { check_summarizer<summarize::max_bound16<bfloat16>>(blocks{}); }
  SUBCASE("mean_pool") { check_summarizer<summarize::mean_pool>(blocks{}); }
  SUBCASE("multi_centroid<2>") { check_summarizer<summarize::multi_centroid<2>>(blocks{}); }
  SUBCASE("multi_centroid<3>") { check_summarizer<summarize::multi_centroid<3>>(std::integer_sequence<int, 1, 2, 4>{}); }
}
