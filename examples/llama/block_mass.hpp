#pragma once
// skim_llama block masses — how much attention each key block truly receives, for the engine's
// measurements and its oracle baseline.
//
//  - dense_block_mass(): the dense attention probabilities of every (query, query head) of one
//    attention call over the call's own Q and K, summed per key block:
//      mass[(i · heads_q + h) · blocks + j] = Σ_{visible keys k of block j} softmax_k(scale · q_{i,h}·k)
//    (causal bottom-right as forward.hpp: query i sees keys k <= i + n_kv − n_q). Eigen products per
//    query head and chunk of queries, on `threads` threads; each chunk's numbers depend on the chunk
//    only, so they are the same for any thread count.
//  - row_mass(): the mass of each visible block for one index row of a skim problem (the row's
//    queries and, for a kv-head row, its group's query heads, summed): the oracle's ranking.
//  - coverage_stats: the share of the true mass each (query, query head) keeps under a selection,
//    per layer and head and as a distribution (mean, p5, worst head), over queries at positions
//    >= min_position.
// An evaluation tool (it allocates, O(n_q · n_kv · heads · head_dim)), not a hot path.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llama/forward.hpp"
#include "skim/core/parallel.hpp"
#include "skim/core/problem.hpp"
#include "skim/index/block_table.hpp"

