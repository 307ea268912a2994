#pragma once
// Shared by the metrics tests: fresh seeds, random block_csr selections, and a brute-force model
// of every quality number written independently of skim::metrics (no row_info for the math, no
// online anything: visibility, index rows and top-t from first principles).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "skim/core/problem.hpp"
#include "skim/core/views.hpp"
#include "skim/index/block_csr.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

namespace skim::metrics_test {

// The test case's next seed (support/seed.hpp: replayed by SKIM_TEST_SEED), INFO'd by the caller.
inline std::uint32_t fresh_seed() { return test::next_seed(); }

// An owned block_csr: each row keeps each visible block with probability `keep`.
struct owned_csr {
  std::vector<std::int32_t> row_ptr{0}, col_idx;
  std::vector<std::vector<char>> selected;  // [rows][kv_blocks of the row's sequence]
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
};

[[nodiscard]] inline owned_csr random_csr(const problem& p, std::mt19937& rng, double keep) {
  owned_csr c;
  (void)for_each_row(p, [&](const row_info& r) {
    std::vector<char> sel(static_cast<std::size_t>(r.kv_blocks), 0);
    for (std::int32_t id = 0; id < r.visible_blocks; ++id) {
      if (test::chance(rng, keep)) {
        c.col_idx.push_back(id);
        sel[static_cast<std::size_t>(id)] = 1;
      }
    }
    c.row_ptr.push_back(static_cast<std::int32_t>(c.col_idx.size()));
    c.selected.push_back(std::move(sel));
  });
  return c;
}

// Brute-force numbers of one (query token, query head), stored at [token * heads_q + head].
struct brute_row {
  std::int32_t visible = 0;
  double coverage = 0.0, error = 0.0;
  std::vector<double> recall;
};

template <element TQ, class KV>
[[nodiscard]] std::vector<brute_row> brute_force(const problem& p, strided_view<const TQ> q, const KV& kv_in,
                                                 const std::vector<std::vector<char>>& selected,
                                                 std::span<const std::int32_t> recall_at) {
  const KV kv = kv_in.bind(p);
  std::vector<brute_row> out(static_cast<std::size_t>(p.tokens_q()) * p.heads_q);
  const double scale = p.scale();
  std::int64_t qblock_base = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t nq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const std::int32_t nk = p.cu_seqlens_kv[b + 1] - p.cu_seqlens_kv[b];
    for (std::int32_t qi = 0; qi < nq; ++qi) {
      for (std::int32_t h = 0; h < p.heads_q; ++h) {
        const std::int32_t group = p.heads_q / p.heads_kv;
        const std::int32_t kvh = h / group;
        const std::int32_t ih = p.scope == index_scope::kv_head ? kvh : h;
        const std::int32_t ih_count = p.scope == index_scope::kv_head ? p.heads_kv : p.heads_q;
        const auto& sel = selected[static_cast<std::size_t>((qblock_base + qi / p.block_q) * ih_count + ih)];
        const std::int32_t token = p.cu_seqlens_q[b] + qi;
        brute_row& r = out[static_cast<std::size_t>(token) * p.heads_q + h];
        std::int32_t visible = 0;
        for (std::int32_t j = 0; j < nk; ++j) {
          if (p.mask == mask_kind::none || j <= qi + nk - nq) visible = j + 1;
        }
        r.visible = visible;
        if (visible == 0) continue;
        std::vector<double> s(static_cast<std::size_t>(visible));
        for (std::int32_t j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (std::int32_t e = 0; e < p.head_dim; ++e) {
            dot += double{to_float(q.row(token, h)[e])} * double{to_float(kv.k_row(b, j, kvh)[e])};
          }
          s[static_cast<std::size_t>(j)] = dot * scale;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double z = 0.0;
        for (double x : s) z += std::exp(x - m);
        std::vector<double> alpha(s.size());
        for (std::size_t j = 0; j < s.size(); ++j) alpha[j] = std::exp(s[j] - m) / z;
        const auto in = [&](std::int32_t j) { return sel[static_cast<std::size_t>(j / p.block_kv)] != 0; };
        std::vector<double> od(static_cast<std::size_t>(p.head_dim), 0.0), os = od;
        double c = 0.0;  // 0 when the selection sees nothing: o_sparse = 0, error 1
        for (std::int32_t j = 0; j < visible; ++j) {
          if (in(j)) c += alpha[static_cast<std::size_t>(j)];
        }
        for (std::int32_t j = 0; j < visible; ++j) {
          for (std::int32_t e = 0; e < p.head_dim; ++e) {
            const double v = to_float(kv.v_row(b, j, kvh)[e]);
            od[static_cast<std::size_t>(e)] += alpha[static_cast<std::size_t>(j)] * v;
            if (in(j) && c > 0.0) os[static_cast<std::size_t>(e)] += alpha[static_cast<std::size_t>(j)] / c * v;
          }
        }
        double nd = 0.0, ne = 0.0;
        for (std::size_t e = 0; e < od.size(); ++e) {
          nd += od[e] * od[e];
          ne += (os[e] - od[e]) * (os[e] - od[e]);
        }
        r.coverage = c;
        r.error = std::sqrt(ne / nd);
        std::vector<std::int32_t> order(static_cast<std::size_t>(visible));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
          return alpha[static_cast<std::size_t>(x)] > alpha[static_cast<std::size_t>(y)];
        });
        for (std::int32_t t : recall_at) {
          const std::int32_t te = std::min(t, visible);
          std::int32_t hits = 0;
          for (std::int32_t k = 0; k < te; ++k) hits += in(order[static_cast<std::size_t>(k)]) ? 1 : 0;
          r.recall.push_back(static_cast<double>(hits) / te);
        }
      }
    }
    qblock_base += (nq + p.block_q - 1) / p.block_q;
  }
  return out;
}

}  // namespace skim::metrics_test
