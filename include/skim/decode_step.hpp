#pragma once
// skim::decode_step<Executor, Summarizer> — an engine's routed decode step on the CPU, in one object.
//
// It owns what a routed decode step needs between tokens and plans it once: each sequence's block
// summaries (fixed room per sequence, so a growing sequence never moves another's records), the
// selection table, the workspace, and the pipeline sparse_attention<Summarizer, route::pooled_router,
// select::reserved<select::top_k>, Executor> configured from skim::defaults (sink, local window,
// the group's scores summed, one selection per kv head). Then, per sequence:
//
//   skim::decode_step<skim::exec::scalar> step;
//   SKIM_TRY(step.plan({.heads_q = 8, .heads_kv = 2, .head_dim = 64, .max_seqlen_kv = 4096,
//                       .sequences = 1, .top_k = 64}));
//   SKIM_TRY(step.prefill(0, kv, n));              // after prefill: summarise the first n keys
//   // each token: write K/V row n, then
//   SKIM_TRY(step.run(0, q, kv, ++n, o));          // append key n - 1's summary, route, select, attend
//
// Contracts:
//  - kv is the sequence's own K/V source holding at least its n keys: a contiguous_kv view of the
//    sequence's whole cache (narrowed to its first n tokens here), or a paged_kv over its page list;
//    q and o are [heads_q, head_dim] (one token).
//  - run(seq, q, kv, n, o) takes the sequence's newest key to be n - 1 and the summaries to hold its
//    first n - 1 keys (prefill(seq, kv, n - 1) or the previous run): anything else is refused with
//    invalid_argument (summaries are sums: a key appended twice would count twice). reset(seq)
//    forgets a sequence (a new request in its slot).
//  - Only plan() allocates; prefill() and run() never do, and never take locks: distinct sequences
//    may run on distinct threads at once (each call uses its sequence's own records, table rows and
//    workspace).
//  - At every length the routed blocks are those of the pipeline over the same problem: the ids
//    sparse_attention gives, bit for bit (tests/decode_step_test.cpp), and with a top_k that covers
//    every block, the output of the executor over every block (dense attention).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/host_buffer.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/defaults.hpp"
#include "skim/index/block_table.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/build.hpp"

namespace skim {

// The shape of an engine's decode steps and the routing budget (blocks per kv head and token).
struct decode_step_config {
  std::int32_t heads_q = 0;
  std::int32_t heads_kv = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_kv = defaults::block_kv;
  std::int32_t max_seqlen_kv = 0;  // keys a sequence may reach
  std::int32_t sequences = 1;      // slots, one per concurrent sequence
  std::int32_t top_k = 0;          // blocks chosen by score, beyond the reserved ones
  std::int32_t sink_blocks = defaults::sink_blocks;
  std::int32_t local_blocks = defaults::local_blocks;
  float softmax_scale = 0.0f;      // 0: 1/sqrt(head_dim)
};

template <class Executor, summarizer Summarizer = defaults::summarizer>
class decode_step {
 public:
  using pipeline = sparse_attention<Summarizer, route::pooled_router, select::reserved<select::top_k>, Executor>;

  decode_step() = default;
  explicit decode_step(Executor executor) { pipe_.executor = executor; }

