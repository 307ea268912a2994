#pragma once
// skim::metrics quality — does the sparse attention an index selects compute what dense would?
//
// For every (query token, query head) row it takes the index row of index head index_head_of(h) for
// the token's query block, and computes in double precision, over the keys the query may see
// (causal bottom-right, sequence length; docs/design.md §3, §12):
//  - α, the dense attention probabilities softmax(scale · q·kᵀ) over every visible key;
//  - recall@t: the share of the dense top-t keys (by α, ties to the lower key index; all visible
//    keys if fewer than t) that lie in the selected blocks;
//  - coverage C = Σ_{j selected, visible} α_j, the attention mass the selection keeps;
//  - error ‖o_sparse − o_dense‖ / ‖o_dense‖, with o_dense = Σ α_j v_j and o_sparse the same α
//    restricted to the selected visible keys and renormalised (computed with its own max, so a
//    selection whose mass underflows C is still exact). A selection that sees no key gives
//    o_sparse = 0, error 1. (If ‖o_dense‖ = 0 the error is 0 when o_sparse = 0, else +inf.)
// A row that sees no key at all (an empty sequence's keys, more queries than keys under causality)
// has no α: it is skipped and counted in rows_without_keys.
//
// Physical cost (tiles, keys read, pairs read vs needed) is per index row: see cost.hpp.
//
// Use: measure() for one call; quality_accumulator to add several calls (layers, or batches of one
// layer) into one report with per-(layer, head) means and the worst (layer, head) by mean.
// for_each_query_row() gives the per-row numbers themselves.
//
// Cost: O(tokens_q · tokens_kv · heads_q · head_dim), like exec::reference. It allocates
// (std::vector, std::map) and keeps every row's numbers (8·(2 + |recall_at|) bytes per row) for
// exact percentiles: an evaluation tool, not a hot path.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "skim/concepts/block_index.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/metrics/cost.hpp"
#include "skim/metrics/tail.hpp"

namespace skim::metrics {

inline constexpr std::int32_t default_recall_at[] = {8, 16, 32};

struct quality_options {
  std::span<const std::int32_t> recall_at = default_recall_at;  // the t of each recall@t, each >= 1
};

// One (query token, query head) row's numbers, as for_each_query_row() hands them on.
struct query_row {
  std::int32_t seq = 0;           // sequence in the batch
  std::int32_t token = 0;         // query token in the packed batch (cu_seqlens_q[seq] + query)
  std::int32_t query = 0;         // query within its sequence
  std::int32_t head = 0;          // query head
  std::int32_t index_head = 0;    // index head whose row was used
  std::int64_t index_row = 0;     // that index row
  std::int32_t visible_keys = 0;  // keys the query may see; 0: nothing below is defined (NaN)
  std::int32_t selected_keys = 0; // visible keys in the selected blocks
  double coverage = std::numeric_limits<double>::quiet_NaN();
  double error = std::numeric_limits<double>::quiet_NaN();
  std::span<const double> recall{};  // [recall_at.size()], recall[i] is recall@recall_at[i]

