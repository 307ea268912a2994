#pragma once
// The CUDA-core split kernel of skim::cuda::decode (decode.cuh holds the host API and the
// contracts, decode_common.cuh what both split kernels share, decode_mma.cuh the tensor-core one).
//
// split_kernel: one CTA per (split, index head, sequence × query block) = (split, unit). A unit is
// the rows that share one index row: with index_scope::kv_head all query heads of a kv head
// (the GQA group) × the queries of the block, with query_head one head × the queries. A split is
// chunk_blocks consecutive entries of the row's id list.
//
//   prologue   unit geometry (make_device_row), the row's span, the chunk's ids checked into shared
//              memory (range, strict order; a bad id becomes -1 and is skipped), Q of the unit's rows
//              into shared memory as fp32 pre-scaled by scale·log2(e).
//   main loop  8 warps. Rows go to warps in groups of rows_per_warp (4); when a unit has fewer than
//              8 groups, the warps of a group split the chunk's keys (slices). Keys come in tiles of
//              tile_keys (8 at d = 128, 16 at d = 64; twice that for 8-bit codes) that never straddle
//              a block; slice s takes tiles s, s + slices, ... A key is read by lanes_per_key (d/16)
//              lanes, 16 dims each (two chunks of 8 dims, c and c + lanes_per_key, so each chunk load
//              of the warp covers 128 (64) contiguous bytes of a row). K and V go global → shared memory by cp.async into
//              `stages` lane-private buffers (each lane reads back exactly the bytes it copied, so
//              no barrier is needed between the copy and the use), so stages − 1 tiles (8 KB per warp)
//              are in flight while one is computed. Scores: fp32 dot over 16 dims, then a butterfly
//              over the key's lanes; online softmax per row in the log2 domain (m is warp-uniform).
//              Quantised K/V (core/cuda/quantized.cuh): codes widen exactly to fp32; a tile's key
//              block has one K and one V scale (loaded with the ids): S = scale_k · (q · code_k), and
//              P · (scale_v · code_v) is accumulated as (P · scale_v) · code_v (l sums P).
//   epilogue   o and l summed over the lanes of different keys, per-slice (m, l, o) through shared
//              memory, combined in slice order; a unit whose row has one split writes O and lse, a
//              split of a longer row writes its partial (m, l, o) to the workspace, or with the
//              cluster merge (InCluster) to shared memory for the row's splits to merge (finish_pass).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "skim/exec/cuda/decode_common.cuh"

