#pragma once
// skim::parallel_for — a small fork-join over std::thread, for executors' work items.
//
//   skim::parallel_for(items, threads, [&](std::int32_t slot, std::int64_t first, std::int64_t last) { ... });
//
// Items [0, n) are handed out one at a time from a shared atomic counter (dynamic: causal prefill
// units differ in cost by up to the sequence length), to `threads` workers numbered by slot
// 0..threads-1; slot 0 is the calling thread. Which worker runs an item is not deterministic, so
// callers make each item's result independent of it (skim's executors do: an item's output depends
// only on the item, never on its slot's scratch contents or on the order of items).
//
// Cost: each call spawns threads - 1 std::threads and joins them (tens of microseconds, and
// std::thread allocates). That is fine for a prefill call; an engine that runs many small calls
// (decode steps) should run executors' items on its own persistent pool (run_items) instead.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

namespace skim {

// Upper bound on workers of one parallel_for (the callers keep per-slot state in fixed arrays).
inline constexpr std::int32_t max_parallel_threads = 64;

// Runs f(slot, i, i + 1) for every i in [0, n), on min(threads, n, max_parallel_threads) workers.
// f must not throw. threads <= 1 runs everything on the calling thread, in order, without spawning.
template <class F>
void parallel_for(std::int64_t n, std::int32_t threads, F&& f) {
  const std::int64_t workers64 = std::min<std::int64_t>({static_cast<std::int64_t>(threads), n,
                                                         static_cast<std::int64_t>(max_parallel_threads)});
  const std::int32_t workers = static_cast<std::int32_t>(workers64);
  if (workers <= 1) {
    for (std::int64_t i = 0; i < n; ++i) f(std::int32_t{0}, i, i + 1);
    return;
  }
  std::atomic<std::int64_t> next{0};
  const auto work = [&](std::int32_t slot) {
    for (std::int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      f(slot, i, i + 1);
    }
  };
  std::thread pool[max_parallel_threads];
  for (std::int32_t s = 1; s < workers; ++s) pool[s] = std::thread(work, s);
  work(0);
  for (std::int32_t s = 1; s < workers; ++s) pool[s].join();
}

}  // namespace skim