  [[nodiscard]] bool has_keys() const noexcept { return visible_keys > 0; }
};

[[nodiscard]] inline status check_recall_at(std::span<const std::int32_t> recall_at) noexcept {
  for (std::size_t i = 0; i < recall_at.size(); ++i) {
    if (recall_at[i] < 1) {
      return status::error(status_code::invalid_argument, "recall_at[%zu] = %d < 1", i, recall_at[i]);
    }
  }
  return status::success();
}

// Calls f(const query_row&) for every (query token, query head) row, in order (sequence, query
// block, query head, query). Checks the problem, Q, the K/V source, the index (validate(), and each
// id as it is read) and recall_at before reading anything; f is not called past a failure.
template <element TQ, kv_source KV, block_index Index, class F>
[[nodiscard]] status for_each_query_row(const problem& p, strided_view<const TQ> q, const KV& kv_source_in,
                                        const Index& index, std::span<const std::int32_t> recall_at, F&& f) {
  SKIM_TRY(validate(p));
  SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
  SKIM_TRY(kv_source_in.validate(p));
  SKIM_TRY(index.validate(p));
  SKIM_TRY(check_recall_at(recall_at));
  const KV kv = kv_source_in.bind(p);
  const double scale = p.scale();
  const std::int32_t d = p.head_dim;
  const std::int32_t t_max = recall_at.empty() ? 0 : *std::max_element(recall_at.begin(), recall_at.end());

  std::vector<char> selected;       // [kv_blocks] of the current index row
  std::vector<double> score, alpha; // [visible keys]
  std::vector<std::int32_t> order;  // [visible keys], keys by α descending
  std::vector<double> o_dense(static_cast<std::size_t>(d)), o_sparse(static_cast<std::size_t>(d));
  std::vector<double> recall(recall_at.size());

  std::int64_t row_base = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    for (std::int32_t i = 0; i < p.q_blocks(b); ++i) {
      for (std::int32_t h = 0; h < p.heads_q; ++h) {
        const row_info row = make_row_info(p, row_base, b, i, p.index_head_of(h));
        const std::int32_t kv_head = h / p.group_size();
        selected.assign(static_cast<std::size_t>(row.kv_blocks), 0);
        SKIM_TRY(for_each_block_id(index, row, [&](std::int32_t id) { selected[static_cast<std::size_t>(id)] = 1; }));
        const auto is_selected = [&](std::int32_t j) { return selected[static_cast<std::size_t>(j / p.block_kv)] != 0; };

        for (std::int32_t qi = row.q_begin; qi < row.q_end; ++qi) {
          query_row r{.seq = b, .token = p.cu_seqlens_q[b] + qi, .query = qi, .head = h, .index_head = row.head,
                      .index_row = row.row, .visible_keys = row.visible_keys(qi, p.mask)};
          const std::int32_t n = r.visible_keys;
          if (n == 0) {
            for (double& x : recall) x = std::numeric_limits<double>::quiet_NaN();
            r.recall = recall;
            f(static_cast<const query_row&>(r));
            continue;
          }
          const TQ* qrow = q.row(r.token, h);
          score.resize(static_cast<std::size_t>(n));
          alpha.resize(static_cast<std::size_t>(n));
          double m = -std::numeric_limits<double>::infinity();
          double m_sel = -std::numeric_limits<double>::infinity();
          for (std::int32_t j = 0; j < n; ++j) {
            const auto* krow = kv.k_row(b, j, kv_head);
            double s = 0.0;
            for (std::int32_t e = 0; e < d; ++e) {
              s += static_cast<double>(to_float(qrow[e])) * static_cast<double>(to_float(krow[e]));
            }
            s *= scale;
            if (!std::isfinite(s)) {
              return status::error(status_code::invalid_argument,
                                   "score %g is not finite for query token %d, head %d, key %d of sequence %d", s,
                                   r.token, h, j, b);
            }
            score[static_cast<std::size_t>(j)] = s;
            m = s > m ? s : m;
            if (is_selected(j)) {
              ++r.selected_keys;
              m_sel = s > m_sel ? s : m_sel;
            }
          }

          // Dense α and o_dense; the sparse softmax with its own max (see the header comment).
          double sum = 0.0, sum_sel = 0.0;
          for (std::int32_t j = 0; j < n; ++j) {
            alpha[static_cast<std::size_t>(j)] = std::exp(score[static_cast<std::size_t>(j)] - m);
            sum += alpha[static_cast<std::size_t>(j)];
          }
          std::fill(o_dense.begin(), o_dense.end(), 0.0);
          std::fill(o_sparse.begin(), o_sparse.end(), 0.0);
          double coverage = 0.0;
          for (std::int32_t j = 0; j < n; ++j) {
            double& a = alpha[static_cast<std::size_t>(j)];
            a /= sum;
            const auto* vrow = kv.v_row(b, j, kv_head);
            for (std::int32_t e = 0; e < d; ++e) o_dense[static_cast<std::size_t>(e)] += a * to_float(vrow[e]);
            if (!is_selected(j)) continue;
            coverage += a;
            const double w = std::exp(score[static_cast<std::size_t>(j)] - m_sel);
            sum_sel += w;
            for (std::int32_t e = 0; e < d; ++e) o_sparse[static_cast<std::size_t>(e)] += w * to_float(vrow[e]);
          }
          double norm_dense = 0.0, norm_diff = 0.0;
          for (std::int32_t e = 0; e < d; ++e) {
            double& os = o_sparse[static_cast<std::size_t>(e)];
            os = sum_sel > 0.0 ? os / sum_sel : 0.0;
            const double od = o_dense[static_cast<std::size_t>(e)];
            norm_dense += od * od;
            norm_diff += (os - od) * (os - od);
          }
          if (!std::isfinite(norm_dense) || !std::isfinite(norm_diff)) {
            return status::error(status_code::invalid_argument,
                                 "output is not finite for query token %d, head %d of sequence %d (V not finite?)",
                                 r.token, h, b);
          }
          r.coverage = coverage;
          r.error = norm_dense > 0.0 ? std::sqrt(norm_diff / norm_dense)
                                     : (norm_diff == 0.0 ? 0.0 : std::numeric_limits<double>::infinity());

          // Dense top-t keys: α descending, ties to the lower key index.
          const std::int32_t top = t_max < n ? t_max : n;
          order.resize(static_cast<std::size_t>(n));
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](std::int32_t x, std::int32_t y) {
            const double ax = alpha[static_cast<std::size_t>(x)], ay = alpha[static_cast<std::size_t>(y)];
            return ax > ay || (ax == ay && x < y);
          });
          for (std::size_t t = 0; t < recall_at.size(); ++t) {
            const std::int32_t te = recall_at[t] < n ? recall_at[t] : n;
            std::int32_t hits = 0;
            for (std::int32_t k = 0; k < te; ++k) hits += is_selected(order[static_cast<std::size_t>(k)]) ? 1 : 0;
            recall[t] = static_cast<double>(hits) / static_cast<double>(te);
          }
          r.recall = recall;
          f(static_cast<const query_row&>(r));
        }
      }
    }
    row_base += p.q_blocks(b);
  }
  return status::success();
}