namespace skim::cuda::detail::decode_impl {

// ---------------------------------------------------------------------------------------------
// One warp's rows over one slice of the chunk's keys.

template <int D>
struct warp_rows {
  float o[rows_per_warp][16];  // unnormalised output, this lane's 16 dims, this lane's keys
  float m[rows_per_warp];      // running max of scores (log2 domain), warp-uniform
  float l[rows_per_warp];      // Σ 2^(s - m) over this lane's keys (equal on the lanes of a key)
  std::int32_t vis[rows_per_warp];  // keys [0, vis) visible to the row; 0 for a padding row
};

// Everything the main loop reads, fixed for the CTA.
template <int D, class KV>
struct chunk_view {
  kv_rows<KV> src;
  const std::int32_t* ids;  // shared [chunk entries], -1 = skipped
  const float2* scales;     // shared [chunk entries] (K, V) scales of a quantised source; else null
  std::int32_t entries;     // ids in this chunk
  std::int32_t block_kv;
  std::int32_t tiles_per_block;
  std::int32_t load_end;    // keys [0, load_end) may be loaded (visible to the unit's last query)
  std::uint32_t* error;     // device error word or null
};

// K/V element size of a source (8-bit codes or 16-bit elements).
template <class KV>
inline constexpr int kv_bytes_of = static_cast<int>(sizeof(typename KV::value_type));
// One lane's chunk of 8 dims.
template <int Bytes>
using chunk_t = std::conditional_t<Bytes == 1, uint2, uint4>;

template <int D, class KV>
__device__ __forceinline__ void issue_tile(const chunk_view<D, KV>& cv, std::int32_t tile, uint4* kv_stage_raw,
                                           std::int32_t* tok_stage) noexcept {
  constexpr int B = kv_bytes_of<KV>;
  using G = geometry<D, B>;
  using T = typename KV::value_type;
  using C = chunk_t<B>;
  C* const kv_stage = reinterpret_cast<C*>(kv_stage_raw);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int ks = lane / G::lanes_per_key, c = lane % G::lanes_per_key;
  const std::int32_t j = tile / cv.tiles_per_block;
  const std::int32_t id = cv.ids[j];
  const std::int32_t first = (tile - j * cv.tiles_per_block) * G::tile_keys;  // offset in the block
#pragma unroll
  for (int step = 0; step < G::steps; ++step) {
    const std::int32_t off = first + step * G::keys_per_step + ks;
    std::int32_t tok = no_key;
    if (id >= 0 && off < cv.block_kv) {
      const std::int32_t t = id * cv.block_kv + off;
      if (t < cv.load_end) tok = t;
    }
    if (tok != no_key) {
      const T* kr;
      const T* vr;
      if (cv.src.rows(tok, kr, vr)) {
        const C* k4 = reinterpret_cast<const C*>(kr);
        const C* v4 = reinterpret_cast<const C*>(vr);
        C* k_slot = kv_stage + (0 * G::steps + step) * 64 + lane;
        C* v_slot = kv_stage + (1 * G::steps + step) * 64 + lane;
        if constexpr (B == 2) {
          cp_async_16(k_slot, k4 + c);
          cp_async_16(k_slot + 32, k4 + c + G::lanes_per_key);
          cp_async_16(v_slot, v4 + c);
          cp_async_16(v_slot + 32, v4 + c + G::lanes_per_key);
        } else {
          cp_async_8(k_slot, k4 + c);
          cp_async_8(k_slot + 32, k4 + c + G::lanes_per_key);
          cp_async_8(v_slot, v4 + c);
          cp_async_8(v_slot + 32, v4 + c + G::lanes_per_key);
        }
      } else {
        if (c == 0 && cv.error != nullptr) atomicOr(cv.error, skim::cuda::bad_page);
        tok = no_key;
      }
    }
    tok_stage[step * 32 + lane] = tok;
  }
}

// Eight elements (one chunk) to floats: 16-bit elements, or 8-bit codes (their values before scaling).
template <class T>
__device__ __forceinline__ void widen_chunk(const uint4& w, float* f) noexcept { widen8<T>(w, f); }
template <class T>
__device__ __forceinline__ void widen_chunk(const uint2& w, float* f) noexcept { skim::cuda::widen8_codes<T>(w, f); }

// Online softmax of one tile (already in this lane's stage buffers) into w; ks, vs: the tile's K and
// V scales (Quantized only).
template <int D, class T, bool Quantized>
__device__ __forceinline__ void attend_tile(const uint4* kv_stage_raw, const std::int32_t* tok_stage, const float* q_group,
                                            float ks, float vs, warp_rows<D>& w) noexcept {
  constexpr int B = static_cast<int>(sizeof(T));
  using G = geometry<D, B>;
  using C = chunk_t<B>;
  const C* const kv_stage = reinterpret_cast<const C*>(kv_stage_raw);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int c = lane % G::lanes_per_key;
  constexpr float neg_inf = -INFINITY;

  float s[G::steps][rows_per_warp];
  std::int32_t tok[G::steps];
#pragma unroll
  for (int step = 0; step < G::steps; ++step) {
    tok[step] = tok_stage[step * 32 + lane];
    float kf[16];
    widen_chunk<T>(kv_stage[(0 * G::steps + step) * 64 + lane], kf);
    widen_chunk<T>(kv_stage[(0 * G::steps + step) * 64 + 32 + lane], kf + 8);
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
      const float4* q4 = reinterpret_cast<const float4*>(q_group) + rr * 4 * G::lanes_per_key + c;
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 q = q4[i * G::lanes_per_key];
        acc = fmaf(q.x, kf[4 * i + 0], acc);
        acc = fmaf(q.y, kf[4 * i + 1], acc);
        acc = fmaf(q.z, kf[4 * i + 2], acc);
        acc = fmaf(q.w, kf[4 * i + 3], acc);
      }
#pragma unroll
      for (int x = 1; x < G::lanes_per_key; x *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
      if constexpr (Quantized) acc *= ks;
      // A key outside the row's view (or not loaded: tok = no_key) gets -inf; its K bits, stale or
      // never written, are ignored by the select.
      s[step][rr] = tok[step] < w.vis[rr] ? acc : neg_inf;
    }
  }

