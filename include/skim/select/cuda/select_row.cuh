#pragma once
// The selection of one routed row in a CTA (select_row), shared by the select kernel
// (select/cuda/select_kernel.cuh) and decode's split kernels, and the helpers the two-halves
// selection (select/cuda/candidates.cuh) shares with it. route/cuda/decode_router.cuh holds the
// contract: the bits of the CPU pipeline, reserved blocks and ties.
//
// Order-preserving 32-bit keys of the row's candidates' scores in shared memory (<= max_blocks), a
// 4-pass radix select (8 bits a pass, warp-aggregated shared-memory histograms) finds the k-th best
// key and how many of its ties to keep; one block-wide scan in id order writes the chosen ids
// ascending (ties: lower ids first). select_row is that selection for any CTA size: the select kernel
// runs it with 1024 threads, decode's split kernels with 256.

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

}  // namespace detail::route_impl
}  // namespace skim::cuda
