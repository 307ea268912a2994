#pragma once
// skim::exec::token_gather — exact attention over the key tokens an index::token_list lists.
//
// The function (docs/design.md §3, with tokens for blocks): for each query token q of sequence b
// and query head h, with r the row of index head index_head_of(h) for q's block,
//   o = softmax(scale · q·kᵀ) · V   over the listed positions of row r that q sees
// (position j < visible_keys(q): under causality the earlier queries of a multi-query row see a
// prefix of the list; a decode row's one query sees all of it). A query that sees no listed key
// gets o = 0, lse = -inf, as the block executors write for an empty row. lse is natural log,
// [tokens_q · heads_q] token-major, optional.
//
// Work unit: (sequence, query block, index head), like exec::scalar: with kv-head rows (the
// default) the unit is the whole GQA group, so each gathered K/V row is converted to fp32 once for
// all the group's query heads. The row's positions are walked in tiles of tile_tokens:
//   gather K (transposed) and V rows of the listed positions, fp32   (each position checked first:
//                                                                     in range, strictly ascending)
//   S = (scale·Q) Kᵀ over the tile, fp32
//   (m, l, u) online-softmax update per query row (core/softmax_state.hpp), u += P·V
// then o = u / l, lse = m + log l. Accumulation is fp32 in one fixed order: deterministic, and equal
// to exec::reference over the same keys to fp32 rounding.
//
// Inputs: token_attention_args below — attention_args with a token_list for the block index.
// K/V through any unquantised source (contiguous_kv, paged_kv; float, half or bfloat16 elements):
// a gathered row is read with the source's k_row/v_row, so paged K/V costs one page-table lookup
// per listed token. Int8 sources need their per-block scales and are refused at compile time.
//
// Cost per unit: count · head_dim elements of K and of V read (the listed rows only, each once
// for the group), 2 · count · heads · queries · head_dim fp32 multiply-adds.
// Errors: check_args (problem, views, K/V source, lse, overlaps), the list's validate, can_implement
// and check_workspace, all before reading a byte; each position is checked again as it is gathered.
// No allocation: scratch comes from the caller's workspace of workspace_bytes(problem) bytes.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/config.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/softmax_state.hpp"
#include "skim/core/status.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/token_list.hpp"

namespace skim::exec {

// Everything one token_gather call reads and writes (attention_args' fields, with a token list).
template <element TQ, kv_source KV, element TO = TQ>
struct token_attention_args {
  using q_type = TQ;
  using kv_type = KV;
  using o_type = TO;

  problem prob;
  strided_view<const TQ> q;   // [tokens_q, heads_q, head_dim]
  KV kv;                      // K, V: [tokens_kv, heads_kv, head_dim], contiguous or paged
  index::token_list tokens;   // one row per (sequence, query block, index head)
  strided_view<TO> o;         // [tokens_q, heads_q, head_dim]
  std::span<float> lse = {};  // [tokens_q * heads_q] token-major, empty = not written
};

namespace token_gather_detail {

inline constexpr std::size_t floats_per_line = workspace_alignment / sizeof(float);

// The workspace of one unit. Rows of the unit are numbered r = head_in_unit * queries + query.
struct tiles {
  std::size_t dim_stride = 0;   // padded head_dim
  std::size_t key_stride = 0;   // padded tile_tokens
  std::span<float> q;           // [unit_rows, dim_stride]  scale · Q
  std::span<float> kt;          // [head_dim, key_stride]   Kᵀ of the gathered tile
  std::span<float> v;           // [tile_tokens, dim_stride] V of the gathered tile
  std::span<float> s;           // [key_stride]              one row's scores, then probabilities
  std::span<float> u;           // [unit_rows, dim_stride]  unnormalised output
  std::span<softmax_state> state;  // [unit_rows]

  // @pre heads, head_dim and block_q positive, heads_q % heads_kv == 0, tile > 0.
  [[nodiscard]] static tiles carve(const problem& p, std::int32_t tile, workspace_arena& arena) noexcept {
    const std::size_t heads_per_unit = p.scope == index_scope::kv_head ? static_cast<std::size_t>(p.group_size()) : 1;
    const std::size_t unit_rows = heads_per_unit * static_cast<std::size_t>(p.block_q);
    tiles t;
    t.dim_stride = align_up(static_cast<std::size_t>(p.head_dim), floats_per_line);
    t.key_stride = align_up(static_cast<std::size_t>(tile), floats_per_line);
    t.q = arena.take<float>(unit_rows * t.dim_stride);
    t.kt = arena.take<float>(static_cast<std::size_t>(p.head_dim) * t.key_stride);
    t.v = arena.take<float>(static_cast<std::size_t>(tile) * t.dim_stride);
    t.s = arena.take<float>(t.key_stride);
    t.u = arena.take<float>(unit_rows * t.dim_stride);
    t.state = arena.take<softmax_state>(unit_rows);
    return t;
  }
};


}  // namespace token_gather_detail

struct token_gather {
  std::int32_t tile_tokens = 64;  // > 0: listed keys gathered and converted per step

