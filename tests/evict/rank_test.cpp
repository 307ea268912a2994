// skim::evict::rank with the recency, attention_mass and summary_score policies, against brute force.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "skim/core/workspace.hpp"
#include "skim/evict/attention_mass.hpp"
#include "skim/evict/rank.hpp"
#include "skim/evict/recency.hpp"
#include "skim/evict/summary_score.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "support/allocation_counter.hpp"

using namespace skim;

namespace {

// Keep = protected resident ids + the best (keep - protected) others by (score desc, id asc).
void brute_force(const evict::request& r, const std::vector<float>& scores, std::vector<int>& keep, std::vector<int>& ev) {
  std::vector<int> res;
  if (r.resident.empty()) {
    for (int i = 0; i < r.blocks; ++i) res.push_back(i);
  } else {
    res.assign(r.resident.begin(), r.resident.end());
  }
  std::vector<int> prot, rest;
  for (int id : res) (id < r.sink || id >= r.blocks - r.newest ? prot : rest).push_back(id);
  std::stable_sort(rest.begin(), rest.end(), [&](int a, int b) {
    const float ka = std::isnan(scores[a]) ? -INFINITY : scores[a], kb = std::isnan(scores[b]) ? -INFINITY : scores[b];
    return ka > kb || (ka == kb && a < b);
  });
  const int take = std::clamp(r.keep - static_cast<int>(prot.size()), 0, static_cast<int>(rest.size()));
  keep = prot;
  keep.insert(keep.end(), rest.begin(), rest.begin() + take);
  ev.assign(rest.begin() + take, rest.end());
  std::sort(keep.begin(), keep.end());
  std::sort(ev.begin(), ev.end());
}

template <class E>
void check_against_brute_force(const E& policy, const evict::request& r, const evict::evidence& ev,
                               const std::vector<float>& scores) {
  workspace_buffer ws(evict::workspace_bytes(r.blocks));
  std::vector<std::int32_t> keep(static_cast<std::size_t>(r.blocks) + 1, -7), out(keep.size(), -7);
  evict::decision d{.keep_ids = keep, .evict_ids = out};
  status s;
  {
    test::allocation_counter counter;
    s = evict::rank(policy, r, ev, d, ws.span());
    CHECK(counter.stop() == 0);
  }
  REQUIRE_MESSAGE(s.ok(), s.message());
  std::vector<int> want_keep, want_evict;
  brute_force(r, scores, want_keep, want_evict);
  CHECK(std::vector<int>(keep.begin(), keep.begin() + d.keep_count) == want_keep);
  CHECK(std::vector<int>(out.begin(), out.begin() + d.evict_count) == want_evict);
}

}  // namespace

TEST_CASE("evict::rank: attention_mass and recency against brute force (random caches, ties, NaN)") {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int blocks = std::uniform_int_distribution<int>(0, 40)(rng);
    std::vector<float> mass(static_cast<std::size_t>(blocks));
    for (float& x : mass) x = static_cast<float>(std::uniform_int_distribution<int>(0, 5)(rng));  // many ties
    if (blocks > 3 && trial % 7 == 0) mass[2] = NAN;
    std::vector<std::int32_t> resident;
    if (trial % 2 == 1) {
      for (int i = 0; i < blocks; ++i) {
        if (rng() % 3 != 0) resident.push_back(i);
      }
    }
    const evict::request r{.blocks = blocks, .resident = resident,
                           .keep = std::uniform_int_distribution<int>(0, blocks + 2)(rng),
                           .sink = std::uniform_int_distribution<int>(0, 3)(rng),
                           .newest = std::uniform_int_distribution<int>(0, 3)(rng)};
    CAPTURE(trial);
    check_against_brute_force(evict::attention_mass{}, r, {.mass = mass}, mass);
    std::vector<float> ids(static_cast<std::size_t>(blocks));
    for (int i = 0; i < blocks; ++i) ids[static_cast<std::size_t>(i)] = static_cast<float>(i);
    check_against_brute_force(evict::recency{}, r, {}, ids);
  }
}