  // Checks the configuration against the pipeline and allocates everything run() uses.
  [[nodiscard]] status plan(const decode_step_config& c) {
    if (c.sequences < 1) return status::error(status_code::invalid_argument, "decode_step: sequences %d < 1", c.sequences);
    if (c.max_seqlen_kv < 1) {
      return status::error(status_code::invalid_argument, "decode_step: max_seqlen_kv %d < 1", c.max_seqlen_kv);
    }
    if (c.top_k < 0 || c.sink_blocks < 0 || c.local_blocks < 0) {
      return status::error(status_code::invalid_argument, "decode_step: top_k %d, sink_blocks %d, local_blocks %d < 0",
                           c.top_k, c.sink_blocks, c.local_blocks);
    }
    config_ = c;
    pipe_.router = {.reduce = defaults::reduce};
    pipe_.selector = {.sink = c.sink_blocks, .local = c.local_blocks, .recency = true, .dynamic = {.k = c.top_k}};
    const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, c.max_seqlen_kv};
    const problem longest = problem_for(cu_q, cu_kv);
    SKIM_TRY(pipe_.can_implement(longest));
    record_floats_ = pipe_.summary_floats(longest);  // a sequence's records grow by whole blocks: room for all
    width_ = std::max(pipe_.table_width(longest), 1);
    rows_ = longest.index_rows();
    // The workspace and the table at the longest sequence serve every shorter one (stage needs
    // grow with the blocks); run() checks the need again.
    std::size_t bytes = std::max(pipe_.workspace_bytes(longest), summarize::workspace_bytes<Summarizer>(longest));
    for (std::int32_t n = 1; n < c.max_seqlen_kv; n = std::min(2 * n, c.max_seqlen_kv)) {  // and a few shorter ones
      const std::int32_t cu_n[2] = {0, n};
      bytes = std::max(bytes, pipe_.workspace_bytes(problem_for(cu_q, cu_n)));
    }
    const auto slots = static_cast<std::size_t>(c.sequences);
    records_ = host_buffer<float>(slots * static_cast<std::size_t>(record_floats_), 0.0f);
    ids_.assign(slots * static_cast<std::size_t>(rows_ * width_), index::mutable_block_table::pad);
    count_.assign(slots * static_cast<std::size_t>(rows_), 0);
    summarized_.assign(slots, 0);
    workspaces_.clear();
    workspaces_.reserve(slots);
    for (std::size_t s = 0; s < slots; ++s) workspaces_.emplace_back(bytes);
    return status::success();
  }

