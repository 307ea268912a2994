#pragma once
// The select kernel of skim::cuda::decode_router (route/cuda/decode_router.cuh holds the host API and the
// contract; route/cuda/score_kernel.cuh the score kernel whose scores it reads), and the routed tables
// that decode selects from as it reads them (device_routed_table, device_kept_table). It needs
// nothing of the score kernel's code, so decode includes this header alone.
//
// One CTA of 1024 threads per (sequence, index head), or per sequence for shared rows (the heads'
// scores pooled first, route/head_pool.hpp), runs select_row (select/cuda/select_row.cuh).

#include <cstddef>
#include <cstdint>

#include "skim/core/cuda/common.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/select/cuda/candidates.cuh"
#include "skim/select/cuda/select_row.cuh"

namespace skim::cuda {

namespace detail::route_impl {

// Grid (index head, sequence), or (1, sequence) for Shared rows (one per query block, the heads'
// scores pooled). Dynamic shared memory: keys [stride] (the row's candidates).
template <bool Shared>
__global__ void __launch_bounds__(select_threads)
    decode_select_kernel(device_problem p, const float* scores, mutable_device_block_table t, select_params sp) {
  extern __shared__ std::uint32_t route_select_keys[];
  __shared__ select_scratch scratch;
  const int h = Shared ? 0 : static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  const device_row r = make_device_row(p, b, 0);
  if (!r.ok) return;  // no query: no row (or bad lengths, reported)
  const std::int64_t q_block = p.cu_seqlens_q[b] - p.cu_seqlens_q[0];  // decode: one query a block
  const std::int64_t row = Shared ? q_block : q_block * p.index_heads() + h;
  if (row < 0 || row >= t.rows) {
    if (threadIdx.x == 0) report(p, bad_seqlen);
    return;
  }
  const int count = select_row<select_threads, Shared>(p, scores, b, h, plan_row(r.visible_blocks, sp), sp,
                                                       t.ids + row * t.width, t.width, route_select_keys, scratch);
  if (threadIdx.x == 0) t.count[row] = count;
}

}  // namespace detail::route_impl

// A decode_router selection that skim::cuda::decode makes as it reads it: each split CTA of
// decode selects its row's ids into shared memory, from the router's scores with select_row, or
// from the candidates its score kernel kept with select_candidates (the select kernel's ids, bit for
// bit, either way), and split 0 writes the row (ids, count) to `table`, for the merge kernel of the
// same run and for the engine. It saves the select kernel's launch in a decode step (score, then
// decode). Made by decode_router::routed() or score_routed(); only decode reads it (it has no
// cursor: before decode ran, the table holds nothing of this step). Per-index-head rows only (no
// share_heads), one query per sequence.
struct device_routed_table {
  mutable_device_block_table table;  // [rows, width >= decode_router::width(p)], written
  const float* scores = nullptr;     // [batch, index_heads, select.stride], as decode_router::score writes them
  detail::route_impl::select_params select{};
  // The kept candidates (decode_router::score_routed), or null: select_row over the scores.
  // [batch, index_heads, candidate_stride]: a row's tile t at t · slots.
  const std::uint64_t* candidates = nullptr;
  std::int32_t slots = 0;               // detail::route_impl::candidate_slots(select.k)
  std::int64_t candidate_stride = 0;    // tiles of a row · slots

  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return table.width; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return table.rows; }
  // Row r as written by this step's decode (the merge kernel reads it after the split kernel).
  [[nodiscard]] __device__ __forceinline__ device_block_table::span row(std::int64_t r) const noexcept {
    return device_block_table{table.ids, table.count, table.width, table.rows}.row(r);
  }
  // Shared memory of a CTA's selection, from a 16-byte aligned base: the scratch, then the row's ids
  // (width of them, to a 16-byte boundary) at ids_offset, then at keys_offset(width) the scores' keys
  // (max_kv_blocks of them) or the candidates (a row's candidate_stride); scratch_bytes in all.
  static constexpr std::size_t ids_offset = sizeof(detail::route_impl::select_scratch);
  [[nodiscard]] SKIM_HOST_DEVICE static constexpr std::size_t keys_offset(std::int32_t width) noexcept {
    return ids_offset + (static_cast<std::size_t>(width) * 4 + 15) / 16 * 16;
  }
  [[nodiscard]] constexpr std::size_t scratch_bytes(std::int32_t max_kv_blocks) const noexcept {
    const std::size_t keys =
        candidates != nullptr ? static_cast<std::size_t>(detail::route_impl::candidate_entries(candidate_stride)) * 8
                              : static_cast<std::size_t>(max_kv_blocks) * 4;
    return keys_offset(table.width) + keys;
  }

  [[nodiscard]] status validate() const noexcept {
    SKIM_TRY(device_block_table(table).validate());
    if (select.k < 0 || select.sink < 0 || select.newest < 0 || select.stride < 0) {
      return status::error(status_code::invalid_argument, "routed table: k %d, sink %d, newest %d, stride %lld (< 0)",
                           select.k, select.sink, select.newest, static_cast<long long>(select.stride));
    }
    if (candidates != nullptr) {
      namespace impl = detail::route_impl;
      const std::int64_t tiles = (select.stride + impl::candidate_tile - 1) / impl::candidate_tile;
      if (slots != impl::candidate_slots(select.k) || candidate_stride < tiles * slots) {
        return status::error(status_code::invalid_argument, "routed table: %d candidate slots a tile and %lld a row, "
                             "for k %d over %lld blocks (%d and %lld expected)", slots,
                             static_cast<long long>(candidate_stride), select.k, static_cast<long long>(select.stride),
                             impl::candidate_slots(select.k), static_cast<long long>(tiles * impl::candidate_slots(select.k)));
      }
    }
    return status::success();
  }
};

// A device_routed_table with candidates as decode runs it (decode::run passes it on as this type):
// a type of its own, so that the kernels that select from candidates and those that select from
// scores each hold only their own selection's code.
struct device_kept_table : device_routed_table {};

}  // namespace skim::cuda
