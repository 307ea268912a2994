#pragma once
// skim::exec::cuda::prefill — block-sparse attention over many queries per sequence (prefill,
// chunked prefill, prefix-cached prefill) on tensor cores, sm_80 and later.
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
//   skim::exec::cuda::prefill exec;
//   SKIM_TRY(exec.can_implement(args.prob));                  // head_dim, block sizes
//   SKIM_TRY(exec.run(args, nullptr, 0, stream));             // asynchronous; no allocation, no sync
//   SKIM_TRY(skim::cuda::read_device_error(args.prob.error, stream));  // when the caller wants to know
//
// Supported: head_dim 64 or 128, block_q and block_kv 64 or 128 (a compile-time tile each: 8
// kernels per element type, K/V source and index kind), Q and K/V both bf16 or both fp16, O of the
// same type or float, K/V contiguous (the fast path) or paged (any page size), scope kv_head or
// query_head, and any device index (index.cuh): device_block_table and device_block_csr share one
// kernel (the form is a uniform run-time branch); device_causal_all, device_sink,
// device_sliding_window and unions (make_device_union(table, device_sink{1},
// device_sliding_window{4}): a routed table with its reserved blocks, merged on the fly, never
// materialised) each compile a kernel of their own. Alignment contracts, checked by run():
//   - Q and K/V rows start on 16 bytes: base pointers 16-byte aligned, every stride a multiple of
//     8 elements (they are read with 16-byte cp.async);
//   - O rows: base pointer aligned to 2 · sizeof(TO), strides even (pairs of elements are stored).
//
// Device-side content (cu_seqlens, page tables, indices) is never trusted (common.cuh): an id
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
#include <type_traits>

#include "skim/core/status.hpp"
#include "skim/exec/cuda/common.cuh"
#include "skim/exec/cuda/prefill_sm80.cuh"

namespace skim::exec::cuda {

namespace detail::prefill_sm80 {

// Launches the (D, BQ, BK) kernel: grid of max_q_blocks · batch · heads_q CTAs, BQ / 16 warps each.
template <class T, class KV, class Index, int D, int BQ, int BK>
[[nodiscard]] status launch(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  constexpr std::size_t smem = smem_bytes<D, BQ, BK>;
  constexpr int threads = BQ / 16 * 32;
  constexpr auto kernel = prefill_kernel<T, KV, D, BQ, BK, Index>;
  if constexpr (smem > 48 * 1024) {
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::exec::cuda::prefill: device attributes"));
    if (static_cast<std::size_t>(d.smem_optin) < smem) {
      return status::error(status_code::unsupported,
                           "prefill tile (head_dim %d, block_q %d, block_kv %d) needs %zu bytes of shared memory, "
                           "device %d allows %d", D, BQ, BK, smem, d.device, d.smem_optin);
    }
    SKIM_TRY(skim::cuda::allow_dynamic_smem<kernel>(d, "cudaFuncSetAttribute in skim::exec::cuda::prefill"));
  }
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(prm);
  return skim::cuda::check_launch("skim::exec::cuda::prefill");
}

template <class T, class KV, class Index, int D, int BQ>
[[nodiscard]] status launch_bk(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  return prm.prob.block_kv == 64 ? launch<T, KV, Index, D, BQ, 64>(prm, grid, stream)
                                  : launch<T, KV, Index, D, BQ, 128>(prm, grid, stream);
}

template <class T, class KV, class Index, int D>
[[nodiscard]] status launch_bq(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  return prm.prob.block_q == 64 ? launch_bk<T, KV, Index, D, 64>(prm, grid, stream)
                                : launch_bk<T, KV, Index, D, 128>(prm, grid, stream);
}

[[nodiscard]] inline bool aligned(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// 16-byte rows of a 16-bit source: pointers on 16 bytes, strides in whole 8-element chunks.
// A stride that is never multiplied by a nonzero index (one head) is not checked.
template <class T>
[[nodiscard]] status check_alignment(const skim::cuda::device_contiguous_kv<T>& kv,
                                     const skim::cuda::device_problem& p) noexcept {
  if (!aligned(kv.k, 16) || !aligned(kv.v, 16) || kv.token_stride % chunk_elems != 0 ||
      (p.heads_kv > 1 && kv.head_stride % chunk_elems != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: K %p, V %p not 16-byte aligned, or K/V strides (token %lld, head %lld) not "
                         "multiples of 8", static_cast<const void*>(kv.k),
                         static_cast<const void*>(kv.v), static_cast<long long>(kv.token_stride),
                         static_cast<long long>(kv.head_stride));
  }
  return status::success();
}
template <class T>
[[nodiscard]] status check_alignment(const skim::cuda::device_paged_kv<T>& kv,
                                     const skim::cuda::device_problem& p) noexcept {
  if (!aligned(kv.k_pages, 16) || !aligned(kv.v_pages, 16) || kv.page_stride % chunk_elems != 0 ||
      kv.token_stride % chunk_elems != 0 || (p.heads_kv > 1 && kv.head_stride % chunk_elems != 0)) {
    return status::error(status_code::unsupported,
                         "prefill: K/V pages %p, %p not 16-byte aligned, or strides (page %lld, token %lld, head "
                         "%lld) not multiples of 8",
                         static_cast<const void*>(kv.k_pages), static_cast<const void*>(kv.v_pages),
                         static_cast<long long>(kv.page_stride), static_cast<long long>(kv.token_stride),
                         static_cast<long long>(kv.head_stride));
  }
  return status::success();
}

}  // namespace detail::prefill_sm80

struct prefill {
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
    return status::success();
  }

