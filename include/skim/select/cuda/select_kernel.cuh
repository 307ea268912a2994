#pragma once
// The select kernel of skim::cuda::decode_router (route/cuda/decode_router.cuh holds the host API and the contract: the
// bits of the CPU pipeline, reserved blocks and ties; route/cuda/score_kernel.cuh the score kernel whose
// scores it reads). It needs nothing of the score kernel's code, so decode, which runs select_row
// for a routed table, includes this header alone.
//
// One CTA of 1024 threads per (sequence, index head), or per sequence for shared rows (the heads'
// scores pooled first, route/head_pool.hpp). Order-preserving 32-bit keys of the
// candidates' scores in shared memory (<= max_blocks), a 4-pass radix select (8 bits a pass,
// warp-aggregated shared-memory histograms) finds the k-th best key and how many of its ties to
// keep; one block-wide scan in id order writes the chosen ids ascending (ties: lower ids first).
// select_row is that selection for any CTA size: the select kernel runs it with 1024 threads, decode's
// split kernels with 256 for a device_routed_table (selected where it is read: no select launch).
//
// Or in two halves: the score kernel's CTA of a tile of candidate_tile blocks keeps the tile's best
// (keep_tile_candidates), and decode selects the row's best among the tiles' kept candidates
// (select_candidates). The row's best `take` are each among their tile's best `take`, so the two
// halves choose select_row's ids; the second ranks a few candidates a tile instead of every block.

#include <cstddef>
#include <cstdint>

#include "skim/core/cuda/common.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/index/block_table.hpp"
#include "skim/route/head_pool.hpp"

