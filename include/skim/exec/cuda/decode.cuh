#pragma once
// skim::cuda::decode — sparse attention for decode rows on the GPU: a few queries per
// sequence (one, or a handful for speculative decoding) attending over the key blocks an index
// selected for them.
//
// It computes exactly what exec::reference computes (cpu/reference.hpp): for query q of sequence b
// and query head h, the index row (q_block_offset(b) + q / block_q) · index_heads + index_head_of(h)
// lists key blocks; q attends, with fp32 accumulation, over the keys of those blocks it may see
// (bottom-right causal: key j iff j <= q + kv_len - q_len, and j < kv_len). A query that sees no key
// gets O = 0 and lse = -inf.
//
// Work: one CTA per (split, unit). A unit is the rows sharing one index row: with index_scope::kv_head
// all query heads of a kv head (the GQA group) × the queries of a query block, so every selected K/V
// block is read from memory once per kv head; with index_scope::query_head one head × the queries.
// A split is `chunk_blocks` consecutive ids of the row. 8 warps per CTA share the split's keys; K/V
// stream through shared memory by cp.async (the tensor-core kernel's copies evict-first in L2 where
// the launch's K/V are at least half of L2: core/cuda/launch.cuh, streams_past_l2). Two split
// kernels compute it (decode::kernel):
//  - decode_kernel::cuda_cores (decode_simt.cuh): fp32 dot products per key, any 16-bit Q and K/V
//    types, any GPU; 2 tiles (8 KB) in flight per warp.
//  - decode_kernel::tensor_cores (decode_mma.cuh): keys as the M of mma.sync.m16n8k16 and the
//    unit's rows as its N (tiles of 8 rows), Sᵀ and Oᵀ on tensor cores, 16 KB in flight per warp;
//    sm_80 and later, Q and K/V of one type. P is rounded to that type before P·V (as in prefill), so
//    O differs from the reference by about that rounding (tests: 2e-2 relative for bf16, 5e-3 for
//    fp16). Quantised K/V (8-bit codes) are widened exactly to Q's type in registers, as the mma's
//    fragments.
//  - decode_kernel::automatic (the default): tensor_cores where it applies, else cuda_cores.
// Rows with more than one split merge the splits' partials (m, l, unnormalised o, fp32) by LSE in
// split order: on sm_90 and later, with at most max_cluster_splits splits, the splits of a row run
// as one thread block cluster and merge through distributed shared memory (merge_in_cluster);
// otherwise they write partials to the workspace and a second kernel merges them. Both merges do
// the same arithmetic (decode_common.cuh: merge_splits), so they give the same bits. The split
// structure depends on the problem and the index only (never on the GPU or on timing), and every sum
// runs in a fixed order, so O and lse are bit-identical run to run for a given kernel (automatic
// picks by the GPU's compute capability: bit-identical across sm_80+ GPUs). Details:
// decode_simt.cuh, decode_mma.cuh.
//
// Contracts
//  - Types: Q and K/V skim::bfloat16 or skim::half (fp32 inside), O the same 16-bit types or float.
//    K/V may instead be quantised (core/cuda/quantized.cuh: int8 or fp8 e4m3 codes with a K and a V
//    scale per (sequence, block, kv head)), with S = scale_k · (q · code) and P·V as (P · scale_v) ·
//    code: the CUDA-core kernel in fp32, the tensor-core kernel with the codes widened exactly to Q's
//    type in shared memory (and P · scale_v rounded to it).
//    K/V base pointers must be aligned to 16 bytes and every K/V stride a multiple of 8 elements
//    (status misaligned otherwise). Q and O take any strides.
//  - head_dim 64 or 128; max_seqlen_q <= max_queries; heads per unit × min(block_q, max_seqlen_q)
//    <= 64 (status unsupported otherwise: prefill belongs to a prefill executor).
//  - Index rows are numbered as skim::problem numbers them: (q_block_offset(b) + i) · index_heads + h,
//    packed over the query blocks that exist (a sequence with no query has no row), so an index built
//    for the CPU executors works unchanged. The host cannot count query blocks of device-side lengths,
//    so it checks only index.rows >= 0; a row at or past index.rows reads as empty and is reported
//    (bad_count). The index is any device index (index/cuda/device_index.cuh): a device_block_table or
//    device_block_csr (a split reads its ids by position), the implicit rules (causal_all, sink,
//    sliding_window: each split computes its ids), unions of them (walked id by id in every CTA of
//    the row: cheap for rules, a dependent load per id of a stored part), or device_head_shared of
//    any of these (one row per query block that every index head reads: row r reads row r /
//    index_heads). A device_routed_table (decode_router::routed) is selected by the split kernels
//    themselves from the router's scores (one launch less a step; split 0 writes the table).
//  - Ids per row: run(a, ...) sizes the grid for a.index.max_ids() ids per row (a block_table's
//    width, a block_csr's capacity, a rule's blocks, a union's sum, causal_all every block; all
//    capped by max_kv_blocks); run(a, max_selected_blocks, ...)
//    takes a tighter bound (a CSR whose rows hold at most k ids). A row with more ids than the bound
//    has ids past it ignored and is reported (bad_count). workspace_bytes(p, bound) must be given the
//    same bound.
//  - Device content is never trusted: an id outside [0, visible_blocks), an id not above its
//    predecessor in the row, a count or row_ptr out of range, or a page outside the pool / a page
//    list too short is skipped (nothing is read through it) and reported in p.error; a sequence
//    longer than the host's bounds is skipped and reported (its outputs are not written). Nothing
//    outside the sequence's own K/V is read.
//  - run() only checks and enqueues: no allocation, no synchronisation, no host read of device memory
//    (graph-capturable; it sets the kernel's dynamic shared memory attribute, a host-side call).
//  - Workspace: a span of at least workspace_bytes(p, bound) bytes aligned to workspace_alignment
//    (core/workspace.hpp, as every skim policy takes it), content ignored (0 bytes when one split
//    covers every row under both split plans, 16-bit and quantised K/V: then it may be empty). Not
//    shared between concurrent runs.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"
#include "skim/exec/cuda/decode_common.cuh"
#include "skim/exec/cuda/decode_simt.cuh"
#include "skim/exec/cuda/decode_mma.cuh"

