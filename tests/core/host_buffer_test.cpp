// host_buffer<T> (core/host_buffer.hpp): sizes, alignment below and from huge_page_bytes on, values,
// moves; and, on Linux with transparent huge pages, that a large buffer's mapping carries the
// huge-page advice (the "hg" flag of /proc/self/smaps), where advice shows there at all.
#include "skim/core/host_buffer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "skim/core/dtypes.hpp"
#include "skim/core/workspace.hpp"
#include "support/seed.hpp"

using namespace skim;

namespace {

[[nodiscard]] std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

#if defined(__linux__)
// The VmFlags of the mapping of /proc/self/smaps that holds p, or "" if none does.
[[nodiscard]] std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= address(p) && address(p) < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return {};
}
#endif

}  // namespace

TEST_CASE("host_buffer: sizes, alignment, values") {
  const std::uint32_t seed = test::next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const host_buffer<float> none;
  CHECK(none.empty());
  CHECK(none.data() == nullptr);
  CHECK(host_buffer<float>(0).data() == nullptr);

  // Below 2 MiB: 64-byte aligned. From huge_page_bytes on: 2 MiB aligned.
  std::vector<std::size_t> sizes = {1, 3, 1000, huge_page_bytes / sizeof(float) - 1, huge_page_bytes / sizeof(float),
                                    3 * huge_page_bytes / sizeof(float) + 5};
  for (int i = 0; i < 4; ++i) sizes.push_back(std::uniform_int_distribution<std::size_t>(1, 1u << 20)(rng));
  for (const std::size_t n : sizes) {
    INFO("floats ", n);
    const float fill = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
    host_buffer<float> b(n, fill);
    REQUIRE(b.size() == n);
    CHECK(address(b.data()) % 64 == 0);
    if (n * sizeof(float) >= huge_page_bytes) CHECK(address(b.data()) % huge_page_bytes == 0);
    CHECK(std::all_of(b.begin(), b.end(), [&](float x) { return x == fill; }));
    CHECK(b.span().size() == n);
    b[n - 1] = fill + 1.0f;
    CHECK(b.span()[n - 1] == fill + 1.0f);
  }
  const host_buffer<std::int32_t> zeros(777);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](std::int32_t x) { return x == 0; }));
  const host_buffer<half> halves(5, half::from_float(1.5f));
  CHECK(halves[4].to_float() == 1.5f);
}

TEST_CASE("host_buffer: moves hand over the array; the source is left empty") {
  host_buffer<float> a(huge_page_bytes / sizeof(float) + 1, 2.0f);
  const float* p = a.data();
  host_buffer<float> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  CHECK(a.data() == nullptr);
  host_buffer<float> c(10, 1.0f);
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(c.size() == huge_page_bytes / sizeof(float) + 1);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  c = host_buffer<float>();
  CHECK(c.empty());
}

TEST_CASE("host_buffer and workspace_buffer: large arrays carry the huge-page advice on Linux") {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) return;  // no THP in this kernel
  {  // Does this process see advice in smaps at all? Not under user-mode emulation (qemu ignores it).
    void* probe = ::mmap(nullptr, 2 * huge_page_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(probe != MAP_FAILED);
    const bool reported = ::madvise(probe, 2 * huge_page_bytes, MADV_HUGEPAGE) == 0 &&
                          vm_flags_at(probe).find(" hg") != std::string::npos;
    ::munmap(probe, 2 * huge_page_bytes);
    if (!reported) {
      MESSAGE("madvise(MADV_HUGEPAGE) does not show in /proc/self/smaps here: the advice is not checked");
      return;
    }
  }
  const host_buffer<float> large(4 * huge_page_bytes / sizeof(float));
  const std::string flags = vm_flags_at(large.data());
  INFO(flags);
  REQUIRE(!flags.empty());
  CHECK(flags.find(" hg") != std::string::npos);
  const workspace_buffer ws(4 * huge_page_bytes);
  CHECK(address(ws.span().data()) % huge_page_bytes == 0);
  CHECK(vm_flags_at(ws.span().data()).find(" hg") != std::string::npos);
  // A small one is left to the allocator: no alignment beyond its own, no advice asked.
  const host_buffer<float> small(1000);
  CHECK(address(small.data()) % 64 == 0);
#endif
}
