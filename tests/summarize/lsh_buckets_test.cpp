#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "skim/summarize/lsh_buckets.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::lsh_buckets;

namespace {

// The hyperplanes as lsh_buckets.hpp documents them, written out as a [rounds · bits, d] matrix of
// ±1 by an independent splitmix64.
std::uint64_t splitmix64(std::uint64_t x) {
  std::uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
std::vector<double> planes(std::uint64_t seed, int rounds, int bits, std::int32_t d) {
  std::vector<double> w(static_cast<std::size_t>(rounds * bits) * d);
  for (int r = 0; r < rounds; ++r)
    for (int b = 0; b < bits; ++b)
      for (std::int32_t e = 0; e < d; ++e) {
        const std::uint64_t h = splitmix64(seed + ((static_cast<std::uint64_t>(r) * 16 + b) << 32) + static_cast<std::uint64_t>(e));
        w[(static_cast<std::size_t>(r * bits + b)) * d + e] = (h >> 63) != 0 ? -1.0 : 1.0;
      }
  return w;
}
// bucket_r(x) from the matrix.
int bucket_of(const std::vector<double>& w, int r, int bits, const float* x, std::int32_t d) {
  int id = 0;
  for (int b = 0; b < bits; ++b) {
    double p = 0.0;
    for (std::int32_t e = 0; e < d; ++e) p += w[static_cast<std::size_t>(r * bits + b) * d + e] * x[e];
    if (p > 0.0) id |= 1 << b;
  }
  return id;
}

// The slow answer: every (key, round) pair compared with the query's bucket.
template <class S>
void check_against_brute_force(std::mt19937& rng, int iterations, std::int32_t force_d = 0) {
  constexpr int rounds = S::rounds, bits = S::bits;
  for (int iter = 0; iter < iterations; ++iter) {
    block_case c = random_block(rng);
    if (force_d > 0) c.d = force_d;
    INFO("iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<double> w = planes(0x5eedb10cull, rounds, bits, c.d);
    const std::vector<float> record = block_record<S>(keys, c.len, c.block_kv, c.d);
    REQUIRE(record.size() == static_cast<std::size_t>(rounds * (1 << bits) + 1));

    std::vector<float> histogram(record.size(), 0.0f);
    for (std::int32_t s = 0; s < c.len; ++s)
      for (int r = 0; r < rounds; ++r) histogram[r * (1 << bits) + bucket_of(w, r, bits, keys.data() + s * c.d, c.d)] += 1;
    histogram.back() = static_cast<float>(c.len);
    CHECK(record == histogram);

    for (int t = 0; t < 4; ++t) {
      // Queries: random, or one of the block's own keys (which collides with itself every round).
      const std::vector<float> q = t < 2 ? random_values(rng, static_cast<std::size_t>(c.d))
                                         : std::vector<float>(keys.begin() + (t % c.len) * c.d, keys.begin() + (t % c.len + 1) * c.d);
      long want = 0;
      for (std::int32_t s = 0; s < c.len; ++s)
        for (int r = 0; r < rounds; ++r)
          want += bucket_of(w, r, bits, keys.data() + s * c.d, c.d) == bucket_of(w, r, bits, q.data(), c.d) ? 1 : 0;
      const float got = S::score(record.data(), q.data(), c.d);
      CHECK(got == static_cast<float>(want));
      if (t >= 2) CHECK(got >= static_cast<float>(rounds));
    }
  }
}

}  // namespace

TEST_CASE("summarize::lsh_buckets counts equal a brute-force SimHash of every key and the query") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_against_brute_force<lsh_buckets<>>(rng, 150);
  check_against_brute_force<lsh_buckets<1, 1>>(rng, 50);
  check_against_brute_force<lsh_buckets<7, 6>>(rng, 50);
  check_against_brute_force<lsh_buckets<>>(rng, 10, 300);  // a head dim past 256
}

TEST_CASE("summarize::lsh_buckets is scale free, reads fp16 and bf16 keys as fp32, and an empty block is -inf") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  using S = lsh_buckets<>;
  for (int iter = 0; iter < 50; ++iter) {
    const block_case c = random_block(rng);
    INFO("iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    std::vector<float> scaled = keys;
    for (float& x : scaled) x *= 8.0f;  // a power of two: the same directions, exactly
    const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
    const std::vector<float> record = block_record<S>(keys, c.len, c.block_kv, c.d);
    CHECK(block_record<S>(scaled, c.len, c.block_kv, c.d) == record);

    const std::vector<half> k16 = to_elements<half>(keys);
    const std::vector<bfloat16> kb16 = to_elements<bfloat16>(keys);
    CHECK(block_record<S>(k16, c.len, c.block_kv, c.d) == block_record<S>(to_floats(k16), c.len, c.block_kv, c.d));
    CHECK(block_record<S>(kb16, c.len, c.block_kv, c.d) == block_record<S>(to_floats(kb16), c.len, c.block_kv, c.d));

    std::vector<float> empty(static_cast<std::size_t>(S::record_floats(c.d)), 1.0f);
    S::init(empty.data(), c.d);
    CHECK(S::score(empty.data(), q.data(), c.d) == -std::numeric_limits<float>::infinity());
  }
}

TEST_CASE("summarize::lsh_buckets ranks a block holding the query's direction above random blocks") {
  // 32 blocks of 16 random keys; in block 21, 8 of them lie near +q. With 4 rounds of 4 bits a key at
  // a small angle to q shares its bucket in most rounds (about 28 collisions expected for the block),
  // a random key in 1/16 of them (about 4 per random block).
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  using S = lsh_buckets<>;
  const std::int32_t d = 64, bk = 16;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(d);
  for (float& x : q) x = normal(rng);
  int wins = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> best(32);
    for (int j = 0; j < 32; ++j) {
      std::vector<float> keys(static_cast<std::size_t>(bk) * d);
      for (float& x : keys) x = normal(rng);
      if (j == 21)
        for (int s = 0; s < 8; ++s)
          for (std::int32_t e = 0; e < d; ++e) keys[s * d + e] = q[e] + 0.1f * normal(rng);
      const std::vector<float> record = block_record<S>(keys, bk, bk, d);
      best[j] = S::score(record.data(), q.data(), d);
    }
    int above = 0;
    for (int j = 0; j < 32; ++j) above += best[j] >= best[21] && j != 21 ? 1 : 0;
    wins += above == 0 ? 1 : 0;
  }
  CHECK(wins >= 18);
}
