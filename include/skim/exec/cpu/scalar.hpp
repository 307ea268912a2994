#pragma once
// skim::exec::scalar — the portable executor: tiled online softmax over the selected tiles.
//
// Work unit: (sequence, query block, index head). With one index per kv head (the default) the
// unit holds the whole GQA group — every query head of the kv head, for every query of the block —
// so each K/V tile is read and converted to float once per group. With per-query-head indices a
// unit is one query head.
//
// For each selected tile of the unit's row (ids checked as they come: strictly ascending, in
// [0, visible_blocks)):
//   S = (scale·Q) Kᵀ        fp32, K transposed in the workspace so the inner loop runs over keys
//   mask                    only on partial tiles (id >= row.full_blocks): under causality and the
//                           ragged tail a query sees a prefix of the tile, so masking = a shorter row
//   (m, l, u) update        online softmax per query row, u += P·V
// and at the end o = u / l, lse = m + log l (o = 0, lse = -inf for a row that saw no key).
//
// No allocation: workspace_bytes() reports the scratch run() carves from the caller's span. Inner
// loops are contiguous fp32 loops without reductions (axpy form), which g++ -O2/-O3 vectorises;
// results are deterministic (one fixed order of operations).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/concepts/executor.hpp"
#include "skim/config.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/softmax_state.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/causal_all.hpp"

namespace skim::exec {

namespace scalar_detail {

// Row strides are padded to whole cache lines (16 floats) so every tile row starts aligned.
inline constexpr std::size_t floats_per_line = workspace_alignment / sizeof(float);

// The workspace of one unit. Rows of the unit are numbered r = head_in_unit * queries + query.
struct tiles {
  std::size_t dim_stride = 0;  // padded head_dim
  std::size_t key_stride = 0;  // padded block_kv
  std::span<float> q;          // [unit_rows, dim_stride]  scale · Q
  std::span<float> kt;         // [head_dim, key_stride]   Kᵀ of the current tile
  std::span<float> v;          // [block_kv, dim_stride]   V of the current tile
  std::span<float> s;          // [unit_rows, key_stride]  scores, then probabilities
  std::span<float> u;          // [unit_rows, dim_stride]  unnormalised output
  std::span<softmax_state> state;   // [unit_rows]
  std::span<std::int32_t> keys;     // [block_q] keys of the current tile each query sees