  // Enqueues the attention on `stream`. No allocation, no synchronisation; the error word (if
  // any) is updated by the kernel and read by the caller (skim::cuda::read_device_error).
  // @pre the device buffers stay alive until the stream reaches the kernel.
  // `workspace` and `bytes` are unused (workspace_bytes is 0).
  template <class TQ, class KV, class Index, class TO>
  [[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a, void* /*workspace*/,
                           std::size_t /*bytes*/, cudaStream_t stream) const noexcept {
    static_assert(std::is_same_v<TQ, skim::bfloat16> || std::is_same_v<TQ, skim::half>,
                  "prefill: Q must be skim::bfloat16 or skim::half");
    static_assert(std::is_same_v<typename KV::value_type, TQ>, "prefill: K/V must have Q's element type");
    static_assert(std::is_same_v<TO, TQ> || std::is_same_v<TO, float>, "prefill: O must be Q's type or float");
    static_assert(skim::cuda::is_device_index_v<Index>,
                  "prefill: index must be a device index (index.cuh): device_block_table, device_block_csr, "
                  "device_causal_all, device_sink, device_sliding_window or a device_union of them");
    namespace k = detail::prefill_sm80;

    SKIM_TRY(skim::cuda::check_args(a));
    const skim::cuda::device_problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    const std::int64_t grid = static_cast<std::int64_t>(p.max_q_blocks()) * p.batch * p.heads_q;
    if (grid == 0) return status::success();
    if (grid > INT_MAX) {
      return status::error(status_code::unsupported, "prefill: %lld CTAs (max_q_blocks %d x batch %d x heads_q %d) "
                           "exceed one grid", static_cast<long long>(grid), p.max_q_blocks(), p.batch, p.heads_q);
    }

    // Alignment contracts of the 16-byte loads and the paired stores.
    if (!k::aligned(a.q.data, 16) || a.q.token_stride % k::chunk_elems != 0 ||
        (p.heads_q > 1 && a.q.head_stride % k::chunk_elems != 0)) {
      return status::error(status_code::unsupported,
                           "prefill: Q %p not 16-byte aligned, or Q strides (token %lld, head %lld) not multiples "
                           "of 8", static_cast<const void*>(a.q.data),
                           static_cast<long long>(a.q.token_stride), static_cast<long long>(a.q.head_stride));
    }
    SKIM_TRY(k::check_alignment(a.kv, p));
    if (!k::aligned(a.o.data, 2 * sizeof(TO)) || a.o.token_stride % 2 != 0 ||
        (p.heads_q > 1 && a.o.head_stride % 2 != 0)) {
      return status::error(status_code::unsupported,
                           "prefill: O %p not %zu-byte aligned, or O strides (token %lld, head %lld) not even", static_cast<const void*>(a.o.data), 2 * sizeof(TO),
                           static_cast<long long>(a.o.token_stride), static_cast<long long>(a.o.head_stride));
    }

    k::params<TQ, KV, k::kernel_index_t<Index>> prm;
    prm.prob = p;
    prm.q = a.q;
    prm.kv = a.kv;
    if constexpr (std::is_same_v<Index, skim::cuda::device_block_csr>) {
      prm.index.csr = a.index;
      prm.index.is_csr = true;
    } else if constexpr (std::is_same_v<Index, skim::cuda::device_block_table>) {
      prm.index.table = a.index;
    } else {
      prm.index = a.index;  // implicit rule or union: its own kernel
    }
    prm.o = a.o.data;
    prm.o_token_stride = a.o.token_stride;
    prm.o_head_stride = a.o.head_stride;
    prm.o_fp32 = std::is_same_v<TO, float>;
    prm.lse = a.lse;
    prm.scale_log2 = p.scale() * k::log2e;
    using KI = k::kernel_index_t<Index>;
    return p.head_dim == 64 ? k::launch_bq<TQ, KV, KI, 64>(prm, grid, stream)
                            : k::launch_bq<TQ, KV, KI, 128>(prm, grid, stream);
  }
};

}  // namespace skim::exec::cuda
