// skim::evict::accumulate_mass against a brute-force softmax in double (GQA, partial blocks,
// block_table and causal_all, executor LSE or computed).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "skim/core/workspace.hpp"
#include "skim/evict/attention_mass.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"

using namespace skim;

TEST_CASE("evict::accumulate_mass: per (block, kv head) mass equals brute-force softmax mass") {
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  const int n_q = 5, n_kv = 37, hq = 4, hkv = 2, hd = 8, bk = 8;  // partial last block
  const std::int32_t cu_q[] = {0, n_q}, cu_kv[] = {0, n_kv};
  const problem p{.heads_q = hq, .heads_kv = hkv, .head_dim = hd, .block_q = 2, .block_kv = bk,
                  .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  std::vector<float> q(n_q * hq * hd), k(n_kv * hkv * hd), v(k.size()), o(q.size()), lse(n_q * hq);
  for (float& x : q) x = g(rng);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  const auto qv = strided_view<const float>::token_major(q.data(), n_q, hq, hd);
  const contiguous_kv<float> kv{.k = strided_view<const float>::token_major(k.data(), n_kv, hkv, hd),
                                .v = strided_view<const float>::token_major(v.data(), n_kv, hkv, hd)};
  // A sparse index: every row reads blocks {0, 2, last visible}.
  const std::int32_t rows = static_cast<std::int32_t>(p.index_rows()), width = 3;
  std::vector<std::int32_t> ids(rows * width), count(rows);
  (void)for_each_row(p, [&](const row_info& r) {
    std::vector<int> s = {0, 2, r.visible_blocks - 1};
    s.erase(std::unique(s.begin(), s.end()), s.end());
    std::copy(s.begin(), s.end(), ids.begin() + r.row * width);
    count[r.row] = static_cast<std::int32_t>(s.size());
  });
  const index::block_table table{.ids = ids, .count = count, .width = width};
  const auto brute = [&](bool sparse) {
    std::vector<double> mass(p.max_kv_blocks() * hkv, 0.0);
    for (int t = 0; t < n_q; ++t) {
      const int visible = t + n_kv - n_q + 1, vb = (visible + bk - 1) / bk;
      for (int h = 0; h < hq; ++h) {
        const int kh = h / (hq / hkv);
        std::vector<double> s(visible, -INFINITY);
        double mx = -INFINITY, z = 0;
        for (int j = 0; j < visible; ++j) {
          const int b = j / bk;
          if (sparse && !(b == 0 || b == 2 || b == vb - 1)) continue;
          double d = 0;
          for (int e = 0; e < hd; ++e) d += static_cast<double>(q[(t * hq + h) * hd + e]) * k[(j * hkv + kh) * hd + e];
          s[j] = d / std::sqrt(8.0);
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int j = 0; j < visible; ++j) mass[(j / bk) * hkv + kh] += s[j] / z;
      }
    }
    return mass;
  };
  // Sparse, with the scalar executor's LSE, and with the LSE computed inside.
  const exec::scalar ex;
  workspace_buffer ws(ex.workspace_bytes(p));
  REQUIRE(ex.run(attention_args<float, contiguous_kv<float>, index::block_table, float>{
                     .prob = p, .q = qv, .kv = kv, .index = table,
                     .o = strided_view<float>::token_major(o.data(), n_q, hq, hd), .lse = lse},
                 ws.span())
              .ok());
  for (const bool with_lse : {true, false}) {
    std::vector<float> mass(evict::mass_floats(p), 0.0f);
    REQUIRE(evict::accumulate_mass(p, qv, kv, table, with_lse ? std::span<const float>(lse) : std::span<const float>{}, mass).ok());
    const std::vector<double> want = brute(true);
    for (std::size_t i = 0; i < mass.size(); ++i) CHECK(mass[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
  std::vector<float> dense(evict::mass_floats(p), 0.0f);
  REQUIRE(evict::accumulate_mass(p, qv, kv, index::causal_all{}, {}, dense).ok());
  const std::vector<double> want = brute(false);
  double total = 0;
  for (std::size_t i = 0; i < dense.size(); ++i) {
    CHECK(dense[i] == doctest::Approx(want[i]).epsilon(1e-5));
    total += dense[i];
  }
  CHECK(total == doctest::Approx(n_q * hq));  // each (query, head) spreads mass 1
  std::vector<float> small(3);
  CHECK_FALSE(evict::accumulate_mass(p, qv, kv, index::causal_all{}, {}, small).ok());
}
