#pragma once
// skim_torch's call into skim's CUDA executors, free of PyTorch: what ops_cuda.cpp takes from the
// tensors it has checked (device, dtype, rank, shapes, a contiguous head dimension) and hands to
// cuda::decode or cuda::prefill (run_cuda.cu, compiled by nvcc). skim checks the rest on the host
// (the problem, strides and alignment, the index's sizes) and answers with a status whose message
// ops_cuda.cpp raises; device content (cu_seqlens, ids, page tables) is checked by the kernels,
// which skip what is out of bounds (see python/README.md).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kinds.hpp"
#include "skim/core/status.hpp"

namespace skim_torch::gpu {

// Which CUDA executor runs a call: automatic takes cuda::decode where it accepts the problem (1 to 8
// queries per sequence, head_dim 64 or 128) and cuda::prefill otherwise.
enum class executor : std::uint8_t { automatic, decode, prefill };

// [tokens, heads, head_dim] device rows: element (t, h, d) at data[t·token_stride + h·head_stride + d].
struct device_rows {
  const void* data = nullptr;
  std::int64_t token_stride = 0, head_stride = 0;  // in elements
};

// Paged K/V on the device (cuda::device_paged_kv's layout).
struct device_pages {
  page_pool pool;
  const std::int32_t* page_indptr = nullptr;   // [batch + 1]
  const std::int32_t* page_indices = nullptr;  // [page_indptr[batch]]
};

struct request {
  // The problem: cu_seqlens are device int32 [batch + 1]; max_seqlen bound every sequence's length.
  std::int32_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0, block_q = 0, block_kv = 0;
  bool causal = true;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_kv = nullptr;
  std::int32_t max_seqlen_q = 0, max_seqlen_kv = 0;

  element_type type = element_type::bf16;  // of Q, K, V and O: f16 or bf16
  device_rows q;
  kv_kind kv = kv_kind::contiguous;
  device_rows k, v;    // kv_kind::contiguous
  device_pages pages;  // kv_kind::paged
  void* o = nullptr;   // [tokens_q, heads_q, head_dim], densely packed, of `type`
  float* lse = nullptr;  // [tokens_q, heads_q] token-major

  index_kind index = index_kind::block_table;
  const std::int32_t* row_ptr = nullptr;  // index_kind::block_csr: [rows + 1]
  const std::int32_t* col_idx = nullptr;  //   [nnz]
  std::int64_t nnz = 0;
  const std::int32_t* ids = nullptr;    // index_kind::block_table: [rows, width]
  const std::int32_t* count = nullptr;  //   [rows]
  std::int32_t width = 0;
  std::int64_t rows = 0;  // index rows, either kind

  executor exec = executor::automatic;
};

// A routed decode step (skim::cuda::decode_step over skim's default multi-centroid summaries):
// append each sequence's newest key to its block's summary, score every block against the query,
// keep the sink, local and top-k blocks per kv head, attend over them. The summaries, the selection
// table and the workspaces live in `state` (state_bytes of device memory the caller keeps between
// steps; the same problem, budget and state every call).
struct step_request {
  request attention;  // the problem (max_seqlen_q 1), q, K/V, o and lse; its index and exec are unused
  std::int32_t top_k = 0, sink_blocks = 0, local_blocks = 0;
  void* state = nullptr;
  std::size_t state_bytes = 0;
};

// Device bytes the step's state takes (summaries, table, workspaces); an error status where
// decode_step refuses the problem or the budget.
[[nodiscard]] skim::status step_state_bytes(const step_request& r, std::size_t& bytes) noexcept;
// Summarises every key of every sequence into the state (after prefill, or to start over).
[[nodiscard]] skim::status step_prefill(const step_request& r, cudaStream_t stream) noexcept;
// One step: o, lse, and the selection copied to ids [batch · heads_kv, width] and count [batch · heads_kv].
[[nodiscard]] skim::status step_run(const step_request& r, std::int32_t* ids, std::int32_t* count, std::int32_t& width,
                                    cudaStream_t stream) noexcept;
// The width of the step's selection table (its most ids per row).
[[nodiscard]] skim::status step_width(const step_request& r, std::int32_t& width) noexcept;

// The executor that runs r (never automatic) and the device workspace it needs, in bytes; an
// error status when the executor asked for (or, for automatic, neither) accepts the problem.
[[nodiscard]] skim::status plan(const request& r, executor& chosen, std::size_t& workspace_bytes) noexcept;

// Enqueues the attention on `stream` with the executor plan() chose and a workspace of at least the
// bytes it asked for (device memory, 256-byte aligned). No allocation, no synchronisation.
[[nodiscard]] skim::status run(const request& r, executor chosen, void* workspace, std::size_t workspace_bytes,
                               cudaStream_t stream) noexcept;

}  // namespace skim_torch::gpu
