#pragma once
// Indices on the device: which key blocks each index row reads, for skim's CUDA kernels.
//
// The same forms as the CPU's skim::index, with the same ids for every row:
//   device_block_table     fixed-width ids + count per row   (index::block_table)
//   device_block_csr       row_ptr + col_idx                  (index::block_csr)
//   device_causal_all      every visible block                (index::causal_all)
//   device_sink            the first `blocks` blocks          (index::sink)
//   device_sliding_window  the newest `blocks` visible blocks (index::sliding_window)
//   device_union<A, B>     A ∪ B, merged on the fly          (index::block_union; make_device_union
//                          nests it for more parts: table ∪ sink ∪ window)
//   device_head_shared<I>  one row per query block, read by every index head (index::head_shared)
// Rows are numbered as on the CPU: row = (q_block_offset(b) + i) · index_heads + h.
//
// One read interface, a cursor (the device counterpart of skim::block_cursor):
//   for (auto c = index.cursor(row, geometry); !c.done(); c.next()) use(c.id());
// where `geometry` is the row's device_row (make_device_row in core/cuda/common.cuh computes it; the
// implicit rules read only visible_blocks). A cursor also says
//   c.malformed()  the stored row was out of its storage (a row number past `rows`, a count
//                  outside [0, width], a CSR range outside col_idx) and was clamped: the kernel
//                  reports bad_count;
//   C::trusted     (static) its ids are by construction strictly ascending and inside
//                  [0, visible_blocks): the kernel may skip its per-id checks. Stored rows are
//                  device content and never trusted; the implicit rules and unions of them are.
// Cursors are a few registers (two pointers, or two ints per range) and read nothing but the
// index's own storage, whatever it holds.
//
// Host side: each index has validate() (null pointers, negative sizes, the value named in the
// message); check_args (core/cuda/common.cuh) calls it.

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "skim/config.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim::cuda {

// Row geometry on the device: the same numbers as skim::row_info (problem.hpp), computed from the
// device cu_seqlens by make_device_row (core/cuda/common.cuh). ok is false (and the error word set) when the
// sequence breaks the host's bounds; the caller then skips the row.
struct device_row {
  std::int32_t q_begin = 0, q_end = 0;  // queries of the block, relative to the sequence
  std::int32_t q_offset = 0;            // cu_seqlens_q[b]
  std::int32_t kv_offset = 0;           // cu_seqlens_kv[b]
  std::int32_t kv_len = 0;
  std::int32_t visible_blocks = 0;
  std::int32_t full_blocks = 0;
  std::int32_t causal_offset = 0;
  bool ok = false;

  // Keys [0, visible_keys(q)) are visible to query q (relative to the sequence).
  [[nodiscard]] SKIM_HOST_DEVICE std::int32_t visible_keys(std::int32_t q, mask_kind m) const noexcept {
    if (m == mask_kind::none) return kv_len;
    const std::int64_t v = static_cast<std::int64_t>(q) + causal_offset + 1;
    return v <= 0 ? 0 : (v >= kv_len ? kv_len : static_cast<std::int32_t>(v));
  }
};

// ---------------------------------------------------------------------------------------------
// Cursors

// A device cursor walks one row's ids (the requirements of skim::block_cursor, plus two):
//  1. done() is true once the row is exhausted;
//  2. id() is the current id, valid while !done();
//  3. next() advances;
//  4. malformed() is true when the row's stored extent was clamped (report bad_count);
//  5. C::trusted is a constexpr bool: true when the ids are strictly ascending in [0, visible_blocks)
//     by construction.
template <class C>
concept device_block_cursor = std::copyable<C> && requires(C& c, const C& cc) {
  { cc.done() } -> std::convertible_to<bool>;
  { cc.id() } -> std::convertible_to<std::int32_t>;
  c.next();
  { cc.malformed() } -> std::convertible_to<bool>;
  { std::bool_constant<C::trusted>{} };
};

