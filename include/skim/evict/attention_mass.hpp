#pragma once
// evict::attention_mass — H2O's heavy hitters at block granularity: a block's score is the attention
// mass it has accumulated (evidence.mass), so the blocks queries actually read stay.
//
// accumulate_mass() builds that evidence: for every row of an index and every query and query head
// of the row, it adds the softmax probability of each key read (exp(scale·q·k − lse)) to
// mass[(kv_block_offset(b) + block) * heads_kv + kv head] — the layout of the summaries
// (summarize/build.hpp), one float per (global key block, kv head). lse is the executor's output
// ([tokens_q * heads_q]; the probabilities then sum to 1 per query and head over the blocks the
// index read); when empty, the row's lse over the index's blocks is computed here (a second pass).
// So "mass from the executor's LSE + scores" and "mass from a dense pass" (index::causal_all) are
// the same call. No allocation.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/concepts/evictor.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"

namespace skim::evict {

struct attention_mass {
  [[nodiscard]] status validate() const noexcept { return status::success(); }
  [[nodiscard]] status score_blocks(const request& r, const evidence& ev, std::span<float> scores) const noexcept {
    if (ev.mass.size() < static_cast<std::size_t>(r.blocks)) {
      return status::error(status_code::shape_mismatch, "attention_mass evidence holds %zu masses, needs %d blocks",
                           ev.mass.size(), r.blocks);
    }
    if (scores.size() < static_cast<std::size_t>(r.blocks)) {
      return status::error(status_code::shape_mismatch, "attention_mass scores hold %zu, need %d", scores.size(), r.blocks);
    }
    std::copy_n(ev.mass.begin(), r.blocks, scores.begin());
    return status::success();
  }
};
static_assert(evictor<attention_mass>);

// Floats of accumulate_mass's output for a problem: total_kv_blocks × heads_kv.
[[nodiscard]] constexpr std::int64_t mass_floats(const problem& p) noexcept {
  return p.total_kv_blocks() * p.heads_kv;
}

// Adds each (global key block, kv head)'s attention mass from the queries of p to mass (see the
// header). @pre the caller zeroes mass before the first call if it wants one pass's mass alone.
template <element TQ, kv_source KV, block_index Index>
[[nodiscard]] status accumulate_mass(const problem& p, strided_view<const TQ> q, const KV& kv_in, const Index& index,
                                     std::span<const float> lse, std::span<float> mass) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
  SKIM_TRY(kv_in.validate(p));
  SKIM_TRY(index.validate(p));
  if (static_cast<std::int64_t>(mass.size()) < mass_floats(p)) {
    return status::error(status_code::shape_mismatch, "mass holds %zu floats, needs %lld (kv blocks x heads_kv)",
                         mass.size(), static_cast<long long>(mass_floats(p)));
  }
  if (!lse.empty() && static_cast<std::int64_t>(lse.size()) != static_cast<std::int64_t>(p.tokens_q()) * p.heads_q) {
    return status::error(status_code::shape_mismatch, "lse has %zu entries, expected tokens_q * heads_q = %lld",
                         lse.size(), static_cast<long long>(p.tokens_q()) * p.heads_q);
  }
  const KV kv = kv_in.bind(p);
  const double scale = p.scale();
  std::int64_t block_base = 0;
  std::int32_t base_seq = 0;
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    for (; base_seq < r.seq; ++base_seq) block_base += p.kv_blocks(base_seq);
    const std::int32_t heads = p.scope == index_scope::kv_head ? p.group_size() : 1;
    const std::int32_t first_head = p.scope == index_scope::kv_head ? r.head * heads : r.head;
    const std::int32_t kvh = first_head / p.group_size();
    const std::int64_t q0 = p.cu_seqlens_q[r.seq];
    // Walks the row's visible keys of query t: f(block, key, logit).
    const auto walk = [&](std::int32_t t, std::int32_t g, auto&& f) noexcept -> status {
      const std::int32_t visible = r.visible_keys(t, p.mask);
      return for_each_block_id(index, r, [&](std::int32_t id) noexcept {
        const std::int32_t end = std::min((id + 1) * p.block_kv, visible);
        for (std::int32_t j = id * p.block_kv; j < end; ++j) {
          const auto* kr = kv.k_row(r.seq, j, kvh);
          const TQ* qr = q.row(q0 + t, g);
          double dot = 0.0;
          for (std::int32_t e = 0; e < p.head_dim; ++e) dot += static_cast<double>(to_float(qr[e])) * to_float(kr[e]);
          f(id, dot * scale);
        }
      });
    };
    for (std::int32_t g = first_head; g < first_head + heads; ++g) {
      for (std::int32_t t = r.q_begin; t < r.q_end; ++t) {
        double row_lse = 0.0;
        if (!lse.empty()) {
          row_lse = lse[static_cast<std::size_t>((q0 + t) * p.heads_q + g)];
        } else {
          double m = -INFINITY, l = 0.0;
          SKIM_TRY(walk(t, g, [&](std::int32_t, double s) noexcept {
            if (s > m) { l = l * std::exp(m - s) + 1.0; m = s; } else { l += std::exp(s - m); }
          }));
          row_lse = m + std::log(l);
        }
        if (!std::isfinite(row_lse)) continue;  // the row read no key
        SKIM_TRY(walk(t, g, [&](std::int32_t id, double s) noexcept {
          mass[static_cast<std::size_t>((block_base + id) * p.heads_kv + kvh)] += static_cast<float>(std::exp(s - row_lse));
        }));
      }
    }
    return status::success();
  });
}

}  // namespace skim::evict