namespace skim::cuda {

namespace detail::route_impl {

// Select kernel geometry.
inline constexpr int select_threads = 1024;  // a row of up to 1024 candidates: one key per thread and pass
inline constexpr int radix_bins = 256;

struct select_params {
  std::int32_t k = 0;         // top_k's k
  std::int32_t sink = 0;      // reserved's sink
  std::int32_t newest = 0;    // reserved's max(local, recency ? 1 : 0)
  std::int64_t stride = 0;    // floats per score row
  bool relative = true;       // shared rows: head_pool::relative (else head_pool::max)
};

// Order-preserving key of a score: a larger key ranks first; NaN ranks as -inf, -0 as +0.
[[nodiscard]] __device__ __forceinline__ std::uint32_t rank_key(float x) noexcept {
  const std::uint32_t u = x != x ? __float_as_uint(neg_inf) : (x == 0.0f ? 0u : __float_as_uint(x));
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Shared memory of one CTA's selection besides its keys (select_row).
struct alignas(16) select_scratch {
  std::uint32_t hist[radix_bins];
  std::uint32_t warp_sums[32];
  float warp_best[32];
  std::uint32_t found_prefix;
  std::int32_t found_remaining;
};

// Exclusive prefix sum of x over the CTA's Threads threads in thread order. warp_sums: [32] shared.
template <int Threads>
[[nodiscard]] __device__ __forceinline__ std::uint32_t block_exclusive_scan(std::uint32_t x,
                                                                            std::uint32_t* warp_sums) noexcept {
  constexpr int warps = Threads / 32;
  static_assert(Threads % 32 == 0 && warps <= 32, "the warp sums are scanned in one warp");
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  std::uint32_t incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const std::uint32_t y = __shfl_up_sync(full_mask, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const std::uint32_t w = lane < warps ? warp_sums[lane] : 0u;
    std::uint32_t wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const std::uint32_t y = __shfl_up_sync(full_mask, wi, o);
      if (lane >= o) wi += y;
    }
    if (lane < warps) warp_sums[lane] = wi - w;
  }
  __syncthreads();
  return incl - x + warp_sums[warp];
}

// The largest of every thread's x (fmaxf; equal for any order up to the sign of a zero maximum, which
// selection ranks as +0). warp_best: [32] shared. @pre called by all Threads threads of the CTA
template <int Threads>
[[nodiscard]] __device__ __forceinline__ float block_max(float x, float* warp_best) noexcept {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(full_mask, x, o));
  __syncthreads();  // warp_best's previous use is over
  if (lane == 0) warp_best[warp] = x;
  __syncthreads();
  float m = warp_best[0];
  for (int w = 1; w < Threads / 32; ++w) m = fmaxf(m, warp_best[w]);
  return m;
}

// The keys of a shared row: for candidate i of [a, a + n), the query block's heads' scores pooled as
// route/head_pool.hpp defines it (head_pool_offset over the visible blocks [0, v), then the fold over
// the heads in order), as order-preserving keys. Each thread pools its own candidates, in keys.
template <int Threads>
__device__ __forceinline__ void pool_heads(const device_problem& p, const float* seq_scores, const select_params& sp,
                                           int a, int n, int v, std::uint32_t* keys, float* warp_best) noexcept {
  const int tid = static_cast<int>(threadIdx.x);
  float* pooled = reinterpret_cast<float*>(keys);
  for (int h = 0; h < p.index_heads(); ++h) {
    const float* hs = seq_scores + h * sp.stride;
    float offset = 0.0f;
    if (sp.relative) {
      float best = neg_inf;
      for (int j = tid; j < v; j += Threads) {
        const float x = hs[j];
        best = isfinite(x) && x > best ? x : best;
      }
      best = block_max<Threads>(best, warp_best);
      offset = isfinite(best) ? best : 0.0f;
    }
    for (int i = tid; i < n; i += Threads) pooled[i] = pool_fold(h, hs[a + i] - offset, pooled[i]);
  }
  for (int i = tid; i < n; i += Threads) keys[i] = rank_key(pooled[i]);
}

// The k-th best of keys [0, n) and its ties: the threshold key and how many candidates equal to it
// are kept (`remaining`), by a 4-pass radix select (8 bits a pass from the top, warp-aggregated
// shared-memory histograms). @pre 0 < take < n; keys written and visible to the CTA's threads
template <int Threads>
__device__ __forceinline__ void radix_threshold(const std::uint32_t* keys, int n, int take, select_scratch& s,
                                                std::uint32_t& threshold, int& remaining) noexcept {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  // Invariant: at least `remaining` >= 1 candidates match `prefix` under `mask`, and take - remaining
  // candidates beat it.
  std::uint32_t prefix = 0, mask = 0;
  remaining = take;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < radix_bins; i += Threads) s.hist[i] = 0;
    __syncthreads();  // hist zeroed (and, the first time, keys written)
    for (int base = 0; base < n; base += Threads) {  // whole warps iterate: __match_any_sync
      const int i = base + tid;
      int bin = -1;
      if (i < n) {
        const std::uint32_t u = keys[i];
        if ((u & mask) == prefix) bin = static_cast<int>((u >> shift) & 0xffu);
      }
      const unsigned peers = __match_any_sync(full_mask, bin);
      if (bin >= 0 && lane == __ffs(static_cast<int>(peers)) - 1) {
        atomicAdd(&s.hist[bin], static_cast<std::uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds bins [8l, 8l + 8); find the bin holding the remaining-th largest
      std::uint32_t c[8];
      std::uint32_t mine = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = s.hist[lane * 8 + e];
        mine += c[e];
      }
      std::uint32_t suffix = mine;  // candidates in bins of lanes >= lane
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const std::uint32_t y = __shfl_down_sync(full_mask, suffix, o);
        if (lane + o < 32) suffix += y;
      }
      const std::uint32_t above = suffix - mine;
      const auto want = static_cast<std::uint32_t>(remaining);
      if (above < want && want <= suffix) {  // exactly one lane
        std::uint32_t seen = above, before = 0;
        int digit = -1;
#pragma unroll
        for (int e = 7; e >= 0; --e) {
          if (digit < 0 && seen + c[e] >= want) {
            digit = lane * 8 + e;
            before = seen;
          }
          seen += c[e];
        }
        s.found_prefix = prefix | (static_cast<std::uint32_t>(digit) << shift);
        s.found_remaining = remaining - static_cast<int>(before);
      }
    }
    __syncthreads();
    prefix = s.found_prefix;
    remaining = s.found_remaining;
    mask |= 0xffu << shift;
  }
  threshold = prefix;
}

// A row of v visible blocks under reserved<top_k>: sink [0, a), local [bb, v), and the top `take` of
// the n candidates [a, bb); count ids in all (never fewer for a longer row).
struct row_plan {
  int a = 0, bb = 0, n = 0, take = 0, count = 0;
  int visible = 0;
};
[[nodiscard]] SKIM_HOST_DEVICE constexpr row_plan plan_row(int v, const select_params& sp) noexcept {
  row_plan r;
  r.visible = v;
  r.a = sp.sink < v ? sp.sink : v;
  const int newest = sp.newest < v ? sp.newest : v;
  r.bb = v - newest > r.a ? v - newest : r.a;
  r.n = r.bb - r.a;
  r.take = sp.k < r.n ? sp.k : r.n;
  r.count = r.a + r.take + (v - r.bb);
  return r;
}

// Whether a row's plan leaves a choice: some but not all of its candidates are taken. Rows without
// one are written by write_reserved alone.
[[nodiscard]] SKIM_HOST_DEVICE constexpr bool chooses(const row_plan& r) noexcept { return r.take > 0 && r.take < r.n; }