namespace skim::cuda {

// Which split kernel decode runs (both compute the same attention; see the header comment).
enum class decode_kernel {
  automatic,     // tensor_cores on sm_80+ when Q and K/V have one type (or K/V are codes), else cuda_cores
  cuda_cores,    // fp32 dot products and shuffles per key (decode_simt.cuh)
  tensor_cores,  // mma.sync.m16n8k16 (decode_mma.cuh); run() reports unsupported where it does not apply
};

struct decode {
  // Selected blocks per split; 0: chosen per problem and bound by chunk() (never from the GPU, so
  // results stay deterministic across GPUs).
  std::int32_t chunk_blocks = 0;
  // Queries per sequence this executor accepts (decode, speculative decoding).
  std::int32_t max_queries = 8;
  // The split kernel (the merge kernel and the workspace are the same for both).
  decode_kernel kernel = decode_kernel::automatic;
  // sm_90 and later: the splits of a row (2..max_cluster_splits of them) run as one thread block
  // cluster and merge through distributed shared memory, with no merge launch and no workspace
  // traffic; the same bits as the merge kernel (its arithmetic, in split order). false: always the
  // merge kernel. The workspace is sized for the merge kernel either way.
  bool merge_in_cluster = true;
  static constexpr std::int32_t max_cluster_splits = 8;  // the portable cluster size

