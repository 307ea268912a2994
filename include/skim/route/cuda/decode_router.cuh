#pragma once
// Decode routing on the device: score every visible key block of each (sequence, index head) from its
// max_bound summary (summarize/cuda/max_bound.cuh), keep the reserved sink and local blocks, add the top-k of the
// rest, and write a device_block_table the CUDA decode executor reads. With summarize/cuda/max_bound.cuh's
// append_newest() a whole decode step (append, route, attend) runs on the device: no host
// synchronisation, no allocation, kernel launches only, so it can be captured in a CUDA graph and
// replayed while the sequences grow (the host knows only the bounds of device_problem).
//
// It computes exactly what the CPU pipeline computes for a decode problem:
//   summarize::max_bound -> route::pooled_router{pool, reduce} -> select::reserved<select::top_k>
// with the same bits: a block's score sums q_d · (q_d >= 0 ? max_d : min_d) over d in index order in
// fp32 (equal, term by term, to max_bound::score's max(q_d·min_d, q_d·max_d); products and sums are
// rounded one by one: __fmul_rn/__fadd_rn, never fused), reduces the group's heads in head order and
// scales as pooled_router does. Ties rank by the lower block id, NaN as -inf, -0 as +0
// (select/rank.hpp), so the ids are the CPU's, bit for bit.
//
// Decode means one query per sequence: device_problem::max_seqlen_q <= 1 (a sequence with no query
// has no row). Row numbering is core/cuda/common.cuh's, row = q_block_offset(b) * index_heads + h, which for
// decode is (cu_seqlens_q[b] - cu_seqlens_q[0]) * index_heads + h. A routed row is written completely:
// ids ascending in [0, count), index::block_table::pad (-1) in [count, width); the rows of a sequence
// that breaks the bounds are left alone (reported: bad_seqlen).
//
// Two kernels: score every block into the workspace (route/cuda/score_kernel.cuh), then select each row's ids
// (select/cuda/select_kernel.cuh). With share_heads the select kernel pools a sequence's index heads first
// (route/head_pool.hpp) and writes one row per sequence: the CPU pipeline's share_heads, bit for bit.
// Or one kernel and decode: routed() hands decode a device_routed_table, and decode's split kernels
// run the select kernel's code on their own rows (same ids) before attending.
//
// Cost: scoring reads every visible block's record per (sequence, kv head), 2 · blocks · head_dim
// elements for max_bound (keep those summaries in K's 16-bit type: exact, half of fp32's bytes). The
// score kernel reads each block's records straight into registers, one block per thread: each thread's
// sum over a head's dims is one chain of dependent adds (the CPU router's order, for the same bits),
// which bounds it more than DRAM does; staging records through shared memory, or four threads a block
// (one head each), was slower. run(args, kv, ...) folds max_bound's append into the score kernel (one
// launch fewer). Measurements: docs/performance.md, "GPU routed decode step".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "skim/core/workspace.hpp"
#include "skim/defaults.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/route/cuda/score_kernel.cuh"
#include "skim/select/cuda/select_kernel.cuh"
#include "skim/summarize/cuda/max_bound.cuh"
#include "skim/summarize/cuda/multi_centroid.cuh"
#include "skim/index/block_table.hpp"
#include "skim/route/head_pool.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"

