// workspace_arena: measuring and carving give the same layout; spans are aligned and disjoint.
#include "skim/core/workspace.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string_view>

#include "support/random_case.hpp"

using namespace skim;

TEST_CASE("workspace_arena: measure then carve the same takes") {
  const auto takes = [](workspace_arena& a) {
    struct spans {
      std::span<float> f;
      std::span<std::int32_t> i;
      std::span<double> d;
    } s{a.take<float>(5), a.take<std::int32_t>(17), a.take<double>(3)};
    return s;
  };
  workspace_arena measure;
  const auto m = takes(measure);
  CHECK(m.f.empty());
  CHECK(measure.bytes() == 64 + 128 + 24);  // 20 -> 64, 68 -> 128, then 24

  test::aligned_workspace ws(measure.bytes());
  REQUIRE(check_workspace(ws.bytes, measure.bytes()).ok());
  workspace_arena carve(ws.bytes);
  const auto c = takes(carve);
  CHECK(carve.bytes() == measure.bytes());
  CHECK(c.f.size() == 5);
  CHECK(c.i.size() == 17);
  CHECK(c.d.size() == 3);
  for (const void* p : {static_cast<const void*>(c.f.data()), static_cast<const void*>(c.i.data()),
                        static_cast<const void*>(c.d.data())}) {
    CHECK(reinterpret_cast<std::uintptr_t>(p) % workspace_alignment == 0);
  }
  CHECK(reinterpret_cast<const std::byte*>(c.i.data()) >= reinterpret_cast<const std::byte*>(c.f.data() + 5));
  CHECK(reinterpret_cast<const std::byte*>(c.d.data() + 3) <= ws.bytes.data() + ws.bytes.size());
}

TEST_CASE("workspace_arena: an exhausted arena gives empty spans, never memory past the end") {
  test::aligned_workspace ws(100);
  workspace_arena a(ws.bytes);
  CHECK(a.take<float>(10).size() == 10);
  CHECK(a.take<float>(10).empty());  // would need bytes [64, 104)
  CHECK(a.bytes() == 104);
}

TEST_CASE("check_workspace names both sizes, or the address") {
  test::aligned_workspace ws(256);
  CHECK(check_workspace(ws.bytes, 256).ok());
  CHECK(check_workspace({}, 0).ok());
  const status s = check_workspace(ws.bytes.first(100), 256);
  CHECK(s.code() == status_code::workspace_too_small);
  CHECK(std::string_view(s.message()) == "workspace has 100 bytes, needs 256");
  CHECK(check_workspace(ws.bytes.subspan(8), 16).code() == status_code::misaligned);
}