namespace skim_llama {

inline constexpr int mass_query_chunk = 128;

[[nodiscard]] inline int key_blocks(int n_kv, int block_kv) { return (n_kv + block_kv - 1) / block_kv; }

// See the header comment; mass is resized to n_q · heads_q · key_blocks(n_kv, block_kv).
// top (optional): the blocks of each row's recall_keys most probable keys, [n_q · heads_q · recall_keys]
// (ties to the lower key; -1 past a row's visible keys), for recall@recall_keys.
inline constexpr int recall_keys = 16;
inline void dense_block_mass(const attention_args& a, int block_kv, int threads, std::vector<float>& mass,
                             std::vector<std::int32_t>* top = nullptr) {
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using strided = Eigen::Map<const matrix, 0, Eigen::OuterStride<>>;
  const int blocks = key_blocks(a.n_kv, block_kv), group = a.heads_q / a.heads_kv;
  mass.assign(static_cast<std::size_t>(a.n_q) * a.heads_q * blocks, 0.0f);
  if (top) top->assign(static_cast<std::size_t>(a.n_q) * a.heads_q * recall_keys, -1);
  std::vector<std::vector<std::int32_t>> order(static_cast<std::size_t>(std::min(std::max(threads, 1), skim::max_parallel_threads)));
  const int chunks = (a.n_q + mass_query_chunk - 1) / mass_query_chunk;
  const int offset = a.n_kv - a.n_q;
  std::vector<matrix> scratch(static_cast<std::size_t>(std::min(std::max(threads, 1), skim::max_parallel_threads)));
  skim::parallel_for(static_cast<std::int64_t>(chunks) * a.heads_q, threads, [&](std::int32_t slot, std::int64_t item, std::int64_t) {
    const int h = static_cast<int>(item % a.heads_q), c = static_cast<int>(item / a.heads_q);
    const int q0 = c * mass_query_chunk, qn = std::min(mass_query_chunk, a.n_q - q0);
    const int keys = std::min(a.n_kv, q0 + qn + offset);  // the chunk's last query sees keys [0, keys)
    const strided q(a.q.data() + (static_cast<std::size_t>(q0) * a.heads_q + h) * a.head_dim, qn, a.head_dim,
                    Eigen::OuterStride<>(a.heads_q * a.head_dim));
    const strided k(a.k.data() + static_cast<std::size_t>(h / group) * a.head_dim, keys, a.head_dim,
                    Eigen::OuterStride<>(a.heads_kv * a.head_dim));
    matrix& s = scratch[static_cast<std::size_t>(slot)];
    s.noalias() = (q * k.transpose()) * a.scale;
    for (int t = 0; t < qn; ++t) {
      const int visible = std::min(a.n_kv, q0 + t + offset + 1);
      const float* row = s.data() + static_cast<std::size_t>(t) * keys;
      const float mx = *std::max_element(row, row + visible);
      double z = 0;
      for (int j = 0; j < visible; ++j) z += std::exp(static_cast<double>(row[j] - mx));
      float* out = mass.data() + (static_cast<std::size_t>(q0 + t) * a.heads_q + h) * blocks;
      for (int b = 0; b * block_kv < visible; ++b) {
        double m = 0;
        for (int j = b * block_kv; j < std::min(visible, (b + 1) * block_kv); ++j) m += std::exp(static_cast<double>(row[j] - mx));
        out[b] = static_cast<float>(m / z);
      }
      if (top) {  // the recall_keys largest scores, ties to the lower key
        std::vector<std::int32_t>& o = order[static_cast<std::size_t>(slot)];
        o.resize(static_cast<std::size_t>(visible));
        for (int j = 0; j < visible; ++j) o[static_cast<std::size_t>(j)] = j;
        const int t_n = std::min(recall_keys, visible);
        std::partial_sort(o.begin(), o.begin() + t_n, o.end(), [&](std::int32_t x, std::int32_t y) { return row[x] != row[y] ? row[x] > row[y] : x < y; });
        std::int32_t* dst = top->data() + (static_cast<std::size_t>(q0 + t) * a.heads_q + h) * recall_keys;
        for (int i = 0; i < t_n; ++i) dst[i] = o[static_cast<std::size_t>(i)] / block_kv;
      }
    }
  });
}

// Query heads an index row stands for: [first, first + count).
struct row_heads {
  int first = 0, count = 1;
};
[[nodiscard]] inline row_heads heads_of(const skim::problem& p, const skim::row_info& r) {
  return p.scope == skim::index_scope::kv_head ? row_heads{r.head * p.group_size(), p.group_size()} : row_heads{r.head, 1};
}

// The row's visible blocks' mass, summed over its queries and query heads, into out[0, visible).
inline void row_mass(const skim::problem& p, const skim::row_info& r, std::span<const float> mass, int blocks, std::span<float> out) {
  std::fill(out.begin(), out.begin() + r.visible_blocks, 0.0f);
  const row_heads hs = heads_of(p, r);
  for (int t = r.q_begin; t < r.q_end; ++t) {
    for (int h = hs.first; h < hs.first + hs.count; ++h) {
      const float* m = mass.data() + (static_cast<std::size_t>(t) * p.heads_q + h) * blocks;
      for (int b = 0; b < r.visible_blocks; ++b) out[b] += m[b];
    }
  }
}

// The mass the executor gave each selected block of each row, from its log-sum-exp: for row r and a
// block j it read,
//   out[r.row · stride + j] = Σ_{queries t, heads h of the row} Σ_{visible keys k of j} exp(scale · q_{t,h}·k − lse_{t,h})
// (stride = p.max_kv_blocks()), and 0 for the blocks it did not read. This is what layer l hands
// layer l + 1 as its prior: an executor that accumulates it while it runs gets it for free.
inline void selected_mass(const skim::problem& p, const attention_args& a, skim::index::block_table table, std::span<const float> lse,
                          std::vector<float>& out) {
  using vec = Eigen::Map<const Eigen::VectorXf>;
  const int stride = p.max_kv_blocks(), group = p.group_size();
  out.assign(static_cast<std::size_t>(p.index_rows()) * stride, 0.0f);
  (void)skim::for_each_row(p, [&](const skim::row_info& r) {
    const row_heads hs = heads_of(p, r);
    float* o = out.data() + static_cast<std::size_t>(r.row) * stride;
    for (auto cur = table.cursor(r); !cur.done(); cur.next()) {
      const int j = cur.id();
      double m = 0;
      for (int t = r.q_begin; t < r.q_end; ++t) {
        const int visible = r.visible_keys(t, p.mask);
        for (int h = hs.first; h < hs.first + hs.count; ++h) {
          const vec q(a.q.data() + (static_cast<std::size_t>(t) * a.heads_q + h) * a.head_dim, a.head_dim);
          const float l = lse[static_cast<std::size_t>(t) * a.heads_q + h];
          for (int k = j * p.block_kv; k < std::min(visible, (j + 1) * p.block_kv); ++k) {
            const vec key(a.k.data() + (static_cast<std::size_t>(k) * a.heads_kv + h / group) * a.head_dim, a.head_dim);
            m += std::exp(static_cast<double>(a.scale * q.dot(key) - l));
          }
        }
      }
      o[j] = static_cast<float>(m);
    }
  });
}

// Coverage of selections against the true block masses (header comment).
struct coverage_stats {
  int min_position = 0;
  std::vector<double> sum;       // [layers * heads_q]
  std::vector<std::int64_t> n;   // [layers * heads_q]
  std::vector<float> all;        // every (query, head) coverage measured
  double recall_sum = 0;         // Σ recall@recall_keys over them
  int heads_q = 0;

