#pragma once
// skim::defaults — the routing skim recommends for decode, and what its tools and routers start from.
//
// Measured on a real long-context model (kcode18M: head dim 64, GQA 4, 4096 tokens of held-out code;
// docs/quality-kcode.md), this configuration kept the most of dense attention at a fixed share of the
// K/V read, of every summarizer, block size, pooling and reserve tried:
//  - key blocks of block_kv = 4 keys (smaller blocks follow the attention more closely; blocks of 16
//    or more lose to a sliding window of blocks of 4 at 1/16 and 1/8 of the keys);
//  - summarize::multi_centroid<2> summaries: each block's keys split into two clusters (two Lloyd
//    steps from the block's two halves) and scored by the better of the two centroids. A key unlike
//    its neighbours (a retrieval target) gets a cluster of its own instead of being averaged with
//    three others, as mean_pool does: at 1/8 of the keys this keeps the block oracle's needle count
//    where mean_pool loses a fifth of them, and lowers the perplexity change too. Its record is
//    2 * head_dim + 2 floats per block and kv head, as many bytes as an fp16 K of the block at blocks
//    of 4 (mean_pool: half), and scoring it is half of a q·k pass over the block: a CPU decode step
//    with these defaults at 1/8 costs about 0.8x dense attention (docs/performance.md), so an engine
//    bound by decode time takes blocks of 8 or mean_pool over larger blocks at the measured loss;
//  - scored by the pooled router with the scores of a kv head's query heads summed
//    (group_reduce::sum): one selection per kv head, so a decode step reads each selected block
//    once for the whole GQA group;
//  - reserved: the first sink_blocks blocks (the attention sink), the local_blocks newest blocks
//    and the newest block (recency); the rest of the budget goes to the best scores.
// An engine sets block_kv in its problem (skim has no default problem) and builds its pipeline from
// the rest, e.g.
//   sparse_attention<defaults::summarizer, route::pooled_router, select::reserved<select::top_k>, Exec> s{
//       .router = {.reduce = defaults::reduce},
//       .selector = {.sink = defaults::sink_blocks, .local = defaults::local_blocks, .dynamic = {.k = k}}};
// cuda::decode_router starts from the same reduce and reserves; given cuda::device_multi_centroid<2>
// summaries (summarize/cuda/multi_centroid.cuh) it computes this pipeline's ids, bit for bit.

#include <cstdint>

#include "skim/core/problem.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/summarize/multi_centroid.hpp"

namespace skim::defaults {

inline constexpr std::int32_t block_kv = 4;
inline constexpr index_scope scope = index_scope::kv_head;
inline constexpr route::group_reduce reduce = route::group_reduce::sum;
inline constexpr std::int32_t sink_blocks = 1;
inline constexpr std::int32_t local_blocks = 8;
using summarizer = summarize::multi_centroid<2>;

}  // namespace skim::defaults
