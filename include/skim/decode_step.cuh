#pragma once
// skim::cuda::decode_step<T, TO, Summaries> — an engine's routed decode step on the GPU, in one object.
//
// The CUDA counterpart of skim::decode_step (decode_step.hpp): it plans once what a routed step needs
// between tokens — the block summaries (Summaries: device_multi_centroid<2>, skim::defaults'
// summarizer, by default; or device_max_bound<TS>, TS float, K's 16-bit type, or over a quantised
// cache its codes' type), the selection table, the router's scores and the decode workspace — inside
// device memory the engine gives it, and runs the step as two launches on the engine's stream (three
// over multi_centroid summaries, whose append is a launch of its own): the score kernel, which also
// keeps each tile's best candidates, then decode, whose CTAs select their own rows from them
// (decode_router::score_routed(): no select launch):
//
//   skim::cuda::decode_step<skim::bfloat16> step;
//   std::byte* memory;  // cudaMalloc(&memory, step.device_bytes(config)), once
//   SKIM_TRY(step.plan(config, {memory, step.device_bytes(config)}));
//   SKIM_TRY(step.prefill(kv, stream));                       // after prefill: summarise every key
//   SKIM_TRY(step.run(q, kv, o, nullptr, stream));            // each token (capturable in a graph)
//
// Contracts:
//  - config.prob is a decode problem (max_seqlen_q 1, block_q 1) whose cu_seqlens_q/kv and error word
//    are the engine's device memory: the lengths may change between calls and graph replays, within
//    max_seqlen_kv. The routing is decode_router's: skim::defaults' reduce and reserves with the
//    config's sink, local and top_k, one selection per kv head; the attention is cuda::decode over
//    exactly the selected blocks.
//  - run(q, kv, o, lse, stream): each sequence's newest key (position seq_len_kv(b) - 1) is already in
//    K/V; its block's summary is brought up to date, then every sequence's blocks are scored,
//    selected and attended. The ids are those the CPU pipeline with the same summarizer selects, bit
//    for bit (decode_router's contract); table() holds them after the step.
//  - No allocation and no synchronisation in prefill() or run(); plan() only carves the caller's
//    memory (and launches nothing). Device content is checked as each kernel documents (the error word).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/core/cuda/common.cuh"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/defaults.hpp"
#include "skim/exec/cuda/decode.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/route/cuda/decode_router.cuh"
#include "skim/summarize/cuda/max_bound.cuh"
#include "skim/summarize/cuda/multi_centroid.cuh"

namespace skim::cuda {

// A decode step's shape (the device problem) and its routing budget, in blocks per kv head.
struct decode_step_config {
  device_problem prob;  // block_q 1, max_seqlen_q 1; block_kv, bounds, cu_seqlens and error word: the engine's
  std::int32_t top_k = 0;  // blocks chosen by score, beyond the reserved ones
  std::int32_t sink_blocks = defaults::sink_blocks;
  std::int32_t local_blocks = defaults::local_blocks;
};

namespace detail::decode_step_impl {

// Summaries' storage carved from an arena (a measuring arena only counts): one trait per summary kind.
template <class S>
struct storage;
template <class TS>
struct storage<device_max_bound<TS>> {
  using value_type = TS;
  static device_max_bound<TS> carve(workspace_arena& arena, const device_problem& p) noexcept {
    const auto n = static_cast<std::size_t>(p.batch) * p.max_kv_blocks() * p.heads_kv * p.head_dim;
    TS* lo = arena.take<TS>(n).data();
    TS* hi = arena.take<TS>(n).data();
    device_max_bound<TS> s{.lo = lo, .hi = hi, .max_kv_blocks = p.max_kv_blocks()};
    if constexpr (device_max_bound<TS>::codes) s.scale = arena.take<float>(static_cast<std::size_t>(s.scales(p))).data();
    return s;
  }
};
template <std::int32_t M, std::int32_t L>
struct storage<device_multi_centroid<M, L>> {
  using value_type = float;
  static device_multi_centroid<M, L> carve(workspace_arena& arena, const device_problem& p) noexcept {
    device_multi_centroid<M, L> s{.records = nullptr, .max_kv_blocks = p.max_kv_blocks()};
    s.records = arena.take<float>(static_cast<std::size_t>(s.elements(p))).data();
    return s;
  }
};

}  // namespace detail::decode_step_impl

template <class T, class TO = T, class Summaries = device_multi_centroid<2>>
class decode_step {
  using storage = detail::decode_step_impl::storage<Summaries>;

