// Fuzz target: index::build_vertical_slash on fuzzed problems (sometimes broken), options (negative
// and extreme counts), Q/K values (NaN, infinities, huge), view shapes and layouts, and buffer sizes
// (row_ptr, col_idx, workspace: short, long, misaligned).
//
// For each input:
//  - a failed build must carry a message, leave row_ptr and col_idx as they were, and have a reason:
//    some input was out of its contract (so a build with every input in contract must succeed);
//  - a successful build must give a CSR that validates against the problem, stays inside
//    vertical_slash_capacity(p, options), holds every row's sink and window blocks, and equals a
//    second build over a workspace of other contents (bit for bit).
// ASan and UBSan watch every read and every arithmetic step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/vertical_slash.hpp"

namespace {

using namespace skim;
using namespace skim::fuzz;

constexpr std::int32_t sentinel = -77;

// An aligned byte buffer of n bytes (plus an offset that may misalign the span), filled with `fill`.
struct scratch {
  std::vector<std::byte> storage;
  std::span<std::byte> bytes;
  scratch(std::size_t n, std::size_t offset, std::byte fill) : storage(n + offset + workspace_alignment, fill) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t skip = (workspace_alignment - base % workspace_alignment) % workspace_alignment + offset;
    bytes = {storage.data() + skip, n};
  }
};