  // The automatic chunk's constants (never the GPU's: the split of a row, and so the bits of its
  // output, are the same on any device). Rows whose units give fewer than auto_target_ctas CTAs are
  // cut to give about that many. Rows are cut to give auto_long_target_ctas instead where every chunk
  // still keeps at least auto_long_keys keys (auto_long_keys_quantized over 8-bit codes); for 16-bit
  // K/V only where that cuts whole rows in two (units give 64 to 127 CTAs). Measured on the H200 and
  // the H100 (docs/performance.md, "GPU: decode's automatic split"): about half the SMs is best for
  // short rows, whose extra chunks cost more to merge than they gain; long rows gain from the other
  // half (64 blocks of 128 at 64 units: 8-9% faster in two chunks, 256 blocks: 11%), and the codes'
  // kernel, which issues more instructions per byte, from chunks of 1024 keys on.
  static constexpr std::int32_t auto_target_ctas = 64;
  static constexpr std::int32_t auto_long_target_ctas = 128;
  static constexpr std::int32_t auto_long_keys = 4096;
  static constexpr std::int32_t auto_long_keys_quantized = 1024;
  static constexpr std::int32_t auto_min_keys = 256;

  // Ids a row may hold: max_selected_blocks, at most the problem's blocks per sequence.
  [[nodiscard]] static std::int32_t selected_bound(const skim::cuda::device_problem& p,
                                                   std::int32_t max_selected_blocks) noexcept {
    return max_selected_blocks < p.max_kv_blocks() ? max_selected_blocks : p.max_kv_blocks();
  }

  // Blocks per split: chunk_blocks if set; else, for a target of T CTAs (as above), ceil(bound /
  // ceil(T / units)), the bound itself (one split) when units >= T; at least auto_min_keys keys, at
  // most max_chunk_blocks.
  [[nodiscard]] std::int32_t chunk(const skim::cuda::device_problem& p, std::int32_t max_selected_blocks,
                                   bool quantized = false) const noexcept {
    if (chunk_blocks > 0) return chunk_blocks;
    const std::int32_t bound = selected_bound(p, max_selected_blocks);
    if (bound <= 0 || p.block_kv <= 0) return 1;
    const std::int64_t units = static_cast<std::int64_t>(p.index_heads()) * p.batch * p.max_q_blocks();
    const auto splits_for = [&](std::int64_t target) -> std::int64_t {
      return units <= 0 || units >= target ? 1 : (target + units - 1) / units;
    };
    const std::int64_t short_splits = splits_for(auto_target_ctas);
    const std::int64_t long_splits = splits_for(auto_long_target_ctas);
    const std::int64_t long_chunk = (bound + long_splits - 1) / long_splits;
    const bool go_long = quantized ? long_chunk * p.block_kv >= auto_long_keys_quantized
                                   : long_chunk * p.block_kv >= auto_long_keys && short_splits == 1;
    const std::int64_t want = go_long ? long_splits : short_splits;
    std::int64_t c = (bound + want - 1) / want;
    const std::int64_t min_blocks = (auto_min_keys + p.block_kv - 1) / p.block_kv;
    if (c < min_blocks) c = min_blocks;
    if (c > detail::decode_impl::max_chunk_blocks) c = detail::decode_impl::max_chunk_blocks;
    return static_cast<std::int32_t>(c);
  }

  // Splits per row for at most max_selected_blocks ids per row (at least 1).
  [[nodiscard]] std::int32_t splits(const skim::cuda::device_problem& p, std::int32_t max_selected_blocks,
                                    bool quantized = false) const noexcept {
    const std::int32_t bound = selected_bound(p, max_selected_blocks);
    const std::int32_t c = chunk(p, max_selected_blocks, quantized);
    if (bound <= 0 || c <= 0) return 1;
    return (bound - 1) / c + 1;
  }

  // Bytes of partial states (m, l, o in fp32) for every split of every unit, for either kind of K/V
  // (the larger of the two split plans); 0 when rows never split.
  [[nodiscard]] std::size_t workspace_bytes(const skim::cuda::device_problem& p,
                                            std::int32_t max_selected_blocks) const noexcept {
    if (!can_implement(p).ok()) return 0;  // run() rejects the problem before touching the workspace
    const std::int32_t s16 = splits(p, max_selected_blocks, false), s8 = splits(p, max_selected_blocks, true);
    const std::int32_t s = s16 > s8 ? s16 : s8;
    if (s <= 1) return 0;
    const std::size_t units = static_cast<std::size_t>(p.index_heads()) * p.batch * p.max_q_blocks();
    return units * s * unit_rows(p) * (static_cast<std::size_t>(p.head_dim) + 2) * sizeof(float);
  }

