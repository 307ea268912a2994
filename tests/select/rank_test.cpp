// skim::select::detail (select/rank.hpp): the ranking order (key descending, id ascending; NaN is
// -inf) and the helpers built on it, against brute force on random scores full of ties (quantised
// levels, -0 beside +0, NaN beside -inf, +inf). The model ranks with std::stable_sort over ids in
// ascending order (select_testing.hpp's ranked), independently of rank.hpp's comparator.
#include "skim/select/rank.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <numeric>
#include <string>
#include <vector>

#include "select/select_testing.hpp"

using namespace skim;
using namespace select_test;
namespace sd = skim::select::detail;

namespace {

// random_scores, with some zeros turned into -0 (equal to +0, so a tie broken by the id).
std::vector<float> tied_scores(std::mt19937& rng, std::size_t n) {
  std::vector<float> s = random_scores(rng, n);
  for (float& x : s) {
    if (x == 0.0f && uniform(rng, 0, 1) == 0) x = -0.0f;
  }
  return s;
}

// Distinct keys close together (one binade around a random centre, so that they share their top
// bits), some repeated exactly, some -0, +-0 subnormals, NaN and +-inf: every digit of ordered_key matters.
std::vector<float> spread_scores(std::mt19937& rng, std::size_t n) {
  const float centre = std::ldexp(1.0f, uniform(rng, -8, 8)) * (uniform(rng, 0, 1) == 0 ? 1.0f : -1.0f);
  std::uniform_real_distribution<float> offset(0.0f, 1.0f);
  std::vector<float> s(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int kind = uniform(rng, 0, 39);
    s[i] = kind == 0 ? qnan : kind == 1 ? -inf : kind == 2 ? inf : kind == 3 ? -0.0f : kind == 4 ? 0.0f
         : kind == 5 ? std::numeric_limits<float>::denorm_min() * static_cast<float>(uniform(rng, -3, 3))
         : kind == 6 && i > 0 ? s[i - 1]  // an exact tie with the previous id
         : centre * (1.0f + offset(rng));
  }
  return s;
}

std::vector<std::int32_t> shuffled_ids(std::mt19937& rng, std::int32_t v) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

}  // namespace

TEST_CASE("select::detail::key reads NaN as -inf and every other score as itself") {
  SKIM_SELECT_RANDOM_CASE(rng);
  const std::vector<float> s = tied_scores(rng, 400);
  std::size_t nans = 0;
  for (const float x : s) {
    if (std::isnan(x)) {
      ++nans;
      CHECK(sd::key(x) == -inf);
    } else {
      CHECK(std::bit_cast<std::uint32_t>(sd::key(x)) == std::bit_cast<std::uint32_t>(x));  // -0 stays -0
    }
  }
  CHECK(nans > 0);
  CHECK(sd::key(-qnan) == -inf);
  CHECK(sd::key(inf) == inf);
}

TEST_CASE("select::detail::ranks_before is a strict total order: sorting by it is the stable-sort model") {
  SKIM_SELECT_RANDOM_CASE(rng);
  std::int64_t ties = 0;  // pairs with equal keys, over all trials: the id decides them
  for (int trial = 0; trial < 200; ++trial) {
    const std::int32_t v = uniform(rng, 0, 60);
    const std::vector<float> s = tied_scores(rng, static_cast<std::size_t>(v));
    INFO("scores ", show(s));
    const sd::ranks_before before{s.data()};
    for (std::int32_t a = 0; a < v; ++a) {
      CHECK_FALSE(before(a, a));
      for (std::int32_t b = a + 1; b < v; ++b) {
        CHECK(before(a, b) != before(b, a));  // exactly one way round for distinct ids
        const bool tie = key(s[static_cast<std::size_t>(a)]) == key(s[static_cast<std::size_t>(b)]);
        ties += tie;
        if (tie) CHECK(before(a, b));  // equal keys: the lower id first
      }
    }
    std::vector<std::int32_t> ids = shuffled_ids(rng, v);
    std::sort(ids.begin(), ids.end(), before);
    CHECK(ids == ranked(s, v));
  }
  CHECK(ties > 1000);
}