namespace skim::cuda {

// What decode_router::run() takes. Summaries: device_max_bound<TS> (the CPU's summarize::max_bound),
// or device_multi_centroid<M, L> with TS = float (summarize::multi_centroid<M, L>; <2> is
// skim::defaults::summarizer, so a default router over them computes the CPU default).
template <class TQ, class TS, class Summaries = device_max_bound<TS>>
struct decode_route_args {
  device_problem prob;              // max_seqlen_q <= 1
  device_view<const TQ> q;          // [tokens_q, heads_q, head_dim]
  Summaries summaries;              // blocks [0, kv_blocks(b)) of every sequence summarised; read (run with a
                                    // K/V source also appends each sequence's newest key)
  mutable_device_block_table index; // [rows, width >= decode_router::width(prob)], written; rows: one per
                                    // (sequence with a query, index head), or per sequence with share_heads
};

// The decode router: summaries -> scores -> reserved<top_k> ids, on the device (see the header).
struct decode_router {
  // Defaults: skim/defaults.hpp's reduce and reserves (the top-k count, dynamic.k, is the caller's).
  route::pooled_router router{.reduce = defaults::reduce};  // reduce combines the group's heads; pool is moot (one query)
  select::reserved<select::top_k> selector{.sink = defaults::sink_blocks,
                                           .local = defaults::local_blocks};  // dynamic.k; importance must be 0
  // One selection per query block (per sequence in decode) for all its index heads, from their scores
  // pooled as `pool` says (route/head_pool.hpp), as the CPU pipeline's share_heads does, bit for bit.
  // The table then has one row per query block (row q_block_offset(b)); the executors read it
  // through device_head_shared{table, index_heads}.
  bool share_heads = false;
  head_pool pool = head_pool::relative;

  static constexpr std::int32_t max_blocks = 8192;  // visible blocks per row: select's keys in shared memory (32 KB)
  static constexpr std::int32_t max_group = detail::route_impl::max_group;  // query heads per row

  // Width of a block table that holds every row's ids.
  [[nodiscard]] std::int32_t width(const device_problem& p) const noexcept {
    return p.block_kv > 0 && p.max_seqlen_kv >= 0 ? selector.max_count(p.max_kv_blocks()) : 0;
  }
  // Floats of the scores select() reads: [batch, index_heads, max_kv_blocks].
  [[nodiscard]] static std::int64_t score_floats(const device_problem& p) noexcept {
    if (p.block_kv <= 0 || p.max_seqlen_kv < 0 || p.batch < 0 || p.heads_q < 0 || p.heads_kv < 0) return 0;
    return static_cast<std::int64_t>(p.batch) * p.index_heads() * p.max_kv_blocks();
  }
  // Candidates a row's tiles keep in score_routed() for decode's selection: the tiles of a row times
  // candidate_slots(k), or 0 where score_routed() keeps none (share_heads, k 0, or more than
  // max_row_candidates: decode ranks each kept candidate against all, so the cost grows as their square,
  // and such rows are selected from the scores instead).
  static constexpr std::int32_t max_row_candidates = 256;
  [[nodiscard]] std::int64_t candidate_stride(const device_problem& p) const noexcept {
    if (share_heads || p.block_kv <= 0 || p.max_seqlen_kv < 0) return 0;
    const std::int64_t tiles = (p.max_kv_blocks() + detail::route_impl::candidate_tile - 1) / detail::route_impl::candidate_tile;
    const std::int64_t m = tiles * detail::route_impl::candidate_slots(selector.dynamic.k);
    return m <= max_row_candidates ? m : 0;
  }
  // Device workspace of run() and score_routed(): the scores, then (from a 16-byte boundary) the
  // candidates where score_routed() keeps them (aligned to workspace_alignment).
  [[nodiscard]] std::size_t workspace_bytes(const device_problem& p) const noexcept {
    const std::int64_t rows = score_floats(p) > 0 ? static_cast<std::int64_t>(p.batch) * p.index_heads() : 0;
    return candidates_offset(p) + static_cast<std::size_t>(rows * candidate_stride(p)) * sizeof(std::uint64_t);
  }
  // The scores inside a workspace of workspace_bytes(p): what score() writes and select() or
  // routed() read when a caller runs the stages itself. A shorter workspace gives a shorter span,
  // which score() and select() refuse (shape_mismatch).
  [[nodiscard]] static std::span<float> scores_in(std::span<std::byte> workspace, const device_problem& p) noexcept {
    const std::size_t fits = workspace.size() / sizeof(float);
    const auto needed = static_cast<std::size_t>(score_floats(p));
    return {reinterpret_cast<float*>(workspace.data()), needed < fits ? needed : fits};
  }

