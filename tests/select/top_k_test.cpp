#include "skim/select/top_k.hpp"

#include <doctest/doctest.h>

#include <numeric>

#include "select/select_testing.hpp"

using namespace skim;
using namespace select_test;
using skim::select::top_k;

TEST_CASE("select::top_k: matches a stable-sort model on tied, NaN and inf scores") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 400; ++trial) {
    const std::int32_t v = uniform(rng, 0, 70);
    const std::size_t extra = static_cast<std::size_t>(uniform(rng, 0, 5));
    std::vector<float> scores = random_scores(rng, static_cast<std::size_t>(v) + extra);
    for (std::size_t j = static_cast<std::size_t>(v); j < scores.size(); ++j) scores[j] = inf;  // never read
    const bool nested = uniform(rng, 0, 2) == 0;
    const std::vector<std::int32_t> exclude = nested ? random_subset(rng, v, 0.3) : std::vector<std::int32_t>{};
    const std::int32_t used = nested ? uniform(rng, 0, 5) : 0;
    const top_k sel{.k = uniform(rng, 0, v + 3)};
    INFO("v ", v, " k ", sel.k, " used ", used, " scores ", show(scores));
    const run_result r = run(sel, {.row = make_row(v, trial), .scores = scores, .exclude = exclude, .budget_used = used});
    REQUIRE_MESSAGE(r.st.ok(), r.st.message());
    const auto want = first_sorted(ranked(scores, v, exclude), static_cast<std::size_t>(std::max(0, sel.k - used)));
    CHECK(r.ids == want);
    CHECK(r.count <= sel.max_count(v));
  }
}

TEST_CASE("select::top_k: k = 0 takes none, k >= visible takes every visible block") {
  const std::vector<float> scores{1, -inf, qnan, 3, inf, 2};
  CHECK(run(top_k{.k = 0}, {.row = make_row(5), .scores = scores}).ids.empty());
  const std::vector<std::int32_t> all{0, 1, 2, 3, 4};
  CHECK(run(top_k{.k = 5}, {.row = make_row(5), .scores = scores}).ids == all);
  CHECK(run(top_k{.k = 99}, {.row = make_row(5), .scores = scores}).ids == all);
  CHECK(top_k{.k = 99}.max_count(5) == 5);
  CHECK(top_k{.k = 3}.max_count(5) == 3);
  CHECK(top_k{.k = 3}.max_count(0) == 0);
  CHECK(run(top_k{.k = 3}, {.row = make_row(0), .scores = {}}).ids.empty());
}

TEST_CASE("select::top_k: ties go to the lower id; NaN ranks as -inf; blocks past visible are never read") {
  const std::vector<float> equal(10, 0.25f);
  CHECK(run(top_k{.k = 4}, {.row = make_row(10), .scores = equal}).ids == std::vector<std::int32_t>{0, 1, 2, 3});
  // Finite first (3 > 1), then -inf and NaN tied by id: 1 (-inf) before 2 (NaN) before 4 (-inf).
  const std::vector<float> s{1, -inf, qnan, 3, -inf, 9};
  CHECK(run(top_k{.k = 2}, {.row = make_row(5), .scores = s}).ids == std::vector<std::int32_t>{0, 3});
  CHECK(run(top_k{.k = 3}, {.row = make_row(5), .scores = s}).ids == std::vector<std::int32_t>{0, 1, 3});
  CHECK(run(top_k{.k = 4}, {.row = make_row(5), .scores = s}).ids == std::vector<std::int32_t>{0, 1, 2, 3});
  const std::vector<float> z{-0.0f, 0.0f, -0.0f};  // -0 == +0: a tie, to the lower id
  CHECK(run(top_k{.k = 1}, {.row = make_row(3), .scores = z}).ids == std::vector<std::int32_t>{0});
}

TEST_CASE("select::top_k: deterministic whatever the workspace held") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 50; ++trial) {
    const std::int32_t v = uniform(rng, 1, 300);
    const std::vector<float> scores = random_scores(rng, static_cast<std::size_t>(v));
    const top_k sel{.k = uniform(rng, 0, v)};
    const run_result a = run(sel, {.row = make_row(v), .scores = scores}, -1, std::byte{0x00});
    const run_result b = run(sel, {.row = make_row(v), .scores = scores}, -1, std::byte{0xa5});
    CHECK(a.ids == b.ids);
  }
}

TEST_CASE("select::top_k: bad parameters and input give exact statuses") {
  const std::vector<float> s{1, 2, 3, 4};
  check_error(run(top_k{.k = -1}, {.row = make_row(4), .scores = s}, 4).st, status_code::invalid_argument,
              "top_k k -1 < 0");
  check_error(run(top_k{.k = 2}, {.row = make_row(5, 7), .scores = s}).st, status_code::shape_mismatch,
              "scores has 4 entries < visible blocks 5 in row 7");
  const std::vector<float> prior{1, 2};
  check_error(run(top_k{.k = 2}, {.row = make_row(4, 3), .scores = s, .prior = prior}).st,
              status_code::shape_mismatch, "prior has 2 entries < visible blocks 4 in row 3");
  const std::vector<std::int32_t> unsorted{2, 1};
  check_error(run(top_k{.k = 2}, {.row = make_row(4, 3), .scores = s, .exclude = unsorted}).st,
              status_code::invalid_argument, "exclude ids not strictly ascending in row 3: 1 at position 1 after 2");
  const std::vector<std::int32_t> outside{1, 4};
  check_error(run(top_k{.k = 2}, {.row = make_row(4, 3), .scores = s, .exclude = outside}).st,
              status_code::invalid_argument, "exclude id 4 outside [0, 4) in row 3 (position 1)");
  check_error(run(top_k{.k = 2}, {.row = make_row(4, 3), .scores = s, .budget_used = -2}).st,
              status_code::invalid_argument, "budget_used -2 < 0 in row 3");
  // Too little room: the status says so and count is what the row needs; out is untouched.
  std::vector<std::int32_t> out(2, -7);
  aligned_bytes ws(top_k{.k = 3}.workspace_bytes(4));
  std::int32_t n = -1;
  check_error(top_k{.k = 3}.select_row({.row = make_row(4, 3), .scores = s}, out, n, ws.bytes),
              status_code::shape_mismatch, "row 3 selects 3 blocks, out has room for 2");
  CHECK(n == 3);
  CHECK(out == std::vector<std::int32_t>{-7, -7});
  // Workspace too small.
  std::vector<std::int32_t> out4(4);
  const auto needed = top_k{.k = 3}.workspace_bytes(4);
  const status st = top_k{.k = 3}.select_row({.row = make_row(4), .scores = s}, out4, n, ws.bytes.first(needed - 1));
  CHECK(st.code() == status_code::workspace_too_small);
  CHECK(n == 0);
}
