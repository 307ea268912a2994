#pragma once
// The score kernel of skim::cuda::decode_router (route/cuda/decode_router.cuh holds the host API and the contract: the
// bits of the CPU pipeline, row numbering, reserved blocks and ties; select/cuda/select_kernel.cuh the select
// kernel that reads the scores; select/cuda/candidates.cuh the tiles' kept candidates).
//
// Grid (128-block tiles, index heads, sequences), 128 threads, one block per thread. The row's query
// heads go to shared memory in fp32 once; each thread reads its block's record straight into
// registers and scores up to 8 heads a pass, so the record is read once per pass:
//  - max_bound records (min, max): 64 bytes of each a step, the next step in flight while this one
//    is summed, so the loads of a warp cover whole 32-byte sectors; records of codes are scaled as
//    they are read (their scale: one float a record); evict-first in L2 where the launch's records
//    are at least half of L2 (score_params::stream);
//  - multi_centroid records (M sums, M sizes): the best over the non-empty clusters of
//    (q . sum) / size, as summarize::multi_centroid::score.
// Writes scores [batch, index_heads, max_kv_blocks] (-inf past the visible blocks) to the workspace;
// with candidates (decode_router::score_routed), each CTA also keeps its tile's best candidates for
// decode's selection (select/cuda/candidates.cuh, keep_tile_candidates).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/exec/cuda/ptx.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/summarize/cuda/max_bound.cuh"
#include "skim/summarize/cuda/multi_centroid.cuh"
#include "skim/route/pooled_router.hpp"
#include "skim/select/cuda/candidates.cuh"

