#pragma once
// skim::problem — what an attention call computes, independent of where the data lives.
//
// Conventions (docs/design.md §2 to §5):
//  - Q is [tokens_q, heads_q, head_dim]; K, V are [tokens_kv, heads_kv, head_dim].
//  - A batch is packed (varlen): sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b+1])
//    and key tokens [cu_seqlens_kv[b], cu_seqlens_kv[b+1]]. A single sequence is a batch of one.
//  - GQA: query head h reads kv head h / (heads_q / heads_kv).
//  - Causality is bottom-right aligned: query i of a sequence with n_q queries and n_kv keys
//    sees key j iff j <= i + n_kv - n_q.
//  - Queries are cut into blocks of block_q, keys into blocks of block_kv, per sequence; the
//    last block of a sequence may be partial. Block ids in an index are relative to the sequence.
//  - An index has one row per (sequence, query block, index head); index heads are the kv heads
//    (the default: one selection shared by a GQA group) or the query heads. Rows are numbered
//    row = (q_block_offset(b) + i) * index_heads + h, i.e. token-major like Q.

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "skim/core/status.hpp"

namespace skim {

enum class mask_kind : std::uint8_t { none, causal };

// Which heads an index row belongs to.
enum class index_scope : std::uint8_t { kv_head, query_head };

struct problem {
  std::int32_t heads_q = 0;
  std::int32_t heads_kv = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_q = 64;   // bq, query tokens per block
  std::int32_t block_kv = 64;  // bk, key tokens per block
  mask_kind mask = mask_kind::causal;
  float softmax_scale = 0.0f;                // 0 means 1/sqrt(head_dim)
  std::span<const std::int32_t> cu_seqlens_q{}; // [batch + 1], cu_seqlens_q[0] == 0, non-decreasing
  std::span<const std::int32_t> cu_seqlens_kv{}; // [batch + 1], cu_seqlens_kv[0] == 0, non-decreasing
  index_scope scope = index_scope::kv_head;