TEST_CASE("evict::rank: recency keeps sink + the newest blocks; equal masses keep the lower ids") {
  workspace_buffer ws(evict::workspace_bytes(10));
  std::vector<std::int32_t> keep(10), out(10);
  evict::decision d{.keep_ids = keep, .evict_ids = out};
  REQUIRE(evict::rank(evict::recency{}, {.blocks = 10, .keep = 4, .sink = 1, .newest = 1}, {}, d, ws.span()).ok());
  CHECK(std::vector<int>(keep.begin(), keep.begin() + d.keep_count) == std::vector<int>{0, 7, 8, 9});
  CHECK(std::vector<int>(out.begin(), out.begin() + d.evict_count) == std::vector<int>{1, 2, 3, 4, 5, 6});
  const std::vector<float> flat(10, 1.0f);
  REQUIRE(evict::rank(evict::attention_mass{}, {.blocks = 10, .keep = 4, .sink = 1, .newest = 1}, {.mass = flat}, d, ws.span()).ok());
  CHECK(std::vector<int>(keep.begin(), keep.begin() + d.keep_count) == std::vector<int>{0, 1, 2, 9});
  // Protection wins over keep.
  REQUIRE(evict::rank(evict::recency{}, {.blocks = 10, .keep = 1, .sink = 2, .newest = 2}, {}, d, ws.span()).ok());
  CHECK(d.keep_count == 4);
}

TEST_CASE("evict::summary_score: the best summary score over recent queries, against brute force") {
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  constexpr int blocks = 12, heads_kv = 2, hd = 8, bk = 4;
  using S = summarize::max_bound;
  const auto rf = static_cast<std::size_t>(S::record_floats(hd));
  std::vector<float> records(blocks * heads_kv * rf), keys(hd);
  for (int b = 0; b < blocks; ++b) {
    for (int h = 0; h < heads_kv; ++h) {
      float* rec = records.data() + (b * heads_kv + h) * rf;
      S::init(rec, hd);
      for (int slot = 0; slot < bk; ++slot) {
        for (float& x : keys) x = g(rng);
        S::append(rec, keys.data(), slot, bk, hd);
      }
    }
  }
  std::vector<float> queries(3 * hd);
  for (float& x : queries) x = g(rng);
  for (int head = 0; head < heads_kv; ++head) {
    std::vector<float> want(blocks);
    for (int b = 0; b < blocks; ++b) {
      float best = -INFINITY;
      for (int i = 0; i < 3; ++i) best = std::max(best, S::score(records.data() + (b * heads_kv + head) * rf, queries.data() + i * hd, hd));
      want[b] = best;
    }
    const evict::evidence ev{.records = records, .heads_kv = heads_kv, .head = head, .head_dim = hd, .queries = queries};
    check_against_brute_force(evict::summary_score<S>{}, {.blocks = blocks, .keep = 6, .sink = 1, .newest = 1}, ev, want);
  }
  // Bad evidence is a status, not a crash.
  workspace_buffer ws(evict::workspace_bytes(blocks));
  std::vector<std::int32_t> keep(blocks), out(blocks);
  evict::decision d{.keep_ids = keep, .evict_ids = out};
  const evict::evidence short_records{.records = std::span<const float>(records).first(10), .heads_kv = heads_kv, .head = 0,
                                      .head_dim = hd, .queries = queries};
  CHECK_FALSE(evict::rank(evict::summary_score<S>{}, {.blocks = blocks, .keep = 6}, short_records, d, ws.span()).ok());
  CHECK_FALSE(evict::rank(evict::attention_mass{}, {.blocks = blocks, .keep = 6}, {}, d, ws.span()).ok());
  const std::int32_t unsorted[] = {3, 2};
  CHECK_FALSE(evict::rank(evict::recency{}, {.blocks = blocks, .resident = unsorted, .keep = 1}, {}, d, ws.span()).ok());
}
