#pragma once
// Shared helpers of the skim::select tests: rows of random scores with many ties (quantised), NaN
// and infinities; a runner with a pattern-filled aligned workspace; and brute-force models that
// rank by std::stable_sort over (score descending) of ids in ascending order — ties to the lower id
// by stability, independently of rank.hpp's comparator.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "skim/concepts/selector.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "support/seed.hpp"

namespace select_test {

using namespace skim;

inline constexpr float inf = std::numeric_limits<float>::infinity();
inline constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// The test case's next seed (support/seed.hpp: replayed by SKIM_TEST_SEED).
inline std::uint32_t fresh_seed() { return skim::test::next_seed(); }

#define SKIM_SELECT_RANDOM_CASE(rng)                           \
  const std::uint32_t seed_ = ::select_test::fresh_seed();     \
  INFO("seed ", seed_);                                        \
  std::mt19937 rng(seed_)

inline int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Scores in a few quantised levels (many ties), with occasional NaN and +-inf when `special`.
inline std::vector<float> random_scores(std::mt19937& rng, std::size_t n, bool special = true) {
  const int levels = uniform(rng, 1, 6);
  std::vector<float> s(n);
  for (float& x : s) {
    const int kind = special ? uniform(rng, 0, 19) : 19;
    x = kind == 0 ? qnan : kind == 1 ? -inf : kind == 2 ? inf : 0.5f * static_cast<float>(uniform(rng, -levels, levels));
  }
  return s;
}

// Sorted unique random subset of [0, v).
inline std::vector<std::int32_t> random_subset(std::mt19937& rng, std::int32_t v, double p) {
  std::vector<std::int32_t> ids;
  std::bernoulli_distribution keep(p);
  for (std::int32_t j = 0; j < v; ++j) {
    if (keep(rng)) ids.push_back(j);
  }
  return ids;
}

inline row_info make_row(std::int32_t visible, std::int64_t row = 0) {
  row_info r;
  r.row = row;
  r.kv_blocks = visible;
  r.visible_blocks = visible;
  r.full_blocks = visible;
  return r;
}

// A workspace aligned to workspace_alignment, filled with a pattern.
struct aligned_bytes {
  std::vector<std::byte> storage;
  std::span<std::byte> bytes;
  explicit aligned_bytes(std::size_t n, std::byte fill = std::byte{0xff}) : storage(n + workspace_alignment, fill) {
    void* p = storage.data();
    std::size_t space = storage.size();
    p = std::align(workspace_alignment, n == 0 ? 1 : n, p, space);
    bytes = {static_cast<std::byte*>(p), n};
  }
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
};

struct run_result {
  status st;
  std::int32_t count = 0;
  std::vector<std::int32_t> ids;  // out[0, count) on success
};

// Runs select_row with out of `room` entries (default: max_count) and a fresh workspace.
template <selector S>
run_result run(const S& s, const row_scores& in, std::int32_t room = -1, std::byte fill = std::byte{0xff}) {
  const std::int32_t v = in.row.visible_blocks;
  aligned_bytes ws(s.workspace_bytes(v), fill);
  std::vector<std::int32_t> out(static_cast<std::size_t>(room < 0 ? s.max_count(v) : room), -7);
  run_result r;
  r.st = s.select_row(in, out, r.count, ws.bytes);
  if (r.st.ok()) r.ids.assign(out.begin(), out.begin() + r.count);
  return r;
}

inline float key(float s) { return std::isnan(s) ? -inf : s; }

// Ids of [0, v) not in exclude, best first: stable_sort by key descending keeps ids ascending on ties.
inline std::vector<std::int32_t> ranked(std::span<const float> keys, std::int32_t v,
                                        const std::vector<std::int32_t>& exclude = {}) {
  std::vector<std::int32_t> ids;
  for (std::int32_t j = 0; j < v; ++j) {
    if (!std::binary_search(exclude.begin(), exclude.end(), j)) ids.push_back(j);
  }
  std::stable_sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) { return key(keys[a]) > key(keys[b]); });
  return ids;
}

inline std::vector<std::int32_t> first_sorted(std::vector<std::int32_t> ids, std::size_t k) {
  ids.resize(std::min(k, ids.size()));
  std::sort(ids.begin(), ids.end());
  return ids;
}

inline std::string show(const std::vector<float>& s) {
  std::string t;
  for (float x : s) t += std::to_string(x) + " ";
  return t;
}

inline void check_error(const status& s, status_code code, const std::string& message) {
  CHECK(s.code() == code);
  CHECK(std::string(s.message()) == message);
}

}  // namespace select_test