// Means of one (layer, query head).
struct head_quality {
  std::int32_t layer = 0;
  std::int32_t head = 0;                // query head
  std::int64_t rows = 0;                // rows measured (with a visible key)
  std::int64_t rows_without_keys = 0;   // rows skipped
  double coverage = std::numeric_limits<double>::quiet_NaN();
  double error = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> recall;           // [recall_at.size()]
};

// A (layer, head) and the mean that made it the worst; layer = head = -1 when no head has rows.
struct head_ref {
  std::int32_t layer = -1;
  std::int32_t head = -1;
  double mean = std::numeric_limits<double>::quiet_NaN();
};

struct quality_report {
  std::vector<std::int32_t> recall_at;   // the t of each recall entry
  std::vector<tail_summary> recall;      // [recall_at.size()], low_is_bad: p1 = 1st percentile, worst = min
  tail_summary coverage;                 // low_is_bad: p1 = 1st percentile, worst = min
  tail_summary error;                    // high_is_bad: p1 = 99th percentile, p5 = 95th, worst = max
  std::int64_t rows = 0;                 // (query token, query head) rows measured, over all calls
  std::int64_t rows_without_keys = 0;    // rows that see no key (skipped)
  cost_summary cost;                     // per index row, over all calls (cost.hpp)
  std::vector<head_quality> heads;       // per (layer, query head) means, sorted by (layer, head)
  head_ref worst_coverage_head;          // lowest mean coverage
  head_ref worst_error_head;             // highest mean error
  std::vector<head_ref> worst_recall_head;  // [recall_at.size()], lowest mean recall@t
};

// Adds calls (typically one per layer) into one report. Options are fixed at construction; a
// (layer, head) seen in several calls (a layer measured batch by batch) pools its rows.
class quality_accumulator {
 public:
  explicit quality_accumulator(const quality_options& options = {})
      : recall_at_(options.recall_at.begin(), options.recall_at.end()), recall_(recall_at_.size()) {}

  // Measures one call and adds it, all or nothing: a failed status leaves the accumulator unchanged.
  template <element TQ, kv_source KV, block_index Index>
  [[nodiscard]] status add(std::int32_t layer, const problem& p, strided_view<const TQ> q, const KV& kv,
                           const Index& index) {
    if (layer < 0) return status::error(status_code::invalid_argument, "layer %d < 0", layer);
    const std::size_t nt = recall_at_.size();
    std::vector<double> coverage, error;
    std::vector<std::vector<double>> recall(nt);
    std::map<std::pair<std::int32_t, std::int32_t>, head_sums> heads;
    std::int64_t without_keys = 0;
    SKIM_TRY(for_each_query_row(p, q, kv, index, recall_at_, [&](const query_row& r) {
      head_sums& hs = heads[{layer, r.head}];
      if (hs.recall.size() != nt) hs.recall.assign(nt, 0.0);
      if (!r.has_keys()) {
        ++without_keys;
        ++hs.rows_without_keys;
        return;
      }
      coverage.push_back(r.coverage);
      error.push_back(r.error);
      for (std::size_t t = 0; t < nt; ++t) recall[t].push_back(r.recall[t]);
      ++hs.rows;
      hs.coverage += r.coverage;
      hs.error += r.error;
      for (std::size_t t = 0; t < nt; ++t) hs.recall[t] += r.recall[t];
    }));
    cost_totals cost;
    SKIM_TRY(measure_cost(p, index, cost));

    coverage_.insert(coverage_.end(), coverage.begin(), coverage.end());
    error_.insert(error_.end(), error.begin(), error.end());
    for (std::size_t t = 0; t < nt; ++t) recall_[t].insert(recall_[t].end(), recall[t].begin(), recall[t].end());
    rows_without_keys_ += without_keys;
    for (const auto& [key, hs] : heads) heads_[key].add(hs, nt);
    cost_.add(cost);
    return status::success();
  }