  // Adds one call's selection `table` (rows of problem p, queries at absolute positions first..),
  // with the true masses and top blocks of dense_block_mass.
  void add(const skim::problem& p, skim::index::block_table table, std::span<const float> mass, std::span<const std::int32_t> top,
           int layer, int first_position) {
    heads_q = p.heads_q;
    const int blocks = p.max_kv_blocks();
    const std::size_t cell = static_cast<std::size_t>(layer + 1) * p.heads_q;
    if (sum.size() < cell) sum.resize(cell, 0.0), n.resize(cell, 0);
    std::vector<char> chosen(static_cast<std::size_t>(blocks));
    (void)skim::for_each_row(p, [&](const skim::row_info& r) {
      const row_heads hs = heads_of(p, r);
      for (int t = std::max(r.q_begin, min_position - first_position); t < r.q_end; ++t) {
        for (int h = hs.first; h < hs.first + hs.count; ++h) {
          const float* m = mass.data() + (static_cast<std::size_t>(t) * p.heads_q + h) * blocks;
          double c = 0;
          std::fill(chosen.begin(), chosen.end(), 0);
          for (auto cur = table.cursor(r); !cur.done(); cur.next()) {
            c += m[cur.id()];
            chosen[static_cast<std::size_t>(cur.id())] = 1;
          }
          const std::int32_t* tb = top.data() + (static_cast<std::size_t>(t) * p.heads_q + h) * recall_keys;
          int hit = 0, want = 0;
          for (int i = 0; i < recall_keys && tb[i] >= 0; ++i, ++want) hit += chosen[static_cast<std::size_t>(tb[i])];
          recall_sum += want > 0 ? static_cast<double>(hit) / want : 1.0;
          sum[static_cast<std::size_t>(layer) * p.heads_q + h] += c;
          ++n[static_cast<std::size_t>(layer) * p.heads_q + h];
          all.push_back(static_cast<float>(c));
        }
      }
    });
  }
  [[nodiscard]] double recall() const { return all.empty() ? 1.0 : recall_sum / static_cast<double>(all.size()); }
  [[nodiscard]] double mean() const {
    double s = 0;
    for (const float c : all) s += c;
    return all.empty() ? 1.0 : s / static_cast<double>(all.size());
  }
  // The p-th quantile (0..1) of all coverages.
  [[nodiscard]] double quantile(double q) const {
    if (all.empty()) return 1.0;
    std::vector<float> v = all;
    const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }
  // The (layer, head) of the lowest mean coverage, and that mean.
  [[nodiscard]] double worst_head(int& layer, int& head) const {
    double worst = 2.0;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      if (n[i] == 0) continue;
      const double m = sum[i] / static_cast<double>(n[i]);
      if (m < worst) worst = m, layer = static_cast<int>(i) / heads_q, head = static_cast<int>(i) % heads_q;
    }
    return worst > 1.5 ? 1.0 : worst;
  }
};

}  // namespace skim_llama