  [[nodiscard]] status can_implement(const device_problem& p) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(selector.validate());
    if (to_string(router.reduce) == "unknown") {
      return status::error(status_code::invalid_argument, "group_reduce %d is not max, mean or sum",
                           static_cast<int>(router.reduce));
    }
    if (selector.importance != 0.0f) {
      return status::error(status_code::unsupported,
                           "decode_router: reserved importance %g needs a prior (none on the GPU)",
                           static_cast<double>(selector.importance));
    }
    if (p.softmax_scale < 0.0f) {
      return status::error(status_code::unsupported, "softmax_scale %g < 0: summaries bound the largest logit only "
                           "for a positive scale", static_cast<double>(p.softmax_scale));
    }
    if (p.max_seqlen_q > 1) {
      return status::error(status_code::unsupported, "decode_router: max_seqlen_q %d > 1 (one query per sequence)",
                           p.max_seqlen_q);
    }
    if (p.max_kv_blocks() > max_blocks) {
      return status::error(status_code::unsupported, "decode_router: %d kv blocks per sequence > %d", p.max_kv_blocks(),
                           max_blocks);
    }
    if (heads_per_row(p) > max_group) {
      return status::error(status_code::unsupported, "decode_router: %d query heads per row > %d", heads_per_row(p),
                           max_group);
    }
    if (query_smem(p) > detail::route_impl::max_query_smem) {
      return status::error(status_code::unsupported, "decode_router: %d query heads per row x head_dim %d need %zu bytes "
                           "of shared memory > %zu", heads_per_row(p), p.head_dim, query_smem(p),
                           detail::route_impl::max_query_smem);
    }
    if (p.batch > 65535 || p.index_heads() > 65535) {
      return status::error(status_code::unsupported, "decode_router: batch %d or index heads %d > 65535 (grid)",
                           p.batch, p.index_heads());
    }
    return status::success();
  }

  // Scores every visible block of every (sequence, index head) into scores [batch, index_heads,
  // max_kv_blocks] (row (b, h) at (b * index_heads + h) * max_kv_blocks; -inf past its visible blocks
  // and for a sequence without a query). Bit for bit pooled_router::score's row q_block_offset(b) * index_heads + h.
  template <class TQ, class TS, class S>
  [[nodiscard]] status score(const decode_route_args<TQ, TS, S>& a, std::span<float> scores,
                             cudaStream_t stream) const noexcept {
    return score(a, detail::route_impl::no_append{}, scores, stream);
  }

  // score() after folding the newest key of every sequence with keys (from kv) into its block's
  // record: summarize/cuda/max_bound.cuh's append_newest(a.prob, kv, a.summaries) and score() in one launch, with
  // the same records and scores as the two calls (multi_centroid records: the two launches).
  template <class TQ, class TS, class S, class KV>
  [[nodiscard]] status score(const decode_route_args<TQ, TS, S>& a, const KV& kv, std::span<float> scores,
                             cudaStream_t stream) const noexcept {
    return score(a, kv, scores, stream, nullptr);
  }