  [[nodiscard]] constexpr std::int32_t batch() const noexcept {
    return cu_seqlens_q.empty() ? 0 : static_cast<std::int32_t>(cu_seqlens_q.size()) - 1;
  }
  [[nodiscard]] constexpr std::int32_t group_size() const noexcept { return heads_q / heads_kv; }
  [[nodiscard]] constexpr std::int32_t index_heads() const noexcept {
    return scope == index_scope::kv_head ? heads_kv : heads_q;
  }
  // Index head used by query head h.
  [[nodiscard]] constexpr std::int32_t index_head_of(std::int32_t h) const noexcept {
    return scope == index_scope::kv_head ? h / group_size() : h;
  }
  [[nodiscard]] float scale() const noexcept {
    return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  [[nodiscard]] constexpr std::int32_t tokens_q() const noexcept {
    return cu_seqlens_q.empty() ? 0 : cu_seqlens_q.back();
  }
  [[nodiscard]] constexpr std::int32_t tokens_kv() const noexcept {
    return cu_seqlens_kv.empty() ? 0 : cu_seqlens_kv.back();
  }
  [[nodiscard]] constexpr std::int32_t seq_len_q(std::int32_t b) const noexcept {
    return cu_seqlens_q[b + 1] - cu_seqlens_q[b];
  }
  [[nodiscard]] constexpr std::int32_t seq_len_kv(std::int32_t b) const noexcept {
    return cu_seqlens_kv[b + 1] - cu_seqlens_kv[b];
  }
  [[nodiscard]] constexpr std::int32_t q_blocks(std::int32_t b) const noexcept {
    return (seq_len_q(b) + block_q - 1) / block_q;
  }
  [[nodiscard]] constexpr std::int32_t kv_blocks(std::int32_t b) const noexcept {
    return (seq_len_kv(b) + block_kv - 1) / block_kv;
  }
  // First query block of sequence b in the batch-wide numbering: Σ_{s<b} q_blocks(s). O(b).
  [[nodiscard]] constexpr std::int64_t q_block_offset(std::int32_t b) const noexcept {
    std::int64_t n = 0;
    for (std::int32_t s = 0; s < b; ++s) n += q_blocks(s);
    return n;
  }
  // First key block of sequence b in the batch-wide numbering: Σ_{s<b} kv_blocks(s). O(b).
  // Summaries and transposed indices number key blocks this way.
  [[nodiscard]] constexpr std::int64_t kv_block_offset(std::int32_t b) const noexcept {
    std::int64_t n = 0;
    for (std::int32_t s = 0; s < b; ++s) n += kv_blocks(s);
    return n;
  }
  // Total query blocks over the batch (the number of index rows per index head).
  [[nodiscard]] constexpr std::int64_t total_q_blocks() const noexcept { return q_block_offset(batch()); }
  // Total key blocks over the batch.
  [[nodiscard]] constexpr std::int64_t total_kv_blocks() const noexcept { return kv_block_offset(batch()); }
  [[nodiscard]] constexpr std::int64_t index_rows() const noexcept {
    return total_q_blocks() * index_heads();
  }
  // Largest kv block count of any sequence (the column count of a dense mask).
  [[nodiscard]] constexpr std::int32_t max_kv_blocks() const noexcept {
    std::int32_t n = 0;
    for (std::int32_t b = 0; b < batch(); ++b) n = n > kv_blocks(b) ? n : kv_blocks(b);
    return n;
  }
};

namespace detail {

// The scalar fields every problem form shares (skim::problem, and the CUDA side's device_problem).
template <class P>
[[nodiscard]] status validate_shape(const P& p) noexcept {
  if (p.heads_q <= 0) return status::error(status_code::invalid_argument, "heads_q %d <= 0", p.heads_q);
  if (p.heads_kv <= 0) return status::error(status_code::invalid_argument, "heads_kv %d <= 0", p.heads_kv);
  if (p.heads_q % p.heads_kv != 0) {
    return status::error(status_code::invalid_argument, "heads_q %d is not a multiple of heads_kv %d",
                         p.heads_q, p.heads_kv);
  }
  if (p.head_dim <= 0) return status::error(status_code::invalid_argument, "head_dim %d <= 0", p.head_dim);
  if (p.block_q <= 0) return status::error(status_code::invalid_argument, "block_q %d <= 0", p.block_q);
  if (p.block_kv <= 0) return status::error(status_code::invalid_argument, "block_kv %d <= 0", p.block_kv);
  if (!std::isfinite(p.softmax_scale)) {
    return status::error(status_code::invalid_argument, "softmax_scale %g is not finite",
                         static_cast<double>(p.softmax_scale));
  }
  return status::success();
}

}  // namespace detail

// Checks the problem's own consistency (not any tensor). Every executor calls it.
[[nodiscard]] inline status validate(const problem& p) noexcept {
  SKIM_TRY(detail::validate_shape(p));
  if (p.cu_seqlens_q.size() < 2) {
    return status::error(status_code::shape_mismatch, "cu_seqlens_q has %zu entries, needs batch + 1 >= 2",
                         p.cu_seqlens_q.size());
  }
  if (p.cu_seqlens_kv.size() != p.cu_seqlens_q.size()) {
    return status::error(status_code::shape_mismatch, "cu_seqlens_kv has %zu entries, cu_seqlens_q %zu",
                         p.cu_seqlens_kv.size(), p.cu_seqlens_q.size());
  }
  for (auto [cu, name] : {std::pair{p.cu_seqlens_q, "cu_seqlens_q"}, std::pair{p.cu_seqlens_kv, "cu_seqlens_kv"}}) {
    if (cu[0] != 0) return status::error(status_code::invalid_argument, "%s[0] = %d, must be 0", name, cu[0]);
    for (std::size_t b = 1; b < cu.size(); ++b) {
      if (cu[b] < cu[b - 1]) {
        return status::error(status_code::invalid_argument, "%s[%zu] = %d < %s[%zu] = %d (must not decrease)",
                             name, b, cu[b], name, b - 1, cu[b - 1]);
      }
    }
  }
  return status::success();
}

// Geometry of one index row: which keys its queries may see and which tiles need masking.
//
// Under causality every query of the block sees a prefix of the sequence's keys, so:
//  - blocks [0, full_blocks) are *full*: every key visible to every query of the block, and
//    complete (not the ragged tail) — executors skip all mask work on them;
//  - blocks [full_blocks, visible_blocks) are *partial*: some key masked for some query;
//  - blocks >= visible_blocks are invisible to every query of the block ("in the future").
struct row_info {
  std::int64_t row = 0;       // row number in the index
  std::int32_t seq = 0;       // sequence in the batch
  std::int32_t q_block = 0;   // query block within the sequence
  std::int32_t head = 0;      // index head (kv head or query head, per problem::scope)
  std::int32_t q_begin = 0;   // first query of the block, relative to the sequence
  std::int32_t q_end = 0;     // one past the last query of the block
  std::int32_t kv_len = 0;    // keys in the sequence
  std::int32_t kv_blocks = 0;       // ceil(kv_len / block_kv)
  std::int32_t visible_blocks = 0;  // blocks with a key visible to some query of the block
  std::int32_t full_blocks = 0;     // blocks with every key visible to every query of the block
  std::int32_t causal_offset = 0;   // kv_len - q_len under causality: query i sees keys j <= i + offset