// The ids of a row that need no scores: sink [0, a), local past the taken candidates, padding past
// count, and every candidate when all are taken (chooses(plan) false). Called by all Threads threads.
template <int Threads>
__device__ __forceinline__ void write_reserved(const row_plan& plan, std::int32_t* out, int width) noexcept {
  const int tid = static_cast<int>(threadIdx.x);
  const int a = plan.a, take = plan.take, count = plan.count;
  for (int i = tid; i < width; i += Threads) {
    if (i < a) {
      out[i] = i;
    } else if (i >= a + take) {
      out[i] = i < count ? plan.bb + (i - a - take) : index::block_table::pad;
    }
  }
  if (take == plan.n) {
    for (int i = tid; i < plan.n; i += Threads) out[a + i] = a + i;
  }
}

// Selects row (sequence b, index head h; Shared: the sequence's heads pooled) of the router's
// scores as `plan` (plan_row) says: sink, the top `take` candidates by score (ties: lower ids first),
// local, ids ascending in out[0, count), index::block_table::pad in [count, width). Returns count.
// out may be global or shared memory; keys: shared, room for the row's candidates (<= max_blocks).
// Called by all Threads threads with the same arguments (barriers inside); out is complete once a
// barrier follows. @pre width >= count (decode_router::width)
template <int Threads, bool Shared>
[[nodiscard]] __device__ __forceinline__ int select_row(const device_problem& p, const float* scores, int b, int h,
                                                         const row_plan& plan, const select_params& sp,
                                                         std::int32_t* out, int width, std::uint32_t* keys,
                                                         select_scratch& s) noexcept {
  const int tid = static_cast<int>(threadIdx.x);
  const int a = plan.a, n = plan.n, take = plan.take, count = plan.count, v = plan.visible;
  write_reserved<Threads>(plan, out, width);
  if (!chooses(plan)) return count;

  if constexpr (Shared) {
    pool_heads<Threads>(p, scores + static_cast<std::int64_t>(b) * p.index_heads() * sp.stride, sp, a, n, v, keys,
                        s.warp_best);
  } else {
    const float* row_scores = scores + (static_cast<std::int64_t>(b) * p.index_heads() + h) * sp.stride + a;
    constexpr int key_batch = 4;  // loads in flight per thread before their keys are stored
    for (int base = 0; base < n; base += key_batch * Threads) {
      float x[key_batch];
#pragma unroll
      for (int u = 0; u < key_batch; ++u) {
        const int i = base + u * Threads + tid;
        x[u] = i < n ? row_scores[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < key_batch; ++u) {
        const int i = base + u * Threads + tid;
        if (i < n) keys[i] = rank_key(x[u]);
      }
    }
  }
  std::uint32_t threshold = 0;
  int remaining = 0;
  radix_threshold<Threads>(keys, n, take, s, threshold, remaining);

  // Keys above the threshold, and the first `remaining` equal to it in id order, in id order: each
  // thread takes a contiguous run of candidates; one scan counts (above, equal) before it.
  const int per = (n + Threads - 1) / Threads;
  const int first = tid * per < n ? tid * per : n;
  const int last = first + per < n ? first + per : n;
  std::uint32_t packed = 0;  // equal << 16 | above; both <= max_blocks < 2^16
  for (int i = first; i < last; ++i) {
    const std::uint32_t u = keys[i];
    packed += u > threshold ? 1u : (u == threshold ? 1u << 16 : 0u);
  }
  const std::uint32_t before = block_exclusive_scan<Threads>(packed, s.warp_sums);
  std::uint32_t above = before & 0xffffu, equal = before >> 16;
  const auto ties = static_cast<std::uint32_t>(remaining);
  for (int i = first; i < last; ++i) {
    const std::uint32_t u = keys[i];
    if (u > threshold) {
      out[a + static_cast<int>(above + (equal < ties ? equal : ties))] = a + i;
      ++above;
    } else if (u == threshold) {
      if (equal < ties) out[a + static_cast<int>(above + equal)] = a + i;
      ++equal;
    }
  }
  return count;
}

// The two-halves selection (header). A candidate is a 64-bit word: the score's rank_key above the
// complement of its block id, so a larger word ranks first (by key, then the lower id), as select_row
// ranks; 0 is an empty slot (every key is at least rank_key(-inf) > 0).
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

// Grid (index head, sequence), or (1, sequence) for Shared rows (one per query block, the heads'
// scores pooled). Dynamic shared memory: keys [stride] (the row's candidates).
template <bool Shared>
__global__ void __launch_bounds__(select_threads)
    decode_select_kernel(device_problem p, const float* scores, mutable_device_block_table t, select_params sp) {
  extern __shared__ std::uint32_t route_select_keys[];
  __shared__ select_scratch scratch;
  const int h = Shared ? 0 : static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  const device_row r = make_device_row(p, b, 0);
  if (!r.ok) return;  // no query: no row (or bad lengths, reported)
  const std::int64_t q_block = p.cu_seqlens_q[b] - p.cu_seqlens_q[0];  // decode: one query a block
  const std::int64_t row = Shared ? q_block : q_block * p.index_heads() + h;
  if (row < 0 || row >= t.rows) {
    if (threadIdx.x == 0) report(p, bad_seqlen);
    return;
  }
  const int count = select_row<select_threads, Shared>(p, scores, b, h, plan_row(r.visible_blocks, sp), sp,
                                                       t.ids + row * t.width, t.width, route_select_keys, scratch);
  if (threadIdx.x == 0) t.count[row] = count;
}

}  // namespace detail::route_impl

