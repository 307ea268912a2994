#pragma once
// The summarizer concept: a cheap description of one key block of one kv head, which a router
// scores against a query (docs/design.md §1, §7).
//
// A summarizer is a stateless policy type; its state lives in a *record* of floats the caller
// owns, one per (key block, kv head) — see skim/summarize/build.hpp for the batch-wide layout.
// A record is filled by appending the block's keys in slot order 0, 1, 2, ... (slot = position
// of the key within its block), exactly as a decode loop sees them, so a record built in one
// batch pass and a record built token by token are the same bits.
//
// Requirements on S (every function static, noexcept, allocation-free):
//  1. S::record_floats(head_dim) -> std::int64_t, constexpr: floats per record (> 0).
//  2. S::workspace_floats(head_dim) -> std::int64_t, constexpr: scratch floats complete_block
//     needs (0 if none); the caller provides them (build.hpp carves them from its workspace).
//  3. S::init(record, head_dim): puts record [record_floats(head_dim)] in the empty-block state.
//  4. S::append(record, key, slot, block_kv, head_dim), for key a `const T*` [head_dim] of any
//     skim::element T: adds the key at `slot` of its block. @pre the record holds exactly
//     slots [0, slot) of the same block (in order) and 0 <= slot < block_kv. O(head_dim), never
//     O(block_kv).
//  5. S::complete_block(record, keys, block_kv, head_dim, scratch), for keys any callable
//     `keys(slot) -> const T*` [head_dim] over slots [0, block_kv): called exactly once, right
//     after slot block_kv - 1 was appended; never for a ragged last block. It may reread the
//     block's keys (amortised over the block, so a decode step stays O(1) in the block length
//     on average). scratch is [workspace_floats(head_dim)].
//  6. S::score(record, q, head_dim) -> float, q a `const float*` [head_dim]: the block's estimated
//     best q·k, unscaled (no softmax scale). A record holding no key scores -inf.
// A summarizer without a completion step makes complete_block a no-op.
//
// Optional: a prepared query. A summarizer whose score spends most of its work on the query alone
// (lsh_buckets hashes it) may let a router do that work once per query vector instead of once per
// block, by defining all three of
//  7. S::query_floats(head_dim) -> std::int64_t, constexpr: floats of a prepared query, at most
//     prepared_query_capacity(head_dim);
//  8. S::prepare_query(q, head_dim), q a `float*` of prepared_query_capacity(head_dim) floats whose
//     first head_dim hold a query: replaces them, in place, by its first query_floats(head_dim)
//     floats of prepared form;
//  9. S::score_prepared(record, prepared, head_dim) -> float: the same bits as score(record, q,
//     head_dim) for the q that was prepared.
//
// Optional: four queries at once. A score is a sum in a fixed order, a chain of dependent additions
// whose latency, not its arithmetic, bounds a single call. A summarizer without a prepared query may
// define
// 10. S::score4(record, q, q_stride, head_dim, out): out[g] = the same bits as score(record, q +
//     g·q_stride, head_dim) for g = 0..3, its four chains run side by side;
// routers then score a GQA group's heads four at a time (skim::score_group<S>). One defining score4
// may also define
// 11. S::score4_blocks<B>(records, q4, head_dim, out), records a `const float* const (&)[B]`: score4
//     of B records at once, the four queries interleaved (q4[4·i + g] is query g's element i,
//     summarize::detail::interleave4): out[4·b + g] = the same bits as score(records[b], query g,
//     head_dim), for b < B; and S::score4_blocks_per_call, the B routers should use (1 to 8): enough
//     blocks that their chains (one or more a block) keep the core's vector units busy, few enough
//     that their sums stay in registers;
// routers then score several blocks a call (skim::score_group_blocks<S, B>), a GQA group's four heads
// in the lanes of one vector and the B blocks' chains in flight together (summarize::detail::dots4).
// Routers call skim::prepare_query<S> and skim::score_prepared<S>, which fall back to the plain
// query and S::score for a summarizer without them; a router sizes each query vector's scratch as
// prepared_query_capacity(head_dim) floats, whatever the summarizer.
//
// The header of each summarizer says what its score estimates (a mean, a bound, a sample) and
// checks the concept right after its definition: static_assert(skim::summarizer<mean_pool>).

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "skim/core/dtypes.hpp"