  // The same sequence of takes measures (workspace_bytes) and carves (run).
  // @pre the problem's heads, head_dim and block sizes are positive and heads_q % heads_kv == 0.
  [[nodiscard]] static tiles carve(const problem& p, workspace_arena& arena) noexcept {
    const std::size_t heads_per_unit = p.scope == index_scope::kv_head ? static_cast<std::size_t>(p.group_size()) : 1;
    const std::size_t unit_rows = heads_per_unit * static_cast<std::size_t>(p.block_q);
    tiles t;
    t.dim_stride = align_up(static_cast<std::size_t>(p.head_dim), floats_per_line);
    t.key_stride = align_up(static_cast<std::size_t>(p.block_kv), floats_per_line);
    t.q = arena.take<float>(unit_rows * t.dim_stride);
    t.kt = arena.take<float>(static_cast<std::size_t>(p.head_dim) * t.key_stride);
    t.v = arena.take<float>(static_cast<std::size_t>(p.block_kv) * t.dim_stride);
    t.s = arena.take<float>(unit_rows * t.key_stride);
    t.u = arena.take<float>(unit_rows * t.dim_stride);
    t.state = arena.take<softmax_state>(unit_rows);
    t.keys = arena.take<std::int32_t>(static_cast<std::size_t>(p.block_q));
    return t;
  }
};

// y[0, len) += Σ_{r < rows} c[r] · m[r·stride, r·stride + len). Four rows per pass over y: a quarter
// of y's loads and stores, and the loop over y stays reduction-free.
SKIM_FORCEINLINE void add_weighted_rows(const float* SKIM_RESTRICT c, const float* SKIM_RESTRICT m, std::size_t stride,
                                        std::int32_t rows, std::int32_t len, float* SKIM_RESTRICT y) noexcept {
  std::int32_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float c0 = c[r], c1 = c[r + 1], c2 = c[r + 2], c3 = c[r + 3];
    const float* SKIM_RESTRICT m0 = m + static_cast<std::size_t>(r) * stride;
    const float* SKIM_RESTRICT m1 = m0 + stride;
    const float* SKIM_RESTRICT m2 = m1 + stride;
    const float* SKIM_RESTRICT m3 = m2 + stride;
    for (std::int32_t i = 0; i < len; ++i) y[i] += (c0 * m0[i] + c1 * m1[i]) + (c2 * m2[i] + c3 * m3[i]);
  }
  for (; r < rows; ++r) {
    const float cr = c[r];
    const float* SKIM_RESTRICT mr = m + static_cast<std::size_t>(r) * stride;
    for (std::int32_t i = 0; i < len; ++i) y[i] += cr * mr[i];
  }
}

// s[0, n) = q · kt[:, 0, n), with kt a [dim, key_stride] transposed K tile.
SKIM_FORCEINLINE void score_row(const float* SKIM_RESTRICT q, const float* SKIM_RESTRICT kt, std::size_t key_stride,
                                std::int32_t dim, std::int32_t n, float* SKIM_RESTRICT s) noexcept {
  for (std::int32_t j = 0; j < n; ++j) s[j] = 0.0f;
  add_weighted_rows(q, kt, key_stride, dim, n, s);
}

// u = alpha·u + Σ_{j<n} p[j]·v[j], with v a [n, dim_stride] tile.
SKIM_FORCEINLINE void accumulate_row(const float* SKIM_RESTRICT p, const float* SKIM_RESTRICT v, std::size_t dim_stride,
                                     std::int32_t dim, std::int32_t n, float alpha, float* SKIM_RESTRICT u) noexcept {
  for (std::int32_t e = 0; e < dim; ++e) u[e] *= alpha;
  add_weighted_rows(p, v, dim_stride, n, dim, u);
}

// Folds the row's scores s[0, n) into its online-softmax state and u; s becomes probabilities.
// @pre n > 0 (a row that sees nothing of the tile is skipped: keeps m = -inf away from -inf - -inf).
SKIM_FORCEINLINE void softmax_row(softmax_state& st, float* SKIM_RESTRICT s, std::int32_t n, const float* v,
                                  std::size_t dim_stride, std::int32_t dim, float* SKIM_RESTRICT u) noexcept {
  float tile_max = s[0];
  for (std::int32_t j = 1; j < n; ++j) tile_max = s[j] > tile_max ? s[j] : tile_max;
  const float m = st.m > tile_max ? st.m : tile_max;
  const float alpha = std::exp(st.m - m);  // 0 on the row's first tile (st.m = -inf, m finite)
  float sum = 0.0f;
  for (std::int32_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  st.m = m;
  st.l = alpha * st.l + sum;
  accumulate_row(s, v, dim_stride, dim, n, alpha, u);
}

// The query rows of one work unit (index row `row`): its query heads [first_head, first_head +
// heads), all reading kv head kv_head, over the block's queries; unit row r = head_in_unit ·
// queries + query, whose token is q_first + query.
struct unit_rows {
  std::int32_t first_head = 0;
  std::int32_t heads = 0;
  std::int32_t kv_head = 0;
  std::int32_t queries = 0;
  std::int64_t q_first = 0;
};

[[nodiscard]] inline unit_rows make_unit_rows(const problem& p, const row_info& row) noexcept {
  const bool group_unit = p.scope == index_scope::kv_head;
  unit_rows w;
  w.first_head = group_unit ? row.head * p.group_size() : row.head;
  w.heads = group_unit ? p.group_size() : 1;
  w.kv_head = w.first_head / p.group_size();
  w.queries = row.q_end - row.q_begin;
  w.q_first = static_cast<std::int64_t>(p.cu_seqlens_q[row.seq]) + row.q_begin;
  return w;
}

// Starts the unit's rows: q = scale · Q, u = 0, empty states (the workspace may hold anything).
// q and u are [rows, dim_stride], state [rows].
template <class Args>
void start_unit(const Args& a, const unit_rows& w, std::size_t dim_stride, float* q, float* u,
                softmax_state* state) noexcept {
  const std::int32_t dim = a.prob.head_dim;
  const float scale = a.prob.scale();
  for (std::int32_t hh = 0; hh < w.heads; ++hh) {
    for (std::int32_t qq = 0; qq < w.queries; ++qq) {
      const std::size_t r = static_cast<std::size_t>(hh * w.queries + qq);
      const typename Args::q_type* src = a.q.row(w.q_first + qq, w.first_head + hh);
      float* dst = q + r * dim_stride;
      for (std::int32_t e = 0; e < dim; ++e) dst[e] = to_float(src[e]) * scale;
      float* ur = u + r * dim_stride;
      for (std::int32_t e = 0; e < dim; ++e) ur[e] = 0.0f;
      state[r] = softmax_state{};
    }
  }
}

// Ends the unit's rows: o = u / l, lse = m + log l; finish() gives o = 0, lse = -inf for a row that
// saw no key. u is overwritten.
template <class Args>
void finish_unit(const Args& a, const unit_rows& w, std::size_t dim_stride, std::span<float> u,
                 std::span<const softmax_state> state) noexcept {
  const problem& p = a.prob;
  const std::int32_t dim = p.head_dim;
  for (std::int32_t hh = 0; hh < w.heads; ++hh) {
    for (std::int32_t qq = 0; qq < w.queries; ++qq) {
      const std::size_t r = static_cast<std::size_t>(hh * w.queries + qq);
      std::span<float> ur = u.subspan(r * dim_stride, static_cast<std::size_t>(dim));
      const float lse = finish(state[r], ur, ur);
      auto* dst = a.o.row(w.q_first + qq, w.first_head + hh);
      for (std::int32_t e = 0; e < dim; ++e) dst[e] = from_float<typename Args::o_type>(ur[e]);
      if (!a.lse.empty()) a.lse[static_cast<std::size_t>((w.q_first + qq) * p.heads_q + w.first_head + hh)] = lse;
    }
  }
}

}  // namespace scalar_detail

struct scalar {
  [[nodiscard]] std::size_t workspace_bytes(const problem& p) const noexcept {
    if (p.heads_q <= 0 || p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0 || p.head_dim <= 0 || p.block_q <= 0 ||
        p.block_kv <= 0) {
      return 0;  // run() rejects this problem before touching the workspace
    }
    workspace_arena measure;
    (void)scalar_detail::tiles::carve(p, measure);
    return measure.bytes();
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept { return validate(p); }

  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status run(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(check_args(a));
    SKIM_TRY(a.index.validate(a.prob));
    const problem& p = a.prob;
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    workspace_arena arena(workspace);
    const scalar_detail::tiles t = scalar_detail::tiles::carve(p, arena);
    const KV kv = a.kv.bind(p);

    std::int64_t row_base = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      for (std::int32_t i = 0; i < p.q_blocks(b); ++i) {
        for (std::int32_t ih = 0; ih < p.index_heads(); ++ih) {
          SKIM_TRY(run_unit(a, kv, t, make_row_info(p, row_base, b, i, ih)));
        }
      }
      row_base += p.q_blocks(b);
    }
    return status::success();
  }

