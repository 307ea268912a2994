// Fuzz target: the selectors (top_k, threshold in its three modes, reserved branches over either)
// on hostile rows — NaN / ±inf / huge scores, k = 0, k beyond the visible blocks, bad thresholds,
// priors, exclude lists (valid or not), budget_used, short score spans, small outputs and
// workspaces — and select_all over a small problem.
//
// Contract checked (concepts/selector.hpp): on ok, out[0, count) holds sorted unique ids in
// [0, visible_blocks), none excluded, count <= max_count(visible_blocks), the same ids whatever
// the workspace held; on failure, a message, count 0 and out untouched — except shape_mismatch
// for a too-small out, where count is the size needed. select_all's table must validate.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "skim/core/workspace.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/select_all.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"

namespace {

using namespace skim;
using namespace skim::fuzz;

constexpr std::int32_t sentinel = -7777;

// An aligned byte buffer of `bytes` (plus a misaligned view of it), filled with `fill`.
struct workspace_store {
  std::vector<std::byte> storage;
  std::span<std::byte> aligned;
  workspace_store(std::size_t bytes, std::byte fill) : storage(bytes + 2 * workspace_alignment, fill) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t skip = (workspace_alignment - addr % workspace_alignment) % workspace_alignment;
    aligned = {storage.data() + skip, bytes};
  }
};

template <class S>
void check_row(const S& sel, fuzz_input& in) {
  // The row: visible blocks, scores (maybe shorter than visible), prior, exclude, budget_used.
  row_scores rs;
  const std::int32_t v = in.flag(32) ? -1 : in.in(0, 40);
  rs.row.visible_blocks = v;
  rs.row.kv_blocks = std::max(v, 0);
  rs.row.row = in.u8();
  std::vector<float> scores(near_size(in, v + in.in(0, 2)));
  for (float& s : scores) s = in.score();
  rs.scores = scores;
  std::vector<float> prior;
  if (in.flag()) {
    prior.resize(near_size(in, v));
    for (float& s : prior) s = in.score();
    rs.prior = prior;
  }
  std::vector<std::int32_t> exclude;
  if (in.flag(3)) {
    const bool raw = in.flag(4);
    for (std::int32_t id = 0; id < std::max(v, 0); ++id) {
      if (in.flag(3)) exclude.push_back(id);
    }
    if (raw && !exclude.empty()) exclude[in.u8() % exclude.size()] = in.id();  // maybe unsorted or out of range
    rs.exclude = exclude;
  }
  rs.budget_used = in.flag(8) ? in.id() : 0;

  // Output room and workspace: as asked, or a little off.
  const std::int32_t max = sel.max_count(v);
  SKIM_FUZZ_CHECK(max >= 0 && max <= std::max(v, 0), "max_count %d outside [0, %d]", max, v);
  std::vector<std::int32_t> out(near_size(in, max), sentinel);
  const std::size_t need = sel.workspace_bytes(v);
  SKIM_FUZZ_CHECK(need >= sel.workspace_bytes(v - 1) || v <= 0, "workspace_bytes decreases at %d", v);
  const std::uint8_t ws_kind = in.u8();
  workspace_store ws(need, std::byte{0xff});
  std::span<std::byte> workspace = ws.aligned;
  if (ws_kind >= 248 && need > 0) workspace = workspace.first(need - 1);
  if (ws_kind == 247 && need > 0) workspace = {ws.storage.data() + (ws.aligned.data() - ws.storage.data()) + 4, need};

  std::int32_t count = -1;
  const status s = sel.select_row(rs, out, count, workspace);
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(s.message()[0] != '\0', "empty message");
    if (s.code() == status_code::shape_mismatch && count > 0) {
      SKIM_FUZZ_CHECK(static_cast<std::size_t>(count) > out.size(), "out too small but count %d fits %zu", count,
                      out.size());
    } else {
      SKIM_FUZZ_CHECK(count == 0, "failed with count %d: %s", count, s.message());
    }
    for (std::int32_t x : out) SKIM_FUZZ_CHECK(x == sentinel, "failed select_row wrote out: %s", s.message());
    return;
  }
  SKIM_FUZZ_CHECK(count >= 0 && count <= max && static_cast<std::size_t>(count) <= out.size(),
                  "count %d, max_count %d, out %zu", count, max, out.size());
  for (std::int32_t i = 0; i < count; ++i) {
    const std::int32_t id = out[static_cast<std::size_t>(i)];
    SKIM_FUZZ_CHECK(id >= 0 && id < v, "id %d outside [0, %d)", id, v);
    SKIM_FUZZ_CHECK(i == 0 || out[static_cast<std::size_t>(i) - 1] < id, "ids not strictly ascending");
    SKIM_FUZZ_CHECK(!std::binary_search(exclude.begin(), exclude.end(), id), "excluded id %d selected", id);
  }
  for (std::size_t i = static_cast<std::size_t>(count); i < out.size(); ++i) {
    SKIM_FUZZ_CHECK(out[i] == sentinel, "select_row wrote past count");
  }
  // Deterministic whatever the workspace held.
  workspace_store ws2(need, std::byte{0x00});
  std::vector<std::int32_t> out2(out.size(), sentinel);
  std::int32_t count2 = -1;
  const status s2 = sel.select_row(rs, out2, count2, ws2.aligned);
  SKIM_FUZZ_CHECK(s2.ok() && count2 == count && out2 == out, "select_row is not deterministic");
}

