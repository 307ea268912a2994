// Regression tests for the crashes and contract breaks the fuzzers (tests/fuzz/, scripts/fuzz)
// found, one test case per finding, each naming the fuzz target that found it.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../examples/common/npy.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/select_all.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"

using namespace skim;

TEST_CASE("fuzz regression (select_fuzz): reserved::max_count is never negative, even for sink < 0") {
  // Was: min(sink, v) + ... = -3 for sink = -5, so select::max_count(sel, p), the documented way to
  // size a block_table, returned a negative width before validate() could report the parameter.
  const select::reserved<select::threshold> sel{.sink = -5, .local = 0, .recency = false,
                                                .dynamic = {.k_min = 0, .k_max = 2}};
  for (std::int32_t v : {0, 1, 3, 10}) {
    CHECK(sel.max_count(v) >= 0);
    CHECK(sel.max_count(v) <= v);
  }
  const select::reserved<select::top_k> with_top_k{.sink = -1, .recency = false, .dynamic = {.k = 0}};
  CHECK(with_top_k.max_count(4) == 0);
  // The bad parameter is still reported, by validate() and by select_row.
  CHECK(std::string(sel.validate().message()) == "reserved sink -5 < 0");
  const std::vector<float> scores{1.0f, 2.0f, 3.0f};
  row_scores in{.scores = scores};
  in.row.visible_blocks = 3;
  in.row.kv_blocks = 3;
  std::vector<std::int32_t> out(3, -7);
  std::int32_t count = -1;
  const status s = sel.select_row(in, out, count, {});
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string(s.message()) == "reserved sink -5 < 0");
  CHECK(count == 0);
  CHECK(out == std::vector<std::int32_t>(3, -7));
}

TEST_CASE("fuzz regression (npy_fuzz): an empty array parse() accepts serialises, whatever its other dims") {
  // Was: parse() accepted shape (2^40, 2^40, 0) (a zero dimension makes the array empty), but
  // serialize() multiplied the other dimensions first and refused the shape as overflowing.
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776, 0), }\n";
  std::vector<std::byte> bytes;
  for (const int c : {0x93, int{'N'}, int{'U'}, int{'M'}, int{'P'}, int{'Y'}, 1, 0}) {
    bytes.push_back(static_cast<std::byte>(c));
  }
  bytes.push_back(std::byte{static_cast<unsigned char>(header.size() & 0xff)});
  bytes.push_back(std::byte{static_cast<unsigned char>(header.size() >> 8)});
  for (char c : header) bytes.push_back(static_cast<std::byte>(c));
  npy::array a;
  REQUIRE(npy::parse(bytes, a).ok());
  CHECK(a.data.empty());
  std::vector<std::byte> again;
  const status s = npy::serialize(a.shape, a.data, again);
  REQUIRE(s.ok());
  npy::array b;
  REQUIRE(npy::parse(again, b).ok());
  CHECK(b.shape == a.shape);
  // A non-empty shape that overflows is still refused.
  const std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 40};
  CHECK(std::string(npy::serialize(huge, {}, again).message()) == "npy: shape [1099511627776, 1099511627776] overflows");
}
