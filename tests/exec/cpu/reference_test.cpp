// exec::reference — the oracle is itself checked: by hand on a tiny case, and against a naive
// dense causal attention written independently here (no row_info, no index).
#include "skim/exec/cpu/reference.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

// softmax(s) · v for the given scores and value rows (double).
std::vector<double> attend(const std::vector<double>& s, const std::vector<std::array<double, 2>>& v) {
  double m = -INFINITY, sum = 0.0;
  for (double x : s) m = std::max(m, x);
  std::vector<double> o(2, 0.0);
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double w = std::exp(s[j] - m);
    sum += w;
    o[0] += w * v[j][0];
    o[1] += w * v[j][1];
  }
  o[0] /= sum;
  o[1] /= sum;
  o.push_back(m + std::log(sum));  // lse
  return o;
}

}  // namespace

TEST_CASE("reference: a tiny causal case computed by hand") {
  // 2 queries, 3 keys, head_dim 2, bq = bk = 2: query 0 sees keys 0, 1; query 1 sees 0, 1, 2.
  const std::array<std::int32_t, 2> cu_q{0, 2}, cu_kv{0, 3};
  const std::array<float, 4> q{0.5f, -1.0f, 2.0f, 0.25f};
  const std::array<float, 6> k{1.0f, 0.0f, -0.5f, 1.5f, 0.75f, 0.75f};
  const std::array<float, 6> v{1.0f, 2.0f, -3.0f, 0.5f, 0.25f, -1.0f};
  const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 2, .block_q = 2, .block_kv = 2, .softmax_scale = 0.5f,
                  .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  std::array<float, 4> o{};
  std::array<float, 2> lse{};
  const contiguous_kv<float> kv{.k = strided_view<const float>::token_major(k.data(), 3, 1, 2),
                                .v = strided_view<const float>::token_major(v.data(), 3, 1, 2)};
  const std::vector<std::array<double, 2>> vrows{{1.0, 2.0}, {-3.0, 0.5}, {0.25, -1.0}};
  const auto score = [&](int qi, int j) { return 0.5 * (q[2 * qi] * k[2 * j] + q[2 * qi + 1] * k[2 * j + 1]); };

  SUBCASE("causal_all") {
    attention_args<float, contiguous_kv<float>, index::causal_all, float> a{
        .prob = p, .q = strided_view<const float>::token_major(q.data(), 2, 1, 2), .kv = kv, .index = {},
        .o = strided_view<float>::token_major(o.data(), 2, 1, 2), .lse = lse};
    REQUIRE(exec::reference{}.run(a, {}).ok());
    const auto e0 = attend({score(0, 0), score(0, 1)}, {vrows[0], vrows[1]});
    const auto e1 = attend({score(1, 0), score(1, 1), score(1, 2)}, vrows);
    CHECK(o[0] == doctest::Approx(e0[0]).epsilon(1e-6));
    CHECK(o[1] == doctest::Approx(e0[1]).epsilon(1e-6));
    CHECK(lse[0] == doctest::Approx(e0[2]).epsilon(1e-6));
    CHECK(o[2] == doctest::Approx(e1[0]).epsilon(1e-6));
    CHECK(o[3] == doctest::Approx(e1[1]).epsilon(1e-6));
    CHECK(lse[1] == doctest::Approx(e1[2]).epsilon(1e-6));
  }
  SUBCASE("sink of one block: query 1 loses key 2") {
    attention_args<float, contiguous_kv<float>, index::sink, float> a{
        .prob = p, .q = strided_view<const float>::token_major(q.data(), 2, 1, 2), .kv = kv, .index = {1},
        .o = strided_view<float>::token_major(o.data(), 2, 1, 2), .lse = lse};
    REQUIRE(exec::reference{}.run(a, {}).ok());
    const auto e1 = attend({score(1, 0), score(1, 1)}, {vrows[0], vrows[1]});
    CHECK(o[2] == doctest::Approx(e1[0]).epsilon(1e-6));
    CHECK(o[3] == doctest::Approx(e1[1]).epsilon(1e-6));
    CHECK(lse[1] == doctest::Approx(e1[2]).epsilon(1e-6));
  }
}

TEST_CASE("reference over causal_all equals a naive dense attention (varlen, GQA, paged, both masks)") {
  for (std::uint32_t seed = 0xa11u; seed < 0xa11u + 24; ++seed) {
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 2e6);
    const random_case<half, bfloat16> c(spec, rng);
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc);
    const problem p = c.prob();
    output<float> o(spec, c.tokens_q());
    c.with_kv([&](auto kv) {
      attention_args<half, decltype(kv), index::causal_all, float> a{
          .prob = p, .q = c.q_view(), .kv = kv, .index = {}, .o = o.view, .lse = o.lse};
      REQUIRE(exec::reference{}.run(a, {}).ok());
    });

    // Naive: query i of sequence b (n_q queries, n_kv keys) sees keys j < n_kv with
    // j <= i + n_kv - n_q under causality; read K/V straight from the token-major arrays.
    const std::int32_t d = spec.head_dim, group = spec.heads_q / spec.heads_kv;
    const double scale = spec.softmax_scale != 0.0f ? spec.softmax_scale : 1.0 / std::sqrt(static_cast<float>(d));
    int mismatches = 0;
    for (std::size_t b = 0; b < spec.seqs.size(); ++b) {
      const std::int32_t nq = spec.seqs[b].q, nkv = spec.seqs[b].kv;
      for (std::int32_t i = 0; i < nq; ++i) {
        for (std::int32_t h = 0; h < spec.heads_q; ++h) {
          const std::int32_t token = c.cu_q[b] + i;
          const half* qrow = c.q_view().row(token, h);
          std::vector<double> s;
          double m = -INFINITY;
          const std::int32_t last = spec.mask == mask_kind::causal ? std::min(nkv, i + nkv - nq + 1) : nkv;
          for (std::int32_t j = 0; j < last; ++j) {
            const bfloat16* krow = &c.k[((c.cu_kv[b] + j) * spec.heads_kv + h / group) * d];
            double dot = 0.0;
            for (std::int32_t e = 0; e < d; ++e) dot += double(qrow[e].to_float()) * krow[e].to_float();
            s.push_back(scale * dot);
            m = std::max(m, s.back());
          }
          double sum = 0.0;
          std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
          for (std::int32_t j = 0; j < static_cast<std::int32_t>(s.size()); ++j) {
            const double w = std::exp(s[j] - m);
            sum += w;
            const bfloat16* vrow = &c.v[((c.cu_kv[b] + j) * spec.heads_kv + h / group) * d];
            for (std::int32_t e = 0; e < d; ++e) acc[e] += w * vrow[e].to_float();
          }
          const float* orow = o.view.row(token, h);
          const float lse = o.lse[static_cast<std::size_t>(token * spec.heads_q + h)];
          if (s.empty()) {
            for (std::int32_t e = 0; e < d; ++e) mismatches += orow[e] != 0.0f;
            mismatches += lse != -INFINITY;
            continue;
          }
          for (std::int32_t e = 0; e < d; ++e) {
            mismatches += std::abs(orow[e] - acc[e] / sum) > 1e-6 * (1.0 + std::abs(acc[e] / sum));
          }
          mismatches += std::abs(lse - (m + std::log(sum))) > 1e-6 * (1.0 + std::abs(m + std::log(sum)));
        }
      }
    }
    CHECK(mismatches == 0);
  }
}