 private:
  // score(), and where `candidates` is not null, the tiles' kept candidates there (score_routed():
  // the workspace's, candidate_stride(p) > 0).
  template <class TQ, class TS, class S, class KV>
  [[nodiscard]] status score(const decode_route_args<TQ, TS, S>& a, const KV& kv, std::span<float> scores,
                             cudaStream_t stream, std::uint64_t* candidates) const noexcept {
    static_assert(std::is_same_v<TQ, float> || is_device_element_v<TQ>, "Q is float, half or bfloat16");
    static_assert(!is_device_multi_centroid_v<S> || std::is_same_v<TS, float>, "multi_centroid records are float");
    namespace impl = detail::route_impl;
    const device_problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    if constexpr (is_device_multi_centroid_v<S> && !std::is_same_v<KV, impl::no_append>) {
      SKIM_TRY(check_scores(p, scores.data(), scores.size()));  // before the records change
      SKIM_TRY(append_newest(p, kv, a.summaries, stream));
      return score(a, impl::no_append{}, scores, stream, candidates);
    } else {
      if constexpr (std::is_same_v<KV, impl::no_append>) {
        SKIM_TRY(validate(a.summaries, p));
      } else {
        SKIM_TRY(detail::summarize_impl::check_summarize(p, kv, a.summaries));
      }
      SKIM_TRY(check_scores(p, scores.data(), scores.size()));
      if (p.batch > 0 && p.max_seqlen_q > 0) {
        if (a.q.data == nullptr) return status::error(status_code::invalid_argument, "Q is null");
        if (a.q.token_stride < 0 || a.q.head_stride < 0 || (p.heads_q > 1 && a.q.head_stride < p.head_dim)) {
          return status::error(status_code::invalid_argument, "Q strides (token %lld, head %lld) with head_dim %d",
                               static_cast<long long>(a.q.token_stride), static_cast<long long>(a.q.head_stride),
                               p.head_dim);
        }
      }
      const std::int32_t stride = p.max_kv_blocks();
      if (p.batch == 0 || stride == 0) return status::success();
      impl::score_params sp{
          .scale = p.scale(), .reduce = router.reduce, .heads = heads_per_row(p), .padded_heads = padded_heads(p),
          .stride = stride,
          .vector_loads = vector_loads(a.summaries, p.head_dim)};
      if constexpr (!is_device_multi_centroid_v<S>) {  // the records' bytes: min and max of every block
        const std::size_t bytes = static_cast<std::size_t>(p.batch) * p.heads_kv * stride * p.head_dim * 2 * sizeof(TS);
        SKIM_TRY(streams_past_l2(bytes, sp.stream, "skim::cuda::decode_router: device attributes"));
      }
      if (candidates != nullptr) {
        sp.candidates = candidates;
        sp.slots = impl::candidate_slots(selector.dynamic.k);
        sp.candidate_stride = candidate_stride(p);
        sp.select = select_params_for(p);
      }
      const dim3 grid(static_cast<unsigned>(ceil_div(stride, impl::tile_blocks)), static_cast<unsigned>(p.index_heads()),
                      static_cast<unsigned>(p.batch));
      const std::size_t smem = query_smem(p);
      const auto launch = [&](auto kernel) {
        kernel<<<grid, impl::score_threads, smem, stream>>>(p, a.q, a.summaries, kv, scores.data(), sp);
      };
      switch (impl::pass_heads(heads_per_row(p))) {
        case 1: launch(impl::decode_score_kernel<1, TQ, S, KV>); break;
        case 2: launch(impl::decode_score_kernel<2, TQ, S, KV>); break;
        case 4: launch(impl::decode_score_kernel<4, TQ, S, KV>); break;
        default: launch(impl::decode_score_kernel<8, TQ, S, KV>); break;
      }
      return check_launch("decode_score_kernel");
    }
  }

 public:

  // Selects every row's ids from scores laid out as score() writes them (read: each row's visible
  // blocks) into index: ids ascending in [0, count), pad past count. With share_heads, one row per
  // query block from the pooled scores of its heads.
  [[nodiscard]] status select(const device_problem& p, std::span<const float> scores,
                              const mutable_device_block_table& index, cudaStream_t stream) const noexcept {
    namespace impl = detail::route_impl;
    SKIM_TRY(check_select(p, scores, index));
    if (p.batch == 0 || p.index_heads() == 0) return status::success();
    const impl::select_params sp = select_params_for(p);
    const dim3 grid(share_heads ? 1u : static_cast<unsigned>(p.index_heads()), static_cast<unsigned>(p.batch));
    const std::size_t smem = sizeof(std::uint32_t) * static_cast<std::size_t>(p.max_kv_blocks());
    if (share_heads) {
      impl::decode_select_kernel<true><<<grid, impl::select_threads, smem, stream>>>(p, scores.data(), index, sp);
    } else {
      impl::decode_select_kernel<false><<<grid, impl::select_threads, smem, stream>>>(p, scores.data(), index, sp);
    }
    return check_launch("decode_select_kernel");
  }

