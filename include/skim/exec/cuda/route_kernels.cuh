#pragma once
// The kernels of skim::cuda::decode_router (route.cuh holds the host API and the contract: the bits
// of the CPU pipeline, row numbering, reserved blocks and ties).
//
// Two kernels:
//  - score: grid (128-block tiles, index heads, sequences), 128 threads, one block per thread. The
//    row's query heads go to shared memory in fp32 once; each thread reads its block's min/max
//    records straight into registers (64 bytes of each a step, the next step in flight while this
//    one is summed) and sums the bound of up to 8 heads a pass, so the record is read once per pass
//    and the loads of a warp cover whole 32-byte sectors. Writes scores [batch, index_heads,
//    max_kv_blocks] (-inf past the visible blocks) to the workspace.
//  - select: one CTA of 1024 threads per (sequence, index head). Order-preserving 32-bit keys of the
//    candidates' scores in shared memory (<= max_blocks), a 4-pass radix select (8 bits a pass,
//    warp-aggregated shared-memory histograms) finds the k-th best key and how many of its ties to
//    keep; one block-wide scan in id order writes the chosen ids ascending (ties: lower ids first).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "skim/exec/cuda/common.cuh"
#include "skim/exec/cuda/index.cuh"
#include "skim/exec/cuda/summarize.cuh"
#include "skim/route/pooled_router.hpp"