  [[nodiscard]] status can_implement(const skim::cuda::device_problem& p) const noexcept {
    SKIM_TRY(skim::cuda::validate(p));
    if (p.head_dim != 64 && p.head_dim != 128) {
      return status::error(status_code::unsupported, "cuda::decode: head_dim %d (supported: 64, 128)", p.head_dim);
    }
    if (chunk_blocks < 0 || chunk_blocks > detail::decode_impl::max_chunk_blocks) {
      return status::error(status_code::unsupported, "cuda::decode: chunk_blocks %d outside [0 (auto), %d]", chunk_blocks,
                           detail::decode_impl::max_chunk_blocks);
    }
    if (max_queries < 1) return status::error(status_code::invalid_argument, "cuda::decode: max_queries %d < 1", max_queries);
    if (p.max_seqlen_q > max_queries) {
      return status::error(status_code::unsupported, "cuda::decode: max_seqlen_q %d > max_queries %d (prefill rows)",
                           p.max_seqlen_q, max_queries);
    }
    if (unit_rows(p) > detail::decode_impl::max_unit_rows) {
      return status::error(status_code::unsupported, "cuda::decode: %d heads x %d queries per index row > %d rows",
                           p.scope == index_scope::kv_head ? p.group_size() : 1, queries_per_unit(p),
                           detail::decode_impl::max_unit_rows);
    }
    if (p.index_heads() > 65535 || static_cast<std::int64_t>(p.batch) * p.max_q_blocks() > 65535) {
      return status::error(status_code::unsupported, "cuda::decode: grid of %d index heads x %lld query blocks too large",
                           p.index_heads(), static_cast<long long>(p.batch) * p.max_q_blocks());
    }
    return status::success();
  }

  template <class TQ, class KV, class Index, class TO>
  [[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a,
                           std::span<std::byte> workspace, cudaStream_t stream) const noexcept {
    return run(a, a.index.max_ids(), workspace, stream);
  }

  // @pre every index row holds at most max_selected_blocks ids (else: reported, ids past it ignored)
  template <class TQ, class KV, class Index, class TO>
  [[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a,
                           std::int32_t max_selected_blocks, std::span<std::byte> workspace,
                           cudaStream_t stream) const noexcept {
    using TKV = typename KV::value_type;
    constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
    static_assert(skim::cuda::is_device_element_v<TQ>, "cuda::decode: Q must be skim::bfloat16 or skim::half");
    static_assert(quantized ? skim::cuda::is_device_code_v<TKV> : skim::cuda::is_device_element_v<TKV>,
                  "cuda::decode: K/V must be skim::bfloat16 or skim::half, or a device_quantized_kv of int8 / fp8_e4m3 codes");
    static_assert(skim::cuda::is_device_element_v<TO> || std::is_same_v<TO, float>,
                  "cuda::decode: O must be skim::bfloat16, skim::half or float");
    static_assert(skim::cuda::is_device_index_v<Index> || skim::cuda::is_routed_device_index_v<Index>,
                  "cuda::decode: the index must be a device index (index/cuda/device_index.cuh) or a device_routed_table");
    if constexpr (std::is_same_v<Index, skim::cuda::device_routed_table>) {  // kept candidates: their own kernels
      if (a.index.candidates != nullptr) {
        const skim::cuda::device_attention_args<TQ, KV, skim::cuda::device_kept_table, TO> kept{
            .prob = a.prob, .q = a.q, .kv = a.kv, .index = {a.index}, .o = a.o, .lse = a.lse};
        return run(kept, max_selected_blocks, workspace, stream);
      }
    }
    const skim::cuda::device_problem& p = a.prob;
    SKIM_TRY(skim::cuda::check_args(a));
    SKIM_TRY(can_implement(p));
    if (max_selected_blocks < 0) {
      return status::error(status_code::invalid_argument, "cuda::decode: max_selected_blocks %d < 0", max_selected_blocks);
    }
    if (a.index.stored_rows() < 0) {
      return status::error(status_code::invalid_argument, "cuda::decode: index rows %lld < 0",
                           static_cast<long long>(a.index.stored_rows()));
    }
    SKIM_TRY(check_alignment(a.kv));
    if constexpr (skim::cuda::is_routed_device_index_v<Index>) SKIM_TRY(check_routed(p, a.index));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p, max_selected_blocks)));
    if (p.batch == 0 || p.max_seqlen_q == 0) return status::success();  // no query anywhere