template <class S>
void check_select_all(const S& sel, fuzz_input& in) {
  std::vector<std::int32_t> cu_q, cu_kv;
  const problem p = read_problem(in, cu_q, cu_kv);
  if (!validate(p).ok()) return;
  const std::int64_t stride = p.max_kv_blocks() + in.in(0, 2);
  std::vector<float> scores(near_size(in, p.index_rows() * stride));
  for (float& s : scores) s = in.score();
  const std::int32_t width = select::max_count(sel, p);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.index_rows()) * static_cast<std::size_t>(width));
  std::vector<std::int32_t> count(static_cast<std::size_t>(p.index_rows()));
  workspace_store ws(select::workspace_bytes(sel, p), std::byte{0xff});
  const status s = select::select_all(sel, p, {.scores = scores, .score_stride = stride},
                                      index::mutable_block_table{ids, count, width}, ws.aligned);
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(s.message()[0] != '\0', "select_all: empty message");
    return;
  }
  const status v = index::block_table{ids, count, width}.validate(p);
  SKIM_FUZZ_CHECK(v.ok(), "select_all's table does not validate: %s", v.message());
}

select::threshold read_threshold(fuzz_input& in) {
  select::threshold t;
  t.mode = static_cast<select::threshold_mode>(in.u8() % 4);  // 3: not a mode
  t.tau = in.score();
  t.k_min = in.flag(3) ? in.id() : 0;
  t.k_max = in.flag(3) ? in.id() : std::numeric_limits<std::int32_t>::max();
  return t;
}

template <class D>
select::reserved<D> read_reserved(fuzz_input& in, D dynamic) {
  select::reserved<D> r;
  r.sink = in.flag() ? in.id() : 0;
  r.local = in.flag() ? in.id() : 0;
  r.recency = in.flag();
  r.importance = in.flag() ? in.score() : 0.0f;
  r.dynamic = dynamic;
  return r;
}

template <class S>
void check(const S& sel, fuzz_input& in) {
  if (in.flag(5)) {
    check_select_all(sel, in);
  } else {
    check_row(sel, in);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in(data, size);
  switch (in.u8() % 4) {
    case 0: check(select::top_k{in.id()}, in); break;
    case 1: check(read_threshold(in), in); break;
    case 2: check(read_reserved(in, select::top_k{in.id()}), in); break;
    default: check(read_reserved(in, read_threshold(in)), in); break;
  }
  return 0;
}
