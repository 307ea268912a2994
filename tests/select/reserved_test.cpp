#include "skim/select/reserved.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "select/select_testing.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"

using namespace skim;
using namespace select_test;
using skim::select::reserved;
using skim::select::threshold;
using skim::select::threshold_mode;
using skim::select::top_k;
using ids = std::vector<std::int32_t>;

TEST_CASE("select::reserved<top_k>: branches always present, never duplicated, dynamic part as modelled") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int32_t v = uniform(rng, 0, 50);
    const std::vector<float> scores = random_scores(rng, static_cast<std::size_t>(v));
    const std::vector<float> prior = random_scores(rng, static_cast<std::size_t>(v));
    const reserved<top_k> sel{.sink = uniform(rng, 0, 4), .local = uniform(rng, 0, 6), .recency = uniform(rng, 0, 1) == 1,
                              .importance = static_cast<float>(uniform(rng, 0, 4)) / 4.0f,
                              .dynamic = {.k = uniform(rng, 0, v + 2)}};
    INFO("v ", v, " sink ", sel.sink, " local ", sel.local, " recency ", sel.recency, " importance ", sel.importance,
         " k ", sel.dynamic.k, " scores ", show(scores), " prior ", show(prior));
    const run_result r = run(sel, {.row = make_row(v, trial), .scores = scores, .prior = prior});
    REQUIRE_MESSAGE(r.st.ok(), r.st.message());
    CHECK(r.count <= sel.max_count(v));
    CHECK(std::is_sorted(r.ids.begin(), r.ids.end()));
    CHECK(std::adjacent_find(r.ids.begin(), r.ids.end()) == r.ids.end());
    // Model: reserved set, then importance by prior, then top_k by score among the rest.
    std::set<std::int32_t> want;
    for (std::int32_t j = 0; j < v; ++j) {
      if (j < sel.sink || j >= v - sel.local || (sel.recency && j == v - 1)) want.insert(j);
    }
    for (std::int32_t j : want) CHECK(std::binary_search(r.ids.begin(), r.ids.end(), j));
    const std::int32_t budget = std::min(sel.dynamic.k, v);
    const auto imp = static_cast<std::int32_t>(std::lround(sel.importance * static_cast<float>(budget) + 0.49f));
    ids taken(want.begin(), want.end());
    const ids by_prior = first_sorted(ranked(prior, v, taken), static_cast<std::size_t>(imp));
    want.insert(by_prior.begin(), by_prior.end());
    taken.assign(want.begin(), want.end());
    const ids dyn = first_sorted(ranked(scores, v, taken), static_cast<std::size_t>(budget - imp));
    want.insert(dyn.begin(), dyn.end());
    CHECK(r.ids == ids(want.begin(), want.end()));
    CHECK(run(sel, {.row = make_row(v, trial), .scores = scores, .prior = prior}, -1, std::byte{0}).ids == r.ids);
  }
}

TEST_CASE("select::reserved: a worked example of every branch") {
  //                          0  1  2  3  4  5  6  7  8  9
  const std::vector<float> s{9, 9, 5, 1, 8, 2, 7, 0, 0, 0};
  const std::vector<float> prior{0, 0, 0, 6, 0, 5, 0, 0, 0, 0};
  const reserved<top_k> sel{.sink = 1, .local = 2, .recency = true, .importance = 0.5f, .dynamic = {.k = 4}};
  // sink {0}, local {8, 9}; importance ceil(0.5 * 4) = 2 by prior: {3, 5}; top_k 2 by score among
  // the rest: {1, 4}.
  const run_result r = run(sel, {.row = make_row(10), .scores = s, .prior = prior});
  REQUIRE(r.st.ok());
  CHECK(r.ids == ids{0, 1, 3, 4, 5, 8, 9});
  CHECK(sel.max_count(10) == 1 + 2 + 4);
  // Recency alone keeps the newest block; branches larger than the row take the whole row.
  CHECK(run(reserved<top_k>{.recency = true, .dynamic = {.k = 1}}, {.row = make_row(10), .scores = s}).ids == ids{0, 9});
  CHECK(run(reserved<top_k>{.sink = 20, .recency = true}, {.row = make_row(3), .scores = s}).ids == ids{0, 1, 2});
  CHECK(run(reserved<top_k>{.local = 20, .recency = false}, {.row = make_row(3), .scores = s}).ids == ids{0, 1, 2});
  CHECK(run(reserved<top_k>{.sink = 2, .dynamic = {.k = 3}}, {.row = make_row(0), .scores = {}}).ids.empty());
}

