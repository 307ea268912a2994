#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "skim/core/softmax_state.hpp"

using namespace skim;

namespace {
// State of a row over scores s with values v (dim d), built directly in double.
struct dense_row {
  double lse;
  std::vector<double> o;
};
dense_row dense(const std::vector<float>& s, const std::vector<std::vector<float>>& v) {
  const std::size_t d = v.empty() ? 0 : v[0].size();
  dense_row r{-INFINITY, std::vector<double>(d, 0.0)};
  if (s.empty()) return r;
  double m = -INFINITY;
  for (float x : s) m = std::max(m, static_cast<double>(x));
  double l = 0;
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (std::size_t i = 0; i < d; ++i) r.o[i] += p * v[j][i];
  }
  for (double& x : r.o) x /= l;
  r.lse = m + std::log(l);
  return r;
}
// Partial state over keys [first, last).
softmax_state partial(const std::vector<float>& s, const std::vector<std::vector<float>>& v, std::size_t first,
                      std::size_t last, std::vector<float>& u) {
  softmax_state st;
  for (std::size_t j = first; j < last; ++j) st.m = std::max(st.m, s[j]);
  for (std::size_t j = first; j < last; ++j) {
    const float p = std::exp(s[j] - st.m);
    st.l += p;
    for (std::size_t i = 0; i < u.size(); ++i) u[i] += p * v[j][i];
  }
  return st;
}
}  // namespace

TEST_CASE("merge of partial states equals the softmax of the union, in any split") {
  std::mt19937 rng(99u);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + rng() % 40, d = 1 + rng() % 9;
    std::vector<float> s(n);
    std::vector<std::vector<float>> v(n, std::vector<float>(d));
    for (auto& x : s) x = nd(rng);
    for (auto& row : v)
      for (auto& x : row) x = nd(rng);
    const std::size_t cut = rng() % (n + 1);  // may leave one side empty
    std::vector<float> ua(d, 0.0f), ub(d, 0.0f), o(d);
    softmax_state a = partial(s, v, 0, cut, ua);
    const softmax_state b = partial(s, v, cut, n, ub);
    merge(a, ua, b, ub);
    const float lse = finish(a, ua, o);
    const dense_row ref = dense(s, v);
    INFO("trial ", trial, " n ", n, " cut ", cut);
    CHECK(lse == doctest::Approx(ref.lse).epsilon(1e-5));
    for (std::size_t i = 0; i < d; ++i) CHECK(o[i] == doctest::Approx(ref.o[i]).epsilon(1e-4).scale(1.0));
  }
}

TEST_CASE("empty rows finish as o = 0, lse = -inf, and merging empties stays empty") {
  std::vector<float> ua{1.0f, 2.0f}, ub{3.0f, 4.0f}, o{7.0f, 7.0f};
  softmax_state a, b;
  merge(a, ua, b, ub);
  CHECK(a.empty());
  CHECK(finish(a, ua, o) == neg_inf);
  CHECK(o[0] == 0.0f);
  CHECK(o[1] == 0.0f);
  CHECK(a.m == neg_inf);  // stays -inf: no -inf - -inf was formed
  CHECK(a.l == 0.0f);
}

TEST_CASE("merge_outputs combines normalised outputs by lse") {
  // Two single-key halves: scores 1 and 3, values 10 and -2.
  std::vector<float> oa{10.0f}, ob{-2.0f};
  float lse_a = 1.0f;
  merge_outputs(oa, lse_a, ob, 3.0f);
  const double w1 = std::exp(1.0), w3 = std::exp(3.0);
  CHECK(oa[0] == doctest::Approx((10 * w1 - 2 * w3) / (w1 + w3)));
  CHECK(lse_a == doctest::Approx(std::log(w1 + w3)));
  std::vector<float> oe{0.0f};
  float lse_e = neg_inf;
  merge_outputs(oe, lse_e, ob, neg_inf);
  CHECK(lse_e == neg_inf);
  CHECK(oe[0] == 0.0f);
  merge_outputs(oe, lse_e, ob, 0.5f);
  CHECK(oe[0] == -2.0f);
  CHECK(lse_e == 0.5f);
}
