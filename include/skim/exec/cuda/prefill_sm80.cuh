#pragma once
// The tile kernel behind skim::cuda::prefill (prefill.cuh): block-sparse FlashAttention-2 on
// the sm_80 tensor-core instructions (mma.sync m16n8k16, ldmatrix, cp.async), which sm_90a runs too.
//
// One CTA computes one (sequence, query block of BQ rows, query head); warp w owns query rows
// [16w, 16w + 16) of the block. Q is staged through shared memory into registers once (A
// fragments), then the CTA walks its index row's block ids in ascending order; for each id it
// holds the K and V tiles (BK keys x D) in shared memory, double-buffered: the tile of the next id
// is in flight (cp.async, 16 bytes a thread) while this one is multiplied. Per 64-key slice of a
// tile, a warp computes S = Q·Kᵀ (16 x 64, fp32 accumulators), masks it when the id is not a full
// block, updates the online softmax of its rows in registers (row max and sum reduced over the
// quad of threads sharing a row), rounds P to the input type and reuses the S fragments directly
// as the A operand of P·V (FA2's register reuse). O = acc / l and lse = m + log l at the end.
//
// Shared-memory rows are D 16-bit elements, cut into 16-byte chunks; chunk c of row r lives at
// chunk c ^ (r & 7), so the eight row addresses of an ldmatrix phase (rows r..r+7, one logical
// chunk) and the chunk writes of cp.async fall in distinct banks.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, c = 2 * (lane % 4)):
//   A 16x16 row-major, 4 x b32: a0 (g, c..c+1), a1 (g+8, c..c+1), a2 (g, c+8..), a3 (g+8, c+8..)
//   B 16x8 col-major, 2 x b32:  b0 (k = c..c+1, n = g), b1 (k = c+8..c+9, n = g)
//   C 16x8 fp32, 4 x f32:       c0, c1 (g, c..c+1), c2, c3 (g+8, c..c+1)
// ldmatrix.x4 gives register i the 8x8 matrix whose row addresses come from lanes 8i..8i+7, lane
// holding (row lane / 4, cols 2 * (lane % 4) + {0, 1}); .trans gives the transpose.
//
// Quantised K/V (core/cuda/quantized.cuh: int8 or fp8 e4m3 codes, a K and a V scale per key block):
// the double buffering moves to the codes, [BK][D] bytes each for K and V, unswizzled, in the room
// the second 16-bit K/V buffers would take (the shared memory is the same). Once a tile's codes
// land, every thread widens its chunks exactly to Q's 16-bit type into the one swizzled K and V
// tile, and the tile is computed as a 16-bit one, with S scaled by the block's K scale and P by its
// V scale before P·V (P · scale_v rounded to 16 bits; l sums the unscaled P). The codes of the next
// id are in flight meanwhile; a tile costs two barriers, as the 16-bit path's does.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "skim/core/status.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"
#include "skim/exec/cuda/prefill_common.cuh"
#include "skim/exec/cuda/ptx.cuh"

