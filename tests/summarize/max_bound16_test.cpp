#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/max_bound16.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::max_bound;
using skim::summarize::max_bound16;

namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// q·k as the library sums it: in index order, each product rounded (never fused, whatever the flags).
float dot_unfused(const float* q, const float* k, std::int32_t d) {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < d; ++i) acc += summarize::detail::product(q[i], k[i]);
  return acc;
}

// The record's element i (min for i < d, max after) as float.
template <class R>
float record_at(const std::vector<float>& record, std::int32_t i) {
  R x;
  std::memcpy(&x, reinterpret_cast<const char*>(record.data()) + static_cast<std::size_t>(i) * sizeof(R), sizeof x);
  return to_float(x);
}

// Keys of R: the record holds max_bound's values, and every scoring path gives max_bound's bits.
template <class R>
void check_exact(std::mt19937& rng, int iters) {
  using S = max_bound16<R>;
  for (int iter = 0; iter < iters; ++iter) {
    const block_case c = random_block(rng);
    INFO(std::string(element_name<R>) << " iter " << iter << " block_kv " << c.block_kv << " d " << c.d << " len " << c.len);
    const auto keys = to_elements<R>(random_values(rng, static_cast<std::size_t>(c.len) * c.d));
    const std::vector<float> wide = block_record<max_bound>(keys, c.len, c.block_kv, c.d);
    const std::vector<float> narrow = block_record<S>(keys, c.len, c.block_kv, c.d);
    REQUIRE(narrow.size() == static_cast<std::size_t>(c.d));
    for (std::int32_t i = 0; i < 2 * c.d; ++i) CHECK(same_bits(record_at<R>(narrow, i), wide[static_cast<std::size_t>(i)]));

    // Eight records of this shape, four query heads: score, score4 and score4_blocks<8> against max_bound's.
    std::vector<std::vector<float>> wides, narrows;
    const float* wp[8];
    const float* np[8];
    for (int b = 0; b < 8; ++b) {
      const std::int32_t len = b == 7 ? 0 : uniform(rng, 1, c.block_kv);  // one empty record
      const auto k = to_elements<R>(random_values(rng, static_cast<std::size_t>(len) * c.d));
      wides.push_back(block_record<max_bound>(k, len, c.block_kv, c.d));
      narrows.push_back(block_record<S>(k, len, c.block_kv, c.d));
    }
    for (int b = 0; b < 8; ++b) wp[b] = wides[static_cast<std::size_t>(b)].data(), np[b] = narrows[static_cast<std::size_t>(b)].data();
    std::vector<float> q = random_values(rng, static_cast<std::size_t>(4 * c.d));
    for (std::size_t i = 0; i < q.size(); i += 7) q[i] = i % 2 ? -0.0f : 0.0f;  // zeros of both signs
    std::vector<float> q4(q.size());
    summarize::detail::interleave4(q.data(), c.d, c.d, q4.data());
    float want[32], got[32];
    max_bound::score4_blocks<8>(wp, q4.data(), c.d, want);
    S::template score4_blocks<8>(np, q4.data(), c.d, got);
    for (int b = 0; b < 8; ++b) {
      float four[4];
      S::score4(np[b], q.data(), c.d, c.d, four);
      for (int g = 0; g < 4; ++g) {
        const float w = max_bound::score(wp[b], q.data() + g * c.d, c.d);
        INFO("block " << b << " head " << g << ": max_bound " << w << ", score4_blocks " << got[4 * b + g]);
        CHECK(same_bits(S::score(np[b], q.data() + g * c.d, c.d), w));
        CHECK(same_bits(four[g], w));
        CHECK(same_bits(want[4 * b + g], w));
        CHECK(same_bits(got[4 * b + g], w));
      }
    }
  }
}