    detail::decode_impl::launch_params lp;
    lp.chunk_blocks = chunk(p, max_selected_blocks, quantized);
    lp.splits = splits(p, max_selected_blocks, quantized);
    lp.max_rows = unit_rows(p);
    lp.q_blocks = p.max_q_blocks();
    lp.scale_log2 = p.scale() * detail::decode_impl::log2e;
    // The K/V bytes this launch may read, each once (its kv heads' selected blocks).
    const std::size_t kv_bytes = static_cast<std::size_t>(p.batch) * p.heads_kv *
                                 selected_bound(p, max_selected_blocks) * p.block_kv * p.head_dim * 2 * sizeof(TKV);
    SKIM_TRY(skim::cuda::streams_past_l2(kv_bytes, lp.stream_kv, "skim::cuda::decode: device attributes"));
    if (lp.splits > 1) {
      const std::size_t units = static_cast<std::size_t>(p.index_heads()) * p.batch * p.max_q_blocks();
      lp.partial_o = reinterpret_cast<float*>(workspace.data());
      lp.partial_ml = lp.partial_o + units * lp.splits * lp.max_rows * p.head_dim;
    }
    const dim3 grid(static_cast<unsigned>(lp.splits), static_cast<unsigned>(p.index_heads()),
                    static_cast<unsigned>(p.batch * lp.q_blocks));
    bool tensor_cores = false, cluster = false;
    const std::size_t mma_smem = detail::decode_impl::mma::shared_bytes(p.head_dim, lp.max_rows, lp.chunk_blocks, quantized);
    SKIM_TRY((pick_kernel<TQ, TKV, quantized>(mma_smem, tensor_cores)));
    SKIM_TRY(pick_merge(lp.splits, cluster));
    // The split kernel for InCluster; `launched` false when its clusters would not all run at once
    // (then nothing was launched).
    const auto launch = [&]<bool InCluster>(bool& launched) -> status {
      if constexpr (std::is_same_v<TQ, TKV> || quantized) {
        if (tensor_cores) {
          namespace k = detail::decode_impl::mma;
          if (p.head_dim == 64) {
            return launch_split<k::split_kernel<64, InCluster, TQ, KV, Index, TO>>(grid, mma_smem, stream, a, lp,
                                                                                   InCluster, launched);
          }
          return launch_split<k::split_kernel<128, InCluster, TQ, KV, Index, TO>>(grid, mma_smem, stream, a, lp,
                                                                                  InCluster, launched);
        }
      }
      const std::size_t smem = detail::decode_impl::shared_bytes(p.head_dim, lp.max_rows, lp.chunk_blocks,
                                                                 static_cast<int>(sizeof(TKV)), quantized);
      if (p.head_dim == 64) {
        return launch_split<detail::decode_impl::split_kernel<64, InCluster, TQ, KV, Index, TO>>(grid, smem, stream, a, lp,
                                                                                           InCluster, launched);
      }
      return launch_split<detail::decode_impl::split_kernel<128, InCluster, TQ, KV, Index, TO>>(grid, smem, stream, a, lp,
                                                                                          InCluster, launched);
    };
    bool launched = false;
    if (cluster) {
      SKIM_TRY(launch.template operator()<true>(launched));
      if (launched) return status::success();
    }
    SKIM_TRY(launch.template operator()<false>(launched));
    if (lp.splits > 1) {
      detail::decode_impl::merge_kernel<Index, TO><<<dim3(1, grid.y, grid.z), detail::decode_impl::merge_threads, 0, stream>>>(
          p, a.index, a.o, a.lse, lp);
      SKIM_TRY(skim::cuda::check_launch("skim::cuda::decode (merge)"));
    }
    return status::success();
  }

