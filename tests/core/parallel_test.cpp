// skim::parallel_for: every item once, on slots below min(threads, n, max_parallel_threads), slot 0
// on the calling thread, one thread per slot; threads <= 1 runs the items in order on the caller.
// (f must not throw: that is the caller's precondition, so nothing here throws.)
#include "skim/core/parallel.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "support/seed.hpp"

using namespace skim;

namespace {

// What one call saw: per item, how often it ran, its slot, the thread that ran it and the
// `last` argument it got.
struct trace {
  std::vector<std::atomic<int>> runs;
  std::vector<std::int32_t> slot, last_minus_first;
  std::vector<std::thread::id> thread;
  std::vector<std::uint64_t> value;  // a function of the item alone
  std::atomic<int> bad_slots{0};

  explicit trace(std::int64_t n)
      : runs(static_cast<std::size_t>(std::max<std::int64_t>(n, 0))),
        slot(runs.size(), -1),
        last_minus_first(runs.size(), -1),
        thread(runs.size()),
        value(runs.size(), 0) {}
};

std::uint64_t item_value(std::int64_t i, std::uint64_t salt) {
  std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull + salt;
  for (int r = 0; r < 8; ++r) x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ull;  // a little work per item
  return x;
}

void run(trace& t, std::int64_t n, std::int32_t threads, std::uint64_t salt) {
  const std::int64_t workers = std::min<std::int64_t>({threads, n, max_parallel_threads});
  parallel_for(n, threads, [&](std::int32_t slot, std::int64_t first, std::int64_t last) {
    if (slot < 0 || slot >= std::max<std::int64_t>(workers, 1)) t.bad_slots.fetch_add(1);
    if (first < 0 || first >= n) {
      t.bad_slots.fetch_add(1);
      return;
    }
    const auto i = static_cast<std::size_t>(first);
    t.runs[i].fetch_add(1);
    t.slot[i] = slot;
    t.last_minus_first[i] = static_cast<std::int32_t>(last - first);
    t.thread[i] = std::this_thread::get_id();
    t.value[i] = item_value(first, salt);
  });
}

}  // namespace

TEST_CASE("parallel_for: each item exactly once, on a valid slot, for any item and thread count") {
  const std::uint32_t seed = skim::test::next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const std::int32_t thread_counts[] = {-3, 0, 1, 2, 3, 5, 8, 64, 65, 200};
  for (int trial = 0; trial < 24; ++trial) {
    const std::int64_t n = trial < 4 ? std::int64_t{trial} : std::uniform_int_distribution<std::int64_t>(0, 700)(rng);
    const std::int32_t threads = thread_counts[static_cast<std::size_t>(trial) % std::size(thread_counts)];
    INFO("n ", n, ", threads ", threads);
    trace t(n);
    run(t, n, threads, seed);
    CHECK(t.bad_slots.load() == 0);
    std::int64_t once = 0;
    for (std::size_t i = 0; i < t.runs.size(); ++i) once += t.runs[i].load() == 1;
    CHECK(once == n);
    CHECK(std::all_of(t.last_minus_first.begin(), t.last_minus_first.end(), [](std::int32_t d) { return d == 1; }));

    // One thread per slot, a different one for each slot, and slot 0 is the caller.
    std::vector<std::set<std::thread::id>> by_slot(max_parallel_threads);
    for (std::size_t i = 0; i < t.slot.size(); ++i) {
      if (t.slot[i] >= 0 && t.slot[i] < max_parallel_threads) {
        by_slot[static_cast<std::size_t>(t.slot[i])].insert(t.thread[i]);
      }
    }
    std::set<std::thread::id> all;
    std::size_t used_slots = 0;
    for (const auto& ids : by_slot) {
      CHECK(ids.size() <= 1);
      if (!ids.empty()) {
        ++used_slots;
        all.insert(*ids.begin());
      }
    }
    CHECK(all.size() == used_slots);
    if (!by_slot[0].empty()) CHECK(*by_slot[0].begin() == std::this_thread::get_id());
    const std::int64_t workers = std::min<std::int64_t>({threads, n, max_parallel_threads});
    CHECK(used_slots <= static_cast<std::size_t>(std::max<std::int64_t>(1, workers)));
  }
}

TEST_CASE("parallel_for: threads <= 1 (and n <= 1) runs the items in order on the calling thread") {
  for (const std::int32_t threads : {-1, 0, 1, 4}) {
    for (const std::int64_t n : {std::int64_t{-5}, std::int64_t{0}, std::int64_t{1}, std::int64_t{37}}) {
      if (threads > 1 && n > 1) continue;  // parallel: order not promised
      INFO("n ", n, ", threads ", threads);
      std::vector<std::int64_t> order;
      std::set<std::thread::id> threads_seen;
      std::set<std::int32_t> slots;
      parallel_for(n, threads, [&](std::int32_t slot, std::int64_t first, std::int64_t last) {
        order.push_back(first);
        CHECK(last == first + 1);
        slots.insert(slot);
        threads_seen.insert(std::this_thread::get_id());
      });
      std::vector<std::int64_t> want;
      for (std::int64_t i = 0; i < n; ++i) want.push_back(i);
      CHECK(order == want);
      if (n > 0) {
        CHECK(slots == std::set<std::int32_t>{0});
        CHECK(threads_seen == std::set<std::thread::id>{std::this_thread::get_id()});
      }
    }
  }
}

TEST_CASE("parallel_for: per-item results are the same for 1..N threads") {
  const std::uint32_t seed = skim::test::next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const std::int64_t n = std::uniform_int_distribution<std::int64_t>(200, 2000)(rng);
  trace one(n);
  run(one, n, 1, seed);
  // Not a constant: the items' values differ.
  REQUIRE(n > 2);
  CHECK(one.value[0] != one.value[1]);
  for (std::int32_t threads = 2; threads <= 9; ++threads) {
    INFO("threads ", threads);
    trace many(n);
    run(many, n, threads, seed);
    CHECK(many.value == one.value);
  }
  // More than one worker really ran when asked for several (items are handed out dynamically, so
  // one busy caller could in principle take them all: look over several calls).
  bool several = false;
  for (int attempt = 0; attempt < 20 && !several; ++attempt) {
    trace t(n);
    parallel_for(n, 4, [&](std::int32_t slot, std::int64_t first, std::int64_t) {
      t.slot[static_cast<std::size_t>(first)] = slot;
      std::this_thread::yield();  // give the spawned workers a chance at the counter
    });
    several = std::any_of(t.slot.begin(), t.slot.end(), [](std::int32_t s) { return s != 0; });
  }
  CHECK(several);
}