// Stored ids [at, end). Reads *at only while at < end.
struct device_span_cursor {
  static constexpr bool trusted = false;
  const std::int32_t* at = nullptr;
  const std::int32_t* end = nullptr;
  bool clamped = false;

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool done() const noexcept { return !(at < end); }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE std::int32_t id() const noexcept { return *at; }
  SKIM_HOST_DEVICE SKIM_FORCEINLINE void next() noexcept { ++at; }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool malformed() const noexcept { return clamped; }
};

// The ids [first, last) (an implicit rule's row).
struct device_range_cursor {
  static constexpr bool trusted = true;  // built inside [0, visible_blocks)
  std::int32_t first = 0;
  std::int32_t last = 0;

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool done() const noexcept { return first >= last; }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE std::int32_t id() const noexcept { return first; }
  SKIM_HOST_DEVICE SKIM_FORCEINLINE void next() noexcept { ++first; }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool malformed() const noexcept { return false; }
};

// The union of two cursors, exactly as index::union_cursor merges: id() is the smaller current id
// of the parts; next() advances each part past it (and past anything a broken part holds at or
// below it), so an id held by both comes out once and the output is strictly ascending whatever
// the parts hold.
template <class A, class B>
class device_union_cursor {
 public:
  static constexpr bool trusted = A::trusted && B::trusted;

  SKIM_HOST_DEVICE SKIM_FORCEINLINE device_union_cursor(A a, B b) noexcept : a_(a), b_(b) { settle(); }

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool done() const noexcept { return done_; }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE std::int32_t id() const noexcept { return id_; }
  SKIM_HOST_DEVICE SKIM_FORCEINLINE void next() noexcept {
    skip_through(a_, id_);
    skip_through(b_, id_);
    settle();
  }
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE bool malformed() const noexcept {
    return a_.malformed() || b_.malformed();
  }

 private:
  template <class C>
  SKIM_HOST_DEVICE static SKIM_FORCEINLINE void skip_through(C& c, std::int32_t id) noexcept {
    while (!c.done() && c.id() <= id) c.next();
  }
  // @post id_ = the smaller current id of the parts; done_ iff both are done.
  SKIM_HOST_DEVICE SKIM_FORCEINLINE void settle() noexcept {
    const bool da = a_.done(), db = b_.done();
    const std::int32_t ia = da ? 0 : a_.id();
    const std::int32_t ib = db ? 0 : b_.id();
    done_ = da && db;
    id_ = da ? ib : (db || ia <= ib ? ia : ib);
  }

  A a_;
  B b_;
  std::int32_t id_ = 0;
  bool done_ = true;
};

// ---------------------------------------------------------------------------------------------
// Stored indices: the same layouts as index::block_table and index::block_csr.

struct device_block_table {
  const std::int32_t* ids = nullptr;    // [rows, width]
  const std::int32_t* count = nullptr;  // [rows]
  std::int32_t width = 0;
  std::int64_t rows = 0;

  // [first, first + n) of row r; n clamped to [0, width] (bad_count reported by the caller).
  struct span {
    const std::int32_t* first = nullptr;
    std::int32_t n = 0;
    bool clamped = false;
  };
  [[nodiscard]] __device__ __forceinline__ span row(std::int64_t r) const noexcept {
    if (r < 0 || r >= rows) return {nullptr, 0, true};
    const std::int32_t c = count[r];
    const std::int32_t n = c < 0 ? 0 : (c > width ? width : c);
    return {ids + r * width, n, n != c};
  }
  [[nodiscard]] __device__ __forceinline__ device_span_cursor cursor(std::int64_t r, const device_row&) const noexcept {
    const span s = row(r);
    return {s.first, s.first + s.n, s.clamped};
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return width; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return rows; }

  [[nodiscard]] status validate() const noexcept {
    if (width < 0) return status::error(status_code::invalid_argument, "block_table width %d < 0", width);
    if (rows > 0 && (count == nullptr || (width > 0 && ids == nullptr))) {
      return status::error(status_code::invalid_argument, "block_table ids/count are null with %lld rows",
                           static_cast<long long>(rows));
    }
    return status::success();
  }
};