namespace skim::cuda::detail::prefill_sm80 {

// What both prefill kernels share (prefill_common.cuh).
using prefill_common::chunk_elems;
using prefill_common::cta_coords;
using prefill_common::fill_params;
using prefill_common::index_ref;
using prefill_common::kernel_index_t;
using prefill_common::ln2;
using prefill_common::log2e;
using prefill_common::params;
using prefill_common::row_ids;

inline constexpr int slice_keys = 64;    // keys per S slice (16 x 64 fp32 = 32 registers a thread)

// Tiles start on 128 bytes (the XOR addressing below needs address bits 4..6 of a tile base clear);
// the dynamic allocation's own alignment is not relied on beyond 16 bytes, hence the slack.
inline constexpr int tile_alignment = 128;
// After the tiles, one byte per key of each K/V buffer and of the widened tile: 1 where the key's
// row could not be read (a bad page), so the key is masked out like a key past the row's end.
template <int D, int BQ, int BK>
inline constexpr std::size_t smem_bytes =
    static_cast<std::size_t>(BQ + 4 * BK) * D * 2 + 3 * BK + tile_alignment;  // Q + 2 x (K, V) + flags

// ---------------------------------------------------------------------------------------------
// PTX wrappers (ptx.cuh; decode's kernels use the same ones)

using skim::cuda::ptx::cp_async_16;
using skim::cuda::ptx::cp_async_commit;
using skim::cuda::ptx::cp_async_wait;
using skim::cuda::ptx::exp2_approx;
using skim::cuda::ptx::ldmatrix_x4;
using skim::cuda::ptx::ldmatrix_x4_trans;
using skim::cuda::ptx::mma_16816;
using skim::cuda::ptx::pack2;
using skim::cuda::ptx::smem_u32;
using skim::cuda::ptx::static_for;
using skim::cuda::ptx::zero_16;

// Element offset of chunk `chunk` of row `row` in a swizzled [rows][D] tile.
template <int D>
[[nodiscard]] __device__ __forceinline__ int swizzle(int row, int chunk) noexcept {
  return row * D + ((chunk ^ (row & 7)) * chunk_elems);
}

// ldmatrix addresses without a register per (row, chunk) pair: a lane's address is formed once
// for its row and its chunk parity (lane_chunk in {0, 1}); moving by a compile-time even chunk c
// is then an XOR of c's low three bits into address bits 4..6 (which hold chunk ^ (row & 7) for
// a 128-byte aligned tile) plus an add of its high bits; moving by whole 8-row groups is an add.
template <int D>
[[nodiscard]] __device__ __forceinline__ std::uint32_t lane_address(std::uint32_t tile, int row,
                                                                    int lane_chunk) noexcept {
  return tile + static_cast<std::uint32_t>(row * D * 2 + ((lane_chunk ^ (row & 7)) << 4));
}
template <int Chunk>
[[nodiscard]] __device__ __forceinline__ std::uint32_t at_chunk(std::uint32_t lane_addr) noexcept {
  static_assert(Chunk % 2 == 0);
  return (lane_addr ^ static_cast<std::uint32_t>((Chunk & 7) << 4)) + static_cast<std::uint32_t>((Chunk & ~7) << 4);
}

// ---------------------------------------------------------------------------------------------
// K/V row addresses. false when the row cannot be read (a paged list that does not cover it or
// names a page outside the pool: reported as bad_page); the caller zero-fills the tile row and
// flags the key, which is then skipped as decode skips it.

template <class T>
[[nodiscard]] __device__ __forceinline__ bool kv_rows(const skim::cuda::device_contiguous_kv<T>& kv,
                                                      const skim::cuda::device_row& r, std::int32_t b,
                                                      std::int32_t t, std::int32_t h, const T*& k, const T*& v,
                                                      std::uint32_t&) noexcept {
  k = kv.k_row(r, b, t, h);
  v = kv.v_row(r, b, t, h);
  return true;
}

template <class T>
[[nodiscard]] __device__ __forceinline__ bool kv_rows(const skim::cuda::device_paged_kv<T>& kv,
                                                      const skim::cuda::device_row&, std::int32_t b, std::int32_t t,
                                                      std::int32_t h, const T*& k, const T*& v,
                                                      std::uint32_t& bits) noexcept {
  const std::int64_t off = kv.offset(b, t, h);
  if (off < 0) {
    bits |= skim::cuda::bad_page;
    return false;
  }
  k = kv.k_pages + off;
  v = kv.v_pages + off;
  return true;
}

// The rows a kernel loads: a quantised source's codes, or the source itself.
template <class KV>
[[nodiscard]] __device__ __forceinline__ const auto& stored_rows(const KV& kv) noexcept {
  if constexpr (skim::cuda::is_device_quantized_kv_v<KV>) {
    return kv.codes;
  } else {
    return kv;
  }
}

// ---------------------------------------------------------------------------------------------
// The kernel. Grid: one CTA per (query block, sequence, query head), head fastest (the heads of
// a GQA group read the same K/V tiles close together in time, from L2), query blocks from the
// last one down (causal rows with more tiles start first). A CTA whose block does not exist in
// its sequence returns at once.
template <class T, class KV, int D, int BQ, int BK, class Index = index_ref>
__global__ void __launch_bounds__(BQ / 16 * 32) prefill_kernel(const params<T, KV, Index> prm) {
  static_assert(D % 16 == 0 && BQ % 16 == 0 && BK % slice_keys == 0);
  constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
  using Stored = typename KV::value_type;  // T, or the codes of a quantised source
  static_assert(std::is_same_v<Stored, T> || quantized);
  constexpr int warps = BQ / 16;
  constexpr int threads = warps * 32;
  constexpr int chunks = D / chunk_elems;  // 16-byte chunks per row
  static_assert(threads % chunks == 0 && (BK * chunks) % threads == 0 && (BQ * chunks) % threads == 0);
  constexpr int row_step = threads / chunks;  // rows one pass of the CTA's loads covers
  constexpr int dn = D / 8;                   // 8-wide n tiles of O
  constexpr int sn = slice_keys / 8;          // 8-wide n tiles of S

  extern __shared__ __align__(16) unsigned char skim_prefill_smem[];
  unsigned char* const smem =
      skim_prefill_smem + (tile_alignment - smem_u32(skim_prefill_smem) % tile_alignment) % tile_alignment;
  T* const sq = reinterpret_cast<T*>(smem);  // [BQ][D]
  T* const sk = sq + BQ * D;                 // [2][BK][D]; quantised: buffer 0 is the widened K tile
  T* const sv = sk + 2 * BK * D;             // [2][BK][D]; quantised: buffer 0 is the widened V tile
  // Quantised: the codes, [2][BK][D] bytes for K and for V, in the room of the second 16-bit K and
  // V buffers (2·BK·D bytes each).
  unsigned char* const ck = reinterpret_cast<unsigned char*>(sk + BK * D);
  unsigned char* const cv = reinterpret_cast<unsigned char*>(sv + BK * D);
  // Bad-key flags [3][BK]: K/V buffers 0 and 1, then the widened tile's (quantised). Only a paged
  // source can fail to read a row; contiguous K/V never touches them.
  std::uint8_t* const bad_key = reinterpret_cast<std::uint8_t*>(smem + static_cast<std::size_t>(BQ + 4 * BK) * D * 2);
  constexpr bool can_fail =
      !std::is_same_v<std::remove_cvref_t<decltype(stored_rows(prm.kv))>, skim::cuda::device_contiguous_kv<Stored>>;

  const skim::cuda::device_problem& p = prm.prob;
  const auto [h, b, i] = cta_coords(p);

  const skim::cuda::device_row row = skim::cuda::make_device_row(p, b, i);
  if (!row.ok) return;  // no query block here (or a bad sequence, reported)

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const std::int32_t kv_head = h / p.group_size();
  std::uint32_t bits = 0;
  auto cursor = row_ids(prm.index, p, b, i, h, row, bits);

  // Loads: thread tid always moves chunk tid % chunks of rows tid / chunks + k · row_step.
  const int my_chunk = tid % chunks;
  const int my_row = tid / chunks;

  // Q tile; rows past the block's last query are zero (never read from memory, never written).
  {
    const std::int32_t q_rows = row.q_end - row.q_begin;
#pragma unroll
    for (int k = 0; k < BQ / row_step; ++k) {
      const int r = my_row + k * row_step;
      const std::uint32_t dst = smem_u32(sq + swizzle<D>(r, my_chunk));
      if (r < q_rows) {
        cp_async_16(dst, prm.q.row(static_cast<std::int64_t>(row.q_offset) + row.q_begin + r, h) + my_chunk * chunk_elems);
      } else {
        zero_16(dst);
      }
    }
    cp_async_commit();
  }

  // Codes move as 16-byte chunks of 16: thread tid moves chunk tid % code_chunks of rows
  // tid / code_chunks + k · code_row_step.
  constexpr int code_chunks = D / 16;
  static_assert(threads % code_chunks == 0 && (BK * code_chunks) % threads == 0);
  constexpr int code_row_step = threads / code_chunks;
  const int my_code_chunk = tid % code_chunks;
  const int my_code_row = tid / code_chunks;

  // K and V tile of block `id` into buffer `buf` (16-bit tiles, or the codes of a quantised
  // source). Keys at or past kv_len are zero-filled, not read: they may belong to the next
  // sequence, or lie past the allocation. A key whose row cannot be read is zero-filled too and
  // flagged in bad_key[buf] (by the thread moving its chunk 0, so every flag of the buffer is
  // rewritten by each load); returns whether this thread met one.
  const auto load_tile = [&](std::int32_t id, int buf) {
    bool met_bad = false;
    constexpr int elems = quantized ? 16 : chunk_elems;  // stored elements per 16-byte copy
    constexpr int step = quantized ? code_row_step : row_step;
    const int chunk = quantized ? my_code_chunk : my_chunk;
    const int first_row = quantized ? my_code_row : my_row;
#pragma unroll
    for (int k = 0; k < BK / step; ++k) {
      const int r = first_row + k * step;
      const std::int32_t key = id * BK + r;
      std::uint32_t dk, dv;
      if constexpr (quantized) {
        dk = smem_u32(ck + (buf * BK + r) * D + chunk * 16);
        dv = smem_u32(cv + (buf * BK + r) * D + chunk * 16);
      } else {
        dk = smem_u32(sk + buf * BK * D + swizzle<D>(r, chunk));
        dv = smem_u32(sv + buf * BK * D + swizzle<D>(r, chunk));
      }
      const Stored* kr = nullptr;
      const Stored* vr = nullptr;
      const bool in_seq = key < row.kv_len;
      const bool readable = in_seq && kv_rows(stored_rows(prm.kv), row, b, key, kv_head, kr, vr, bits);
      if (readable) {
        cp_async_16(dk, kr + chunk * elems);
        cp_async_16(dv, vr + chunk * elems);
      } else {
        zero_16(dk);
        zero_16(dv);
      }
      if constexpr (can_fail) {
        const bool bad = in_seq && !readable;
        met_bad = met_bad || bad;
        if (chunk == 0) bad_key[buf * BK + r] = bad ? 1 : 0;
      }
    }
    return met_bad;
  };

  // Quantised: the codes in buffer `buf`, widened exactly into the 16-bit K and V tiles (each
  // thread the chunks it copied). @pre they landed and are visible to the CTA (barrier); the
  // caller synchronises again before reading the tiles.
  const auto widen_tile = [&](int buf) {
    if constexpr (quantized) {
#pragma unroll
      for (int k = 0; k < BK / code_row_step; ++k) {
        const int r = my_code_row + k * code_row_step;
        const int off = (buf * BK + r) * D + my_code_chunk * 16;
        uint4 lo, hi;
        skim::cuda::widen16_codes<T, Stored>(*reinterpret_cast<const uint4*>(ck + off), lo, hi);
        *reinterpret_cast<uint4*>(sk + swizzle<D>(r, 2 * my_code_chunk)) = lo;
        *reinterpret_cast<uint4*>(sk + swizzle<D>(r, 2 * my_code_chunk + 1)) = hi;
        skim::cuda::widen16_codes<T, Stored>(*reinterpret_cast<const uint4*>(cv + off), lo, hi);
        *reinterpret_cast<uint4*>(sv + swizzle<D>(r, 2 * my_code_chunk)) = lo;
        *reinterpret_cast<uint4*>(sv + swizzle<D>(r, 2 * my_code_chunk + 1)) = hi;
        // The flag goes with the widened row (set by this thread's own load of the row).
        if (can_fail && my_code_chunk == 0) bad_key[2 * BK + r] = bad_key[buf * BK + r];
      }
    }
  };

  std::int32_t id = cursor.next(bits);
  bool met_bad = id >= 0 && load_tile(id, 0);  // this thread's load of the tile computed next
  cp_async_commit();

  // Q fragments: warp's 16 rows, D / 16 k-steps of 16 dims.
  cp_async_wait<1>();  // the Q group (the first tile may still be in flight)
  __syncthreads();
  std::uint32_t qf[D / 16][4];
  {
    const std::uint32_t qa = lane_address<D>(smem_u32(sq), warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
    static_for<D / 16>([&](auto kk) { ldmatrix_x4(qf[kk], at_chunk<2 * kk>(qa)); });
  }

  // This thread's rows of the block: g and g + 8 of the warp's 16. Keys [0, vis[r]) are visible.
  const int g = lane / 4;
  const int quad_col = 2 * (lane % 4);
  std::int32_t vis[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) vis[r] = row.visible_keys(row.q_begin + warp * 16 + g + 8 * r, p.mask);

  float acc[dn][4];
#pragma unroll
  for (int j = 0; j < dn; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the row, base-2 units
  float l[2] = {0.0f, 0.0f};            // this thread's share of the row's sum (quad-reduced at the end)
  const float scale_log2 = prm.scale_log2;

  // One K/V tile: S slices of 64 keys, softmax update, P·V. The mask is compile-time so full
  // tiles carry no mask arithmetic: none, the row's visible keys, or those and the keys flagged in
  // `bad` (a tile with a key on a bad page). S is multiplied by s_mul (the softmax scale in base-2
  // units, times the block's K scale when quantised), P by p_mul before P·V when quantised (the V
  // scale).
  enum mask_kind { no_mask, visible_mask, bad_key_mask };
  const auto compute_tile = [&](std::uint32_t k_lane, std::uint32_t v_lane, std::int32_t tile_id, float s_mul,
                                float p_mul, const std::uint8_t* bad, auto mask_tag) {
    constexpr int mask = decltype(mask_tag)::value;
    constexpr bool masked = mask != no_mask;
    // Not unrolled: a second slice in flight would hold another 32 S registers (spills at D 128).
#pragma unroll 1
    for (int slice = 0; slice < BK / slice_keys; ++slice) {
      float s[sn][4];
#pragma unroll
      for (int j = 0; j < sn; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      static_for<D / 16>([&](auto kk) {
#pragma unroll
        for (int np = 0; np < sn / 2; ++np) {
          // Keys slice·64 + 16np + [0, 16), dims 16kk + [0, 16): b0/b1 of n tiles 2np and 2np + 1.
          std::uint32_t kf[4];
          ldmatrix_x4(kf, at_chunk<2 * kk>(k_lane) + (slice * slice_keys + np * 16) * D * 2);
          mma_16816<T>(s[2 * np], qf[kk], kf[0], kf[1]);
          mma_16816<T>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
        }
      });

      // Scale into base-2 units first, then mask: a negative scale must not turn -inf into +inf.
#pragma unroll
      for (int j = 0; j < sn; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= s_mul;
      }
      if constexpr (masked) {
        const std::int32_t key0 = tile_id * BK + slice * slice_keys + quad_col;
#pragma unroll
        for (int j = 0; j < sn; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 8 * j + (e & 1);
            bool out = key0 + col >= vis[e / 2];
            if constexpr (mask == bad_key_mask) out = out || bad[slice * slice_keys + quad_col + col] != 0;
            if (out) s[j][e] = -INFINITY;
          }
        }
      }

      // Online softmax, per row r (elements e = 2r, 2r + 1 of each n tile).
      float m_use[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[r];
#pragma unroll
        for (int j = 0; j < sn; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // -inf - -inf: a row with no visible key so far keeps its max at -inf; subtract 0 instead,
        // so every p is 0 and alpha (2^-inf) clears nothing but zeros.
        m_use[r] = mx == -INFINITY ? 0.0f : mx;
        const float alpha = exp2_approx(m[r] - m_use[r]);
        m[r] = mx;
        l[r] *= alpha;
#pragma unroll
        for (int j = 0; j < dn; ++j) {
          acc[j][2 * r] *= alpha;
          acc[j][2 * r + 1] *= alpha;
        }
      }
#pragma unroll
      for (int j = 0; j < sn; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = exp2_approx(s[j][e] - m_use[e / 2]);
          l[e / 2] += s[j][e];
        }
      }

      // P·V: the S fragments of n tiles 2kk, 2kk + 1 are the A fragment of k-step kk.
      const auto pw = [&](int jn, int e) { return quantized ? s[jn][e] * p_mul : s[jn][e]; };
#pragma unroll
      for (int kk = 0; kk < slice_keys / 16; ++kk) {
        const std::uint32_t pa[4] = {pack2<T>(pw(2 * kk, 0), pw(2 * kk, 1)), pack2<T>(pw(2 * kk, 2), pw(2 * kk, 3)),
                                     pack2<T>(pw(2 * kk + 1, 0), pw(2 * kk + 1, 1)),
                                     pack2<T>(pw(2 * kk + 1, 2), pw(2 * kk + 1, 3))};
        static_for<D / 16>([&](auto dp) {
          // Keys slice·64 + 16kk + [0, 16), dims 16dp + [0, 16), transposed: b0/b1 of O n tiles 2dp, 2dp + 1.
          std::uint32_t vf[4];
          ldmatrix_x4_trans(vf, at_chunk<2 * dp>(v_lane) + (slice * slice_keys + kk * 16) * D * 2);
          mma_16816<T>(acc[2 * dp], pa, vf[0], vf[1]);
          mma_16816<T>(acc[2 * dp + 1], pa, vf[2], vf[3]);
        });
      }
    }
  };

  // Lane addresses of the K (non-transposed, keys (lane % 8) + 8 (lane / 16), chunk parity
  // (lane / 8) % 2) and V (transposed, keys (lane % 8) + 8 ((lane / 8) % 2), chunk parity lane / 16)
  // fragments in buffer 0.
  const std::uint32_t k_lane0 = lane_address<D>(smem_u32(sk), (lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
  const std::uint32_t v_lane0 = lane_address<D>(smem_u32(sv), (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);

  // Main loop: tile t computes from buffer t & 1 while tile t + 1 loads into the other one.
  // One commit group per iteration (empty at the end) keeps wait_group<1> meaning "tile t landed".
  for (int t = 0; id >= 0; ++t) {
    const std::int32_t next = cursor.next(bits);
    const bool next_bad = next >= 0 && load_tile(next, (t + 1) & 1);
    cp_async_commit();
    float s_mul = scale_log2, p_mul = 1.0f;
    if constexpr (quantized) {  // read while the tile lands; id is one of the row's visible blocks
      const std::int64_t si = prm.kv.scale_index(b, id, kv_head);
      s_mul *= prm.kv.k_scales[si];
      p_mul = prm.kv.v_scales[si];
    }
    cp_async_wait<1>();
    // Tile t visible to every warp (quantised: and every warp done with tile t - 1); with a source
    // that can fail, the barrier also tells every thread whether any key of the tile is bad.
    bool tile_bad = false;
    if constexpr (can_fail) {
      tile_bad = __syncthreads_or(met_bad ? 1 : 0) != 0;
    } else {
      __syncthreads();
    }
    std::uint32_t buf_off = 0;
    const std::uint8_t* bad = bad_key + (t & 1) * BK;
    if constexpr (quantized) {
      widen_tile(t & 1);
      __syncthreads();  // the widened tile (and its flags) visible to every warp
      bad = bad_key + 2 * BK;
    } else {
      buf_off = static_cast<std::uint32_t>((t & 1) * BK * D * 2);
    }
    using none = std::integral_constant<int, no_mask>;
    using visible = std::integral_constant<int, visible_mask>;
    using flagged = std::integral_constant<int, can_fail ? bad_key_mask : visible_mask>;
    if (tile_bad) {
      compute_tile(k_lane0 + buf_off, v_lane0 + buf_off, id, s_mul, p_mul, bad, flagged{});
    } else if (id < row.full_blocks) {
      compute_tile(k_lane0 + buf_off, v_lane0 + buf_off, id, s_mul, p_mul, bad, none{});
    } else {
      compute_tile(k_lane0 + buf_off, v_lane0 + buf_off, id, s_mul, p_mul, bad, visible{});
    }
    // Every warp done with buffer t & 1 before iteration t + 1 refills it. Quantised, the next
    // barrier does it: the codes of buffer t & 1 were read before the barrier above, and the
    // widened tile is rewritten only after the next iteration's first barrier.
    if constexpr (!quantized) __syncthreads();
    id = next;
    met_bad = next_bad;
  }
  cp_async_wait<0>();

  // Epilogue: O = acc / l, lse = (m + log2 l) · ln 2; a row with no visible key gets 0 and -inf.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int32_t qi = row.q_begin + warp * 16 + g + 8 * r;
    if (qi >= row.q_end) continue;
    const std::int64_t token = static_cast<std::int64_t>(row.q_offset) + qi;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const std::int64_t base = token * prm.o_token_stride + h * prm.o_head_stride + quad_col;
    if (prm.o_fp32) {
      float* o = static_cast<float*>(prm.o) + base;
#pragma unroll
      for (int j = 0; j < dn; ++j) {
        *reinterpret_cast<float2*>(o + 8 * j) = make_float2(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
      }
    } else {
      T* o = static_cast<T*>(prm.o) + base;
#pragma unroll
      for (int j = 0; j < dn; ++j) {
        *reinterpret_cast<std::uint32_t*>(o + 8 * j) = pack2<T>(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);
      }
    }
    if (prm.lse != nullptr && lane % 4 == 0) {
      prm.lse[token * p.heads_q + h] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * ln2 : -INFINITY;
    }
  }

  // Index bits are the same in every thread: one report. Page bits are per thread.
  const std::uint32_t mine = tid == 0 ? bits : bits & skim::cuda::bad_page;
  if (mine != 0) skim::cuda::report(p, mine);
}


// Launches the (D, BQ, BK) kernel: grid of max_q_blocks · batch · heads_q CTAs, BQ / 16 warps each.
template <class T, class KV, class Index, int D, int BQ, int BK>
[[nodiscard]] status launch(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  constexpr std::size_t smem = smem_bytes<D, BQ, BK>;
  constexpr int threads = BQ / 16 * 32;
  constexpr auto kernel = prefill_kernel<T, KV, D, BQ, BK, Index>;
  if constexpr (smem > 48 * 1024) {
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::prefill: device attributes"));
    if (static_cast<std::size_t>(d.smem_optin) < smem) {
      return status::error(status_code::unsupported,
                           "prefill tile (head_dim %d, block_q %d, block_kv %d) needs %zu bytes of shared memory, "
                           "device %d allows %d", D, BQ, BK, smem, d.device, d.smem_optin);
    }
    SKIM_TRY(skim::cuda::allow_dynamic_smem<kernel>(d, "cudaFuncSetAttribute in skim::cuda::prefill"));
  }
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(prm);
  return skim::cuda::check_launch("skim::cuda::prefill");
}

template <class T, class KV, class Index, int D, int BQ>
[[nodiscard]] status launch_bk(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  return prm.prob.block_kv == 64 ? launch<T, KV, Index, D, BQ, 64>(prm, grid, stream)
                                  : launch<T, KV, Index, D, BQ, 128>(prm, grid, stream);
}

template <class T, class KV, class Index, int D>
[[nodiscard]] status launch_bq(const params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  return prm.prob.block_q == 64 ? launch_bk<T, KV, Index, D, 64>(prm, grid, stream)
                                : launch_bk<T, KV, Index, D, 128>(prm, grid, stream);
}


// Launches this kernel for `a` (checked by the caller): head_dim, block_q, block_kv 64 or 128.
template <class TQ, class KV, class Index, class TO>
[[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a, std::int64_t grid,
                         cudaStream_t stream) noexcept {
  using KI = kernel_index_t<Index>;
  params<TQ, KV, KI> prm;
  fill_params(prm, a);
  return a.prob.head_dim == 64 ? launch_bq<TQ, KV, KI, 64>(prm, grid, stream)
                               : launch_bq<TQ, KV, KI, 128>(prm, grid, stream);
}

}  // namespace skim::cuda::detail::prefill_sm80