  // select() left to decode: a device_routed_table over `index` that skim::cuda::decode::run
  // takes as its index; decode's split kernels then select each row (select()'s ids, bit for bit)
  // where they read it, and write `index` as select() would. A decode step is then score() and
  // decode: one launch less. Checks what select() checks; share_heads is unsupported here.
  [[nodiscard]] status routed(const device_problem& p, std::span<const float> scores,
                              const mutable_device_block_table& index, device_routed_table& out) const noexcept {
    SKIM_TRY(check_select(p, scores, index));
    if (share_heads) {
      return status::error(status_code::unsupported, "decode_router::routed: share_heads rows are selected by select()");
    }
    out = device_routed_table{.table = index, .scores = scores.data(), .select = select_params_for(p)};
    return status::success();
  }

  // score() with the selection's first half, into the workspace: besides the scores, each score CTA
  // keeps its tile's best candidates (where candidate_stride(p) > 0), and `out` is the routed table
  // over a.index whose decode selects from them (select()'s ids, bit for bit; elsewhere from the
  // scores, as routed() makes it). A decode step is then this launch and decode's. kv: the K/V source
  // whose newest keys are appended first, as score(a, kv, ...) does.
  // workspace: device memory of workspace_bytes(a.prob) bytes, aligned to workspace_alignment.
  template <class TQ, class TS, class S>
  [[nodiscard]] status score_routed(const decode_route_args<TQ, TS, S>& a, std::span<std::byte> workspace,
                                    device_routed_table& out, cudaStream_t stream) const noexcept {
    return score_routed(a, detail::route_impl::no_append{}, workspace, out, stream);
  }
  template <class TQ, class TS, class S, class KV>
  [[nodiscard]] status score_routed(const decode_route_args<TQ, TS, S>& a, const KV& kv, std::span<std::byte> workspace,
                                    device_routed_table& out, cudaStream_t stream) const noexcept {
    SKIM_TRY(can_implement(a.prob));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(a.prob)));
    const std::span<float> scores = scores_in(workspace, a.prob);
    device_routed_table routed_table;
    SKIM_TRY(routed(a.prob, scores, a.index, routed_table));
    std::uint64_t* candidates = nullptr;  // the score kernel writes them, decode reads them
    if (const std::int64_t stride = candidate_stride(a.prob); stride > 0) {
      candidates = reinterpret_cast<std::uint64_t*>(workspace.data() + candidates_offset(a.prob));
      routed_table.candidates = candidates;
      routed_table.slots = detail::route_impl::candidate_slots(selector.dynamic.k);
      routed_table.candidate_stride = stride;
    }
    SKIM_TRY(score(a, kv, scores, stream, candidates));
    out = routed_table;
    return status::success();
  }

  // score() into the workspace, then select(): one decode step's routing, two launches on `stream`.
  // workspace: device memory of workspace_bytes(a.prob) bytes, aligned to workspace_alignment.
  template <class TQ, class TS, class S>
  [[nodiscard]] status run(const decode_route_args<TQ, TS, S>& a, std::span<std::byte> workspace,
                           cudaStream_t stream) const noexcept {
    return run(a, detail::route_impl::no_append{}, workspace, stream);
  }

  // One decode step's summary append and routing in two launches: append_newest(a.prob, kv,
  // a.summaries) folded into score(), then select(). kv: the K/V source the new keys are in.
  template <class TQ, class TS, class S, class KV>
  [[nodiscard]] status run(const decode_route_args<TQ, TS, S>& a, const KV& kv, std::span<std::byte> workspace,
                           cudaStream_t stream) const noexcept {
    SKIM_TRY(can_implement(a.prob));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(a.prob)));
    const std::span<float> scores = scores_in(workspace, a.prob);
    SKIM_TRY(score(a, kv, scores, stream));
    return select(a.prob, scores, a.index, stream);
  }

 private:
  // Where the candidates start in the workspace: past the scores, at a 16-byte boundary.
  [[nodiscard]] static std::size_t candidates_offset(const device_problem& p) noexcept {
    return (static_cast<std::size_t>(score_floats(p)) * sizeof(float) + 15) / 16 * 16;
  }
  // 16-byte record loads in the score kernel: max_bound records whose rows are whole 16-byte words.
  template <class TS>
  [[nodiscard]] static bool vector_loads(const device_max_bound<TS>& s, std::int32_t head_dim) noexcept {
    const auto aligned = [](const void* x) { return reinterpret_cast<std::uintptr_t>(x) % 16 == 0; };
    return (static_cast<std::size_t>(head_dim) * sizeof(TS)) % 16 == 0 && aligned(s.lo) && aligned(s.hi);
  }
  template <std::int32_t M, std::int32_t L>
  [[nodiscard]] static bool vector_loads(const device_multi_centroid<M, L>&, std::int32_t) noexcept { return false; }

  // What select() and routed() check: the problem, the scores' size, the table's shape.
  [[nodiscard]] status check_select(const device_problem& p, std::span<const float> scores,
                                    const mutable_device_block_table& index) const noexcept {
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_scores(p, scores.data(), scores.size()));
    const std::int32_t w = width(p);
    if (index.width < w) {
      return status::error(status_code::shape_mismatch, "block_table width %d < %d ids a row may select",
                           index.width, w);
    }
    if (index.rows < 0) return status::error(status_code::invalid_argument, "block_table rows %lld < 0",
                                             static_cast<long long>(index.rows));
    return device_block_table(index).validate();  // null ids or counts
  }
  [[nodiscard]] detail::route_impl::select_params select_params_for(const device_problem& p) const noexcept {
    return {.k = selector.dynamic.k, .sink = selector.sink,
            .newest = std::max(selector.local, selector.recency ? 1 : 0),  // reserved::newest()
            .stride = p.max_kv_blocks(), .relative = pool == head_pool::relative};
  }

  [[nodiscard]] static std::int32_t heads_per_row(const device_problem& p) noexcept {
    return p.scope == index_scope::kv_head ? p.group_size() : 1;
  }
  // Query heads per row rounded up to whole passes of the score kernel (rows of its staged queries).
  [[nodiscard]] static std::int32_t padded_heads(const device_problem& p) noexcept {
    const std::int32_t hp = detail::route_impl::pass_heads(heads_per_row(p));
    return (heads_per_row(p) + hp - 1) / hp * hp;
  }
  // Shared memory of the score kernel: the staged queries in fp32.
  [[nodiscard]] static std::size_t query_smem(const device_problem& p) noexcept {
    return static_cast<std::size_t>(padded_heads(p)) * static_cast<std::size_t>(p.head_dim > 0 ? p.head_dim : 0) *
           sizeof(float);
  }
  [[nodiscard]] static status check_scores(const device_problem& p, const float* data, std::size_t size) noexcept {
    const std::int64_t needed = score_floats(p);
    if (needed > 0 && data == nullptr) return status::error(status_code::invalid_argument, "scores are null");
    if (static_cast<std::int64_t>(size) < needed) {
      return status::error(status_code::shape_mismatch, "scores has %zu floats, needs %lld (batch %d x %d index heads "
                           "x %d kv blocks)", size, static_cast<long long>(needed), p.batch, p.index_heads(),
                           p.max_kv_blocks());
    }
    return status::success();
  }
};

}  // namespace skim::cuda