// A device_block_table the router writes (same layout); converts to the read-only view.
struct mutable_device_block_table {
  std::int32_t* ids = nullptr;    // [rows, width]
  std::int32_t* count = nullptr;  // [rows]
  std::int32_t width = 0;
  std::int64_t rows = 0;

  [[nodiscard]] constexpr operator device_block_table() const noexcept { return {ids, count, width, rows}; }
};

struct device_block_csr {
  const std::int32_t* row_ptr = nullptr;  // [rows + 1]
  const std::int32_t* col_idx = nullptr;  // [capacity]
  std::int64_t capacity = 0;
  std::int64_t rows = 0;

  [[nodiscard]] __device__ __forceinline__ device_block_table::span row(std::int64_t r) const noexcept {
    if (r < 0 || r >= rows) return {nullptr, 0, true};
    std::int64_t b = row_ptr[r], e = row_ptr[r + 1];
    const bool bad = b < 0 || e < b || e > capacity;
    b = b < 0 ? 0 : (b > capacity ? capacity : b);
    e = e < b ? b : (e > capacity ? capacity : e);
    return {col_idx + b, static_cast<std::int32_t>(e - b), bad};
  }
  [[nodiscard]] __device__ __forceinline__ device_span_cursor cursor(std::int64_t r, const device_row&) const noexcept {
    const device_block_table::span s = row(r);
    return {s.first, s.first + s.n, s.clamped};
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept {
    return capacity > INT32_MAX ? INT32_MAX : static_cast<std::int32_t>(capacity < 0 ? 0 : capacity);
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return rows; }

  [[nodiscard]] status validate() const noexcept {
    if (rows > 0 && row_ptr == nullptr) {
      return status::error(status_code::invalid_argument, "block_csr row_ptr is null with %lld rows",
                           static_cast<long long>(rows));
    }
    if (capacity > 0 && col_idx == nullptr) {
      return status::error(status_code::invalid_argument, "block_csr col_idx is null with capacity %lld",
                           static_cast<long long>(capacity));
    }
    return status::success();
  }
};

// ---------------------------------------------------------------------------------------------
// Implicit rules: computed from the row's geometry, no storage. Under causality a row's visible
// blocks end at the block holding its last query's diagonal (bottom-right aligned); under
// mask_kind::none they are all of the sequence's blocks.

// Every block the row can see: dense attention expressed as an index.
struct device_causal_all {
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE device_range_cursor cursor(std::int64_t,
                                                                            const device_row& g) const noexcept {
    return {0, g.visible_blocks};
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return INT32_MAX; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return 0; }
  [[nodiscard]] status validate() const noexcept { return status::success(); }
};

// The first `blocks` key blocks of the sequence (attention sinks), clipped to what the row sees.
struct device_sink {
  std::int32_t blocks = 1;

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE device_range_cursor cursor(std::int64_t,
                                                                            const device_row& g) const noexcept {
    const std::int32_t n = blocks < 0 ? 0 : blocks;
    return {0, n < g.visible_blocks ? n : g.visible_blocks};
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return blocks > 0 ? blocks : 0; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return 0; }
  [[nodiscard]] status validate() const noexcept {
    if (blocks < 0) return status::error(status_code::invalid_argument, "sink blocks %d < 0", blocks);
    return status::success();
  }
};

// The newest `blocks` key blocks the row can see (its local window); under causality the newest
// visible block is the one holding the row's diagonal.
struct device_sliding_window {
  std::int32_t blocks = 1;

  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE device_range_cursor cursor(std::int64_t,
                                                                            const device_row& g) const noexcept {
    const std::int32_t n = blocks < 0 ? 0 : blocks;
    const std::int32_t first = g.visible_blocks - n;
    return {first > 0 ? first : 0, g.visible_blocks};
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return blocks > 0 ? blocks : 0; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return 0; }
  [[nodiscard]] status validate() const noexcept {
    if (blocks < 0) return status::error(status_code::invalid_argument, "sliding_window blocks %d < 0", blocks);
    return status::success();
  }
};

// ---------------------------------------------------------------------------------------------
// Unions

// A ∪ B, never materialised: the cursor merges the parts' cursors (device_union_cursor). A routed
// table with a sink and a window is make_device_union(table, device_sink{1}, device_sliding_window{2}).
// The cursor type of index I (spelled out: nvcc's host pass cannot deduce a __device__ function's
// return type).
template <class I>
using device_cursor_t = decltype(std::declval<const I&>().cursor(std::int64_t{}, std::declval<const device_row&>()));

template <class A, class B>
struct device_union {
  A a;
  B b;