TEST_CASE("select::detail::ordered_key orders keys as the ranking does: NaN as -inf, -0 as +0") {
  SKIM_SELECT_RANDOM_CASE(rng);
  std::vector<float> s = spread_scores(rng, 2000);
  const std::vector<float> tied = tied_scores(rng, 400);
  s.insert(s.end(), tied.begin(), tied.end());
  for (const float x : {-qnan, qnan, -inf, inf, -0.0f, 0.0f, std::numeric_limits<float>::denorm_min(),
                        -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::lowest()}) {
    s.push_back(x);
  }
  std::int64_t equal = 0;
  for (std::size_t a = 0; a < s.size(); a += 7) {
    for (std::size_t b = 0; b < s.size(); b += 5) {
      const float ka = key(s[a]), kb = key(s[b]);
      const std::uint32_t ua = sd::ordered_key(s[a]), ub = sd::ordered_key(s[b]);
      INFO(s[a], " vs ", s[b]);
      CHECK((ka > kb) == (ua > ub));
      CHECK((ka == kb) == (ua == ub));
      equal += ka == kb;
    }
  }
  CHECK(equal > 100);
  CHECK(sd::ordered_key(-0.0f) == sd::ordered_key(0.0f));
  CHECK(sd::ordered_key(-qnan) == sd::ordered_key(-inf));
}

TEST_CASE("select::detail::keep_best: the k best by the ranking, in id order, from ascending candidates") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 400; ++trial) {
    // Small rows full of ties, and long rows of distinct keys that share their top bits (so the
    // selection refines the k-th key through every digit), with ties, specials and -0 mixed in.
    const bool long_row = trial % 4 == 3;
    const std::int32_t v = long_row ? uniform(rng, 200, 5000) : uniform(rng, 0, 80);
    const std::vector<float> s = long_row ? spread_scores(rng, static_cast<std::size_t>(v))
                                          : tied_scores(rng, static_cast<std::size_t>(v));
    // A random candidate subset (some ids excluded), ascending as every caller hands it over.
    const std::vector<std::int32_t> excluded = random_subset(rng, v, 0.25);
    std::vector<std::int32_t> ids;
    for (std::int32_t j = 0; j < v; ++j) {
      if (!std::binary_search(excluded.begin(), excluded.end(), j)) ids.push_back(j);
    }
    const int n = static_cast<int>(ids.size());
    const int pick = uniform(rng, 0, 3);  // the ends, where the selection has nothing to find, often
    const std::size_t k = static_cast<std::size_t>(pick == 0 ? 0 : pick == 1 ? n : uniform(rng, 0, n));
    INFO("k ", k, " of ", ids.size());
    const std::vector<std::int32_t> want = first_sorted(ranked(s, v, excluded), k);

    std::vector<std::int32_t> got = ids;
    sd::keep_best(s, got, k);
    CHECK(std::vector<std::int32_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(k)) == want);
  }
}

TEST_CASE("select::detail::gather_candidates writes [0, visible) minus exclude, ascending") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int32_t v = uniform(rng, 0, 100);
    const std::vector<std::int32_t> exclude = random_subset(rng, v, uniform(rng, 0, 4) * 0.25);
    std::vector<std::int32_t> want;
    for (std::int32_t j = 0; j < v; ++j) {
      if (std::find(exclude.begin(), exclude.end(), j) == exclude.end()) want.push_back(j);
    }
    std::vector<std::int32_t> out(want.size() + 3, -7);
    const std::int32_t n = sd::gather_candidates(v, exclude, out);
    INFO("visible ", v, ", excluded ", exclude.size());
    REQUIRE(n == static_cast<std::int32_t>(want.size()));
    CHECK(std::vector<std::int32_t>(out.begin(), out.begin() + n) == want);
    CHECK(std::all_of(out.begin() + n, out.end(), [](std::int32_t x) { return x == -7; }));  // nothing past n
  }
}