// A decode_router selection that skim::cuda::decode makes as it reads it: each split CTA of
// decode selects its row's ids into shared memory, from the router's scores with select_row, or
// from the candidates its score kernel kept with select_candidates (the select kernel's ids, bit for
// bit, either way), and split 0 writes the row (ids, count) to `table`, for the merge kernel of the
// same run and for the engine. It saves the select kernel's launch in a decode step (score, then
// decode). Made by decode_router::routed() or score_routed(); only decode reads it (it has no
// cursor: before decode ran, the table holds nothing of this step). Per-index-head rows only (no
// share_heads), one query per sequence.
struct device_routed_table {
  mutable_device_block_table table;  // [rows, width >= decode_router::width(p)], written
  const float* scores = nullptr;     // [batch, index_heads, select.stride], as decode_router::score writes them
  detail::route_impl::select_params select{};
  // The kept candidates (decode_router::score_routed), or null: select_row over the scores.
  // [batch, index_heads, candidate_stride]: a row's tile t at t · slots.
  const std::uint64_t* candidates = nullptr;
  std::int32_t slots = 0;               // detail::route_impl::candidate_slots(select.k)
  std::int64_t candidate_stride = 0;    // tiles of a row · slots

  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int32_t max_ids() const noexcept { return table.width; }
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t stored_rows() const noexcept { return table.rows; }
  // Row r as written by this step's decode (the merge kernel reads it after the split kernel).
  [[nodiscard]] __device__ __forceinline__ device_block_table::span row(std::int64_t r) const noexcept {
    return device_block_table{table.ids, table.count, table.width, table.rows}.row(r);
  }
  // Shared memory of a CTA's selection, from a 16-byte aligned base: the scratch, then the row's ids
  // (width of them, to a 16-byte boundary) at ids_offset, then at keys_offset(width) the scores' keys
  // (max_kv_blocks of them) or the candidates (a row's candidate_stride); scratch_bytes in all.
  static constexpr std::size_t ids_offset = sizeof(detail::route_impl::select_scratch);
  [[nodiscard]] SKIM_HOST_DEVICE static constexpr std::size_t keys_offset(std::int32_t width) noexcept {
    return ids_offset + (static_cast<std::size_t>(width) * 4 + 15) / 16 * 16;
  }
  [[nodiscard]] constexpr std::size_t scratch_bytes(std::int32_t max_kv_blocks) const noexcept {
    const std::size_t keys =
        candidates != nullptr ? static_cast<std::size_t>(detail::route_impl::candidate_entries(candidate_stride)) * 8
                              : static_cast<std::size_t>(max_kv_blocks) * 4;
    return keys_offset(table.width) + keys;
  }

  [[nodiscard]] status validate() const noexcept {
    SKIM_TRY(device_block_table(table).validate());
    if (select.k < 0 || select.sink < 0 || select.newest < 0 || select.stride < 0) {
      return status::error(status_code::invalid_argument, "routed table: k %d, sink %d, newest %d, stride %lld (< 0)",
                           select.k, select.sink, select.newest, static_cast<long long>(select.stride));
    }
    if (candidates != nullptr) {
      namespace impl = detail::route_impl;
      const std::int64_t tiles = (select.stride + impl::candidate_tile - 1) / impl::candidate_tile;
      if (slots != impl::candidate_slots(select.k) || candidate_stride < tiles * slots) {
        return status::error(status_code::invalid_argument, "routed table: %d candidate slots a tile and %lld a row, "
                             "for k %d over %lld blocks (%d and %lld expected)", slots,
                             static_cast<long long>(candidate_stride), select.k, static_cast<long long>(select.stride),
                             impl::candidate_slots(select.k), static_cast<long long>(tiles * impl::candidate_slots(select.k)));
      }
    }
    return status::success();
  }
};

// A device_routed_table with candidates as decode runs it (decode::run passes it on as this type):
// a type of its own, so that the kernels that select from candidates and those that select from
// scores each hold only their own selection's code.
struct device_kept_table : device_routed_table {};

}  // namespace skim::cuda