namespace skim {

namespace detail {
// Stands for any accessor of a block's key rows in the concept check (never defined or called).
template <element T>
struct block_keys_archetype {
  const T* operator()(std::int32_t slot) const noexcept;
};
}  // namespace detail

template <class S>
concept summarizer = requires(float* record, const float* record_in, const float* q, std::int32_t slot,
                              std::int32_t block_kv, std::int32_t head_dim, float* scratch) {
  { S::record_floats(head_dim) } -> std::same_as<std::int64_t>;
  typename std::integral_constant<std::int64_t, S::record_floats(128)>;  // usable at compile time
  { S::workspace_floats(head_dim) } -> std::same_as<std::int64_t>;
  { S::init(record, head_dim) } noexcept;
  { S::append(record, static_cast<const float*>(nullptr), slot, block_kv, head_dim) } noexcept;
  { S::append(record, static_cast<const half*>(nullptr), slot, block_kv, head_dim) } noexcept;
  { S::append(record, static_cast<const bfloat16*>(nullptr), slot, block_kv, head_dim) } noexcept;
  { S::complete_block(record, detail::block_keys_archetype<float>{}, block_kv, head_dim, scratch) } noexcept;
  { S::complete_block(record, detail::block_keys_archetype<half>{}, block_kv, head_dim, scratch) } noexcept;
  { S::complete_block(record, detail::block_keys_archetype<bfloat16>{}, block_kv, head_dim, scratch) } noexcept;
  { S::score(record_in, q, head_dim) } noexcept -> std::same_as<float>;
};

// Floats a router keeps per query vector: the query itself, or its prepared form (requirement 7),
// whichever is larger for any summarizer (a prepared form may hold up to 16 floats even when
// head_dim is smaller).
[[nodiscard]] constexpr std::int64_t prepared_query_capacity(std::int32_t head_dim) noexcept {
  return head_dim > 16 ? head_dim : 16;
}

// Whether S defines the optional prepared query (requirements 7-9).
template <class S>
concept prepares_query = summarizer<S> && requires(float* q, const float* record, std::int32_t head_dim) {
  { S::query_floats(head_dim) } -> std::same_as<std::int64_t>;
  { S::prepare_query(q, head_dim) } noexcept;
  { S::score_prepared(record, q, head_dim) } noexcept -> std::same_as<float>;
};

// Prepares q [prepared_query_capacity(head_dim)] in place for S (nothing for a summarizer without
// requirement 8).
template <summarizer S>
constexpr void prepare_query(float* q, std::int32_t head_dim) noexcept {
  if constexpr (prepares_query<S>) S::prepare_query(q, head_dim);
}

// S's score of a record for a query that prepare_query<S> prepared: S::score_prepared, or S::score.
template <summarizer S>
[[nodiscard]] constexpr float score_prepared(const float* record, const float* q, std::int32_t head_dim) noexcept {
  if constexpr (prepares_query<S>) {
    return S::score_prepared(record, q, head_dim);
  } else {
    return S::score(record, q, head_dim);
  }
}

// Whether S defines score4 (requirement 10) and no prepared query.
template <class S>
concept scores_four = summarizer<S> && !prepares_query<S> &&
                      requires(const float* record, const float* q, std::int64_t stride, std::int32_t head_dim, float* out) {
                        { S::score4(record, q, stride, head_dim, out) } noexcept;
                      };

// Whether S defines score4_blocks (requirement 11) besides score4.
template <class S>
concept scores_four_blocks =
    scores_four<S> && requires(const float* const (&records)[2], const float* q4, std::int32_t head_dim, float* out) {
                        { S::template score4_blocks<2>(records, q4, head_dim, out) } noexcept;
                        { S::score4_blocks_per_call } -> std::convertible_to<std::int32_t>;
                      };

// out[g] = score_prepared<S>(record, q + g·q_stride, head_dim) for g in [0, n): four at a time
// where S defines score4, the same bits either way.
template <summarizer S>
constexpr void score_group(const float* record, const float* q, std::int64_t q_stride, std::int32_t n,
                           std::int32_t head_dim, float* out) noexcept {
  std::int32_t g = 0;
  if constexpr (scores_four<S>) {
    for (; g + 4 <= n; g += 4) S::score4(record, q + g * q_stride, q_stride, head_dim, out + g);
  }
  for (; g < n; ++g) out[g] = score_prepared<S>(record, q + g * q_stride, head_dim);
}

// score_group<S> of B records: out[b][g] for b < B, g in [0, n), the same bits. q4: the queries of
// each whole group of four interleaved ([n / 4][head_dim][4], interleave4 of heads 4j..4j+3); heads
// past the last whole four are scored one by one from q (q_stride apart).
template <summarizer S, int B>
  requires scores_four_blocks<S>
constexpr void score_group_blocks(const float* const (&records)[B], const float* q, std::int64_t q_stride,
                                  const float* q4, std::int32_t n, std::int32_t head_dim,
                                  float* const (&out)[B]) noexcept {
  std::int32_t g = 0;
  for (; g + 4 <= n; g += 4) {
    float s[4 * B];
    S::template score4_blocks<B>(records, q4 + static_cast<std::int64_t>(g) * head_dim, head_dim, s);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < 4; ++i) out[b][g + i] = s[4 * b + i];
  }
  for (; g < n; ++g) {
    for (int b = 0; b < B; ++b) out[b][g] = S::score(records[b], q + g * q_stride, head_dim);
  }
}

}  // namespace skim