  [[nodiscard]] quality_report summary() const {
    quality_report r;
    const std::size_t nt = recall_at_.size();
    r.recall_at = recall_at_;
    for (std::size_t t = 0; t < nt; ++t) r.recall.push_back(summarize_tail(recall_[t], tail_side::low_is_bad));
    r.coverage = summarize_tail(coverage_, tail_side::low_is_bad);
    r.error = summarize_tail(error_, tail_side::high_is_bad);
    r.rows = static_cast<std::int64_t>(coverage_.size());
    r.rows_without_keys = rows_without_keys_;
    r.cost = summarize(cost_);
    r.worst_recall_head.resize(nt);
    for (const auto& [key, hs] : heads_) {
      head_quality h{.layer = key.first, .head = key.second, .rows = hs.rows,
                     .rows_without_keys = hs.rows_without_keys, .recall = std::vector<double>(nt, h_nan)};
      if (hs.rows > 0) {
        const double n = static_cast<double>(hs.rows);
        h.coverage = hs.coverage / n;
        h.error = hs.error / n;
        for (std::size_t t = 0; t < nt; ++t) h.recall[t] = hs.recall[t] / n;
        // Strictly worse only: ties go to the first (layer, head).
        const auto worse = [&](head_ref& w, double mean, bool high_is_bad) {
          if (w.layer < 0 || (high_is_bad ? mean > w.mean : mean < w.mean)) w = {h.layer, h.head, mean};
        };
        worse(r.worst_coverage_head, h.coverage, false);
        worse(r.worst_error_head, h.error, true);
        for (std::size_t t = 0; t < nt; ++t) worse(r.worst_recall_head[t], h.recall[t], false);
      }
      r.heads.push_back(std::move(h));
    }
    return r;
  }

 private:
  static constexpr double h_nan = std::numeric_limits<double>::quiet_NaN();

  struct head_sums {
    std::int64_t rows = 0;
    std::int64_t rows_without_keys = 0;
    double coverage = 0.0;
    double error = 0.0;
    std::vector<double> recall;  // [recall_at.size()]

    void add(const head_sums& o, std::size_t nt) {
      if (recall.size() != nt) recall.assign(nt, 0.0);
      rows += o.rows;
      rows_without_keys += o.rows_without_keys;
      coverage += o.coverage;
      error += o.error;
      for (std::size_t t = 0; t < nt; ++t) recall[t] += o.recall[t];
    }
  };

  std::vector<std::int32_t> recall_at_;
  std::vector<double> coverage_, error_;              // [rows measured]
  std::vector<std::vector<double>> recall_;           // [recall_at.size()][rows measured]
  std::int64_t rows_without_keys_ = 0;
  std::map<std::pair<std::int32_t, std::int32_t>, head_sums> heads_;  // (layer, head), ordered
  cost_totals cost_;
};

// One call, one report (layer 0). `out` is written only on success.
template <element TQ, kv_source KV, block_index Index>
[[nodiscard]] status measure(const problem& p, strided_view<const TQ> q, const KV& kv, const Index& index,
                             const quality_options& options, quality_report& out) {
  quality_accumulator acc(options);
  SKIM_TRY(acc.add(0, p, q, kv, index));
  out = acc.summary();
  return status::success();
}

// The per-(layer, head) means as a Markdown table, for docs:
// | layer | head | rows | coverage | error | recall@8 | ... |
[[nodiscard]] inline std::string head_table_markdown(const quality_report& r) {
  std::string s = "| layer | head | rows | coverage | error |";
  char buf[64];
  for (std::int32_t t : r.recall_at) {
    std::snprintf(buf, sizeof buf, " recall@%d |", t);
    s += buf;
  }
  s += "\n|---:|---:|---:|---:|---:|";
  for (std::size_t t = 0; t < r.recall_at.size(); ++t) s += "---:|";
  s += '\n';
  for (const head_quality& h : r.heads) {
    std::snprintf(buf, sizeof buf, "| %d | %d | %lld | %.4f | %.4g |", h.layer, h.head,
                  static_cast<long long>(h.rows), h.coverage, h.error);
    s += buf;
    for (double x : h.recall) {
      std::snprintf(buf, sizeof buf, " %.4f |", x);
      s += buf;
    }
    s += '\n';
  }
  return s;
}

}  // namespace skim::metrics
