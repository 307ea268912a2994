#pragma once
// skim::cuda::prefill — block-sparse attention over many queries per sequence (prefill,
// chunked prefill, prefix-cached prefill) on tensor cores, sm_80 and later, with two kernels:
// mma.sync (prefill_sm80.cuh, FlashAttention-2 style, every supported shape) and, on sm_90, wgmma
// with tensor-memory copies and a producer warpgroup (prefill_sm90.cuh: block_q 128, contiguous
// K/V, a binary built for sm_90a). prefill_kernel::automatic takes wgmma where it applies.
//
// It computes exactly what skim::exec::reference computes (exec/cpu/reference.hpp): for each query
// token q of sequence b and query head h, the index row (q_block_offset(b) + q / block_q) ·
// index_heads + index_head_of(h) lists key blocks; q attends over the keys of those blocks it may
// see (bottom-right causal: key j iff j <= q + kv_len - q_len, and j < kv_len; mask_kind::none:
// j < kv_len), softmax(scale · q·kᵀ) · V, fp32 accumulation. A query that sees no key gets
// o = 0 and lse = -inf. P is rounded to the input type before P·V (as FlashAttention does), so
// outputs differ from the reference by about that rounding (tests/cuda/prefill_test.cu bounds the
// per-row relative L2 error by 2e-2 for bf16 and 5e-3 for fp16; lse is not affected by it).
//
//   skim::cuda::prefill exec;
//   SKIM_TRY(exec.can_implement(args.prob));                  // head_dim, block sizes
//   SKIM_TRY(exec.run(args, nullptr, 0, stream));             // asynchronous; no allocation, no sync
//   SKIM_TRY(skim::cuda::read_device_error(args.prob.error, stream));  // when the caller wants to know
//
// Supported: head_dim 64 or 128, block_q and block_kv 64 or 128 (a compile-time tile each: 8
// kernels per element type, K/V source and index kind), Q and K/V both bf16 or both fp16, O of the
// same type or float, K/V contiguous (the fast path) or paged (any page size), or quantised
// (core/cuda/quantized.cuh: int8 or fp8 e4m3 codes, contiguous or paged, with a K and a V scale per
// key block: the codes are widened exactly to Q's type into the kernel's 16-bit tiles, S is scaled by
// the block's K scale and P by its V scale before P·V; contiguous codes on the wgmma kernel where it
// applies, paged ones on the mma.sync kernel), scope kv_head or
// query_head, and any device index (index/cuda/device_index.cuh): device_block_table and device_block_csr share one
// kernel (the form is a uniform run-time branch); device_causal_all, device_sink,
// device_sliding_window and unions (make_device_union(table, device_sink{1},
// device_sliding_window{4}): a routed table with its reserved blocks, merged on the fly, never
// materialised) each compile a kernel of their own. Alignment contracts, checked by run():
//   - Q and K/V rows start on 16 bytes: base pointers 16-byte aligned, every stride a multiple of
//     8 elements (16 codes when quantised; they are read with 16-byte cp.async);
//   - O rows: base pointer aligned to 2 · sizeof(TO), strides even (pairs of elements are stored).
//
// Device-side content (cu_seqlens, page tables, indices) is never trusted (core/cuda/common.cuh): an id
// outside [0, visible_blocks) of its row, an id not above the previous one, a count or CSR range
// outside the storage, or a page outside the pool is skipped and reported in prob.error; keys
// at or past a sequence's kv_len are never read (their tile rows are zero-filled). Rows of a
// malformed sequence (bad_seqlen) are not written.
//
// Determinism: each output element is produced by one thread in a fixed order (ids ascending,
// fixed reduction trees), so repeated runs are bit-identical.

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/core/status.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"
#include "skim/exec/cuda/prefill_common.cuh"
#include "skim/exec/cuda/prefill_sm80.cuh"
#include "skim/exec/cuda/prefill_sm90.cuh"

namespace skim::cuda {

// Which kernel prefill runs.
enum class prefill_kernel : std::uint8_t {
  automatic,  // wgmma where it applies (sm_90 device, sm_90a binary, block_q 128, contiguous K/V or codes), else
              // mma_sync
  mma_sync,   // the sm_80 kernel, every supported shape and source
  wgmma,      // the sm_90a kernel; unsupported where it does not apply
};

struct prefill {
  prefill_kernel kernel = prefill_kernel::automatic;

