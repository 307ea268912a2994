#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "skim/core/status.hpp"

using namespace skim;

namespace {
status check_positive(int v, const char* where) {
  if (v <= 0) return status::error(status_code::invalid_argument, "%s %d <= 0", where, v);
  return status::success();
}
status two_checks(int a, int b) {
  SKIM_TRY(check_positive(a, "a"));
  SKIM_TRY(check_positive(b, "b"));
  return status::success();
}
}  // namespace

TEST_CASE("status carries a code and a formatted message") {
  const status ok;
  CHECK(ok.ok());
  CHECK(std::string_view(ok.message()) == "ok");
  const status s = status::error(status_code::invalid_index, "block id %d >= kv blocks %d in row %lld", 97, 96, 12LL);
  CHECK_FALSE(s.ok());
  CHECK(s.code() == status_code::invalid_index);
  CHECK(std::string_view(s.message()) == "block id 97 >= kv blocks 96 in row 12");
  CHECK(to_string(s.code()) == "invalid_index");
}

TEST_CASE("SKIM_TRY returns the first failure") {
  CHECK(two_checks(1, 2).ok());
  CHECK(std::string_view(two_checks(1, -3).message()) == "b -3 <= 0");
  CHECK(std::string_view(two_checks(0, -3).message()) == "a 0 <= 0");
}

TEST_CASE("long messages are cut, never overflow") {
  const std::string long_name(1000, 'x');
  const status s = status::error(status_code::shape_mismatch, "%s", long_name.c_str());
  CHECK(std::string_view(s.message()).size() == static_cast<std::size_t>(status::max_message - 1));
}