TEST_CASE("select::detail::merge_into merges two disjoint ascending lists in place") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int32_t v = uniform(rng, 0, 90);
    // Split a random subset of [0, v) into two disjoint ascending lists.
    std::vector<std::int32_t> a, b;
    for (const std::int32_t id : random_subset(rng, v, 0.6)) (uniform(rng, 0, 1) ? a : b).push_back(id);
    std::vector<std::int32_t> want;
    std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(want));
    const std::size_t na = a.size();
    const std::size_t spare = static_cast<std::size_t>(uniform(rng, 0, 3));
    a.resize(na + b.size() + spare, -7);
    sd::merge_into(a, na, b);
    CHECK(std::vector<std::int32_t>(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(want.size())) == want);
    const auto untouched = [](std::int32_t x) { return x == -7; };
    CHECK(std::all_of(a.begin() + static_cast<std::ptrdiff_t>(want.size()), a.end(), untouched));
  }
}

TEST_CASE("select::detail::check_row_input accepts valid rows and names each bad value") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 200; ++trial) {  // valid: extra scores/prior, any exclude set
    const std::int32_t v = uniform(rng, 0, 40);
    const std::vector<float> scores = random_scores(rng, static_cast<std::size_t>(v + uniform(rng, 0, 3)));
    const std::vector<float> prior =
        uniform(rng, 0, 1) ? random_scores(rng, static_cast<std::size_t>(v)) : std::vector<float>{};
    const std::vector<std::int32_t> exclude = random_subset(rng, v, 0.3);
    const status st = sd::check_row_input(
        {.row = make_row(v, trial), .scores = scores, .prior = prior, .exclude = exclude,
         .budget_used = uniform(rng, 0, 9)});
    CHECK_MESSAGE(st.ok(), st.message());
  }
  const std::vector<float> three{1.0f, 2.0f, 3.0f}, two{1.0f, 2.0f};
  const auto check = [&](row_scores in, status_code code, const std::string& message) {
    check_error(sd::check_row_input(in), code, message);
  };
  check({.row = make_row(-1, 7), .scores = three}, status_code::invalid_argument, "visible blocks -1 < 0 in row 7");
  check({.row = make_row(3, 7), .scores = two}, status_code::shape_mismatch,
        "scores has 2 entries < visible blocks 3 in row 7");
  check({.row = make_row(3, 7), .scores = three, .prior = two}, status_code::shape_mismatch,
        "prior has 2 entries < visible blocks 3 in row 7");
  check({.row = make_row(3, 7), .scores = three, .budget_used = -2}, status_code::invalid_argument,
        "budget_used -2 < 0 in row 7");
  const std::vector<std::int32_t> negative{-1}, too_big{0, 3}, repeated{0, 2, 2}, descending{1, 0};
  check({.row = make_row(3, 7), .scores = three, .exclude = negative}, status_code::invalid_argument,
        "exclude id -1 outside [0, 3) in row 7 (position 0)");
  check({.row = make_row(3, 7), .scores = three, .exclude = too_big}, status_code::invalid_argument,
        "exclude id 3 outside [0, 3) in row 7 (position 1)");
  check({.row = make_row(3, 7), .scores = three, .exclude = repeated}, status_code::invalid_argument,
        "exclude ids not strictly ascending in row 7: 2 at position 2 after 2");
  check({.row = make_row(3, 7), .scores = three, .exclude = descending}, status_code::invalid_argument,
        "exclude ids not strictly ascending in row 7: 0 at position 1 after 1");
  // No prior at all is fine, and a row of 0 visible blocks needs no scores.
  CHECK(sd::check_row_input({.row = make_row(3, 7), .scores = three}).ok());
  CHECK(sd::check_row_input({.row = make_row(0, 7)}).ok());
}

TEST_CASE("select::detail::out_too_small names the row, the ids needed and the room") {
  check_error(sd::out_too_small(make_row(9, 12), 5, 3), status_code::shape_mismatch,
              "row 12 selects 5 blocks, out has room for 3");
}