 private:
  // A routed table's rows are selected in the split kernels' K/V buffers (both kernels have at least
  // detail::decode_impl::kv_bytes there), for one query per sequence (the router's rows).
  [[nodiscard]] static status check_routed(const skim::cuda::device_problem& p,
                                           const skim::cuda::device_routed_table& index) noexcept {
    if (p.max_seqlen_q > 1) {
      return status::error(status_code::unsupported, "cuda::decode: a routed table needs max_seqlen_q <= 1, not %d",
                           p.max_seqlen_q);
    }
    if (index.scores == nullptr && index.candidates == nullptr && p.max_kv_blocks() > 0 && index.table.rows > 0) {
      return status::error(status_code::invalid_argument, "cuda::decode: routed table's scores and candidates are null");
    }
    const std::int32_t most = skim::cuda::detail::route_impl::plan_row(p.max_kv_blocks(), index.select).count;
    if (index.table.width < most) {
      return status::error(status_code::shape_mismatch, "cuda::decode: routed table width %d < %d ids a row may select",
                           index.table.width, most);
    }
    if (index.select.stride < p.max_kv_blocks()) {
      return status::error(status_code::shape_mismatch, "cuda::decode: routed table's score rows of %lld floats < %d "
                           "kv blocks", static_cast<long long>(index.select.stride), p.max_kv_blocks());
    }
    const std::size_t need = index.scratch_bytes(p.max_kv_blocks());
    if (need > detail::decode_impl::kv_bytes) {
      return status::error(status_code::unsupported, "cuda::decode: selecting %d ids of %d kv blocks needs %zu bytes "
                           "of shared memory > %zu", index.table.width, p.max_kv_blocks(), need,
                           detail::decode_impl::kv_bytes);
    }
    return status::success();
  }

  // Whether run() launches the tensor-core split kernel: `kernel`, resolved for Q/K/V types TQ, TKV
  // and the current device (host queries, allowed during graph capture): sm_80 or later with `smem`
  // bytes of shared memory per block (an H100/H200 has them; an A100 does not). tensor_cores where
  // it does not apply is unsupported.
  template <class TQ, class TKV, bool Quantized>
  [[nodiscard]] status pick_kernel(std::size_t smem, bool& tensor_cores) const noexcept {
    tensor_cores = false;
    if (kernel == decode_kernel::cuda_cores) return status::success();
    constexpr bool one_type = std::is_same_v<TQ, TKV> || Quantized;  // codes widen to Q's type
    if (kernel == decode_kernel::tensor_cores && !one_type) {
      return status::error(status_code::unsupported, "cuda::decode: the tensor-core kernel needs Q and K/V of one type");
    }
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::decode: device attributes"));
    const bool fits = d.major >= 8 && smem <= static_cast<std::size_t>(d.smem_optin);
    if (kernel == decode_kernel::tensor_cores && !fits) {
      return status::error(status_code::unsupported, "cuda::decode: the tensor-core kernel needs sm_80 or later and "
                           "%zu bytes of shared memory per block (device %d: sm_%d%d, %d bytes)", smem, d.device,
                           d.major, d.minor, d.smem_optin);
    }
    tensor_cores = one_type && fits;
    return status::success();
  }

  [[nodiscard]] static std::int32_t queries_per_unit(const skim::cuda::device_problem& p) noexcept {
    return p.block_q < p.max_seqlen_q ? p.block_q : p.max_seqlen_q;
  }
  // Rows of the largest unit: heads per index row × queries per query block.
  [[nodiscard]] static std::int32_t unit_rows(const skim::cuda::device_problem& p) noexcept {
    const std::int64_t heads = p.scope == index_scope::kv_head ? p.group_size() : 1;
    const std::int64_t rows = heads * queries_per_unit(p);
    return rows > INT32_MAX ? INT32_MAX : static_cast<std::int32_t>(rows);
  }