template <element T>
void run(fuzz_input& in, const problem& p) {
  const bool problem_ok = validate(p).ok();
  index::vertical_slash_options o;
  o.columns = in.id();
  o.diagonals = in.id();
  o.sink_blocks = in.in(-1, 3);
  o.window_blocks = in.in(-1, 3);
  o.last_q = in.flag(8) ? in.id() : in.in(1, 20);
  if (in.flag(16)) {  // many columns (or very negative ones)
    const std::int64_t x = static_cast<std::int64_t>(in.id()) * 1000;
    o.columns = static_cast<std::int32_t>(std::clamp<std::int64_t>(x, std::numeric_limits<std::int32_t>::min(),
                                                                   std::numeric_limits<std::int32_t>::max()));
  }
  const bool options_ok = o.validate().ok();

  // Q and K as views of the problem's shape, now and then one field off; buffers always hold what
  // the view addresses (a view that lies about its memory is the caller's contract, not checked).
  const auto nonneg = [](std::int64_t x) { return x < 0 ? std::int32_t{0} : static_cast<std::int32_t>(x); };
  std::int32_t q_tokens = nonneg(p.tokens_q()), k_tokens = nonneg(p.tokens_kv());
  std::int32_t q_heads = nonneg(p.heads_q), k_heads = nonneg(p.heads_kv), dim = nonneg(p.head_dim);
  bool views_ok = true;
  if (in.flag(16)) {
    switch (in.u8() % 3) {
      case 0: q_tokens += 1; break;
      case 1: k_heads += 1; break;
      default: dim += 1; break;
    }
    views_ok = false;
  }
  const std::size_t q_elems = static_cast<std::size_t>(q_tokens) * q_heads * dim;
  const std::size_t k_elems = static_cast<std::size_t>(k_tokens) * k_heads * dim;
  std::vector<T> q(q_elems + 1), k(k_elems + 1);
  std::uint32_t seed = in.u8() * 2654435761u + 7u;
  const bool hostile = in.flag(4);
  for (auto* v : {&q, &k}) {
    for (T& x : *v) {
      seed = seed * 1664525u + 1013904223u;
      const float plain = static_cast<float>(static_cast<std::int32_t>(seed >> 24) - 128) / 32.0f;  // [-4, 4)
      const float f = hostile && (seed >> 28) == 0 ? in.score() : plain;
      x = from_float<T>(f);
    }
  }
  const bool head_major = in.flag();
  const auto view = [&](const std::vector<T>& data, std::int32_t tokens, std::int32_t heads) {
    return head_major ? strided_view<const T>::head_major(data.data(), tokens, heads, dim)
                      : strided_view<const T>::token_major(data.data(), tokens, heads, dim);
  };
  strided_view<const T> qv = view(q, q_tokens, q_heads);
  const strided_view<const T> kv = view(k, k_tokens, k_heads);
  if (in.flag(32)) {  // a negative stride on a view of the right shape
    qv.token_stride = -1;
    views_ok = false;
  }

  const std::int64_t rows = problem_ok ? p.index_rows() : in.in(0, 4);
  const std::int64_t capacity = index::vertical_slash_capacity(p, o);
  const std::size_t ws_bytes = index::vertical_slash_workspace_bytes(p, o);
  std::vector<std::int32_t> row_ptr(near_size(in, rows + 1), sentinel);
  std::vector<std::int32_t> col_idx(near_size(in, capacity), sentinel);
  const std::size_t offset = in.flag(16) ? 8 : 0;
  scratch ws(near_size(in, static_cast<std::int64_t>(ws_bytes)), offset, std::byte{0xff});
  const bool buffers_ok = row_ptr.size() == static_cast<std::size_t>(rows) + 1 &&
                          col_idx.size() >= static_cast<std::size_t>(capacity) &&
                          (ws_bytes == 0 || (offset == 0 && ws.bytes.size() >= ws_bytes));

  const status s = index::build_vertical_slash(p, qv, kv, o, {row_ptr, col_idx}, ws.bytes);
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(s.message()[0] != '\0', "empty message");
    SKIM_FUZZ_CHECK(!(problem_ok && options_ok && views_ok && buffers_ok), "all inputs valid, yet: %s", s.message());
    const auto untouched = [](const std::vector<std::int32_t>& v) {
      return std::all_of(v.begin(), v.end(), [](std::int32_t x) { return x == sentinel; });
    };
    SKIM_FUZZ_CHECK(untouched(row_ptr) && untouched(col_idx), "a failed build wrote its outputs: %s", s.message());
    return;
  }
  SKIM_FUZZ_CHECK(problem_ok && options_ok, "ok with an invalid problem or options");
  const index::block_csr csr{row_ptr, col_idx};
  const status v = csr.validate(p);
  SKIM_FUZZ_CHECK(v.ok(), "built CSR fails validate: %s", v.message());
  SKIM_FUZZ_CHECK(row_ptr.back() <= capacity, "nnz %d > capacity %lld", row_ptr.back(),
                  static_cast<long long>(capacity));
  const status sink_window = for_each_row(p, [&](const row_info& r) -> status {
    const std::int32_t* first = col_idx.data() + row_ptr[static_cast<std::size_t>(r.row)];
    const std::int32_t* last = col_idx.data() + row_ptr[static_cast<std::size_t>(r.row) + 1];
    for (std::int32_t j = 0; j < r.visible_blocks; ++j) {
      const bool reserved = j < o.sink_blocks || j >= r.visible_blocks - o.window_blocks;
      if (reserved && !std::binary_search(first, last, j)) {
        return status::error(status_code::invalid_index, "row %lld lacks reserved block %d",
                             static_cast<long long>(r.row), j);
      }
    }
    return status::success();
  });
  SKIM_FUZZ_CHECK(sink_window.ok(), "%s", sink_window.message());

  std::vector<std::int32_t> row_ptr2(row_ptr.size(), sentinel), col_idx2(col_idx.size(), sentinel);
  scratch ws2(ws.bytes.size(), offset, std::byte{0x00});
  const status again = index::build_vertical_slash(p, qv, kv, o, {row_ptr2, col_idx2}, ws2.bytes);
  SKIM_FUZZ_CHECK(again.ok(), "second build failed: %s", again.message());
  SKIM_FUZZ_CHECK(row_ptr2 == row_ptr, "row_ptr differs between builds");
  SKIM_FUZZ_CHECK(std::equal(col_idx.begin(), col_idx.begin() + row_ptr.back(), col_idx2.begin()),
                  "col_idx differs between builds");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in(data, size);
  std::vector<std::int32_t> cu_q, cu_kv;
  const problem p = read_problem(in, cu_q, cu_kv);
  switch (in.u8() % 3) {
    case 0: run<float>(in, p); break;
    case 1: run<half>(in, p); break;
    default: run<bfloat16>(in, p); break;
  }
  return 0;
}