  // No scratch: every CTA owns its output rows.
  [[nodiscard]] std::size_t workspace_bytes(const skim::cuda::device_problem&) const noexcept { return 0; }

  // unsupported unless head_dim, block_q and block_kv each are 64 or 128 (the compiled tiles).
  [[nodiscard]] status can_implement(const skim::cuda::device_problem& p) const noexcept {
    SKIM_TRY(skim::cuda::validate(p));
    const auto tile = [](std::int32_t v) { return v == 64 || v == 128; };
    if (!tile(p.head_dim)) {
      return status::error(status_code::unsupported, "prefill: head_dim %d is not 64 or 128", p.head_dim);
    }
    if (!tile(p.block_q)) {
      return status::error(status_code::unsupported, "prefill: block_q %d is not 64 or 128", p.block_q);
    }
    if (!tile(p.block_kv)) {
      return status::error(status_code::unsupported, "prefill: block_kv %d is not 64 or 128", p.block_kv);
    }
    if (kernel == prefill_kernel::wgmma && p.block_q != detail::prefill_sm90::block_q) {
      return status::error(status_code::unsupported, "prefill (wgmma): block_q %d is not 128", p.block_q);
    }
    return status::success();
  }

  // Enqueues the attention on `stream`. No allocation, no synchronisation; the error word (if
  // any) is updated by the kernel and read by the caller (skim::cuda::read_device_error).
  // @pre the device buffers stay alive until the stream reaches the kernel.
  // `workspace` is unused (workspace_bytes is 0): the same run(args, workspace, stream) as decode's.
  template <class TQ, class KV, class Index, class TO>
  [[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a,
                           std::span<std::byte> /*workspace*/, cudaStream_t stream) const noexcept {
    static_assert(std::is_same_v<TQ, skim::bfloat16> || std::is_same_v<TQ, skim::half>,
                  "prefill: Q must be skim::bfloat16 or skim::half");
    static_assert(std::is_same_v<typename KV::value_type, TQ> ||
                      (skim::cuda::is_device_quantized_kv_v<KV> && skim::cuda::is_device_code_v<typename KV::value_type>),
                  "prefill: K/V must have Q's element type, or be a device_quantized_kv of int8 / fp8_e4m3 codes");
    static_assert(std::is_same_v<TO, TQ> || std::is_same_v<TO, float>, "prefill: O must be Q's type or float");
    static_assert(skim::cuda::is_device_index_v<Index>,
                  "prefill: index must be a device index (index/cuda/device_index.cuh): device_block_table, device_block_csr, "
                  "device_causal_all, device_sink, device_sliding_window or a device_union of them");

    SKIM_TRY(skim::cuda::check_args(a));
    const skim::cuda::device_problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    const std::int64_t grid = static_cast<std::int64_t>(p.max_q_blocks()) * p.batch * p.heads_q;
    if (grid == 0) return status::success();
    if (grid > INT_MAX) {
      return status::error(status_code::unsupported, "prefill: %lld CTAs (max_q_blocks %d x batch %d x heads_q %d) "
                           "exceed one grid", static_cast<long long>(grid), p.max_q_blocks(), p.batch, p.heads_q);
    }

    SKIM_TRY(detail::prefill_common::check_views(a));
    bool wgmma = false;
    if (kernel != prefill_kernel::mma_sync) SKIM_TRY((detail::prefill_sm90::available<TQ, KV, Index>(p, wgmma)));
    if (kernel == prefill_kernel::wgmma && !wgmma) {
      return status::error(status_code::unsupported,
                           "prefill (wgmma): needs contiguous K/V (16-bit, or 8-bit codes), block_q 128, an sm_90 "
                           "device and a binary built for sm_90a");
    }
    if constexpr (detail::prefill_sm90::wgmma_source_v<TQ, KV>) {
      if (wgmma) return detail::prefill_sm90::run(a, grid, stream);
    }
    return detail::prefill_sm80::run(a, grid, stream);
  }
};

}  // namespace skim::cuda