  template <class T>
  [[nodiscard]] static status check_alignment(const skim::cuda::device_contiguous_kv<T>& s) noexcept {
    if (reinterpret_cast<std::uintptr_t>(s.k) % 16 != 0 || reinterpret_cast<std::uintptr_t>(s.v) % 16 != 0 ||
        s.token_stride % 8 != 0 || s.head_stride % 8 != 0) {
      return status::error(status_code::misaligned, "cuda::decode: K/V rows not 16-byte aligned (k %p, v %p, token "
                           "stride %lld, head stride %lld; strides must be multiples of 8 elements)",
                           static_cast<const void*>(s.k), static_cast<const void*>(s.v),
                           static_cast<long long>(s.token_stride), static_cast<long long>(s.head_stride));
    }
    return status::success();
  }
  template <class Source>
  [[nodiscard]] static status check_alignment(const skim::cuda::device_quantized_kv<Source>& s) noexcept {
    return check_alignment(s.codes);  // 8 codes are 8 bytes: the 8-byte copies of the CUDA-core kernel
  }
  template <class T>
  [[nodiscard]] static status check_alignment(const skim::cuda::device_paged_kv<T>& s) noexcept {
    if (reinterpret_cast<std::uintptr_t>(s.k_pages) % 16 != 0 || reinterpret_cast<std::uintptr_t>(s.v_pages) % 16 != 0 ||
        s.page_stride % 8 != 0 || s.token_stride % 8 != 0 || s.head_stride % 8 != 0) {
      return status::error(status_code::misaligned, "cuda::decode: paged K/V rows not 16-byte aligned (page stride "
                           "%lld, token stride %lld, head stride %lld; multiples of 8 elements needed)",
                           static_cast<long long>(s.page_stride), static_cast<long long>(s.token_stride),
                           static_cast<long long>(s.head_stride));
    }
    return status::success();
  }

  // Whether run() merges a row's `splits` splits in a thread block cluster (merge_in_cluster, sm_90
  // or later, 2..max_cluster_splits splits) rather than by the merge kernel.
  [[nodiscard]] status pick_merge(std::int32_t splits, bool& cluster) const noexcept {
    cluster = false;
    if (!merge_in_cluster || splits < 2 || splits > max_cluster_splits) return status::success();
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::decode: device attributes"));
    cluster = d.major >= 9;
    return status::success();
  }

  // Launches split kernel Kernel (its dynamic shared memory allowed once per device); with
  // `cluster`, the CTAs of grid.x (a row's splits) as one thread block cluster, and only if all of
  // the grid's clusters can run at once (else `launched` is false and nothing was launched: clusters
  // in two waves ran slower than the merge kernel on the H200, docs/cuda.md).
  template <auto Kernel, class Args>
  [[nodiscard]] static status launch_split(dim3 grid, std::size_t smem, cudaStream_t stream, const Args& a,
                                           const detail::decode_impl::launch_params& lp, bool cluster,
                                           bool& launched) noexcept {
    launched = false;
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::decode: device attributes"));
    SKIM_TRY(skim::cuda::allow_dynamic_smem<Kernel>(d, "cudaFuncSetAttribute in skim::cuda::decode"));
    const skim::cuda::launch_shape shape{.grid = grid, .block = dim3(detail::decode_impl::threads), .smem = smem,
                                         .cluster_x = cluster ? grid.x : 1u};
    if (cluster) {
      int fit = 0;
      SKIM_TRY(skim::cuda::max_active_clusters<Kernel>(d, shape, fit));
      if (static_cast<long long>(grid.y) * grid.z > fit) return status::success();
    }
    SKIM_TRY(skim::cuda::launch(Kernel, shape, stream, "skim::cuda::decode (split kernel)", a, lp));
    launched = true;
    return status::success();
  }
};

}  // namespace skim::cuda
