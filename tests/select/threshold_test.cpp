#include "skim/select/threshold.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "select/select_testing.hpp"

using namespace skim;
using namespace select_test;
using skim::select::threshold;
using skim::select::threshold_mode;

namespace {

// The definition, written out: how many blocks pass, then the clamps, then the best k.
std::vector<std::int32_t> model(const threshold& t, std::span<const float> scores, std::int32_t v,
                                const std::vector<std::int32_t>& exclude, std::int32_t used) {
  const std::vector<std::int32_t> order = ranked(scores, v, exclude);
  float m = -inf;
  for (std::int32_t j = 0; j < v; ++j) m = std::max(m, key(scores[j]));
  std::int32_t passing = 0;
  if (t.mode == threshold_mode::mass) {
    if (m != -inf) {
      auto w = [&](float s) {
        s = key(s);
        if (m == inf) return s == inf ? 1.0 : 0.0;
        return s == -inf ? 0.0 : std::exp(static_cast<double>(s) - static_cast<double>(m));
      };
      double kept = 0, total = 0;
      for (std::int32_t id : exclude) kept += w(scores[id]);
      total = kept;
      for (std::int32_t id : order) total += w(scores[id]);
      while (kept < t.tau * total && passing < static_cast<std::int32_t>(order.size())) kept += w(scores[order[passing++]]);
    }
  } else {
    const float cut = t.mode == threshold_mode::absolute ? t.tau : (t.tau == inf ? -inf : m - t.tau);
    for (std::int32_t id : order) {
      const float s = key(scores[id]);
      if (m != -inf && s > -inf && s >= cut) ++passing;
    }
  }
  const std::int32_t lo = std::max(0, t.k_min - used), hi = std::max(0, t.k_max - used);
  const std::int32_t k = std::min(hi, std::max(lo, passing));
  return first_sorted(order, static_cast<std::size_t>(k));
}

std::vector<std::int32_t> pick(const threshold& t, const std::vector<float>& s) {
  const run_result r = run(t, {.row = make_row(static_cast<std::int32_t>(s.size())), .scores = s});
  REQUIRE_MESSAGE(r.st.ok(), r.st.message());
  return r.ids;
}

using ids = std::vector<std::int32_t>;

}  // namespace

TEST_CASE("select::threshold: every mode matches the model on tied, NaN and inf scores") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 600; ++trial) {
    const std::int32_t v = uniform(rng, 0, 60);
    const std::vector<float> scores = random_scores(rng, static_cast<std::size_t>(v) + 2, uniform(rng, 0, 1) == 1);
    threshold t;
    t.mode = static_cast<threshold_mode>(uniform(rng, 0, 2));
    t.tau = t.mode == threshold_mode::absolute   ? 0.5f * static_cast<float>(uniform(rng, -8, 8))
            : t.mode == threshold_mode::relative ? (uniform(rng, 0, 9) == 0 ? inf : 0.5f * static_cast<float>(uniform(rng, 0, 8)))
                                                 : static_cast<float>(uniform(rng, 1, 20)) / 20.0f;
    t.k_min = uniform(rng, 0, 1) ? 0 : uniform(rng, 0, 10);
    t.k_max = uniform(rng, 0, 1) ? std::numeric_limits<std::int32_t>::max() : t.k_min + uniform(rng, 0, 20);
    const bool nested = uniform(rng, 0, 2) == 0;
    const ids exclude = nested ? random_subset(rng, v, 0.3) : ids{};
    const std::int32_t used = nested ? uniform(rng, 0, 4) : 0;
    INFO("v ", v, " mode ", static_cast<int>(t.mode), " tau ", t.tau, " k ", t.k_min, "..", t.k_max, " used ", used,
         " scores ", show(scores));
    const run_result r = run(t, {.row = make_row(v, trial), .scores = scores, .exclude = exclude, .budget_used = used});
    REQUIRE_MESSAGE(r.st.ok(), r.st.message());
    CHECK(r.ids == model(t, scores, v, exclude, used));
    CHECK(r.count <= t.max_count(v));
    // Deterministic whatever the workspace held.
    CHECK(run(t, {.row = make_row(v, trial), .scores = scores, .exclude = exclude, .budget_used = used}, -1,
              std::byte{0}).ids == r.ids);
  }
}

TEST_CASE("select::threshold: absolute and relative cuts, with k_min and k_max clamps") {
  const std::vector<float> s{-2, 0, -1, -3, 0, -inf};
  CHECK(pick({.mode = threshold_mode::absolute, .tau = -1.0f}, s) == ids{1, 2, 4});
  CHECK(pick({.mode = threshold_mode::absolute, .tau = 0.5f}, s).empty());
  CHECK(pick({.mode = threshold_mode::absolute, .tau = 0.5f, .k_min = 2}, s) == ids{1, 4});
  CHECK(pick({.mode = threshold_mode::absolute, .tau = -1.0f, .k_max = 2}, s) == ids{1, 4});
  CHECK(pick({.mode = threshold_mode::absolute, .tau = -inf}, s) == ids{0, 1, 2, 3, 4});  // -inf never counts
  CHECK(pick({.mode = threshold_mode::absolute, .tau = -inf, .k_min = 6}, s) == ids{0, 1, 2, 3, 4, 5});
  CHECK(pick({.mode = threshold_mode::absolute, .tau = 9.0f, .k_min = 99}, s).size() == 6);  // clamped to the row
  // relative: within tau logits of the best (0), i.e. weight >= e^-tau of the best's.
  CHECK(pick({.mode = threshold_mode::relative, .tau = 0.0f}, s) == ids{1, 4});
  CHECK(pick({.mode = threshold_mode::relative, .tau = 2.0f}, s) == ids{0, 1, 2, 4});
  CHECK(pick({.mode = threshold_mode::relative, .tau = inf}, s) == ids{0, 1, 2, 3, 4});
  CHECK(pick({.mode = threshold_mode::relative, .tau = 2.0f, .k_min = 0, .k_max = 1}, s) == ids{1});
}

