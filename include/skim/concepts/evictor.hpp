#pragma once
// The evictor concept: which KV blocks of one (sequence, kv head) stay in a cache that must shrink
// (docs/design.md §1: skim's summaries can rank KV blocks for eviction).
//
// An evictor is a policy that gives every resident block a retention score from the evidence it
// names (accumulated attention mass, recency, summaries against recent queries); skim::evict::rank
// (evict/rank.hpp) then keeps the protected blocks (sink and newest) and the best-scored rest, and
// reports the others as evicted. Ranking is (score descending, id ascending), NaN read as -inf, so
// ties keep the lower block id and the same inputs give the same ids.
//
// Requirements on E:
//  1. std::copyable; parameters are public members (designated initialisers).
//  2. e.validate() -> status: ok iff the parameters are in their domain.
//  3. e.score_blocks(request, evidence, scores) noexcept -> status: writes scores[id] for every
//     resident id of the request (other entries are not read); checks the evidence it reads
//     (sizes, shapes) and names what is wrong. Never allocates.

#include <concepts>
#include <cstdint>
#include <span>

#include "skim/core/status.hpp"

namespace skim::evict {

// One (sequence, kv head) of a cache that must shrink.
struct request {
  std::int32_t blocks = 0;                   // blocks of the sequence so far, ids [0, blocks)
  std::span<const std::int32_t> resident{};  // sorted unique ids still cached; empty = all of [0, blocks)
  std::int32_t keep = 0;                     // blocks to keep, protected ones included (>= 0)
  std::int32_t sink = 1;                     // ids [0, sink) are never evicted
  std::int32_t newest = 1;                   // ids [blocks - newest, blocks) are never evicted
};

// What a policy may read; each policy says which fields it needs.
struct evidence {
  std::span<const float> mass{};     // [>= blocks] attention mass each block received (attention_mass)
  std::span<const float> records{};  // [>= blocks, heads_kv, record_floats] the sequence's summaries (summary_score)
  std::int32_t heads_kv = 0;         // summary_score: layout of records
  std::int32_t head = 0;             // summary_score: the kv head of this request
  std::int32_t head_dim = 0;         // summary_score
  std::span<const float> queries{};  // [n, head_dim] recent queries of the kv head's group (summary_score)
};

}  // namespace skim::evict

namespace skim {

template <class E>
concept evictor = std::copyable<E> && requires(const E& e, const evict::request& r, const evict::evidence& ev,
                                               std::span<float> scores) {
  { e.validate() } -> std::same_as<status>;
  { e.score_blocks(r, ev, scores) } noexcept -> std::same_as<status>;
};

}  // namespace skim
