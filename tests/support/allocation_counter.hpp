#pragma once
// Counts global operator new calls, so tests can prove that a hot path does not allocate.
// tests/main.cpp replaces the global operator new/delete of the test binary with versions that
// forward to malloc/free and count while an allocation_counter is alive.
//
//   skim::test::allocation_counter counter;
//   REQUIRE(exec.run(args, ws).ok());
//   CHECK(counter.stop() == 0);

#include <atomic>
#include <cstddef>

namespace skim::test {

inline std::atomic<bool> counting_allocations{false};
inline std::atomic<long> allocations_counted{0};

// Counts allocations made while alive (or until stop()).
struct allocation_counter {
  allocation_counter() noexcept {
    allocations_counted = 0;
    counting_allocations = true;
  }
  ~allocation_counter() { counting_allocations = false; }
  allocation_counter(const allocation_counter&) = delete;
  allocation_counter& operator=(const allocation_counter&) = delete;
  long stop() noexcept {
    counting_allocations = false;
    return allocations_counted.load();
  }
};

}  // namespace skim::test