TEST_CASE("select::threshold: mass keeps the smallest best set holding a share tau") {
  // Weights 0.5, 0.3, 0.2 (scores are their logs, in scrambled order).
  const std::vector<float> s{std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.4f}, s) == ids{1});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.5f}, s) == ids{1});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.6f}, s) == ids{1, 2});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.85f}, s) == ids{0, 1, 2});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 1.0f}, s) == ids{0, 1, 2});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 1.0f, .k_max = 2}, s) == ids{1, 2});
  // A block whose weight vanishes against the best one does not change the sum: tau = 1 leaves it.
  CHECK(pick({.mode = threshold_mode::mass, .tau = 1.0f}, {0.0f, -1000.0f}) == ids{0});
  // +inf blocks share all the mass; NaN and -inf hold none.
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.5f}, {inf, 3.0f, inf, qnan}) == ids{0});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 0.75f}, {inf, 3.0f, inf, qnan}) == ids{0, 2});
  CHECK(pick({.mode = threshold_mode::mass, .tau = 1.0f}, {-inf, qnan}).empty());
  CHECK(pick({.mode = threshold_mode::mass, .tau = 1.0f, .k_min = 1}, {-inf, qnan}) == ids{0});
  // Excluded blocks' mass counts as kept: with block 1 (0.5) taken outside, 0.6 needs only block 2.
  const run_result r = run(threshold{.mode = threshold_mode::mass, .tau = 0.6f},
                           {.row = make_row(3), .scores = s, .exclude = std::vector<std::int32_t>{1}});
  CHECK(r.ids == ids{2});
}

TEST_CASE("select::threshold: NaN scores read as -inf; all -inf rows keep only k_min") {
  const std::vector<float> s{qnan, 1.0f, qnan, 1.0f};
  CHECK(pick({.mode = threshold_mode::relative, .tau = 100.0f}, s) == ids{1, 3});
  CHECK(pick({.mode = threshold_mode::relative, .tau = 0.0f, .k_min = 3}, s) == ids{0, 1, 3});
  const std::vector<float> none{qnan, -inf, qnan};
  CHECK(pick({.mode = threshold_mode::relative, .tau = 1.0f}, none).empty());
  CHECK(pick({.mode = threshold_mode::relative, .tau = 1.0f, .k_min = 2}, none) == ids{0, 1});
  CHECK(pick({.mode = threshold_mode::absolute, .tau = 0.0f}, {inf, 1.0f}) == ids{0, 1});
}

TEST_CASE("select::threshold: parameter validation gives exact statuses") {
  const auto bad = [](const threshold& t, const char* message) {
    CHECK(t.validate().code() == status_code::invalid_argument);
    CHECK(std::string(t.validate().message()) == message);
    const std::vector<float> s{1.0f};
    check_error(run(t, {.row = make_row(1), .scores = s}, 1).st, status_code::invalid_argument, message);
  };
  bad({.k_min = -1}, "threshold k_min -1 < 0");
  bad({.k_min = 0, .k_max = -2}, "threshold k_max -2 < 0");
  bad({.k_min = 5, .k_max = 4}, "threshold k_min 5 > k_max 4");
  bad({.mode = threshold_mode::absolute, .tau = qnan}, "threshold tau is NaN");
  bad({.mode = threshold_mode::relative, .tau = -0.5f}, "threshold relative tau -0.5 < 0");
  bad({.mode = threshold_mode::mass, .tau = 0.0f}, "threshold mass tau 0 outside (0, 1]");
  bad({.mode = threshold_mode::mass, .tau = 1.5f}, "threshold mass tau 1.5 outside (0, 1]");
  bad({.mode = threshold_mode::mass, .tau = inf}, "threshold mass tau inf outside (0, 1]");
  bad({.mode = static_cast<threshold_mode>(7)}, "threshold mode 7 unknown");
  CHECK(threshold{.mode = threshold_mode::absolute, .tau = -inf}.validate().ok());
  CHECK(threshold{.mode = threshold_mode::relative, .tau = inf}.validate().ok());
  CHECK(threshold{.mode = threshold_mode::mass, .tau = 1.0f}.validate().ok());
  CHECK(threshold{.k_max = 3}.max_count(10) == 3);
  CHECK(threshold{}.max_count(10) == 10);
}