namespace skim::cuda {

namespace detail::route_impl {

// Score kernel geometry: one block per thread, its record read straight from memory into registers.
inline constexpr int score_threads = 128;        // threads per CTA
inline constexpr int tile_blocks = score_threads;  // blocks per CTA, one per thread
static_assert(tile_blocks == candidate_tile, "a score CTA keeps the candidates of its own tile");
inline constexpr int record_vecs = 4;            // 16-byte loads per record (min, and max) per step: 64 bytes
inline constexpr int max_group = 32;             // query heads per row
inline constexpr int max_pass_heads = 8;         // query heads scored per pass over a record
inline constexpr std::size_t max_query_smem = 48 * 1024;  // the query heads in fp32 (no opt-in needed)

struct score_params {
  float scale = 1.0f;                  // problem's softmax scale (pooled_router's)
  route::group_reduce reduce{};        //
  std::int32_t heads = 1;              // query heads per row (<= max_group)
  std::int32_t padded_heads = 1;       // heads rounded up to the pass width (rows of the staged queries)
  std::int64_t stride = 0;             // floats per score row: the problem's max_kv_blocks()
  bool vector_loads = false;           // 16-byte loads of records (head_dim·sizeof(TS) % 16 == 0, aligned)
  bool stream = false;                 // records evict-first in L2 (launch.cuh: streams_past_l2)
  // Candidates kept for decode's selection (device_routed_table's), or null: scores only.
  std::uint64_t* candidates = nullptr;
  std::int32_t slots = 0;
  std::int64_t candidate_stride = 0;
  select_params select{};
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

// One 16-byte word of a record as floats (codes: their own values, before the scale).
template <class TS>
__device__ __forceinline__ void unpack(const uint4& w, float (&f)[16 / sizeof(TS)]) noexcept {
  if constexpr (std::is_same_v<TS, float>) {
    f[0] = __uint_as_float(w.x), f[1] = __uint_as_float(w.y), f[2] = __uint_as_float(w.z), f[3] = __uint_as_float(w.w);
  } else if constexpr (is_device_code_v<TS>) {
    widen8_codes<TS>(make_uint2(w.x, w.y), f);
    widen8_codes<TS>(make_uint2(w.z, w.w), f + 8);
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

// A record element's bounds as the float summary of the dequantised keys holds them: code summaries'
// fp32(scale · code) of each end (max_bound.cuh: the same values; a negative scale's swap of the ends
// is the caller's, once a record); other summaries as they are.
template <class TS>
__device__ __forceinline__ void dequantize(float& lo, float& hi, float scale) noexcept {
  if constexpr (is_device_code_v<TS>) {
    lo = __fmul_rn(scale, lo);
    hi = __fmul_rn(scale, hi);
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
// vector loads, are read one element at a time. scale: the record's, for code summaries (lo and hi
// already swapped where it is negative); policy: the vector loads' L2 policy (ptx.cuh, l2_policy).
template <int HP, class TS>
__device__ __forceinline__ void score_heads(const TS* lo, const TS* hi, float scale, const float* sq, int head_dim,
                                            int h0, bool vector_loads, std::uint64_t policy,
                                            float (&acc)[HP]) noexcept {
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
      for (int v = 0; v < record_vecs; ++v) cl[v] = ptx::ld_16(vlo + v, policy), ch[v] = ptx::ld_16(vhi + v, policy);
    }
    for (; d0 < whole; d0 += step) {
      uint4 nl[record_vecs], nh[record_vecs];
      if (d0 + step < whole) {
        const int w0 = (d0 + step) / per;
#pragma unroll
        for (int v = 0; v < record_vecs; ++v) {
          nl[v] = ptx::ld_16(vlo + w0 + v, policy);
          nh[v] = ptx::ld_16(vhi + w0 + v, policy);
        }
      }
#pragma unroll
      for (int v = 0; v < record_vecs; ++v) {
        float fl[per], fh[per];
        unpack<TS>(cl[v], fl);
        unpack<TS>(ch[v], fh);
#pragma unroll
        for (int e = 0; e < per; ++e) dequantize<TS>(fl[e], fh[e], scale);
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
    float l = skim::cuda::to_float(lo[d0]), h = skim::cuda::to_float(hi[d0]);
    dequantize<TS>(l, h, scale);
#pragma unroll
    for (int i = 0; i < HP; ++i) acc[i] = bound_step(acc[i], q0[i * head_dim + d0], l, h);
  }
}

// Heads [h0, h0 + HP) of one block from its multi_centroid record (rec: its first float):
// multi_centroid::score, the best over the clusters with keys of (q · sum) / size, each dot product
// summed in dimension order and rounded step by step; -inf where no cluster has keys.
template <int HP, std::int32_t M, std::int32_t L>
__device__ __forceinline__ void score_heads(const device_multi_centroid<M, L>& s, std::int64_t rec, const float* sq,
                                            int head_dim, int h0, bool, std::uint64_t, float (&acc)[HP]) noexcept {
  const float* r = s.records + rec;
  const float* size = r + static_cast<std::ptrdiff_t>(M) * head_dim;
  const float* q0 = sq + static_cast<std::ptrdiff_t>(h0) * head_dim;
#pragma unroll
  for (int i = 0; i < HP; ++i) acc[i] = neg_inf;
  for (int c = 0; c < M; ++c) {
    const float n = size[c];
    if (!(n > 0.0f)) continue;
    const float* sum = r + static_cast<std::ptrdiff_t>(c) * head_dim;
    float dot[HP];
#pragma unroll
    for (int i = 0; i < HP; ++i) dot[i] = 0.0f;
    for (int d = 0; d < head_dim; ++d) {
      const float x = sum[d];
#pragma unroll
      for (int i = 0; i < HP; ++i) dot[i] = __fadd_rn(dot[i], __fmul_rn(q0[i * head_dim + d], x));
    }
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      const float v = __fdiv_rn(dot[i], n);
      acc[i] = v > acc[i] ? v : acc[i];
    }
  }
}
// The same heads from a max_bound record.
template <int HP, class TS>
__device__ __forceinline__ void score_heads(const device_max_bound<TS>& s, std::int64_t rec, const float* sq,
                                            int head_dim, int h0, bool vector_loads, std::uint64_t policy,
                                            float (&acc)[HP]) noexcept {
  const TS* lo = s.lo + rec;
  const TS* hi = s.hi + rec;
  float scale = 1.0f;
  if constexpr (device_max_bound<TS>::codes) {
    scale = s.scale[rec / head_dim];
    if (scale < 0.0f) {  // the greatest code's product is then the least
      const TS* t = lo;
      lo = hi;
      hi = t;
    }
  }
  score_heads<HP>(lo, hi, scale, sq, head_dim, h0, vector_loads, policy, acc);
}

// Whether a record holds no key (it scores -inf for every head).
template <class TS>
[[nodiscard]] __device__ __forceinline__ bool record_empty(const device_max_bound<TS>& s, std::int64_t rec, int) noexcept {
  return skim::cuda::to_float(s.lo[rec]) > skim::cuda::to_float(s.hi[rec]);
}
template <std::int32_t M, std::int32_t L>
[[nodiscard]] __device__ __forceinline__ bool record_empty(const device_multi_centroid<M, L>& s, std::int64_t rec,
                                                          int head_dim) noexcept {
  const float* size = s.records + rec + static_cast<std::ptrdiff_t>(M) * head_dim;
  for (int c = 0; c < M; ++c) {
    if (size[c] > 0.0f) return false;
  }
  return true;
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
template <int HP, class TQ, class S, class KV>
__global__ void __launch_bounds__(score_threads)
    decode_score_kernel(device_problem p, device_view<const TQ> q, S s, KV kv, float* scores, score_params sp) {
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
    static_assert(!is_device_multi_centroid_v<S>, "multi_centroid records are appended by their own kernel");
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
  float result = neg_inf;
  if (j < n) {
    const std::int64_t rec = s.record(p, b, j0 + j, kv_head);
    const bool empty = record_empty(s, rec, head_dim);  // no key: -inf
    const bool by_max = sp.reduce == route::group_reduce::max;
    const std::uint64_t policy = ptx::l2_policy(sp.stream);
    float a = by_max ? neg_inf : 0.0f;
    for (int h0 = 0; h0 < heads; h0 += HP) {
      float acc[HP];
      score_heads<HP>(s, rec, sq, head_dim, h0, sp.vector_loads, policy, acc);
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
  if (j < n_out) out[j] = result;
  if (sp.candidates != nullptr) {  // block-uniform: the row's plan, and whether this tile holds candidates
    __shared__ tile_scratch kept;
    const row_plan plan = plan_row(r.visible_blocks, sp.select);
    if (chooses(plan) && j0 < plan.bb && j0 + tile_blocks > plan.a) {
      std::uint64_t* tile = sp.candidates + (static_cast<std::int64_t>(b) * p.index_heads() + rh) * sp.candidate_stride +
                            static_cast<std::int64_t>(blockIdx.x) * sp.slots;
      keep_tile_candidates(result, j0 + j, plan, sp.slots, tile, kept);
    }
  }
}

}  // namespace detail::route_impl

}  // namespace skim::cuda