  [[nodiscard]] std::size_t workspace_bytes(const problem& p) const noexcept {
    if (p.heads_q <= 0 || p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0 || p.head_dim <= 0 || p.block_q <= 0 ||
        tile_tokens <= 0) {
      return 0;  // run() rejects this problem before touching the workspace
    }
    workspace_arena measure;
    (void)token_gather_detail::tiles::carve(p, tile_tokens, measure);
    return measure.bytes();
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept {
    if (tile_tokens <= 0) {
      return status::error(status_code::invalid_argument, "token_gather tile_tokens %d <= 0", tile_tokens);
    }
    return validate(p);
  }

  template <element TQ, kv_source KV, element TO>
    requires element<typename KV::value_type>
  [[nodiscard]] status run(const token_attention_args<TQ, KV, TO>& a, std::span<std::byte> workspace) const noexcept {
    const attention_args<TQ, KV, index::causal_all, TO> shared{
        .prob = a.prob, .q = a.q, .kv = a.kv, .index = {}, .o = a.o, .lse = a.lse};
    SKIM_TRY(check_args(shared));
    SKIM_TRY(can_implement(a.prob));
    SKIM_TRY(a.tokens.validate(a.prob));
    const problem& p = a.prob;
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    workspace_arena arena(workspace);
    const token_gather_detail::tiles t = token_gather_detail::tiles::carve(p, tile_tokens, arena);
    const KV kv = a.kv.bind(p);
    return for_each_row(p, [&](const row_info& r) noexcept { return run_unit(a, kv, t, r); });
  }

 private:
  template <class Args, class KV>
  [[nodiscard]] status run_unit(const Args& a, const KV& kv, const token_gather_detail::tiles& t,
                                const row_info& row) const noexcept {
    const problem& p = a.prob;
    const std::int32_t dim = p.head_dim;
    const scalar_detail::unit_rows w = scalar_detail::make_unit_rows(p, row);
    const std::int32_t heads = w.heads, kv_head = w.kv_head, queries = w.queries;
    scalar_detail::start_unit(a, w, t.dim_stride, t.q.data(), t.u.data(), t.state.data());

    const std::span<const std::int32_t> list = a.tokens.row(row);
    const std::int32_t visible = index::row_visible_keys(row, p.mask);
    const auto n_list = static_cast<std::int32_t>(list.size());
    for (std::int32_t first = 0; first < n_list; first += tile_tokens) {
      const std::int32_t n_tile = n_list - first < tile_tokens ? n_list - first : tile_tokens;
      for (std::int32_t j = 0; j < n_tile; ++j) {
        const std::int32_t at = first + j;
        const std::int32_t pos = list[static_cast<std::size_t>(at)];
        SKIM_TRY(index::check_token_position(row, visible, pos, at > 0 ? list[static_cast<std::size_t>(at - 1)] : -1, at));
        const auto* k = kv.k_row(row.seq, pos, kv_head);
        const auto* v = kv.v_row(row.seq, pos, kv_head);
        float* vt = t.v.data() + static_cast<std::size_t>(j) * t.dim_stride;
        for (std::int32_t e = 0; e < dim; ++e) t.kt[static_cast<std::size_t>(e) * t.key_stride + j] = to_float(k[e]);
        for (std::int32_t e = 0; e < dim; ++e) vt[e] = to_float(v[e]);
      }
      for (std::int32_t qq = 0; qq < queries; ++qq) {
        // The tile's keys query qq sees: a prefix, the positions ascending.
        const std::int32_t sees = row.visible_keys(row.q_begin + qq, p.mask);
        std::int32_t n = n_tile;
        while (n > 0 && list[static_cast<std::size_t>(first + n - 1)] >= sees) --n;
        if (n == 0) continue;
        for (std::int32_t hh = 0; hh < heads; ++hh) {
          const std::size_t r = static_cast<std::size_t>(hh * queries + qq);
          scalar_detail::score_row(t.q.data() + r * t.dim_stride, t.kt.data(), t.key_stride, dim, n, t.s.data());
          scalar_detail::softmax_row(t.state[r], t.s.data(), n, t.v.data(), t.dim_stride, dim,
                                     t.u.data() + r * t.dim_stride);
        }
      }
    }

    scalar_detail::finish_unit(a, w, t.dim_stride, t.u, t.state);
    return status::success();
  }
};

}  // namespace skim::exec
