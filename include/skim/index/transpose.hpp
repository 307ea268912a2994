#pragma once
// Transpose: a q->kv index (which kv blocks each query block reads) into a kv->q CSR (which query
// blocks read each kv block) — for backward passes, KV eviction by readership, and kv-major
// executors.
//
// The transposed index has one row per (sequence b, kv block j, index head h), numbered
//   t = (kv_block_offset(p, b) + j) * index_heads + h,
// holding the query block ids i (relative to the sequence) of the rows (b, i, h) that read j,
// sorted ascending. It is built by a counting sort in two passes over the input's cursors:
// rows are visited in (b, i, h) order, so each output row fills in ascending i by construction.
// No allocation: the counts live in row_ptr_out itself.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/order.hpp"

namespace skim::index {

// First kv block of sequence b in the batch-wide kv block numbering (problem::kv_block_offset). O(b).
[[nodiscard]] constexpr std::int64_t kv_block_offset(const problem& p, std::int32_t b) noexcept {
  return p.kv_block_offset(b);
}

// Rows of the transposed index: total kv blocks over the batch x index heads.
[[nodiscard]] constexpr std::int64_t transposed_rows(const problem& p) noexcept {
  return p.total_kv_blocks() * p.index_heads();
}

namespace detail {

// Calls f(row_info, kv_base) for every q->kv row in row order, kv_base = kv_block_offset(p, r.seq).
template <class F>
[[nodiscard]] status for_each_row_with_kv_base(const problem& p, F&& f) noexcept {
  std::int64_t q_base = 0;
  std::int64_t kv_base = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    for (std::int32_t i = 0; i < p.q_blocks(b); ++i) {
      for (std::int32_t h = 0; h < p.index_heads(); ++h) SKIM_TRY(f(make_row_info(p, q_base, b, i, h), kv_base));
    }
    q_base += p.q_blocks(b);
    kv_base += p.kv_blocks(b);
  }
  return status::success();
}

}  // namespace detail

// Writes the kv->q transpose of idx.
// @pre  row_ptr_out has transposed_rows(p) + 1 entries; col_idx_out at least count_nnz(p, idx).
// @post on ok, row t = (kv_block_offset(p, b) + j) * index_heads + h of
//       {row_ptr_out, col_idx_out} lists, ascending, every query block i whose row (b, i, h)
//       reads kv block j (each once if idx is canonical). Ids are checked against their q row as in
//       validate, so an invalid index costs a status, never an out-of-bounds write.
template <block_index I>
[[nodiscard]] status transpose(const problem& p, const I& idx, std::span<std::int32_t> row_ptr_out,
                               std::span<std::int32_t> col_idx_out) noexcept {
  SKIM_TRY(skim::validate(p));
  const std::int64_t rows_t = transposed_rows(p);
  if (row_ptr_out.size() != static_cast<std::size_t>(rows_t) + 1) {
    return status::error(status_code::shape_mismatch,
                         "transpose row_ptr_out has %zu entries, needs transposed rows %lld + 1", row_ptr_out.size(),
                         static_cast<long long>(rows_t));
  }
  const std::int64_t heads = p.index_heads();
  for (auto& x : row_ptr_out) x = 0;

  // Pass 1: count row t's entries into row_ptr_out[t + 2] (the last row's count is never needed).
  std::int64_t total = 0;
  const auto count_row = [&](const row_info& r, std::int64_t kv_base) noexcept -> status {
    std::int64_t pos = 0;
    for (auto c = idx.cursor(r); !c.done(); c.next(), ++pos) {
      const auto id = static_cast<std::int32_t>(c.id());
      SKIM_TRY(detail::check_id_range(r, id, pos));
      if (++total > std::numeric_limits<std::int32_t>::max()) {
        return status::error(status_code::invalid_argument, "transpose: more than %d ids overflow int32 row_ptr",
                             std::numeric_limits<std::int32_t>::max());
      }
      const std::int64_t t = (kv_base + id) * heads + r.head;
      if (t + 2 <= rows_t) ++row_ptr_out[static_cast<std::size_t>(t) + 2];
    }
    return status::success();
  };
  if (const status counted = detail::for_each_row_with_kv_base(p, count_row); !counted.ok()) return counted;
  if (static_cast<std::size_t>(total) > col_idx_out.size()) {
    return status::error(status_code::shape_mismatch, "transpose col_idx_out has %zu entries, needs %lld",
                         col_idx_out.size(), static_cast<long long>(total));
  }
  // Inclusive prefix sum: row_ptr_out[t + 1] = start of row t, the fill position of pass 2.
  for (std::size_t k = 1; k < row_ptr_out.size(); ++k) row_ptr_out[k] += row_ptr_out[k - 1];

  // Pass 2: place each q block; row_ptr_out[t + 1] advances from start(t) to end(t) = start(t + 1).
  return detail::for_each_row_with_kv_base(p, [&](const row_info& r, std::int64_t kv_base) noexcept -> status {
    for (auto c = idx.cursor(r); !c.done(); c.next()) {
      const std::int64_t t = (kv_base + static_cast<std::int32_t>(c.id())) * heads + r.head;
      // Pass 1 checked every id and the total; only a cursor that changed between passes fails here.
      if (t < 0 || t >= rows_t || static_cast<std::size_t>(row_ptr_out[static_cast<std::size_t>(t) + 1]) >=
                                      col_idx_out.size()) {
        return status::error(status_code::invalid_index, "transpose: index changed between passes at row %lld",
                             static_cast<long long>(r.row));
      }
      col_idx_out[static_cast<std::size_t>(row_ptr_out[static_cast<std::size_t>(t) + 1]++)] = r.q_block;
    }
    return status::success();
  });
}

}  // namespace skim::index
