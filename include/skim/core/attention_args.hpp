#pragma once
// attention_args — everything one executor call reads and writes, as one aggregate.
//
//   skim::attention_args<float, skim::contiguous_kv<float>, skim::index::causal_all, float> args{
//       .prob = p,
//       .q = skim::strided_view<const float>::token_major(q, tokens_q, heads_q, head_dim),
//       .kv = {.k = k_view, .v = v_view},
//       .index = {},
//       .o = skim::strided_view<float>::token_major(o, tokens_q, heads_q, head_dim),
//       .lse = lse};
//
// check_args() is the shared validation every executor runs first. check_block_id() is the
// per-id check executors apply while walking a row (for_each_block_id() walks a row with it), so
// that an index that skipped (or lies in) validation costs a status, never an out-of-bounds read.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "skim/concepts/block_index.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"

namespace skim {

template <element TQ, kv_source KV, block_index Index, element TO = TQ>
struct attention_args {
  using q_type = TQ;
  using kv_type = KV;
  using index_type = Index;
  using o_type = TO;

  problem prob;
  strided_view<const TQ> q;  // [tokens_q, heads_q, head_dim]
  KV kv;                     // K, V: [tokens_kv, heads_kv, head_dim], contiguous or paged
  Index index;               // one row per (sequence, query block, index head)
  strided_view<TO> o;        // [tokens_q, heads_q, head_dim]
  std::span<float> lse = {}; // [tokens_q * heads_q] token-major, empty = not written
};

namespace detail {

using byte_range = std::pair<const std::byte*, const std::byte*>;  // [first, last)

[[nodiscard]] inline bool overlaps(byte_range a, byte_range b) noexcept {
  return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
}

template <class T>
[[nodiscard]] byte_range span_extent(std::span<T> s) noexcept {
  const auto* first = reinterpret_cast<const std::byte*>(s.data());
  return {first, first + s.size_bytes()};
}

// Byte ranges a K/V source may read: {K, V}. Unknown sources report empty ranges (not checked).
template <element T>
[[nodiscard]] std::pair<byte_range, byte_range> kv_extents(const contiguous_kv<T>& kv, const problem&) noexcept {
  return {kv.k.extent(), kv.v.extent()};
}

template <element T>
[[nodiscard]] std::pair<byte_range, byte_range> kv_extents(const paged_kv<T>& kv, const problem& p) noexcept {
  const auto extent = [&](const T* pages) -> byte_range {
    const auto* base = reinterpret_cast<const std::byte*>(pages);
    if (pages == nullptr || kv.num_pages <= 0) return {base, base};
    const std::int64_t last = (kv.num_pages - 1) * kv.page_stride + (kv.page_size - 1) * kv.token_stride +
                              (p.heads_kv - 1) * kv.head_stride + p.head_dim;
    return {base, base + last * static_cast<std::int64_t>(sizeof(T))};
  };
  return {extent(kv.k_pages), extent(kv.v_pages)};
}

template <class KV>
[[nodiscard]] std::pair<byte_range, byte_range> kv_extents(const KV&, const problem&) noexcept {
  return {};
}

// Do two (token, head) rows of a written view share memory? Taking the dimensions with more than
// one entry in ascending stride order, rows nest without overlap iff each stride is at least the
// extent of the rows inside it. Conservative: an interleaving whose rows happen not to collide is
// refused too. Input views are not checked this way: reading a row twice (a broadcast) is harmless.
template <class T>
[[nodiscard]] bool rows_overlap(const strided_view<T>& v) noexcept {
  if (v.tokens <= 0 || v.heads <= 0 || v.head_dim <= 0) return false;
  std::pair<std::int64_t, std::int64_t> dims[] = {{v.token_stride, v.tokens}, {v.head_stride, v.heads}};  // (stride, n)
  if (dims[0].first > dims[1].first) std::swap(dims[0], dims[1]);
  std::int64_t extent = v.head_dim;
  for (const auto& [stride, n] : dims) {
    if (n <= 1) continue;
    if (stride < extent) return true;
    extent += stride * (n - 1);
  }
  return false;
}

}  // namespace detail

// Checks everything an executor needs before reading a byte: the problem, the Q and O views, the
// K/V source, the LSE span, and that the outputs (O, LSE) do not overlap an input or each other.
// The index is checked separately (index.validate), since executors may check it differently.
template <element TQ, kv_source KV, block_index Index, element TO>
[[nodiscard]] status check_args(const attention_args<TQ, KV, Index, TO>& a) noexcept {
  const problem& p = a.prob;
  SKIM_TRY(validate(p));
  SKIM_TRY(check_view(a.q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
  SKIM_TRY(check_view(a.o, p.tokens_q(), p.heads_q, p.head_dim, "O"));
  // O is written: rows that share memory would make the result depend on write order (and on
  // threads). Found missing by tests/hardening/bad_api_test.cpp (token_stride 0 was accepted).
  if (detail::rows_overlap(a.o)) {
    return status::error(status_code::invalid_argument, "O strides (token %lld, head %lld) make rows of head_dim %d overlap",
                         static_cast<long long>(a.o.token_stride), static_cast<long long>(a.o.head_stride), p.head_dim);
  }
  SKIM_TRY(a.kv.validate(p));
  const std::int64_t lse_size = static_cast<std::int64_t>(p.tokens_q()) * p.heads_q;
  if (!a.lse.empty() && static_cast<std::int64_t>(a.lse.size()) != lse_size) {
    return status::error(status_code::shape_mismatch,
                         "lse has %zu entries, expected tokens_q * heads_q = %lld (or 0 to skip it)", a.lse.size(),
                         static_cast<long long>(lse_size));
  }
  const detail::byte_range o = a.o.extent();
  const detail::byte_range lse = detail::span_extent(a.lse);
  const auto [k, v] = detail::kv_extents(a.kv, p);
  const std::pair<detail::byte_range, const char*> inputs[] = {{a.q.extent(), "Q"}, {k, "K"}, {v, "V"}};
  for (const auto& [in, name] : inputs) {
    if (detail::overlaps(o, in)) {
      return status::error(status_code::invalid_argument, "O [%p, %p) overlaps %s [%p, %p)",
                           static_cast<const void*>(o.first), static_cast<const void*>(o.second), name,
                           static_cast<const void*>(in.first), static_cast<const void*>(in.second));
    }
    if (detail::overlaps(lse, in)) {
      return status::error(status_code::invalid_argument, "lse [%p, %p) overlaps %s [%p, %p)",
                           static_cast<const void*>(lse.first), static_cast<const void*>(lse.second), name,
                           static_cast<const void*>(in.first), static_cast<const void*>(in.second));
    }
  }
  if (detail::overlaps(o, lse)) {
    return status::error(status_code::invalid_argument, "lse [%p, %p) overlaps O [%p, %p)",
                         static_cast<const void*>(lse.first), static_cast<const void*>(lse.second),
                         static_cast<const void*>(o.first), static_cast<const void*>(o.second));
  }
  return status::success();
}

// Checks the next id of a row walk: in [0, row.visible_blocks) and strictly after `prev`
// (-1 before the first id). The canonical form every executor requires (block_index.hpp).
[[nodiscard]] inline status check_block_id(const row_info& row, std::int32_t id, std::int32_t prev) noexcept {
  if (id < 0) {
    return status::error(status_code::invalid_index, "block id %d < 0 in row %lld", id,
                         static_cast<long long>(row.row));
  }
  if (id >= row.visible_blocks) {
    return status::error(status_code::invalid_index, "block id %d >= visible blocks %d in row %lld", id,
                         row.visible_blocks, static_cast<long long>(row.row));
  }
  if (id <= prev) {
    return status::error(status_code::invalid_index, "block id %d after %d in row %lld (ids must ascend strictly)",
                         id, prev, static_cast<long long>(row.row));
  }
  return status::success();
}

// Walks index row `row` in order, checking each id (check_block_id) before f(id) sees it, and
// returns the first bad id's status. f returns void, or bool: false stops the walk (a caller
// that needs only a window of the row).
//
// With first > 0 the walk starts at the row's id number `first` (ids before it are not given to
// f). A skippable cursor jumps there and checks only the id before it (as `prev` of the first
// one); any other cursor walks, checking, from the start. A row's windows that cover it together
// (the chunks of a split decode row) thus check every id, each against its predecessor.
template <class Index, class F>
[[nodiscard]] status for_each_block_id(const Index& index, const row_info& row, F&& f, std::int64_t first = 0) {
  std::int32_t prev = -1;
  auto c = index.cursor(row);
  std::int64_t pos = 0;
  if constexpr (skippable_cursor<decltype(c)>) {
    if (first > 1) {
      c.skip(first - 1);
      pos = first - 1;
      if (!c.done()) {  // the id before the window: checked against the row only, then `prev`
        prev = static_cast<std::int32_t>(c.id());
        SKIM_TRY(check_block_id(row, prev, -1));
        c.next();
        ++pos;
      }
    }
  }
  for (; !c.done(); c.next(), ++pos) {
    const auto id = static_cast<std::int32_t>(c.id());
    SKIM_TRY(check_block_id(row, id, prev));
    prev = id;
    if (pos < first) continue;
    if constexpr (std::is_same_v<decltype(f(id)), bool>) {
      if (!f(id)) break;
    } else {
      f(id);
    }
  }
  return status::success();
}

}  // namespace skim