  // Summarises keys [0, n) of sequence seq (after its prefill); replaces what the slot held.
  template <kv_source KV>
  [[nodiscard]] status prefill(std::int32_t seq, const KV& kv, std::int32_t n) noexcept {
    SKIM_TRY(check_seq(seq, n, 0));
    summarized_[static_cast<std::size_t>(seq)] = 0;
    if (n > 0) {
      const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, n};
      const problem p = problem_for(cu_q, cu_kv);
      SKIM_TRY(summarize::build<Summarizer>(p, first_keys(kv, n), records(seq, p), workspace(seq)));
    }
    summarized_[static_cast<std::size_t>(seq)] = n;
    return status::success();
  }

  // One token of sequence seq, whose K/V now hold n keys (the newest, n - 1, just written).
  // q, o: [heads_q, head_dim]; lse: heads_q floats or empty.
  template <element TQ, kv_source KV, element TO>
  [[nodiscard]] status run(std::int32_t seq, std::span<const TQ> q, const KV& kv, std::int32_t n, std::span<TO> o,
                           std::span<float> lse = {}, stage_times* times = nullptr) noexcept {
    SKIM_TRY(check_seq(seq, n, 1));
    const std::int32_t have = summarized_[static_cast<std::size_t>(seq)];
    if (have != n - 1) {
      return status::error(status_code::invalid_argument,
                           "decode_step: sequence %d has summaries of %d keys, a step to %d keys needs %d", seq, have,
                           n, n - 1);
    }
    const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, n};
    const problem p = problem_for(cu_q, cu_kv);
    const auto heads = static_cast<std::size_t>(config_.heads_q) * static_cast<std::size_t>(config_.head_dim);
    if (q.size() != heads || o.size() != heads) {
      return status::error(status_code::shape_mismatch, "decode_step: q has %zu and o %zu elements, need %zu",
                           q.size(), o.size(), heads);
    }
    const pipeline_args<TQ, KV, TO> a{
        .prob = p,
        .q = strided_view<const TQ>::token_major(q.data(), 1, config_.heads_q, config_.head_dim),
        .kv = first_keys(kv, n),
        .o = strided_view<TO>::token_major(o.data(), 1, config_.heads_q, config_.head_dim),
        .lse = lse,
        .summaries = records(seq, p),
        .mode = summaries_mode::append_newest,
        .selected = table(seq)};
    SKIM_TRY(pipe_.run(a, workspace(seq), times));
    summarized_[static_cast<std::size_t>(seq)] = n;
    return status::success();
  }

  // Forgets sequence seq (its next call must be prefill, or run with n == 1).
  void reset(std::int32_t seq) noexcept {
    if (seq >= 0 && seq < config_.sequences) summarized_[static_cast<std::size_t>(seq)] = 0;
  }

  // The blocks the last run of sequence seq attended over: one row per kv head.
  [[nodiscard]] index::block_table selected(std::int32_t seq) const noexcept {
    const auto rows = static_cast<std::size_t>(rows_);
    const auto s = static_cast<std::size_t>(seq);
    return {.ids = std::span<const std::int32_t>(ids_).subspan(s * rows * width_, rows * width_),
            .count = std::span<const std::int32_t>(count_).subspan(s * rows, rows),
            .width = width_};
  }
  [[nodiscard]] std::int32_t summarized(std::int32_t seq) const noexcept {
    return summarized_[static_cast<std::size_t>(seq)];
  }
  [[nodiscard]] const decode_step_config& config() const noexcept { return config_; }
  [[nodiscard]] const pipeline& stages() const noexcept { return pipe_; }

 private:
  // A contiguous view of a longer cache narrowed to its first n tokens (the problem's K/V shape);
  // other sources as given.
  template <kv_source KV>
  [[nodiscard]] static KV first_keys(KV kv, std::int32_t n) noexcept {
    if constexpr (requires { kv.k.tokens; kv.v.tokens; }) {
      kv.k.tokens = std::min(kv.k.tokens, n);
      kv.v.tokens = std::min(kv.v.tokens, n);
    }
    return kv;
  }
  [[nodiscard]] problem problem_for(const std::int32_t (&cu_q)[2], const std::int32_t (&cu_kv)[2]) const noexcept {
    return {.heads_q = config_.heads_q, .heads_kv = config_.heads_kv, .head_dim = config_.head_dim, .block_q = 1,
            .block_kv = config_.block_kv, .mask = mask_kind::causal, .softmax_scale = config_.softmax_scale,
            .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv, .scope = defaults::scope};
  }
  [[nodiscard]] status check_seq(std::int32_t seq, std::int32_t n, std::int32_t least) const noexcept {
    if (summarized_.empty()) return status::error(status_code::invalid_argument, "decode_step: plan() first");
    if (seq < 0 || seq >= config_.sequences) {
      return status::error(status_code::invalid_argument, "decode_step: sequence %d outside [0, %d)", seq,
                           config_.sequences);
    }
    if (n < least || n > config_.max_seqlen_kv) {
      return status::error(status_code::invalid_argument, "decode_step: %d keys outside [%d, max_seqlen_kv %d]", n,
                           least, config_.max_seqlen_kv);
    }
    return status::success();
  }
  [[nodiscard]] std::span<float> records(std::int32_t seq, const problem& p) noexcept {
    return records_.span().subspan(static_cast<std::size_t>(seq) * static_cast<std::size_t>(record_floats_),
                                   static_cast<std::size_t>(pipe_.summary_floats(p)));
  }
  [[nodiscard]] index::mutable_block_table table(std::int32_t seq) noexcept {
    const auto rows = static_cast<std::size_t>(rows_);
    return {.ids = std::span<std::int32_t>(ids_).subspan(static_cast<std::size_t>(seq) * rows * width_, rows * width_),
            .count = std::span<std::int32_t>(count_).subspan(static_cast<std::size_t>(seq) * rows, rows),
            .width = width_};
  }
  [[nodiscard]] std::span<std::byte> workspace(std::int32_t seq) const noexcept {
    return workspaces_[static_cast<std::size_t>(seq)].span();
  }

  pipeline pipe_{};
  decode_step_config config_{};
  std::int64_t record_floats_ = 0;  // per sequence
  std::int32_t width_ = 1;
  std::int64_t rows_ = 0;  // table rows per sequence (kv heads)
  host_buffer<float> records_;  // huge pages where the kernel gives them: scoring reads them all every step
  std::vector<std::int32_t> ids_, count_;
  std::vector<std::int32_t> summarized_;  // keys summarised per sequence
  std::vector<workspace_buffer> workspaces_;
};

}  // namespace skim
