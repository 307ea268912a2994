// Fuzz target: index::token_list, select::top_tokens and exec::token_gather on fuzzed problems
// (sometimes broken), lists (widths, counts and positions a little outside their ranges, short
// spans), selector parameters, Q/K/V values and K/V layouts (contiguous, paged, hostile page
// tables).
//
// For each input, one of:
//  - a fuzzed list: validate() fails with a message, or every row is ascending, unique and inside
//    the keys its last query sees. token_gather over it must then run when K/V are sound, write
//    finite outputs, and, at block_kv 1 (where a token position is a block id), equal
//    exec::reference over the same arrays read as a block table; over a bad list or bad K/V it
//    must return a status with a message.
//  - top_tokens with fuzzed t, sink and window into a list of fuzzed width: an error carries a
//    message and has a reason (some input out of its contract); a success writes a list that
//    validates, holds each row's sink and window tokens, stays within max_count, and equals a
//    second selection over a workspace of other contents.
// ASan and UBSan watch every read and every arithmetic step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "fuzz_tensors.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/token_gather.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/token_list.hpp"
#include "skim/select/top_tokens.hpp"

namespace {

using namespace skim;
using namespace skim::fuzz;

constexpr std::int32_t sentinel = -77;

void check_error(const status& s, const char* what) {
  SKIM_FUZZ_CHECK(s.code() != status_code::ok, "%s", what);
  SKIM_FUZZ_CHECK(s.message()[0] != '\0', "%s: empty message", what);
}

// A token list from the input: a width in [0, 8] (sometimes -1), counts and positions mostly in
// range, now and then one past it, and spans near their sizes.
struct list_store {
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;
  list_store(fuzz_input& in, std::int64_t rows) {
    width = in.flag(16) ? -1 : in.in(0, 8);
    count.resize(near_size(in, rows));
    positions.resize(near_size(in, rows * std::max(width, 0)));
    for (std::int32_t& c : count) {
      const std::uint8_t v = in.u8();
      c = v < 224 ? static_cast<std::int32_t>(v % static_cast<std::uint32_t>(std::max(width, 0) + 1))
                  : (v % 2 ? -1 : width + 1);
    }
    // Mostly ascending runs (a valid row is likely), sometimes anything.
    const bool raw = in.flag(4);
    std::int32_t at = 0;
    for (std::size_t i = 0; i < positions.size(); ++i) {
      if (width > 0 && i % static_cast<std::size_t>(width) == 0) at = in.in(-1, 2);
      at = raw ? in.id() : at + in.in(0, 3) + (in.flag(32) ? -2 : 0);
      positions[i] = at;
    }
  }
  [[nodiscard]] index::token_list view() const { return {positions, count, width}; }
};

// Rows of a valid list are ascending, unique and visible to the row's last query.
void check_rows(const problem& p, index::token_list list) {
  (void)for_each_row(p, [&](const row_info& r) {
    const std::span<const std::int32_t> row = list.row(r);
    const std::int32_t visible = index::row_visible_keys(r, p.mask);
    for (std::size_t i = 0; i < row.size(); ++i) {
      SKIM_FUZZ_CHECK(row[i] >= 0 && row[i] < visible, "valid list: position %d outside [0, %d) in row %lld", row[i],
                      visible, static_cast<long long>(r.row));
      SKIM_FUZZ_CHECK(i == 0 || row[i - 1] < row[i], "valid list: row %lld not ascending",
                      static_cast<long long>(r.row));
    }
  });
}

// token_gather over `list` (and, at block_kv 1, exec::reference over the same arrays as a table).
void run_gather(const problem& p, const list_store& store, bool list_ok, tensors& t) {
  t.with_kv(p, [&](const auto& kv) {
    using KV = std::decay_t<decltype(kv)>;
    const bool kv_ok = validate(p).ok() && kv.validate(p).ok();
    const auto q = strided_view<const float>::token_major(t.q.data(), p.tokens_q(), p.heads_q, p.head_dim);
    const auto out = [&](std::vector<float>& o) {
      return strided_view<float>::token_major(o.data(), p.tokens_q(), p.heads_q, p.head_dim);
    };
    const status s = run(exec::token_gather{}, exec::token_attention_args<float, KV, float>{
                                                   .prob = p, .q = q, .kv = kv, .tokens = store.view(),
                                                   .o = out(t.o_scalar), .lse = t.lse_scalar});
    if (!(list_ok && kv_ok)) {
      check_error(s, "token_gather accepted a bad list or K/V");
      return;
    }
    SKIM_FUZZ_CHECK(s.ok(), "token_gather: %s", s.message());
    for (const float x : t.o_scalar) SKIM_FUZZ_CHECK(std::isfinite(x), "token_gather output not finite");
    if (p.block_kv != 1) return;
    const index::block_table table{store.positions, store.count, store.width};
    const status r = run(exec::reference{}, attention_args<float, KV, index::block_table, float>{
                                                .prob = p, .q = q, .kv = kv, .index = table, .o = out(t.o_ref),
                                                .lse = t.lse_ref});
    SKIM_FUZZ_CHECK(r.ok(), "reference over the list as a table: %s", r.message());
    for (std::size_t i = 0; i < t.o_ref.size(); ++i) {
      const float a = t.o_scalar[i], b = t.o_ref[i];
      SKIM_FUZZ_CHECK(std::fabs(a - b) <= 1e-4f * (1.0f + std::fabs(b)), "token_gather %g vs reference %g at %zu",
                      static_cast<double>(a), static_cast<double>(b), i);
    }
    for (std::size_t i = 0; i < t.lse_ref.size(); ++i) {
      SKIM_FUZZ_CHECK(std::isinf(t.lse_ref[i]) == std::isinf(t.lse_scalar[i]), "empty rows differ at %zu", i);
    }
  });
}

// top_tokens into a list of fuzzed width, over a workspace exactly as big as it asks.
void run_select(fuzz_input& in, const problem& p, tensors& t) {
  const bool problem_ok = validate(p).ok();
  const select::top_tokens sel{.t = in.id(), .sink = in.in(-1, 4), .window = in.in(-1, 4)};
  const bool params_ok = sel.validate().ok();
  const std::int64_t rows = problem_ok ? p.index_rows() : in.in(0, 4);
  const std::int32_t need = problem_ok && params_ok ? sel.max_count(p) : in.in(0, 4);
  std::vector<std::int32_t> positions, count(near_size(in, rows), sentinel);
  const std::int32_t width = static_cast<std::int32_t>(near_size(in, need));
  positions.assign(static_cast<std::size_t>(std::max<std::int64_t>(rows, 0)) * static_cast<std::size_t>(width), sentinel);
  const bool list_ok = count.size() == static_cast<std::size_t>(rows) && width >= need;
  const std::size_t bytes = problem_ok ? sel.workspace_bytes(p) : 0;
  const auto select_into = [&](std::vector<std::int32_t>& pos, std::vector<std::int32_t>& cnt, std::byte fill) {
    std::vector<std::byte> storage(bytes + workspace_alignment, fill);
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t skip = (workspace_alignment - addr % workspace_alignment) % workspace_alignment;
    status s;
    t.with_kv(p, [&](const auto& kv) {
      s = sel.select(p, strided_view<const float>::token_major(t.q.data(), p.tokens_q(), p.heads_q, p.head_dim), kv,
                     index::mutable_token_list{pos, cnt, width}, std::span<std::byte>(storage.data() + skip, bytes));
    });
    return s;
  };
  const status s = select_into(positions, count, std::byte{0xff});
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(s.message()[0] != '\0', "top_tokens: empty message");
    bool kv_ok = true;
    t.with_kv(p, [&](const auto& kv) { kv_ok = problem_ok && kv.validate(p).ok(); });
    SKIM_FUZZ_CHECK(!(problem_ok && params_ok && list_ok && kv_ok), "every input valid, yet: %s", s.message());
    return;
  }
  SKIM_FUZZ_CHECK(problem_ok && params_ok && list_ok, "top_tokens ok with an invalid problem, parameters or list");
  const index::token_list list{positions, count, width};
  const status v = list.validate(p);
  SKIM_FUZZ_CHECK(v.ok(), "top_tokens wrote a list that fails validate: %s", v.message());
  (void)for_each_row(p, [&](const row_info& r) {
    const std::span<const std::int32_t> row = list.row(r);
    const std::int32_t visible = index::row_visible_keys(r, p.mask);
    SKIM_FUZZ_CHECK(static_cast<std::int32_t>(row.size()) <= sel.max_count(visible), "row %lld over max_count",
                    static_cast<long long>(r.row));
    for (std::int32_t j = 0; j < visible; ++j) {
      const bool reserved = j < sel.sink || j >= visible - sel.window;
      SKIM_FUZZ_CHECK(!reserved || std::binary_search(row.begin(), row.end(), j), "row %lld lacks reserved token %d",
                      static_cast<long long>(r.row), j);
    }
  });
  std::vector<std::int32_t> positions2(positions.size(), sentinel), count2(count.size(), sentinel);
  const status again = select_into(positions2, count2, std::byte{0x00});
  SKIM_FUZZ_CHECK(again.ok(), "second selection failed: %s", again.message());
  SKIM_FUZZ_CHECK(count2 == count, "counts differ between selections");
  (void)for_each_row(p, [&](const row_info& r) {
    const std::span<const std::int32_t> a = list.row(r), b = index::token_list{positions2, count2, width}.row(r);
    SKIM_FUZZ_CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()), "row %lld differs between selections",
                    static_cast<long long>(r.row));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in(data, size);
  std::vector<std::int32_t> cu_q, cu_kv;
  const problem p = read_problem(in, cu_q, cu_kv);
  tensors t(in, p);
  if (in.flag()) {
    run_select(in, p, t);
    return 0;
  }
  const std::int64_t rows = validate(p).ok() ? p.index_rows() : in.in(0, 4);
  const list_store store(in, rows);
  const status v = store.view().validate(p);
  if (v.ok()) {
    check_rows(p, store.view());
  } else {
    check_error(v, "token_list validate");
  }
  run_gather(p, store, v.ok(), t);
  return 0;
}
