// head_pool (skim/route/head_pool.hpp): the offset each head's scores lose under relative pooling,
// and the fold over heads, on scores with infinities and NaN (the GPU router pools the same way and
// its tests compare ids with these functions' selections).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "skim/route/head_pool.hpp"

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

// x and y hold the same values, NaN matching NaN.
bool same(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("head_pool_offset: the largest finite score under relative, 0 without one or under max") {
  const std::vector<float> s{1.5f, -inf, 3.25f, qnan, inf, -2.0f};
  CHECK(skim::head_pool_offset(skim::head_pool::relative, s) == 3.25f);
  CHECK(skim::head_pool_offset(skim::head_pool::max, s) == 0.0f);
  const std::vector<float> none{-inf, qnan, inf};
  CHECK(skim::head_pool_offset(skim::head_pool::relative, none) == 0.0f);
  CHECK(skim::head_pool_offset(skim::head_pool::relative, {}) == 0.0f);
}

TEST_CASE("pool_head_scores: the maximum over heads in order, a NaN never hiding a value") {
  const std::vector<float> h0{1.0f, 3.0f, -inf, qnan, 2.0f};
  const std::vector<float> h1{10.0f, 4.0f, 5.0f, 7.0f, qnan};
  std::vector<float> pooled(5, 123.0f);  // head 0 overwrites whatever is there
  skim::pool_head_scores(skim::head_pool::relative, 0, h0, pooled);
  CHECK(same(pooled, {-2.0f, 0.0f, -inf, qnan, -1.0f}));
  skim::pool_head_scores(skim::head_pool::relative, 1, h1, pooled);
  CHECK(same(pooled, {0.0f, 0.0f, -5.0f, -3.0f, -1.0f}));

  skim::pool_head_scores(skim::head_pool::max, 0, h0, pooled);
  skim::pool_head_scores(skim::head_pool::max, 1, h1, pooled);
  CHECK(same(pooled, {10.0f, 4.0f, 5.0f, 7.0f, 2.0f}));
}