  using cursor_type = device_union_cursor<device_cursor_t<A>, device_cursor_t<B>>;
  [[nodiscard]] __device__ __forceinline__ cursor_type cursor(std::int64_t r, const device_row& g) const noexcept {
    return cursor_type(a.cursor(r, g), b.cursor(r, g));
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept {
    const std::int64_t n = static_cast<std::int64_t>(a.max_ids()) + b.max_ids();
    return n > INT32_MAX ? INT32_MAX : static_cast<std::int32_t>(n);
  }
  // 0: a stored part reports on the device the rows it lacks (bad_count).
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return 0; }
  // ok iff both parts validate; a failure is prefixed with the part ("union part 1: sink blocks -1 < 0").
  [[nodiscard]] status validate() const noexcept {
    status s = a.validate();
    if (!s.ok()) return status::error(s.code(), "union part 0: %s", s.message());
    s = b.validate();
    if (!s.ok()) return status::error(s.code(), "union part 1: %s", s.message());
    return status::success();
  }
};

// The union of two or more device indices, nested to the right: (a, b, c) -> a ∪ (b ∪ c). The
// ids are those of index::make_union over the same parts (a nested merge yields the same set).
template <class A, class B>
[[nodiscard]] constexpr device_union<A, B> make_device_union(const A& a, const B& b) noexcept {
  return {a, b};
}
template <class A, class B, class C, class... Rest>
[[nodiscard]] constexpr auto make_device_union(const A& a, const B& b, const C& c, const Rest&... rest) noexcept {
  return make_device_union(a, make_device_union(b, c, rest...));
}

// ---------------------------------------------------------------------------------------------
// One selection for every index head (index::head_shared's device form)

// `shared` holds one row per query block, laid out for index::head_shared::shared_problem(p) (row
// q_block_offset(b) + i); row r of the problem, (q_block_offset(b) + i) · index_heads + h, reads its
// row r / index_heads, whatever h. What sparse_attention::share_heads selects on the CPU, read on the
// GPU without copying the row once per head. index_heads must be the problem's index_heads()
// (check_index_heads, called by check_args, reports a mismatch).
template <class Index>
struct device_head_shared {
  Index shared;
  std::int32_t index_heads = 1;

  // The shared row of problem row r (-1, no row, for a negative r).
  [[nodiscard]] SKIM_HOST_DEVICE SKIM_FORCEINLINE std::int64_t shared_row(std::int64_t r) const noexcept {
    return r < 0 || index_heads <= 0 ? -1 : r / index_heads;
  }
  // Stored forms only (decode addresses a row's ids by position).
  [[nodiscard]] __device__ __forceinline__ device_block_table::span row(std::int64_t r) const noexcept {
    return shared.row(shared_row(r));
  }
  [[nodiscard]] __device__ __forceinline__ device_cursor_t<Index> cursor(std::int64_t r,
                                                                       const device_row& g) const noexcept {
    return shared.cursor(shared_row(r), g);
  }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return shared.max_ids(); }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return shared.stored_rows(); }
  [[nodiscard]] status validate() const noexcept {
    if (index_heads < 1) {
      return status::error(status_code::invalid_argument, "head_shared index_heads %d < 1", index_heads);
    }
    const status s = shared.validate();
    if (!s.ok()) return status::error(s.code(), "head_shared: %s", s.message());
    return status::success();
  }
};