  [[nodiscard]] constexpr bool is_full(std::int32_t id) const noexcept { return id < full_blocks; }
  // Keys [0, visible_keys(q)) are visible to query q (relative to the sequence), q in [q_begin, q_end).
  [[nodiscard]] constexpr std::int32_t visible_keys(std::int32_t q, mask_kind m) const noexcept {
    if (m == mask_kind::none) return kv_len;
    const std::int64_t v = static_cast<std::int64_t>(q) + causal_offset + 1;
    return v <= 0 ? 0 : (v >= kv_len ? kv_len : static_cast<std::int32_t>(v));
  }
};

// Row geometry of (sequence b, query block i, index head h); row_base = q_block_offset(b).
[[nodiscard]] constexpr row_info make_row_info(const problem& p, std::int64_t row_base, std::int32_t b,
                                               std::int32_t i, std::int32_t h) noexcept {
  row_info r;
  r.row = (row_base + i) * p.index_heads() + h;
  r.seq = b;
  r.q_block = i;
  r.head = h;
  const std::int32_t n_q = p.seq_len_q(b);
  r.q_begin = i * p.block_q;
  r.q_end = r.q_begin + p.block_q < n_q ? r.q_begin + p.block_q : n_q;
  r.kv_len = p.seq_len_kv(b);
  r.kv_blocks = p.kv_blocks(b);
  const std::int32_t complete_blocks = r.kv_len / p.block_kv;
  if (p.mask == mask_kind::none) {
    r.causal_offset = 0;
    r.visible_blocks = r.kv_blocks;
    r.full_blocks = complete_blocks;
    return r;
  }
  r.causal_offset = r.kv_len - n_q;
  const std::int32_t last_visible = r.visible_keys(r.q_end - 1, p.mask);  // keys seen by the last query
  const std::int32_t first_visible = r.visible_keys(r.q_begin, p.mask);   // keys seen by every query
  r.visible_blocks = (last_visible + p.block_kv - 1) / p.block_kv;
  const std::int32_t full = first_visible / p.block_kv;
  r.full_blocks = full < complete_blocks ? full : complete_blocks;
  return r;
}

// Checks that a caller's row_info is the row make_row_info gives for its (seq, q_block, head): a
// stage handed one row (a router's score_row, a selector's select_row) trusts its geometry (query
// range, keys, visible blocks) to stay inside the sequence's Q and K/V. O(1). @pre validate(p) is ok.
[[nodiscard]] inline status check_row(const problem& p, const row_info& r) noexcept {
  if (r.seq < 0 || r.seq >= p.batch()) {
    return status::error(status_code::invalid_argument, "row %lld: sequence %d out of [0, %d)",
                         static_cast<long long>(r.row), r.seq, p.batch());
  }
  if (r.q_block < 0 || r.q_block >= p.q_blocks(r.seq)) {
    return status::error(status_code::invalid_argument, "row %lld: query block %d out of [0, %d) of sequence %d",
                         static_cast<long long>(r.row), r.q_block, p.q_blocks(r.seq), r.seq);
  }
  if (r.head < 0 || r.head >= p.index_heads()) {
    return status::error(status_code::invalid_argument, "row %lld: index head %d out of [0, %d)",
                         static_cast<long long>(r.row), r.head, p.index_heads());
  }
  const row_info e = make_row_info(p, 0, r.seq, r.q_block, r.head);
  if (r.q_begin != e.q_begin || r.q_end != e.q_end || r.kv_len != e.kv_len || r.kv_blocks != e.kv_blocks ||
      r.visible_blocks != e.visible_blocks || r.full_blocks != e.full_blocks || r.causal_offset != e.causal_offset) {
    return status::error(status_code::invalid_argument,
                         "row %lld: geometry (queries [%d, %d), %d keys, %d visible of %d kv blocks) differs from "
                         "make_row_info's ([%d, %d), %d, %d of %d)",
                         static_cast<long long>(r.row), r.q_begin, r.q_end, r.kv_len, r.visible_blocks, r.kv_blocks,
                         e.q_begin, e.q_end, e.kv_len, e.visible_blocks, e.kv_blocks);
  }
  return status::success();
}

// Calls f(row_info) for every index row in row order. f may return void or status; a failed
// status stops the walk and is returned.
template <class F>
[[nodiscard]] status for_each_row(const problem& p, F&& f) {
  std::int64_t row_base = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t nqb = p.q_blocks(b);
    for (std::int32_t i = 0; i < nqb; ++i) {
      for (std::int32_t h = 0; h < p.index_heads(); ++h) {
        const row_info r = make_row_info(p, row_base, b, i, h);
        if constexpr (std::is_same_v<decltype(f(r)), status>) {
          SKIM_TRY(f(r));
        } else {
          f(r);
        }
      }
    }
    row_base += nqb;
  }
  return status::success();
}

}  // namespace skim
