#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/probe_max.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::mean_pool;
using skim::summarize::probe_max;

TEST_CASE("summarize::probe_max probe slots are floor(j * block_kv / N)") {
  using p4 = probe_max<4>;
  CHECK(p4::probe_slot(0, 64) == 0);
  CHECK(p4::probe_slot(1, 64) == 16);
  CHECK(p4::probe_slot(3, 64) == 48);
  CHECK(p4::probe_slot(1, 10) == 2);
  CHECK(p4::probe_slot(2, 10) == 5);
  CHECK(p4::probe_slot(3, 10) == 7);
  CHECK(p4::probe_slot(1, 3) == 0);  // more probes than slots: slots repeat
  CHECK(p4::probe_slot(3, 3) == 2);
}

template <std::int32_t N>
void check_probes(std::mt19937& rng, int iters) {
  using S = probe_max<N>;
  for (int iter = 0; iter < iters; ++iter) {
    const block_case c = random_block(rng);
    INFO("N " << N << " iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<float> record = block_record<S>(keys, c.len, c.block_kv, c.d);
    REQUIRE(record.size() == static_cast<std::size_t>(N) * c.d + 1);
    // Probes present: those whose slot the block reached, i.e. min(N, ceil(len * N / block_kv)).
    std::int32_t present = 0;
    while (present < N && S::probe_slot(present, c.block_kv) < c.len) ++present;
    CHECK(present == std::min<std::int32_t>(N, (c.len * N + c.block_kv - 1) / c.block_kv));
    CHECK(present >= 1);
    CHECK(record[static_cast<std::size_t>(N) * c.d] == static_cast<float>(present));
    for (std::int32_t j = 0; j < present; ++j) {
      const std::int32_t slot = S::probe_slot(j, c.block_kv);
      CHECK(std::equal(keys.begin() + slot * c.d, keys.begin() + (slot + 1) * c.d, record.begin() + j * c.d));
    }
    for (int query = 0; query < 4; ++query) {
      const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
      float want = -std::numeric_limits<float>::infinity();
      for (std::int32_t j = 0; j < present; ++j) {
        want = std::max(want, dot_f32(q.data(), keys.data() + S::probe_slot(j, c.block_kv) * c.d, c.d));
      }
      CHECK(S::score(record.data(), q.data(), c.d) == want);
    }
  }
}

TEST_CASE("summarize::probe_max keeps the keys at its probe slots and scores their best dot") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_probes<1>(rng, 50);
  check_probes<2>(rng, 50);
  check_probes<3>(rng, 80);
  check_probes<4>(rng, 80);
  check_probes<8>(rng, 80);
}

TEST_CASE("summarize::probe_max sees a needle at a probe slot in the middle of a block; mean_pool dilutes it") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr std::int32_t bk = 64, d = 32;
  using S = probe_max<4>;
  for (int iter = 0; iter < 20; ++iter) {
    std::vector<float> keys = random_values(rng, static_cast<std::size_t>(bk) * d);
    const std::vector<float> q = random_values(rng, d);
    // Needle: 200 q / |q|, at the middle probe slot (32); its dot is 200 |q|, far above the others.
    const std::int32_t needle = S::probe_slot(2, bk);
    REQUIRE(needle == 32);
    const float qn = std::sqrt(dot_f32(q.data(), q.data(), d));
    for (std::int32_t i = 0; i < d; ++i) keys[needle * d + i] = 200.0f * q[i] / qn;
    const float needle_dot = dot_f32(q.data(), keys.data() + needle * d, d);
    float others = -std::numeric_limits<float>::infinity();
    for (std::int32_t s = 0; s < bk; ++s) {
      if (s != needle) others = std::max(others, dot_f32(q.data(), keys.data() + s * d, d));
    }
    REQUIRE(needle_dot > 2.0f * std::abs(others));
    const auto record = block_record<S>(keys, bk, bk, d);
    CHECK(S::score(record.data(), q.data(), d) == needle_dot);
    const auto mean = block_record<mean_pool>(keys, bk, bk, d);
    CHECK(mean_pool::score(mean.data(), q.data(), d) < 0.5f * needle_dot);
    // One slot later the needle falls between probes and is missed: the documented trade-off.
    std::vector<float> moved = keys;
    for (std::int32_t i = 0; i < d; ++i) std::swap(moved[needle * d + i], moved[(needle + 1) * d + i]);
    const auto missed = block_record<S>(moved, bk, bk, d);
    CHECK(S::score(missed.data(), q.data(), d) < 0.5f * needle_dot);
  }
}

TEST_CASE("summarize::probe_max: a ragged block of one key has that key as its probe; an empty record scores -inf") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> key = random_values(rng, 9);
  const std::vector<float> q = random_values(rng, 9);
  const auto record = block_record<probe_max<4>>(key, 1, 64, 9);
  CHECK(record[4 * 9] == 1.0f);
  CHECK(probe_max<4>::score(record.data(), q.data(), 9) == dot_f32(q.data(), key.data(), 9));
  std::vector<float> empty(probe_max<4>::record_floats(9), 3.0f);
  probe_max<4>::init(empty.data(), 9);
  CHECK(probe_max<4>::score(empty.data(), q.data(), 9) == -std::numeric_limits<float>::infinity());
}