// Host check of an index against the problem it is read for, beyond validate()'s own scalars: every
// device_head_shared in it, alone or inside a union, must have the problem's index heads (check_args
// calls it with p.index_heads()). Other forms have nothing to check.
template <class I>
[[nodiscard]] inline status check_index_heads(const I&, std::int32_t) noexcept {
  return status::success();
}
template <class I>
[[nodiscard]] inline status check_index_heads(const device_head_shared<I>& x, std::int32_t index_heads) noexcept {
  if (x.index_heads != index_heads) {
    return status::error(status_code::shape_mismatch, "head_shared index_heads %d, the problem has %d index heads",
                         x.index_heads, index_heads);
  }
  return status::success();
}
template <class A, class B>
[[nodiscard]] inline status check_index_heads(const device_union<A, B>& x, std::int32_t index_heads) noexcept {
  SKIM_TRY(check_index_heads(x.a, index_heads));
  return check_index_heads(x.b, index_heads);
}

// ---------------------------------------------------------------------------------------------
// Traits

// An index a kernel can read through cursor(row, geometry) (requirements listed at the top):
//  1. cursor(std::int64_t row, const device_row&) -> device_block_cursor (device code);
//  2. validate() -> status (host: the index's own scalars and pointers);
//  3. max_ids() -> std::int32_t: the most ids a row yields (a stored width, a rule's block count,
//     a union's sum), the bound decode sizes its split for;
//  4. stored_rows() -> std::int64_t: the rows stored on the device (0 for rules and unions).
template <class I>
concept device_block_index = std::copyable<I> && requires(const I& index, std::int64_t r, const device_row& g) {
  { index.cursor(r, g) } -> device_block_cursor;
  { index.validate() } -> std::same_as<status>;
  { index.max_ids() } -> std::same_as<std::int32_t>;
  { index.stored_rows() } -> std::same_as<std::int64_t>;
};

// Stored forms (device_block_table, device_block_csr): rows whose ids a kernel can address by
// position (decode's split over a row).
template <class I>
inline constexpr bool is_stored_device_index_v =
    std::is_same_v<I, device_block_table> || std::is_same_v<I, device_block_csr>;

// Indices whose rows have an address, read by position through row(): the stored forms, a stored
// form shared by the index heads, and a routed table (its rows once decode selected them). Decode
// splits these by position and walks the others through their cursors.
template <class I>
inline constexpr bool is_shared_stored_device_index_v = false;
template <class I>
inline constexpr bool is_shared_stored_device_index_v<device_head_shared<I>> = is_stored_device_index_v<I>;
// A table decode fills as it reads it, from decode_router's scores or the candidates its score kernel
// kept (select/cuda/select_kernel.cuh, select_row.cuh, candidates.cuh; device_kept_table: the latter,
// as decode runs it): decode only.
struct device_routed_table;
struct device_kept_table;
template <class I>
inline constexpr bool is_routed_device_index_v =
    std::is_same_v<I, device_routed_table> || std::is_same_v<I, device_kept_table>;
template <class I>
inline constexpr bool is_positional_device_index_v =
    is_stored_device_index_v<I> || is_shared_stored_device_index_v<I> || is_routed_device_index_v<I>;

// Every device index: stored forms, implicit rules, unions and shared rows of them (what prefill takes).
template <class I>
inline constexpr bool is_device_index_v = device_block_index<I>;

static_assert(device_block_index<device_block_table>);
static_assert(device_block_index<device_block_csr>);
static_assert(device_block_index<device_causal_all>);
static_assert(device_block_index<device_sink>);
static_assert(device_block_index<device_sliding_window>);
static_assert(device_block_index<device_union<device_block_table, device_union<device_sink, device_sliding_window>>>);
static_assert(device_block_index<device_head_shared<device_block_table>>);

}  // namespace skim::cuda