 public:
  using summary_value_type = typename storage::value_type;

  // Device bytes plan() carves (aligned to workspace_alignment; cudaMalloc's alignment suffices);
  // 0 for a configuration plan() refuses. The sizes follow the problem's bounds and its device
  // pointers' presence (set them before asking).
  [[nodiscard]] static std::size_t device_bytes(const decode_step_config& c) noexcept {
    decode_step s;
    if (!s.configure(c).ok()) return 0;
    workspace_arena measure;
    s.carve(measure);
    return measure.bytes();
  }

  // Checks the configuration and lays out device_memory (at least device_bytes(c) bytes).
  [[nodiscard]] status plan(const decode_step_config& c, std::span<std::byte> device_memory) noexcept {
    planned_ = false;
    SKIM_TRY(configure(c));
    SKIM_TRY(check_workspace(device_memory, device_bytes(c)));
    workspace_arena arena(device_memory);
    carve(arena);
    planned_ = true;
    return status::success();
  }

  // Summarises every key block of every sequence (after prefill; the lengths are read on the device).
  template <class KV>
  [[nodiscard]] status prefill(const KV& kv, cudaStream_t stream) const noexcept {
    SKIM_TRY(check_planned());
    return build(prob_, kv, summaries_, stream);
  }

  // One token of every sequence: append, score, select, attend. lse: [batch, heads_q] floats or null.
  template <class KV>
  [[nodiscard]] status run(device_view<const T> q, const KV& kv, device_view<TO> o, float* lse,
                           cudaStream_t stream) const noexcept {
    SKIM_TRY(check_planned());
    const decode_route_args<T, summary_value_type, Summaries> route{
        .prob = prob_, .q = q, .summaries = summaries_, .index = table_};
    device_routed_table routed;
    SKIM_TRY(router_.score_routed(route, kv, route_ws_, routed, stream));
    const device_attention_args<T, KV, device_routed_table, TO> attend{
        .prob = prob_, .q = q, .kv = kv, .index = routed, .o = o, .lse = lse};
    return decode_.run(attend, decode_ws_, stream);
  }

  [[nodiscard]] const device_problem& problem() const noexcept { return prob_; }
  [[nodiscard]] device_block_table table() const noexcept { return table_; }  // the last step's ids
  [[nodiscard]] const Summaries& summaries() const noexcept { return summaries_; }
  [[nodiscard]] const decode_router& router() const noexcept { return router_; }
  // The attention executor (chunking, kernel choice); set before plan().
  [[nodiscard]] cuda::decode& executor() noexcept { return decode_; }

 private:
  // The problem and the router's reserves from c, checked against the router and decode.
  [[nodiscard]] status configure(const decode_step_config& c) noexcept {
    if (c.top_k < 0 || c.sink_blocks < 0 || c.local_blocks < 0) {
      return status::error(status_code::invalid_argument, "decode_step: top_k %d, sink_blocks %d, local_blocks %d < 0",
                           c.top_k, c.sink_blocks, c.local_blocks);
    }
    prob_ = c.prob;
    router_.selector.sink = c.sink_blocks;
    router_.selector.local = c.local_blocks;
    router_.selector.dynamic.k = c.top_k;
    SKIM_TRY(router_.can_implement(prob_));
    return decode_.can_implement(prob_);
  }
  // The one layout of device memory, for measuring and for carving alike.
  void carve(workspace_arena& arena) noexcept {
    summaries_ = storage::carve(arena, prob_);
    const std::int32_t width = router_.width(prob_) > 0 ? router_.width(prob_) : 1;
    const std::int64_t rows = static_cast<std::int64_t>(prob_.batch) * prob_.index_heads();
    table_ = {.ids = arena.take<std::int32_t>(static_cast<std::size_t>(rows * width)).data(),
              .count = arena.take<std::int32_t>(static_cast<std::size_t>(rows)).data(),
              .width = width,
              .rows = rows};
    route_ws_ = arena.take<std::byte>(router_.workspace_bytes(prob_));
    decode_ws_ = arena.take<std::byte>(decode_.workspace_bytes(prob_, width));
  }
  [[nodiscard]] status check_planned() const noexcept {
    return planned_ ? status::success()
                    : status::error(status_code::invalid_argument, "decode_step: plan() did not succeed");
  }

  device_problem prob_{};
  decode_router router_{};
  cuda::decode decode_{};
  Summaries summaries_{};
  mutable_device_block_table table_{};
  std::span<std::byte> route_ws_{}, decode_ws_{};
  bool planned_ = false;
};

}  // namespace skim::cuda