TEST_CASE("select::reserved: a decimal share rounds as written (0.3 of 10 is 3 blocks)") {
  const std::vector<float> s(20, 0.0f);
  std::vector<float> prior(20, 0.0f);
  for (int j = 0; j < 20; ++j) prior[static_cast<std::size_t>(j)] = static_cast<float>(j);  // newest best
  // Importance takes 17, 18, 19 by prior; top_k the remaining 7 by score (all tied: ids 0..6).
  const run_result r = run(reserved<top_k>{.recency = false, .importance = 0.3f, .dynamic = {.k = 10}},
                           {.row = make_row(20), .scores = s, .prior = prior});
  CHECK(r.ids == ids{0, 1, 2, 3, 4, 5, 6, 17, 18, 19});
  const run_result q = run(reserved<top_k>{.recency = false, .importance = 0.31f, .dynamic = {.k = 10}},
                           {.row = make_row(20), .scores = s, .prior = prior});
  CHECK(q.ids == ids{0, 1, 2, 3, 4, 5, 16, 17, 18, 19});
}

TEST_CASE("select::reserved<threshold>: the dynamic threshold sees reserved blocks' mass as kept") {
  // Weights 0.5 at sink block 0, then 0.3, 0.2. With sink = 1 and tau 0.6 the threshold needs 0.1 more: block 1.
  const std::vector<float> s{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const reserved<threshold> sel{.sink = 1, .recency = false,
                                .dynamic = {.mode = threshold_mode::mass, .tau = 0.6f}};
  CHECK(run(sel, {.row = make_row(3), .scores = s}).ids == ids{0, 1});
  // Nested: the inner reserved never repeats the outer one's blocks.
  const reserved<reserved<top_k>> nested{.sink = 2, .recency = false,
                                         .dynamic = {.sink = 3, .local = 1, .dynamic = {.k = 2}}};
  const std::vector<float> flat(8, 1.0f);
  CHECK(run(nested, {.row = make_row(8), .scores = flat}).ids == ids{0, 1, 2, 3, 4, 7});
}

TEST_CASE("select::reserved: bad parameters give exact statuses") {
  const std::vector<float> s{1, 2, 3};
  const auto bad = [&](const reserved<top_k>& sel, status_code code, const char* message) {
    check_error(run(sel, {.row = make_row(3, 4), .scores = s}, 3).st, code, message);
  };
  bad({.sink = -1}, status_code::invalid_argument, "reserved sink -1 < 0");
  bad({.local = -3}, status_code::invalid_argument, "reserved local -3 < 0");
  bad({.importance = 1.5f}, status_code::invalid_argument, "reserved importance 1.5 outside [0, 1]");
  bad({.importance = -0.25f}, status_code::invalid_argument, "reserved importance -0.25 outside [0, 1]");
  bad({.importance = qnan}, status_code::invalid_argument, "reserved importance nan outside [0, 1]");
  bad({.dynamic = {.k = -2}}, status_code::invalid_argument, "top_k k -2 < 0");
  bad({.importance = 0.5f, .dynamic = {.k = 2}}, status_code::invalid_argument,
      "reserved importance 0.5 needs a prior; none given for row 4");
  check_error(run(reserved<top_k>{.sink = 2, .dynamic = {.k = 3}}, {.row = make_row(3, 4), .scores = s}, 2).st,
              status_code::shape_mismatch, "row 4 selects 3 blocks, out has room for 2");
}