// Keys of another type: each bound is the nearest R value outside the keys' range, so the score
// never falls below a key's q·k.
template <class R, element T>
void check_outward(std::mt19937& rng, int iters) {
  using S = max_bound16<R>;
  for (int iter = 0; iter < iters; ++iter) {
    const block_case c = random_block(rng);
    INFO(std::string(element_name<R>) << " records, " << std::string(element_name<T>) << " keys, iter " << iter << " d " << c.d << " len " << c.len);
    std::vector<float> values = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    if (iter % 5 == 0) {  // below half's subnormals, and (keys that hold it) beyond its range
      const float big = std::is_same_v<T, half> ? 1.0f : 1e5f;
      for (std::size_t i = 0; i < values.size(); i += 3) values[i] *= i % 2 ? big : 1e-7f;
    }
    const auto keys = to_elements<T>(values);
    const std::vector<float> kf = to_floats(keys);
    const std::vector<float> record = block_record<S>(keys, c.len, c.block_kv, c.d);
    for (std::int32_t i = 0; i < c.d; ++i) {
      float lo = kf[static_cast<std::size_t>(i)], hi = lo;
      for (std::int32_t s = 1; s < c.len; ++s) {
        lo = std::min(lo, kf[static_cast<std::size_t>(s * c.d + i)]);
        hi = std::max(hi, kf[static_cast<std::size_t>(s * c.d + i)]);
      }
      const float rlo = record_at<R>(record, i), rhi = record_at<R>(record, c.d + i);
      INFO("dim " << i << ": keys [" << lo << ", " << hi << "], record [" << rlo << ", " << rhi << "]");
      CHECK(rlo <= lo);
      CHECK(rhi >= hi);
      // the nearest: one step further in is inside the keys' range
      CHECK(to_float(S::round_up(std::nextafter(rlo, std::numeric_limits<float>::infinity()))) > lo);
      CHECK(to_float(S::round_down(std::nextafter(rhi, -std::numeric_limits<float>::infinity()))) < hi);
    }
    for (int query = 0; query < 4; ++query) {
      const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
      float best = -std::numeric_limits<float>::infinity();
      for (std::int32_t s = 0; s < c.len; ++s) best = std::max(best, dot_unfused(q.data(), kf.data() + s * c.d, c.d));
      CHECK(S::score(record.data(), q.data(), c.d) >= best);
    }
  }
}

}  // namespace

TEST_CASE("summarize::max_bound16 over keys of its own type: max_bound's values and scores, bit for bit") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_exact<half>(rng, 150);
  check_exact<bfloat16>(rng, 150);
}

TEST_CASE("summarize::max_bound16 over other keys: bounds rounded outward, the score still an upper bound") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_outward<half, float>(rng, 100);
  check_outward<half, bfloat16>(rng, 100);
  check_outward<bfloat16, float>(rng, 100);
  check_outward<bfloat16, half>(rng, 100);
}

TEST_CASE("summarize::max_bound16: rounding at zero, the infinities and the ends of the range") {
  using H = max_bound16<half>;
  using B = max_bound16<bfloat16>;
  const float least = to_float(half::from_bits(0x0001));  // 2^-24
  CHECK(H::round_down(1e-9f).bits == 0x0000);
  CHECK(H::round_up(1e-9f).bits == 0x0001);
  CHECK(H::round_down(-1e-9f).bits == 0x8001);
  CHECK(H::round_up(-1e-9f).bits == 0x8000);
  CHECK(H::round_down(least).bits == 0x0001);
  CHECK(H::round_up(least).bits == 0x0001);
  CHECK(H::round_down(65519.0f).bits == 0x7bff);  // 65504, the greatest half
  CHECK(H::round_up(65505.0f).bits == 0x7c00);    // +inf
  CHECK(H::round_down(-65505.0f).bits == 0xfc00);  // -inf
  CHECK(H::round_down(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(H::round_up(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(H::round_down(1.0f + 1e-4f).bits == 0x3c00);  // 1
  CHECK(H::round_up(1.0f + 1e-4f).bits == 0x3c01);
  CHECK(B::round_down(1.0f + 1e-3f).bits == 0x3f80);
  CHECK(B::round_up(1.0f + 1e-3f).bits == 0x3f81);
  CHECK(B::round_up(-1.0f - 1e-3f).bits == 0xbf80);
  CHECK(B::round_down(-1.0f - 1e-3f).bits == 0xbf81);
}

TEST_CASE("summarize::max_bound16: an empty record scores -inf on every path") {
  std::vector<float> record(static_cast<std::size_t>(max_bound16<half>::record_floats(5)), 1.0f);
  max_bound16<half>::init(record.data(), 5);
  const float q[20] = {0.0f, -2.0f, 0.5f, 1.0f, -0.0f};  // a zero q_i must not turn 0 * inf into NaN
  CHECK(max_bound16<half>::score(record.data(), q, 5) == -std::numeric_limits<float>::infinity());
  float four[4];
  max_bound16<half>::score4(record.data(), q, 5, 5, four);
  for (const float x : four) CHECK(x == -std::numeric_limits<float>::infinity());
}