 private:
  // One unit: the query heads that share index row `row`, over the queries of its block.
  template <class Args, class KV>
  [[nodiscard]] static status run_unit(const Args& a, const KV& kv, const scalar_detail::tiles& t,
                                       const row_info& row) noexcept {
    const problem& p = a.prob;
    const std::int32_t dim = p.head_dim;
    const scalar_detail::unit_rows w = scalar_detail::make_unit_rows(p, row);
    const std::int32_t kv_head = w.kv_head, queries = w.queries;
    const std::int32_t rows = w.heads * queries;
    scalar_detail::start_unit(a, w, t.dim_stride, t.q.data(), t.u.data(), t.state.data());

    SKIM_TRY(for_each_block_id(a.index, row, [&](std::int32_t id) {
      const std::int32_t k0 = id * p.block_kv;
      const std::int32_t tile_keys = row.kv_len - k0 < p.block_kv ? row.kv_len - k0 : p.block_kv;

      // K tile transposed, V tile as rows; both converted to float once for the whole unit.
      for (std::int32_t j = 0; j < tile_keys; ++j) {
        const auto* k = kv.k_row(row.seq, k0 + j, kv_head);
        const auto* v = kv.v_row(row.seq, k0 + j, kv_head);
        float* vt = t.v.data() + static_cast<std::size_t>(j) * t.dim_stride;
        for (std::int32_t e = 0; e < dim; ++e) t.kt[static_cast<std::size_t>(e) * t.key_stride + j] = to_float(k[e]);
        for (std::int32_t e = 0; e < dim; ++e) vt[e] = to_float(v[e]);
      }

      // Keys of the tile each query sees: all of them on a full tile, a prefix on a partial one.
      if (row.is_full(id)) {
        for (std::int32_t qq = 0; qq < queries; ++qq) t.keys[qq] = tile_keys;
      } else {
        for (std::int32_t qq = 0; qq < queries; ++qq) {
          const std::int32_t n = row.visible_keys(row.q_begin + qq, p.mask) - k0;
          t.keys[qq] = n < 0 ? 0 : (n > tile_keys ? tile_keys : n);
        }
      }

      for (std::int32_t r = 0; r < rows; ++r) {
        const std::int32_t n = t.keys[r % queries];
        if (n == 0) continue;
        float* s = t.s.data() + static_cast<std::size_t>(r) * t.key_stride;
        const float* q = t.q.data() + static_cast<std::size_t>(r) * t.dim_stride;
        float* u = t.u.data() + static_cast<std::size_t>(r) * t.dim_stride;
        scalar_detail::score_row(q, t.kt.data(), t.key_stride, dim, n, s);
        scalar_detail::softmax_row(t.state[r], s, n, t.v.data(), t.dim_stride, dim, u);
      }
    }));

    scalar_detail::finish_unit(a, w, t.dim_stride, t.u, t.state);
    return status::success();
  }
};

static_assert(executor<scalar, attention_args<float, contiguous_kv<float>, index::causal_all, float>>);
static_assert(executor<scalar, attention_args<bfloat16, paged_kv<half>, index::causal_all, half>>);

}  // namespace skim::exec