  bool rescale = false;
  float alpha[rows_per_warp];
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    float mt = s[0][rr];
#pragma unroll
    for (int step = 1; step < G::steps; ++step) mt = fmaxf(mt, s[step][rr]);
#pragma unroll
    for (int x = G::lanes_per_key; x < 32; x *= 2) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
    const float m_new = fmaxf(w.m[rr], mt);
    // -inf - -inf: subtract 0 instead while the row has seen no key (p comes out 0). An unchanged
    // max (the common case, and a padding row's -inf) needs no rescale.
    const float m_use = m_new == neg_inf ? 0.0f : m_new;
    const bool changed = m_new != w.m[rr];
    alpha[rr] = changed ? exp2_approx(w.m[rr] - m_use) : 1.0f;
    rescale = rescale || changed;
    w.m[rr] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int step = 0; step < G::steps; ++step) {
      s[step][rr] = exp2_approx(s[step][rr] - m_use);  // now p
      sum += s[step][rr];
    }
    w.l[rr] = w.l[rr] * alpha[rr] + sum;
  }
  if (rescale) {  // warp-uniform: m and hence alpha are equal on every lane
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
      for (int e = 0; e < 16; ++e) w.o[rr][e] *= alpha[rr];
    }
  }

#pragma unroll
  for (int step = 0; step < G::steps; ++step) {
    C v0 = kv_stage[(1 * G::steps + step) * 64 + lane];
    C v1 = kv_stage[(1 * G::steps + step) * 64 + 32 + lane];
    if (tok[step] == no_key) {  // never written or stale: p is 0, but 0 · NaN is not
      v0 = C{};
      v1 = v0;
    }
    float vf[16];
    widen_chunk<T>(v0, vf);
    widen_chunk<T>(v1, vf + 8);
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
      const float pw = Quantized ? s[step][rr] * vs : s[step][rr];
#pragma unroll
      for (int e = 0; e < 16; ++e) w.o[rr][e] = fmaf(pw, vf[e], w.o[rr][e]);
    }
  }
}

