#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"

using namespace skim;

namespace {

// block_table's ids behind a cursor without skip(): for_each_block_id must walk it from the start.
struct walk_only {
  index::block_table table;
  struct cursor_type {
    index::detail::span_cursor c;
    [[nodiscard]] bool done() const noexcept { return c.done(); }
    [[nodiscard]] std::int32_t id() const noexcept { return c.id(); }
    void next() noexcept { c.next(); }
  };
  [[nodiscard]] cursor_type cursor(const row_info& r) const noexcept { return {table.cursor(r)}; }
  [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
};
static_assert(block_index<walk_only> && !skippable_cursor<walk_only::cursor_type>);
static_assert(skippable_cursor<index::detail::span_cursor> && skippable_cursor<index::range_cursor>);

// Ids of row r from position first, at most n of them (n < 0: to the end), or the walk's status.
template <class Index>
status window(const Index& index, const row_info& r, std::int64_t first, std::int64_t n, std::vector<std::int32_t>& out) {
  out.clear();
  return for_each_block_id(
      index, r,
      [&](std::int32_t id) {
        out.push_back(id);
        return n < 0 || static_cast<std::int64_t>(out.size()) < n;
      },
      first);
}

}  // namespace

TEST_CASE("for_each_block_id: windows of a row, skipped to or walked to, give the row's ids") {
  std::mt19937 rng(0x5eed);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int32_t visible = 1 + static_cast<std::int32_t>(rng() % 300);
    std::vector<std::int32_t> ids;
    for (std::int32_t b = 0; b < visible; ++b)
      if (rng() % 3 == 0) ids.push_back(b);
    const std::vector<std::int32_t> count{static_cast<std::int32_t>(ids.size())};
    const std::int32_t width = static_cast<std::int32_t>(ids.size()) + 2;
    std::vector<std::int32_t> storage(ids);
    storage.resize(static_cast<std::size_t>(width), -1);
    const index::block_table table{storage, count, width};
    const row_info r{.row = 0, .kv_blocks = visible, .visible_blocks = visible};
    const std::int64_t chunk = 1 + static_cast<std::int64_t>(rng() % 7);
    std::vector<std::int32_t> joined, walked, part;
    for (std::int64_t first = 0; first < static_cast<std::int64_t>(ids.size()) + chunk; first += chunk) {
      REQUIRE(window(table, r, first, chunk, part).ok());
      joined.insert(joined.end(), part.begin(), part.end());
      REQUIRE(window(walk_only{table}, r, first, chunk, part).ok());
      walked.insert(walked.end(), part.begin(), part.end());
    }
    CHECK(joined == ids);
    CHECK(walked == ids);
    // An id range (causal_all) skips too.
    REQUIRE(window(index::causal_all{}, r, visible / 2, -1, part).ok());
    CHECK(static_cast<std::int32_t>(part.size()) == visible - visible / 2);
    CHECK((part.empty() || part.front() == visible / 2));
  }
}

TEST_CASE("for_each_block_id: a window checks its ids and the one before it") {
  const row_info r{.row = 0, .kv_blocks = 6, .visible_blocks = 6};
  std::vector<std::int32_t> part;
  {
    const std::vector<std::int32_t> ids{0, 3, 2, 5}, count{4};
    const index::block_table t{ids, count, 4};
    const status s = window(t, r, 2, 2, part);  // id 2 after id 3 (the id before the window)
    CHECK(s.code() == status_code::invalid_index);
    CHECK(std::string(s.message()) == "block id 2 after 3 in row 0 (ids must ascend strictly)");
    CHECK(window(t, r, 3, 1, part).ok());  // ids 2, 5: fine on their own
    CHECK(window(walk_only{t}, r, 3, 1, part).code() == status_code::invalid_index);  // walked from 0: sees 3, 2
  }
  {
    const std::vector<std::int32_t> ids{0, 9, 10}, count{3};
    const index::block_table t{ids, count, 3};
    const status s = window(t, r, 2, 1, part);  // the id before the window is out of the row
    CHECK(s.code() == status_code::invalid_index);
    CHECK(std::string(s.message()) == "block id 9 >= visible blocks 6 in row 0");
    CHECK(part.empty());
  }
}
