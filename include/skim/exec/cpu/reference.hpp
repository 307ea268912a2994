#pragma once
// skim::exec::reference — the oracle: masked dense attention in double precision.
//
// For every query token q of sequence b and query head h it takes the row of index head
// index_head_of(h) for q's block, marks the keys of the row's blocks that q may see (the causal
// mask and the sequence length), and computes softmax(scale · q·kᵀ) · V over exactly those keys in
// double precision. A query that sees no key gets o = 0, lse = -inf.
//
// It is written to be obviously correct, not fast: O(tokens_q · tokens_kv · heads_q · head_dim),
// no tiling, no online softmax, and it allocates (std::vector) — the one executor allowed to.
// It checks the index twice: index.validate(p), and each id it reads against the row's contract,
// so it also catches an index whose validate() is wrong.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "skim/concepts/executor.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/index/causal_all.hpp"

namespace skim::exec {

struct reference {
  [[nodiscard]] std::size_t workspace_bytes(const problem&) const noexcept { return 0; }

  [[nodiscard]] status can_implement(const problem& p) const noexcept { return validate(p); }

  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status run(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte>) const noexcept {
    SKIM_TRY(check_args(a));
    SKIM_TRY(a.index.validate(a.prob));
    const problem& p = a.prob;
    const KV kv = a.kv.bind(p);
    const double scale = p.scale();
    const std::int32_t d = p.head_dim;

    std::vector<char> selected;  // [kv_blocks] of the current row
    std::vector<double> score;   // [kv_len], score of each visible selected key, else unused
    std::vector<char> seen;      // [kv_len], key is visible and selected
    std::vector<double> out(static_cast<std::size_t>(d));

    std::int64_t row_base = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t q_first = p.cu_seqlens_q[b];
      for (std::int32_t i = 0; i < p.q_blocks(b); ++i) {
        for (std::int32_t h = 0; h < p.heads_q; ++h) {
          const row_info row = make_row_info(p, row_base, b, i, p.index_head_of(h));
          const std::int32_t kv_head = h / p.group_size();

          // The row's blocks, checked against the contract as they come.
          selected.assign(static_cast<std::size_t>(row.kv_blocks), 0);
          SKIM_TRY(for_each_block_id(a.index, row, [&](std::int32_t id) { selected[static_cast<std::size_t>(id)] = 1; }));

          for (std::int32_t qi = row.q_begin; qi < row.q_end; ++qi) {
            const std::int64_t token = static_cast<std::int64_t>(q_first) + qi;
            const TQ* qrow = a.q.row(token, h);
            const std::int32_t visible = row.visible_keys(qi, p.mask);

            // Scores of the keys this query sees.
            score.assign(static_cast<std::size_t>(row.kv_len), 0.0);
            seen.assign(static_cast<std::size_t>(row.kv_len), 0);
            double m = -std::numeric_limits<double>::infinity();
            for (std::int32_t j = 0; j < visible; ++j) {
              if (!selected[static_cast<std::size_t>(j / p.block_kv)]) continue;
              const auto* krow = kv.k_row(b, j, kv_head);
              double s = 0.0;
              for (std::int32_t e = 0; e < d; ++e) {
                s += static_cast<double>(to_float(qrow[e])) * static_cast<double>(to_float(krow[e]));
              }
              s *= scale;
              score[static_cast<std::size_t>(j)] = s;
              seen[static_cast<std::size_t>(j)] = 1;
              m = s > m ? s : m;
            }

            // Softmax over the seen keys; an empty set leaves sum = 0.
            // `any_seen`, not sum > 0, decides "no visible key": a NaN or +inf score makes sum NaN,
            // and that row must come out NaN like the other executors', not as an empty row
            // (o = 0, lse = -inf) that hides the poison. Found by tests/hardening/numeric_test.cpp.
            bool any_seen = false;
            double sum = 0.0;
            for (double& x : out) x = 0.0;
            for (std::int32_t j = 0; j < visible; ++j) {
              if (!seen[static_cast<std::size_t>(j)]) continue;
              any_seen = true;
              const double w = std::exp(score[static_cast<std::size_t>(j)] - m);
              sum += w;
              const auto* vrow = kv.v_row(b, j, kv_head);
              for (std::int32_t e = 0; e < d; ++e) out[static_cast<std::size_t>(e)] += w * to_float(vrow[e]);
            }

            TO* orow = a.o.row(token, h);
            for (std::int32_t e = 0; e < d; ++e) {
              const double x = any_seen ? out[static_cast<std::size_t>(e)] / sum : 0.0;
              orow[e] = from_float<TO>(static_cast<float>(x));
            }
            if (!a.lse.empty()) {
              a.lse[static_cast<std::size_t>(token * p.heads_q + h)] =
                  any_seen ? static_cast<float>(m + std::log(sum)) : -std::numeric_limits<float>::infinity();
            }
          }
        }
      }
      row_base += p.q_blocks(b);
    }
    return status::success();
  }
};

static_assert(executor<reference, attention_args<float, contiguous_kv<float>, index::causal_all, float>>);
static_assert(executor<reference, attention_args<half, paged_kv<bfloat16>, index::causal_all, float>>);

}  // namespace skim::exec