namespace skim::cuda {

namespace detail::route_impl {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr unsigned full_mask = 0xffffffffu;

// Score kernel geometry: one block per thread, its record read straight from memory into registers.
inline constexpr int score_threads = 128;        // threads per CTA
inline constexpr int tile_blocks = score_threads;  // blocks per CTA, one per thread
inline constexpr int record_vecs = 4;            // 16-byte loads per record (min, and max) per step: 64 bytes
inline constexpr int max_group = 32;             // query heads per row
inline constexpr int max_pass_heads = 8;         // query heads scored per pass over a record
inline constexpr std::size_t max_query_smem = 48 * 1024;  // the query heads in fp32 (no opt-in needed)

// Select kernel geometry.
inline constexpr int select_threads = 1024;  // a row of up to 1024 candidates: one key per thread and pass
inline constexpr int select_warps = select_threads / 32;
static_assert(select_warps <= 32, "block_exclusive_scan scans the warp sums in one warp");
inline constexpr int radix_bins = 256;

struct score_params {
  float scale = 1.0f;                  // problem's softmax scale (pooled_router's)
  route::group_reduce reduce{};        //
  std::int32_t heads = 1;              // query heads per row (<= max_group)
  std::int32_t padded_heads = 1;       // heads rounded up to the pass width (rows of the staged queries)
  std::int64_t stride = 0;             // floats per score row: the problem's max_kv_blocks()
  bool vector_loads = false;           // 16-byte loads of records (head_dim·sizeof(TS) % 16 == 0, aligned)
};

struct select_params {
  std::int32_t k = 0;       // top_k's k
  std::int32_t sink = 0;    // reserved's sink
  std::int32_t newest = 0;  // reserved's max(local, recency ? 1 : 0)
  std::int64_t stride = 0;  // floats per score row
};

[[nodiscard]] __device__ __forceinline__ std::int32_t clamp_blocks(std::int32_t x, std::int32_t hi) noexcept {
  return x < 0 ? 0 : (x > hi ? hi : x);
}

// Query heads scored per pass: the group size rounded up to a power of two, at most max_pass_heads.
[[nodiscard]] constexpr int pass_heads(int heads) noexcept {
  int hp = 1;
  while (hp < heads && hp < max_pass_heads) hp *= 2;
  return hp;
}

// One 16-byte word of a record as floats.
template <class TS>
__device__ __forceinline__ void unpack(const uint4& w, float (&f)[16 / sizeof(TS)]) noexcept {
  if constexpr (std::is_same_v<TS, float>) {
    f[0] = __uint_as_float(w.x), f[1] = __uint_as_float(w.y), f[2] = __uint_as_float(w.z), f[3] = __uint_as_float(w.w);
  } else {
    const std::uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = skim::cuda::to_float2<TS>(u[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

// acc += q · (q >= 0 ? hi : lo), rounded step by step (never fused): max_bound::score's term.
[[nodiscard]] __device__ __forceinline__ float bound_step(float acc, float q, float lo, float hi) noexcept {
  return __fadd_rn(acc, __fmul_rn(q, q >= 0.0f ? hi : lo));
}

// Heads [h0, h0 + HP) of one block over dims [0, head_dim): acc[i] sums head h0 + i's terms in dim
// order (the CPU's order). The thread's record is read in steps of record_vecs 16-byte words of min
// and of max, the next step's loads issued before this step is summed, so each thread keeps two
// steps (256 bytes) in flight; queries come from shared memory (sq: [padded heads][head_dim] fp32,
// the same address for every lane: broadcast). Dims past the last whole step, or every dim without
// vector loads, are read one element at a time.
template <int HP, class TS>
__device__ __forceinline__ void score_heads(const TS* lo, const TS* hi, const float* sq, int head_dim, int h0,
                                            bool vector_loads, float (&acc)[HP]) noexcept {
  constexpr int per = 16 / static_cast<int>(sizeof(TS));  // elements per 16-byte word
  constexpr int step = record_vecs * per;                  // dims per step
#pragma unroll
  for (int i = 0; i < HP; ++i) acc[i] = 0.0f;
  const float* q0 = sq + static_cast<std::ptrdiff_t>(h0) * head_dim;
  int d0 = 0;
  if (vector_loads) {
    const int whole = head_dim / step * step;
    const auto* vlo = reinterpret_cast<const uint4*>(lo);
    const auto* vhi = reinterpret_cast<const uint4*>(hi);
    uint4 cl[record_vecs], ch[record_vecs];
    if (whole > 0) {
#pragma unroll
      for (int v = 0; v < record_vecs; ++v) cl[v] = vlo[v], ch[v] = vhi[v];
    }
    for (; d0 < whole; d0 += step) {
      uint4 nl[record_vecs], nh[record_vecs];
      if (d0 + step < whole) {
        const int w0 = (d0 + step) / per;
#pragma unroll
        for (int v = 0; v < record_vecs; ++v) nl[v] = vlo[w0 + v], nh[v] = vhi[w0 + v];
      }
#pragma unroll
      for (int v = 0; v < record_vecs; ++v) {
        float fl[per], fh[per];
        unpack<TS>(cl[v], fl);
        unpack<TS>(ch[v], fh);
#pragma unroll
        for (int e = 0; e < per; e += 4) {
          const int d = d0 + v * per + e;
#pragma unroll
          for (int i = 0; i < HP; ++i) {
            const float4 qv = *reinterpret_cast<const float4*>(q0 + i * head_dim + d);
            float x = bound_step(acc[i], qv.x, fl[e], fh[e]);
            x = bound_step(x, qv.y, fl[e + 1], fh[e + 1]);
            x = bound_step(x, qv.z, fl[e + 2], fh[e + 2]);
            acc[i] = bound_step(x, qv.w, fl[e + 3], fh[e + 3]);
          }
        }
      }
#pragma unroll
      for (int v = 0; v < record_vecs; ++v) cl[v] = nl[v], ch[v] = nh[v];
    }
  }
  for (; d0 < head_dim; ++d0) {
    const float l = skim::cuda::to_float(lo[d0]), h = skim::cuda::to_float(hi[d0]);
#pragma unroll
    for (int i = 0; i < HP; ++i) acc[i] = bound_step(acc[i], q0[i * head_dim + d0], l, h);
  }
}

// What the score kernel appends before it scores: nothing, or the newest key of each sequence from
// a K/V source (decode_router::run with a source: summarize's append_newest folded in).
struct no_append {};

// Grid (tile of tile_blocks blocks, index head, sequence); thread j scores block j0 + j for every
// query head of the row, HP heads a pass, and folds them in head order as pooled_router does.
// Shared memory: the row's query heads in fp32, [padded_heads][head_dim], zero past heads (their
// sums are computed and dropped). With a K/V source, the CTA whose tile holds a sequence's newest
// block first folds the newest key into that block's record (all threads over the head dimension,
// as append_newest does), and the barrier before scoring makes it visible: the score reads the
// updated record. Under index_scope::query_head the CTAs of a group's heads each append the same
// key to the same record: they write equal values (min and max are idempotent), so the result does
// not depend on their order.
template <int HP, class TQ, class TS, class KV>
__global__ void __launch_bounds__(score_threads)
    decode_score_kernel(device_problem p, device_view<const TQ> q, device_max_bound<TS> s, KV kv, float* scores,
                        score_params sp) {
  extern __shared__ float4 route_score_smem[];
  float* sq = reinterpret_cast<float*>(route_score_smem);

  const int j0 = static_cast<int>(blockIdx.x) * tile_blocks;
  const int rh = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int j = static_cast<int>(threadIdx.x);
  float* out = scores + (static_cast<std::int64_t>(b) * p.index_heads() + rh) * sp.stride + j0;
  const int n_out = static_cast<int>(sp.stride - j0 < tile_blocks ? sp.stride - j0 : tile_blocks);
  const int heads = sp.heads;
  const bool kv_scope = p.scope == index_scope::kv_head;
  const int first_head = kv_scope ? rh * heads : rh;
  const int kv_head = kv_scope ? rh : rh / p.group_size();

  if constexpr (!std::is_same_v<KV, no_append>) {  // before any exit: a sequence without a query appends too
    namespace si = detail::summarize_impl;
    const device_row kr = si::key_range(p, b);
    const int newest = kr.kv_len > 0 ? (kr.kv_len - 1) / p.block_kv : -1;  // the block the new key is in
    if (kr.ok && newest >= j0 && newest < j0 + tile_blocks) si::append_key(p, kv, s, kr, b, kv_head, j, score_threads);
  }
  const device_row r = make_device_row(p, b, 0);  // decode: the sequence's one query block
  const int n = r.ok ? clamp_blocks(r.visible_blocks - j0, tile_blocks) : 0;
  if (n == 0) {  // no row here, or blocks past the visible ones: -inf (block-uniform exit)
    if (j < n_out) out[j] = neg_inf;
    return;
  }
  const std::int64_t token = static_cast<std::int64_t>(r.q_offset) + r.q_end - 1;
  const int head_dim = p.head_dim;
  for (int i = j; i < sp.padded_heads * head_dim; i += score_threads) {
    const int g = i / head_dim;
    sq[i] = g < heads ? skim::cuda::to_float(q.row(token, first_head + g)[i - g * head_dim]) : 0.0f;
  }
  __syncthreads();  // queries staged; an appended record visible to the thread that scores it
  if (j >= n_out) return;
  float result = neg_inf;
  if (j < n) {
    const std::int64_t rec = s.record(p, b, j0 + j, kv_head);
    const TS* lo = s.lo + rec;
    const TS* hi = s.hi + rec;
    const bool empty = skim::cuda::to_float(lo[0]) > skim::cuda::to_float(hi[0]);  // no key: -inf
    const bool by_max = sp.reduce == route::group_reduce::max;
    float a = by_max ? neg_inf : 0.0f;
    for (int h0 = 0; h0 < heads; h0 += HP) {
      float acc[HP];
      score_heads<HP>(lo, hi, sq, head_dim, h0, sp.vector_loads, acc);
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        if (h0 + i < heads) {  // head order, as pooled_router folds; NaN pools as -inf
          const float x = empty || !(acc[i] > neg_inf) ? neg_inf : acc[i];
          a = by_max ? (x > a ? x : a) : __fadd_rn(a, x);
        }
      }
    }
    if (sp.reduce == route::group_reduce::mean) a = __fdiv_rn(a, static_cast<float>(heads));
    result = a == neg_inf ? neg_inf : __fmul_rn(a, sp.scale);
  }
  out[j] = result;
}

// Order-preserving key of a score: a larger key ranks first; NaN ranks as -inf, -0 as +0.
[[nodiscard]] __device__ __forceinline__ std::uint32_t rank_key(float x) noexcept {
  const std::uint32_t u = x != x ? __float_as_uint(neg_inf) : (x == 0.0f ? 0u : __float_as_uint(x));
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of x over the CTA's threads in thread order. warp_sums: [32] shared.
[[nodiscard]] __device__ __forceinline__ std::uint32_t block_exclusive_scan(std::uint32_t x,
                                                                            std::uint32_t* warp_sums) noexcept {
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
    const std::uint32_t w = lane < select_warps ? warp_sums[lane] : 0u;
    std::uint32_t wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const std::uint32_t y = __shfl_up_sync(full_mask, wi, o);
      if (lane >= o) wi += y;
    }
    if (lane < select_warps) warp_sums[lane] = wi - w;
  }
  __syncthreads();
  return incl - x + warp_sums[warp];
}

// Grid (index head, sequence). Dynamic shared memory: keys [stride] (the row's candidates).
// (A template only so that a header-defined kernel has one definition across translation units.)
template <int = 0>
__global__ void __launch_bounds__(select_threads)
    decode_select_kernel(device_problem p, const float* scores, mutable_device_block_table t, select_params sp) {
  extern __shared__ std::uint32_t route_select_keys[];
  std::uint32_t* keys = route_select_keys;
  __shared__ std::uint32_t hist[radix_bins];
  __shared__ std::uint32_t warp_sums[32];
  __shared__ std::uint32_t found_prefix;
  __shared__ std::int32_t found_remaining;

  const int h = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const device_row r = make_device_row(p, b, 0);
  if (!r.ok) return;  // no query: no row (or bad lengths, reported)
  const std::int64_t row = static_cast<std::int64_t>(p.cu_seqlens_q[b] - p.cu_seqlens_q[0]) * p.index_heads() + h;
  if (row < 0 || row >= t.rows) {
    if (tid == 0) report(p, bad_seqlen);
    return;
  }

  // reserved<top_k>: sink [0, a), local [bb, v), top-k of [a, bb).
  const int v = r.visible_blocks;
  const int a = sp.sink < v ? sp.sink : v;
  const int newest = sp.newest < v ? sp.newest : v;
  const int bb = v - newest > a ? v - newest : a;
  const int n = bb - a;
  const int take = sp.k < n ? sp.k : n;
  const int count = a + take + (v - bb);
  std::int32_t* out = t.ids + row * t.width;
  for (int i = tid; i < t.width; i += select_threads) {  // reserved ids and padding
    if (i < a) {
      out[i] = i;
    } else if (i >= a + take) {
      out[i] = i < count ? bb + (i - a - take) : index::block_table::pad;
    }
  }
  if (tid == 0) t.count[row] = count;
  if (take == 0) return;
  if (take == n) {
    for (int i = tid; i < n; i += select_threads) out[a + i] = a + i;
    return;
  }

  const float* row_scores = scores + (static_cast<std::int64_t>(b) * p.index_heads() + h) * sp.stride + a;
  constexpr int key_batch = 4;  // loads in flight per thread before their keys are stored
  for (int base = 0; base < n; base += key_batch * select_threads) {
    float x[key_batch];
#pragma unroll
    for (int u = 0; u < key_batch; ++u) {
      const int i = base + u * select_threads + tid;
      x[u] = i < n ? row_scores[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < key_batch; ++u) {
      const int i = base + u * select_threads + tid;
      if (i < n) keys[i] = rank_key(x[u]);
    }
  }

  // Radix select of the take-th largest key, 8 bits a pass from the top. Invariant: at least
  // `remaining` >= 1 candidates match `prefix` under `mask`, and take - remaining candidates beat it.
  std::uint32_t prefix = 0, mask = 0;
  int remaining = take;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < radix_bins; i += select_threads) hist[i] = 0;
    __syncthreads();  // hist zeroed (and, the first time, keys written)
    for (int base = 0; base < n; base += select_threads) {  // whole warps iterate: __match_any_sync
      const int i = base + tid;
      int bin = -1;
      if (i < n) {
        const std::uint32_t u = keys[i];
        if ((u & mask) == prefix) bin = static_cast<int>((u >> shift) & 0xffu);
      }
      const unsigned peers = __match_any_sync(full_mask, bin);
      if (bin >= 0 && lane == __ffs(static_cast<int>(peers)) - 1) {
        atomicAdd(&hist[bin], static_cast<std::uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds bins [8l, 8l + 8); find the bin holding the remaining-th largest
      std::uint32_t c[8];
      std::uint32_t mine = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = hist[lane * 8 + e];
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
        found_prefix = prefix | (static_cast<std::uint32_t>(digit) << shift);
        found_remaining = remaining - static_cast<int>(before);
      }
    }
    __syncthreads();
    prefix = found_prefix;
    remaining = found_remaining;
    mask |= 0xffu << shift;
  }

  // Keys above the threshold, and the first `remaining` equal to it in id order, in id order: each
  // thread takes a contiguous run of candidates; one scan counts (above, equal) before it.
  const std::uint32_t threshold = prefix;
  const int per = (n + select_threads - 1) / select_threads;
  const int first = tid * per < n ? tid * per : n;
  const int last = first + per < n ? first + per : n;
  std::uint32_t packed = 0;  // equal << 16 | above; both <= max_blocks < 2^16
  for (int i = first; i < last; ++i) {
    const std::uint32_t u = keys[i];
    packed += u > threshold ? 1u : (u == threshold ? 1u << 16 : 0u);
  }
  const std::uint32_t before = block_exclusive_scan(packed, warp_sums);
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
}

}  // namespace detail::route_impl

}  // namespace skim::cuda