// The warp's tiles (slice, slice + slices, ...) through the cp.async pipeline.
template <int D, class KV>
__device__ __forceinline__ void attend_slice(const chunk_view<D, KV>& cv, std::int32_t slice, std::int32_t slices,
                                             uint4* kv_warp, std::int32_t* tok_warp, const float* q_group,
                                             warp_rows<D>& w) noexcept {
  using G = geometry<D, kv_bytes_of<KV>>;
  constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
  constexpr int kv_stage_uint4 = static_cast<int>(stage_uint4);
  constexpr int tok_stage_ints = G::steps * 32;
  const std::int32_t tiles = cv.entries * cv.tiles_per_block;
  const std::int32_t mine = slice < tiles ? (tiles - slice + slices - 1) / slices : 0;

#pragma unroll
  for (int k = 0; k < stages - 1; ++k) {
    if (k < mine) issue_tile(cv, slice + k * slices, kv_warp + k * kv_stage_uint4, tok_warp + k * tok_stage_ints);
    cp_async_commit();
  }
  for (std::int32_t k = 0; k < mine; ++k) {
    // Refill the buffer that tile k - 1 used (this lane finished reading it in the last iteration).
    const std::int32_t next = k + stages - 1;
    if (next < mine) {
      const int st = next % stages;
      issue_tile(cv, slice + next * slices, kv_warp + st * kv_stage_uint4, tok_warp + st * tok_stage_ints);
    }
    cp_async_commit();
    cp_async_wait<stages - 1>();  // groups 0..k complete: tile k is in its buffer
    const int st = k % stages;
    float ks = 1.0f, vs = 1.0f;
    if constexpr (quantized) {  // the tile's block: one shared-memory read for the warp
      const float2 sc = cv.scales[(slice + k * slices) / cv.tiles_per_block];
      ks = sc.x;
      vs = sc.y;
    }
    attend_tile<D, typename KV::value_type, quantized>(kv_warp + st * kv_stage_uint4, tok_warp + st * tok_stage_ints,
                                                       q_group, ks, vs, w);
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Split kernel

template <int D, bool InCluster, class TQ, class KV, class Index, class TO>
__global__ void __launch_bounds__(threads, 1)
    split_kernel(const __grid_constant__ device_attention_args<TQ, KV, Index, TO> a, const launch_params lp) {
  using G = geometry<D, kv_bytes_of<KV>>;
  constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
  const device_problem& p = a.prob;
  extern __shared__ uint4 smem[];

  unit u;
  if (!make_unit(p, lp.q_blocks, u)) return;  // CTA-uniform
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t j = static_cast<std::int32_t>(threadIdx.x);
  const std::int32_t entry = split * lp.chunk_blocks + j;  // this thread's entry of the row
  static_assert(max_chunk_blocks <= threads, "one id per thread");

  uint4* kv_all = smem;
  std::int32_t* tok_all = reinterpret_cast<std::int32_t*>(reinterpret_cast<char*>(smem) + kv_bytes);
  float* q_s = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + kv_bytes + tok_bytes_for(G::steps));
  const std::int32_t qr = q_rows(u.rows);
  std::int32_t* ids_s = reinterpret_cast<std::int32_t*>(q_s + static_cast<std::size_t>(q_rows(lp.max_rows)) * D);
  float2* scales_s = reinterpret_cast<float2*>(reinterpret_cast<char*>(ids_s) + ids_bytes(lp.chunk_blocks));

  // Global loads before anything waits on them (each smem store waits for its load): the row's
  // count, the sequence's page list, this thread's id and its predecessor (a block_table's row
  // address does not depend on the count: loaded speculatively, inside the table), then Q.
  entry_ids e;
  // A routed table's row is selected in the K/V buffers (free until the pipeline starts).
  const skim::cuda::device_block_table::span span =
      split_row_span(p, a.index, u, split, entry, e, reinterpret_cast<unsigned char*>(kv_all));
  const kv_rows<KV> src(a.kv, u.row, static_cast<std::int32_t>(blockIdx.z) / lp.q_blocks, u.kv_head);
  load_ids_early(a.index, u, lp, j, entry, e);

  // Q rows (padding rows zero), pre-scaled, in the lane-read layout: q_batch loads, then q_batch stores.
  constexpr int q_batch = 4;
  for (std::int32_t x0 = j; x0 < qr * D; x0 += threads * q_batch) {
    float val[q_batch];
#pragma unroll
    for (int k = 0; k < q_batch; ++k) {
      const std::int32_t x = x0 + k * threads, row = x / D, d = x % D;
      val[k] = 0.0f;
      if (x < qr * D && row < u.rows) {
        const std::int64_t token = static_cast<std::int64_t>(u.row.q_offset) + u.row.q_begin + row / u.heads;
        val[k] = skim::cuda::to_float(a.q.row(token, u.first_head + row % u.heads)[d]);
      }
    }
#pragma unroll
    for (int k = 0; k < q_batch; ++k) {
      const std::int32_t x = x0 + k * threads, row = x / D, d = x % D;
      if (x >= qr * D) break;
      const int chunk = d / 8, c = chunk % G::lanes_per_key, hi = chunk / G::lanes_per_key;
      const int i = hi * 2 + (d % 8) / 4;
      q_s[((row * 4 + i) * G::lanes_per_key + c) * 4 + d % 4] = val[k] * lp.scale_log2;
    }
  }

  const std::int32_t n = span.n > 0 ? span.n : 0;
  const std::int32_t nsplit = used_splits(n, lp);
  if (split >= nsplit) return;  // CTA-uniform, before any barrier
  const std::int32_t first_entry = split * lp.chunk_blocks;
  const std::int32_t entries = n - first_entry < lp.chunk_blocks ? n - first_entry : lp.chunk_blocks;
  load_ids_late<Index>(span, j, entry, entries, e);
  check_ids(p, u, span, n, lp, split, j, entry, entries, e, ids_s);
  if constexpr (quantized) load_scales(src, j, entries, ids_s, scales_s);
  __syncthreads();

  const chunk_view<D, KV> cv{
      .src = src,
      .ids = ids_s,
      .scales = quantized ? scales_s : nullptr,
      .entries = entries,
      .block_kv = p.block_kv,
      .tiles_per_block = (p.block_kv + G::tile_keys - 1) / G::tile_keys,
      .load_end = u.row.visible_keys(u.row.q_end - 1, p.mask),
      .error = p.error};

  // Warps: groups of rows_per_warp rows; fewer than 8 groups → the keys split into slices, else
  // passes of 8 groups, one slice each.
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int32_t groups = qr / rows_per_warp;
  const std::int32_t groups_per_pass = groups < warps ? groups : warps;
  const std::int32_t slices = warps / groups_per_pass;
  const std::int32_t passes = (groups + groups_per_pass - 1) / groups_per_pass;
  const std::int32_t pass_rows = groups_per_pass * rows_per_warp;
  const std::int32_t my_slice = warp / groups_per_pass;
  const bool active_slice = my_slice < slices;

  float* comb_o = reinterpret_cast<float*>(smem);  // aliases kv: used between barriers only
  float* comb_m = comb_o + combine_rows * D;
  float* comb_l = comb_m + combine_rows;
  float* partial_s = comb_l + combine_rows;  // a pass's partial for the cluster merge (finish_pass)

  for (std::int32_t pass = 0; pass < passes; ++pass) {
    const std::int32_t g = pass * groups_per_pass + warp % groups_per_pass;
    const bool active = active_slice && g < groups;
    warp_rows<D> w;
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
      w.m[rr] = -INFINITY;
      w.l[rr] = 0.0f;
#pragma unroll
      for (int e = 0; e < 16; ++e) w.o[rr][e] = 0.0f;
      const std::int32_t row = g * rows_per_warp + rr;
      w.vis[rr] = row < u.rows ? u.row.visible_keys(u.row.q_begin + row / u.heads, p.mask) : 0;
    }
    if (active) {
      attend_slice<D, KV>(cv, my_slice, slices, kv_all + warp * kv_uint4_per_warp, tok_all + warp * stages * G::steps * 32,
                          q_s + static_cast<std::size_t>(g) * rows_per_warp * D, w);
    }
    // Sum o and l over the lanes of different keys (lanes c, c + lanes_per_key, ...).
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
      for (int x = G::lanes_per_key; x < 32; x *= 2) {
        w.l[rr] += __shfl_xor_sync(0xffffffffu, w.l[rr], x);
#pragma unroll
        for (int e = 0; e < 16; ++e) w.o[rr][e] += __shfl_xor_sync(0xffffffffu, w.o[rr][e], x);
      }
    }
    __syncthreads();  // every warp is done with its K/V buffers: comb may overwrite them
    if (active && lane < G::lanes_per_key) {
      const int c = lane;
#pragma unroll
      for (int rr = 0; rr < rows_per_warp; ++rr) {
        const std::int32_t slot = my_slice * pass_rows + (g - pass * groups_per_pass) * rows_per_warp + rr;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const int d = e < 8 ? 8 * c + e : 8 * (c + G::lanes_per_key) + e - 8;
          comb_o[slot * D + d] = w.o[rr][e];
        }
        if (c == 0) {
          comb_m[slot] = w.m[rr];
          comb_l[slot] = w.l[rr];
        }
      }
    }
    __syncthreads();

    // Combine the slices in slice order; write O (one split) or this split's partial.
    const std::int32_t row0 = pass * pass_rows;
    const std::int32_t rows_here = u.rows - row0 < pass_rows ? u.rows - row0 : pass_rows;
    const slice_states st{.o = comb_o, .m = comb_m, .l = comb_l, .slices = slices, .rows = pass_rows, .o_stride = D};
    finish_pass<InCluster, D>(a, lp, u, split, nsplit, st, row0, rows_here, partial_s);
    __syncthreads();  // comb is read before the next pass refills the K/V buffers
  }
}

}  // namespace skim::cuda::detail::decode_impl
