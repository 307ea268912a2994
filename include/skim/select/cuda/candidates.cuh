#pragma once
// The routed selection in two halves: the score kernel's CTA of a tile of candidate_tile blocks keeps
// the tile's best (keep_tile_candidates, route/cuda/score_kernel.cuh), and decode selects the row's best
// among the tiles' kept candidates (select_candidates). The row's best `take` are each among their
// tile's best `take`, so the two halves choose select_row's ids (select/cuda/select_row.cuh); the
// second ranks a few candidates a tile instead of every block.

#include <cstdint>

#include "skim/select/cuda/select_row.cuh"

namespace skim::cuda::detail::route_impl {

// A candidate is a 64-bit word: the score's rank_key above the complement of its block id, so a
// larger word ranks first (by key, then the lower id), as select_row ranks; 0 is an empty slot (every
// key is at least rank_key(-inf) > 0).
inline constexpr int candidate_tile = 128;  // blocks of a tile: the score kernel's CTA (one block a thread)

[[nodiscard]] __device__ __forceinline__ std::uint64_t candidate(float score, int id) noexcept {
  return static_cast<std::uint64_t>(rank_key(score)) << 32 | static_cast<std::uint32_t>(~id);
}
[[nodiscard]] __device__ __forceinline__ int candidate_id(std::uint64_t c) noexcept {
  return ~static_cast<int>(static_cast<std::uint32_t>(c));
}

// Slots a tile keeps for a top-k of k: the most candidates of one tile a row can take.
[[nodiscard]] SKIM_HOST_DEVICE constexpr int candidate_slots(int k) noexcept {
  return k < candidate_tile ? (k > 0 ? k : 0) : candidate_tile;
}

// Shared memory of keep_tile_candidates.
struct alignas(16) tile_scratch {
  std::uint64_t c[candidate_tile];          // each warp's candidates, best first, warp w's at [32 w, 32 w + 32)
  std::uint32_t kept[candidate_tile / 32];  // the kept blocks of the tile, a bit each
};

// How many of a warp's sorted candidates (best first, then empty slots) rank before c.
[[nodiscard]] __device__ __forceinline__ int ranked_before(const std::uint64_t* list, std::uint64_t c) noexcept {
  int n = list[15] > c ? 16 : 0;
  n += list[n + 7] > c ? 8 : 0;
  n += list[n + 3] > c ? 4 : 0;
  n += list[n + 1] > c ? 2 : 0;
  n += list[n] > c ? 1 : 0;
  return n == 31 && list[31] > c ? 32 : n;
}

// First half, in a CTA of candidate_tile threads: thread j holds block id = j0 + j (j0 a multiple of
// candidate_tile) and its score (any value past the row's visible blocks). Keeps the tile's best
// plan.take candidates (blocks in [plan.a, plan.bb)), or all it has if fewer, and writes them in id
// order to out[0, kept), 0 to out[kept, slots). Each warp sorts its 32 (a bitonic network over its
// lanes); a candidate's rank in the tile is its place in its warp's list plus, found by binary
// search, how many of each other warp's rank before it. @pre chooses(plan); slots ==
// candidate_slots(k) of the plan's k; called by all threads (barriers inside)
__device__ __forceinline__ void keep_tile_candidates(float score, int id, const row_plan& plan, int slots,
                                                     std::uint64_t* out, tile_scratch& s) noexcept {
  constexpr int warps = candidate_tile / 32;
  const int j = static_cast<int>(threadIdx.x);
  const int lane = j % 32, warp = j / 32;
  std::uint64_t c = id >= plan.a && id < plan.bb ? candidate(score, id) : 0;
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {  // the warp's candidates, best first
#pragma unroll
    for (int d = k / 2; d > 0; d /= 2) {
      const std::uint64_t o = __shfl_xor_sync(full_mask, c, d);
      const bool larger = ((lane & d) == 0) == ((lane & k) == 0);  // keep the larger of the pair
      c = larger == (o > c) ? o : c;
    }
  }
  s.c[j] = c;
  if (j < warps) s.kept[j] = 0;
  __syncthreads();
  bool keep = false;
  if (c != 0 && lane < plan.take) {
    int rank = lane;
#pragma unroll
    for (int w = 0; w < warps; ++w) rank += w == warp ? 0 : ranked_before(s.c + 32 * w, c);
    keep = rank < plan.take;
  }
  const int local = candidate_id(c) % candidate_tile;  // the kept block's place in the tile
  if (keep) atomicOr(&s.kept[local / 32], 1u << (local % 32));
  __syncthreads();
  int total = 0, before = 0;
#pragma unroll
  for (int w = 0; w < warps; ++w) {
    const int n = __popc(s.kept[w]);
    total += n;
    before += w < local / 32 ? n : 0;
  }
  if (keep) out[before + __popc(s.kept[local / 32] & ((1u << (local % 32)) - 1u))] = c;
  if (j >= total && j < slots) out[j] = 0;
}

// Shared memory entries select_candidates needs for up to m slots: m rounded up to whole groups of 8
// (each thread ranks against a group at a time), and one group more, all past m zero, so that a
// group loaded ahead of the loop's test stays inside.
[[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t candidate_entries(std::int64_t m) noexcept {
  return (m + 7) / 8 * 8 + 8;
}

// Second half: select_row's ids from the candidates the row's tiles kept. tiles: the row's first
// tile's slots (tile t at t · slots). cands: shared, candidate_entries(m) for the m slots of the
// tiles that hold the row's candidates [a, bb); each thread ranks a contiguous run of them against
// all. Returns count. Called by all Threads threads with the same arguments (barriers inside); out
// is complete once a barrier follows. @pre width >= count; the tiles' slots as keep_tile_candidates
// wrote them for this plan; m <= 32 · Threads
template <int Threads>
[[nodiscard]] __device__ __forceinline__ int select_candidates(const row_plan& plan, const std::uint64_t* tiles,
                                                               int slots, std::int32_t* out, int width,
                                                               std::uint64_t* cands, select_scratch& s) noexcept {
  const int tid = static_cast<int>(threadIdx.x);
  write_reserved<Threads>(plan, out, width);
  if (!chooses(plan)) return plan.count;
  const int t0 = plan.a / candidate_tile;
  const int m = ((plan.bb - 1) / candidate_tile + 1 - t0) * slots;
  const auto entries = static_cast<int>(candidate_entries(m));
  const std::uint64_t* src = tiles + static_cast<std::ptrdiff_t>(t0) * slots;
  for (int i = tid; i < entries; i += Threads) cands[i] = i < m ? src[i] : 0;
  __syncthreads();
  // Slots in order hold candidates in id order (tiles in order, each in id order, empty slots never
  // chosen: the kept candidates outnumber take). Chosen: rank < take; written at a + the chosen
  // before it, found by one scan over the threads' runs.
  const int per = (m + Threads - 1) / Threads;
  const int first = tid * per < m ? tid * per : m;
  const int last = first + per < m ? first + per : m;
  std::uint32_t chosen = 0;  // bit i - first: candidate i is chosen
  for (int i = first; i < last; ++i) {
    const std::uint64_t c = cands[i];
    int above = 0;
    for (int x = 0; x < entries - 8; x += 8) {
#pragma unroll
      for (int u = 0; u < 8; ++u) above += cands[x + u] > c ? 1 : 0;
    }
    if (c != 0 && above < plan.take) chosen |= 1u << (i - first);
  }
  std::uint32_t before = block_exclusive_scan<Threads>(static_cast<std::uint32_t>(__popc(chosen)), s.warp_sums);
  for (int i = first; i < last; ++i) {
    if ((chosen >> (i - first) & 1u) != 0) out[plan.a + static_cast<int>(before++)] = candidate_id(cands[i]);
  }
  return plan.count;
}

}  // namespace skim::cuda::detail::route_impl
