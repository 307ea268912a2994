#pragma once
// The Hopper kernel behind skim::cuda::prefill (prefill.cuh): block-sparse prefill attention
// on the warpgroup matrix multiply (wgmma, sm_90a), with the same semantics and contracts as the
// sm_80 kernel (prefill_sm80.cuh; P rounded to the input type before P·V, the device error word,
// o = 0 / lse = -inf for rows that see no key, deterministic), on a narrower set of shapes:
//
//   head_dim 64 or 128, block_q 128, block_kv 64 or 128, Q and K/V both bf16 or both fp16 (or K/V
//   as int8 / fp8 e4m3 codes), O of the same type or float, K/V contiguous, any device index
//   (index/cuda/device_index.cuh), scope kv_head or query_head. prefill picks it on an sm_90 device
//   for such problems (prefill_kernel::automatic) when the binary holds its wgmma body: built for
//   sm_90a (`-gencode=arch=compute_90a,code=sm_90a`).
//   Other device passes (sm_80, plain sm_90) compile a stand-in body that prefill recognises by its
//   static shared memory (available()) and never launches; paged K/V takes the sm_80 kernel.
//
// The kernel: one CTA of three warpgroups per (query block of 128 rows, sequence, query head).
//   - Warpgroup 0 produces: it walks the index row's ids (checked as prefill does), copies Q once
//     (cp.async) and the K and V tiles of each id into a ring of `stages` shared-memory buffers:
//     a tile inside the sequence by tensor copies (TMA, cp.async.bulk.tensor through K/V tensor
//     maps encoded by run(), one thread issuing), the sequence's last partial tile by cp.async with
//     the keys at or past kv_len zero-filled, never read. A buffer is handed over through an
//     mbarrier ("full", with the id in a shared slot; id -1 ends the row) and taken back through
//     another ("empty"). It keeps few registers (setmaxnreg).
//     (With cp.async for every tile this kernel ran no faster than the sm80 one, both bound by moving
//     tiles; whole-tile tensor copies are what make it faster: docs/performance.md, GPU prefill.)
//     Over 8-bit codes its threads load every tile's codes into registers, widen them exactly to
//     Q's type and store the same 16-bit tiles, with the block's K and V scales in a slot beside
//     the id; the consumers scale S by the K scale and P by the V scale (rounded to 16 bits; l sums
//     the unscaled P), as the sm_80 kernel does.
//   - Warpgroups 1 and 2 consume, 64 query rows each: S = Q·Kᵀ by wgmma (Q and K from shared
//     memory, K-major), online softmax in registers (masking only on tiles that are not full
//     blocks), then O += P·V by wgmma with P from registers and V from shared memory (MN-major).
//     The S product of tile t + 1 is issued before the P·V product of tile t, so the tensor cores
//     work on both while the warpgroup waits for S only; the softmax of tile t + 1 runs while
//     P·V of tile t may still be in flight.
// Shared tiles are [rows][D] 16-bit, stored as D / 64 column blocks of [rows][64] with the
// 128-byte swizzle that the wgmma descriptors name (wgmma.cuh): chunk c of row r at chunk c ^ (r % 8).
//
// Determinism: ids are taken in index order, every product and reduction has a fixed order, each
// output element is written by one thread: repeated runs are bit-identical.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>  // CUtensorMap (the encoder is fetched through the runtime: no -lcuda)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "skim/core/status.hpp"
#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"
#include "skim/exec/cuda/prefill_common.cuh"
#include "skim/exec/cuda/ptx.cuh"
#include "skim/exec/cuda/wgmma.cuh"

namespace skim::cuda {

namespace detail::prefill_sm90 {

// What both prefill kernels share (prefill_common.cuh).
using prefill_common::chunk_elems;
using prefill_common::cta_coords;
using prefill_common::index_ref;
using prefill_common::kernel_index_t;
using prefill_common::ln2;
using prefill_common::params;
using prefill_common::row_ids;

inline constexpr int block_q = 128;              // two consumer warpgroups of 64 rows
inline constexpr int threads = 3 * 128;          // producer warpgroup + two consumers
inline constexpr int producer_regs = 56;         // setmaxnreg budgets: 56·128 + 224·256 = 64512 of 65536
inline constexpr int consumer_regs = 224;
inline constexpr int stages = 3;                 // K/V buffers in the ring (d 128, bk 128: 224 KB with Q)
inline constexpr int atom_bytes = 1024;          // 8 rows x 128 bytes: the swizzle atom

// Byte offset of 16-byte chunk `c` of row `r` in a [R][D] tile laid out for the 128-byte swizzle.
template <int R>
[[nodiscard]] __device__ __forceinline__ std::uint32_t tile_offset(int r, int c) noexcept {
  return static_cast<std::uint32_t>((c / 8) * (R * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4));
}

template <int D, int BK>
struct layout {
  static constexpr std::uint32_t q_bytes = block_q * D * 2;
  static constexpr std::uint32_t tile_bytes = BK * D * 2;  // one K or one V tile
  static constexpr std::uint32_t q = 0;
  static constexpr std::uint32_t k = q + q_bytes;
  static constexpr std::uint32_t v = k + stages * tile_bytes;
  static constexpr std::uint32_t full = v + stages * tile_bytes;  // mbarriers, 8 bytes each
  static constexpr std::uint32_t empty = full + 8 * stages;
  static constexpr std::uint32_t q_ready = empty + 8 * stages;
  static constexpr std::uint32_t ids = q_ready + 8;  // int32 per stage: the tile's block id, -1 = end
  // float2 per stage: the block's K and V scales (codes), on 8 bytes
  static constexpr std::uint32_t scales = (ids + 4 * stages + 7) / 8 * 8;
  static constexpr std::size_t bytes = scales + 8 * stages + atom_bytes;  // + slack to align the base
};

// The K/V sources this kernel reads: contiguous 16-bit K/V of Q's type, or contiguous 8-bit codes
// (core/cuda/quantized.cuh) that its producer widens into the same 16-bit tiles.
template <class T, class KV>
inline constexpr bool wgmma_source_v = std::is_same_v<KV, skim::cuda::device_contiguous_kv<T>>;
template <class T, class Code>
inline constexpr bool wgmma_source_v<T, skim::cuda::device_quantized_kv<skim::cuda::device_contiguous_kv<Code>>> =
    skim::cuda::is_device_code_v<Code>;

// The kernel's arguments: prefill's, and the tensor maps of K and V (3-d: head_dim, token, kv head;
// boxes of 64 dims x BK tokens, 128-byte swizzle) through which whole tiles are copied.
template <class T, class KV, class Index = index_ref>
struct tma_params : params<T, KV, Index> {
  CUtensorMap k_map;
  CUtensorMap v_map;
};

// Static shared memory of the kernel's stand-in body, built where wgmma is not (sm_80, plain sm_90):
// run() tells the two bodies apart by it (cudaFuncGetAttributes) and never launches the stand-in.
inline constexpr int stand_in_marker_bytes = 16;

template <class T, class KV, int D, int BK, class Index>
__global__ void __launch_bounds__(threads, 1) prefill_sm90_kernel(const __grid_constant__ tma_params<T, KV, Index> prm) {
#if SKIM_WGMMA_AVAILABLE
  namespace wg = skim::cuda::wgmma;
  using skim::cuda::ptx::exp2_approx;
  using skim::cuda::ptx::pack2;
  using skim::cuda::ptx::smem_u32;
  using skim::cuda::ptx::static_for;
  using L = layout<D, BK>;
  constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
  constexpr int chunks = D / chunk_elems;      // 16-byte chunks per row
  constexpr int row_step = 128 / chunks;       // rows one pass of the producer's 128 threads covers
  static_assert(BK % row_step == 0 && block_q % row_step == 0);

  extern __shared__ __align__(16) unsigned char skim_prefill_sm90_smem[];
  const std::uint32_t raw = smem_u32(skim_prefill_sm90_smem);
  const std::uint32_t base = (raw + atom_bytes - 1) / atom_bytes * atom_bytes;
  unsigned char* const smem = skim_prefill_sm90_smem + (base - raw);  // generic address of `base`
  std::int32_t* const tile_ids = reinterpret_cast<std::int32_t*>(smem + L::ids);
  float2* const tile_scales = reinterpret_cast<float2*>(smem + L::scales);

  const skim::cuda::device_problem& p = prm.prob;
  const auto [h, b, i] = cta_coords(p);

  const skim::cuda::device_row row = skim::cuda::make_device_row(p, b, i);
  if (!row.ok) return;  // no query block here (or a bad sequence, reported): uniform over the CTA

  const int tid = static_cast<int>(threadIdx.x);
  const std::int32_t kv_head = h / p.group_size();
  const auto full = [&](int s) { return base + L::full + 8u * static_cast<std::uint32_t>(s); };
  const auto empty = [&](int s) { return base + L::empty + 8u * static_cast<std::uint32_t>(s); };
  const std::uint32_t q_ready = base + L::q_ready;

  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      wg::mbar_init(full(s), 128);   // every producer thread arrives once its copies landed
      wg::mbar_init(empty(s), 256);  // every consumer thread arrives once its products are done
    }
    wg::mbar_init(q_ready, 128);
  }
  __syncthreads();

  if (tid < 128) {
    // ---------------------------------------------------------------- producer warpgroup
    wg::setmaxnreg_dec<producer_regs>();
    std::uint32_t bits = 0;
    auto ids = row_ids(prm.index, p, b, i, h, row, bits);

    const int chunk = tid % chunks;
    const int row0 = tid / chunks;

    // Q; rows past the block's last query are zero (never read).
    const std::int32_t q_rows = row.q_end - row.q_begin;
#pragma unroll
    for (int k = 0; k < block_q / row_step; ++k) {
      const int r = row0 + k * row_step;
      const bool ok = r < q_rows;
      const T* src = ok ? prm.q.row(static_cast<std::int64_t>(row.q_offset) + row.q_begin + r, h) + chunk * chunk_elems
                        : prm.q.data;
      wg::cp_async_16_zfill(base + L::q + tile_offset<block_q>(r, chunk), src, ok ? 16u : 0u);
    }
    skim::cuda::ptx::cp_async_commit();

    // K/V tiles. A tile inside the sequence is two tensor copies per 64 dims (one thread issues
    // them; the buffer's barrier counts their bytes); the sequence's last, partial tile is copied by
    // cp.async with the keys past kv_len zero-filled, never read. Q is announced once tile 0 is in
    // flight, and before the producer first blocks on a buffer.
    // Codes: every tile by the 128 threads, 16 codes a load (thread tid: chunk tid % code_chunks of
    // rows tid / code_chunks + k · code_step), `batch` rows of K and of V in flight, each widened
    // exactly to T (cvt: fp8 e4m3 and int8 are exact in bf16 and fp16) and stored as two 16-byte
    // chunks of the swizzled tile; keys at or past kv_len are zero, never read. Thread 0 puts the
    // block's scales beside its id. Generic stores, so each thread fences them for wgmma's reads.
    const auto widen_codes = [&](std::int32_t id, int s, std::uint32_t kb, std::uint32_t vb) {
      if constexpr (quantized) {
        using Code = typename KV::value_type;
        constexpr int code_chunks = D / 16;
        constexpr int code_step = 128 / code_chunks;
        constexpr int passes = BK / code_step;
        constexpr int batch = passes < 2 ? passes : 2;  // 4 spills under the producer's 56 registers
        const int cc = tid % code_chunks;
        const int cr0 = tid / code_chunks;
        if (tid == 0) {
          const std::int64_t si = prm.kv.scale_index(b, id, kv_head);
          tile_scales[s] = make_float2(prm.kv.k_scales[si], prm.kv.v_scales[si]);
        }
#pragma unroll
        for (int k0 = 0; k0 < passes; k0 += batch) {
          uint4 kw[batch], vw[batch];
#pragma unroll
          for (int k = 0; k < batch; ++k) {
            const std::int32_t key = id * BK + cr0 + (k0 + k) * code_step;
            kw[k] = vw[k] = make_uint4(0u, 0u, 0u, 0u);
            if (key < row.kv_len) {
              kw[k] = *reinterpret_cast<const uint4*>(prm.kv.codes.k_row(row, b, key, kv_head) + cc * 16);
              vw[k] = *reinterpret_cast<const uint4*>(prm.kv.codes.v_row(row, b, key, kv_head) + cc * 16);
            }
          }
#pragma unroll
          for (int k = 0; k < batch; ++k) {
            const int r = cr0 + (k0 + k) * code_step;
            uint4 lo, hi;
            skim::cuda::widen16_codes<T, Code>(kw[k], lo, hi);
            *reinterpret_cast<uint4*>(smem + (kb - base) + tile_offset<BK>(r, 2 * cc)) = lo;
            *reinterpret_cast<uint4*>(smem + (kb - base) + tile_offset<BK>(r, 2 * cc + 1)) = hi;
            skim::cuda::widen16_codes<T, Code>(vw[k], lo, hi);
            *reinterpret_cast<uint4*>(smem + (vb - base) + tile_offset<BK>(r, 2 * cc)) = lo;
            *reinterpret_cast<uint4*>(smem + (vb - base) + tile_offset<BK>(r, 2 * cc + 1)) = hi;
          }
        }
        wg::fence_proxy_async();
        wg::mbar_arrive(full(s));
      }
    };

    bool q_pending = true;
    const auto flush_q = [&] {
      if (q_pending) {
        skim::cuda::ptx::cp_async_wait<0>();
        wg::fence_proxy_async();  // the copies are visible to wgmma's (async proxy) reads
        wg::mbar_arrive(q_ready);
        q_pending = false;
      }
    };
    int t = 0;
    for (std::int32_t id = ids.next(bits); id >= 0; id = ids.next(bits), ++t) {
      const int s = t % stages;
      if (t >= stages) {
        flush_q();
        wg::mbar_wait(empty(s), static_cast<std::uint32_t>((t / stages + 1) & 1));
      }
      const std::uint32_t kb = base + L::k + static_cast<std::uint32_t>(s) * L::tile_bytes;
      const std::uint32_t vb = base + L::v + static_cast<std::uint32_t>(s) * L::tile_bytes;
      if (tid == 0) tile_ids[s] = id;
      if constexpr (quantized) {
        widen_codes(id, s, kb, vb);
      } else if ((id + 1) * BK <= row.kv_len) {
        if (tid == 0) {
          wg::mbar_arrive_expect_tx(full(s), 2 * L::tile_bytes);
          const std::int32_t token = row.kv_offset + id * BK;
#pragma unroll
          for (int c = 0; c < D / 64; ++c) {
            wg::tma_load_3d(kb + static_cast<std::uint32_t>(c * BK * 128), &prm.k_map, 64 * c, token, kv_head, full(s));
            wg::tma_load_3d(vb + static_cast<std::uint32_t>(c * BK * 128), &prm.v_map, 64 * c, token, kv_head, full(s));
          }
        } else {
          wg::mbar_arrive(full(s));
        }
      } else {
#pragma unroll 4
        for (int k = 0; k < BK / row_step; ++k) {
          const int r = row0 + k * row_step;
          const std::int32_t key = id * BK + r;
          const bool ok = key < row.kv_len;
          const T* ks = ok ? prm.kv.k_row(row, b, key, kv_head) + chunk * chunk_elems : prm.kv.k;
          const T* vs = ok ? prm.kv.v_row(row, b, key, kv_head) + chunk * chunk_elems : prm.kv.v;
          const std::uint32_t off = tile_offset<BK>(r, chunk);
          wg::cp_async_16_zfill(kb + off, ks, ok ? 16u : 0u);
          wg::cp_async_16_zfill(vb + off, vs, ok ? 16u : 0u);
        }
        skim::cuda::ptx::cp_async_commit();
        skim::cuda::ptx::cp_async_wait<0>();
        wg::fence_proxy_async();
        wg::mbar_arrive(full(s));
      }
      if (t == 0) flush_q();
    }
    flush_q();
    // End of the row: id -1 in the next buffer.
    const int s = t % stages;
    if (t >= stages) wg::mbar_wait(empty(s), static_cast<std::uint32_t>((t / stages + 1) & 1));
    if (tid == 0) tile_ids[s] = -1;
    wg::mbar_arrive(full(s));
    if (tid == 0 && bits != 0) skim::cuda::report(p, bits);
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    wg::setmaxnreg_inc<consumer_regs>();
    const int ctid = tid - 128;
    const int cw = ctid / 128;        // consumer warpgroup: query rows [64 cw, 64 cw + 64)
    const int wi = (ctid / 32) % 4;   // warp in the warpgroup: rows 16 wi + [0, 16) of those
    const int lane = ctid % 32;
    const int g = lane / 4;
    const int quad_col = 2 * (lane % 4);

    // This thread's rows (g and g + 8 of the warp's 16): keys [0, vis[r]) are visible.
    std::int32_t vis[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) vis[r] = row.visible_keys(row.q_begin + 64 * cw + 16 * wi + g + 8 * r, p.mask);

    // Descriptors: Q rows of this warpgroup (K-major, A), K tile (K-major, B), V tile (MN-major, B).
    // K steps move the start address only (in 16-byte units, added to the low bits).
    const std::uint64_t q_desc = wg::desc_sw128(base + L::q + 64u * 128u * static_cast<std::uint32_t>(cw), 16, 1024);
    const std::uint64_t k_desc = wg::desc_sw128(base + L::k, 16, 1024);
    const std::uint64_t v_desc = wg::desc_sw128(base + L::v, BK * 128, 1024);
    constexpr std::uint64_t stage_step = L::tile_bytes / 16;

    float o[D / 2];
    float sc[BK / 2];
    std::uint32_t pf[BK / 16][4];
#pragma unroll
    for (int j = 0; j < D / 2; ++j) o[j] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY};  // running max of the row, base-2 units
    float l[2] = {0.0f, 0.0f};            // this thread's share of the row's sum (quad-reduced at the end)
    const float scale_log2 = prm.scale_log2;
    // The tile's factors: S by s_mul (scale_log2, times the block's K scale over codes), P by p_mul
    // before P·V (the V scale; l sums the unscaled P), as the sm_80 kernel scales them.
    float s_mul = scale_log2, p_mul = 1.0f;
    const auto take_scales = [&](int s) {
      if constexpr (quantized) {
        const float2 ks = tile_scales[s];
        s_mul = scale_log2 * ks.x;
        p_mul = ks.y;
      }
    };

    const auto gemm_s = [&](int s) {
      static_for<D / 16>([&](auto kk) {
        constexpr std::uint64_t step = ((kk / 4) * block_q * 128 + (kk % 4) * 32) / 16;
        constexpr std::uint64_t kstep = ((kk / 4) * BK * 128 + (kk % 4) * 32) / 16;
        const std::uint64_t a = q_desc + step;
        const std::uint64_t bd = k_desc + static_cast<std::uint64_t>(s) * stage_step + kstep;
        wg::mma_ss<T>(sc, a, bd, kk == 0 ? 0u : 1u);  // n = BK
      });
    };
    const auto gemm_pv = [&](int s) {
      static_for<BK / 16>([&](auto kk) {
        const std::uint64_t bd = v_desc + static_cast<std::uint64_t>(s) * stage_step + kk * (16 * 128 / 16);
        wg::mma_rs<T>(o, pf[kk], bd, 1u);  // n = D
      });
    };
    const auto pin_o = [&] {
#pragma unroll
      for (int j = 0; j < D / 2; ++j) wg::pin(o[j]);
    };
    const auto pin_s = [&] {
#pragma unroll
      for (int j = 0; j < BK / 2; ++j) wg::pin(sc[j]);
    };

    // Softmax of the S tile of block `id` in place (sc becomes unnormalised P, fp32); alpha is
    // the factor the accumulated O must take once the previous P·V is in it.
    const auto softmax = [&](std::int32_t id, float (&alpha)[2], auto masked_tag) {
      constexpr bool masked = decltype(masked_tag)::value;
      // Scale into base-2 units first, then mask: a negative scale must not turn -inf into +inf.
#pragma unroll
      for (int j = 0; j < BK / 2; ++j) sc[j] *= s_mul;
      if constexpr (masked) {
        const std::int32_t key0 = id * BK + quad_col;
#pragma unroll
        for (int j = 0; j < BK / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (key0 + 8 * j + (e & 1) >= vis[e / 2]) sc[4 * j + e] = -INFINITY;
          }
        }
      }
      float m_use[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[r];
#pragma unroll
        for (int j = 0; j < BK / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * r], sc[4 * j + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // -inf - -inf: a row with no visible key so far keeps its max at -inf; subtract 0 instead.
        m_use[r] = mx == -INFINITY ? 0.0f : mx;
        alpha[r] = exp2_approx(m[r] - m_use[r]);
        m[r] = mx;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int j = 0; j < BK / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[4 * j + e] = exp2_approx(sc[4 * j + e] - m_use[e / 2]);
          l[e / 2] += sc[4 * j + e];
        }
      }
    };
    const auto softmax_of = [&](std::int32_t id, float (&alpha)[2]) {
      if (id < row.full_blocks) {
        softmax(id, alpha, std::false_type{});
      } else {
        softmax(id, alpha, std::true_type{});
      }
    };
    // O *= alpha (row r: elements 4j + 2r, 4j + 2r + 1), and P (times p_mul over codes) rounded to T
    // as the A fragments of P·V: k step kk is S's n tiles 2kk and 2kk + 1.
    const auto rescale_and_pack = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
      if constexpr (quantized) {
#pragma unroll
        for (int j = 0; j < BK / 2; ++j) sc[j] *= p_mul;
      }
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        pf[kk][0] = pack2<T>(sc[8 * kk], sc[8 * kk + 1]);
        pf[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
        pf[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
        pf[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
      }
    };

    wg::mbar_wait(q_ready, 0);
    int t = 0;
    wg::mbar_wait(full(0), 0);
    std::int32_t id = tile_ids[0];
    take_scales(0);
    if (id >= 0) {
      float alpha[2];
      wg::fence();
      gemm_s(0);
      wg::commit();
      wg::wait<0>();
      pin_s();
      softmax_of(id, alpha);
      rescale_and_pack(alpha);
      int prev = 0;
      for (;;) {
        ++t;
        const int s = t % stages;
        wg::mbar_wait(full(s), static_cast<std::uint32_t>((t / stages) & 1));
        id = tile_ids[s];
        if (id < 0) break;
        take_scales(s);
        pin_o();
        wg::fence();
        gemm_s(s);       // S of tile t ...
        wg::commit();
        gemm_pv(prev);   // ... and P·V of tile t - 1, both in flight
        wg::commit();
        wg::wait<1>();   // S landed
        pin_s();
        softmax_of(id, alpha);
        wg::wait<0>();   // P·V landed: buffer `prev` is free, O may be rescaled
        pin_o();
        wg::mbar_arrive(empty(prev));
        rescale_and_pack(alpha);
        prev = s;
      }
      pin_o();
      wg::fence();
      gemm_pv(prev);
      wg::commit();
      wg::wait<0>();
      pin_o();
      wg::mbar_arrive(empty(prev));
    }

    // Epilogue: O = acc / l, lse = (m + log2 l) · ln 2; a row with no visible key gets 0 and -inf.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int32_t qi = row.q_begin + 64 * cw + 16 * wi + g + 8 * r;
      if (qi >= row.q_end) continue;
      const std::int64_t token = static_cast<std::int64_t>(row.q_offset) + qi;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const std::int64_t at = token * prm.o_token_stride + h * prm.o_head_stride + quad_col;
      if (prm.o_fp32) {
        float* out = static_cast<float*>(prm.o) + at;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          *reinterpret_cast<float2*>(out + 8 * j) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        }
      } else {
        T* out = static_cast<T*>(prm.o) + at;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          *reinterpret_cast<std::uint32_t*>(out + 8 * j) = pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        }
      }
      if (prm.lse != nullptr && lane % 4 == 0) {
        prm.lse[token * p.heads_q + h] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * ln2 : -INFINITY;
      }
    }
  }
#else
  // The stand-in: static shared memory marks it (stand_in_marker_bytes); run() never launches it.
  __shared__ std::uint32_t marker[stand_in_marker_bytes / 4];
  marker[threadIdx.x % 4] = 1u;
  __syncwarp();
  if (marker[0] != 0u) __trap();
  (void)prm;
#endif
}

// Whether the binary holds the wgmma body of `Kernel` for the current device (not the stand-in
// built for other targets), once per kernel and device.
template <auto Kernel>
[[nodiscard]] inline status has_wgmma_body(const skim::cuda::device_facts& d, bool& yes) noexcept {
  const auto ask = [](int& body) {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, Kernel);
    body = e == cudaSuccess && attr.sharedSizeBytes < static_cast<std::size_t>(stand_in_marker_bytes) ? 1 : 0;
    return e;
  };
  int body = 0;
  SKIM_TRY(skim::cuda::check(skim::cuda::once_per_device(d.device, body, ask),
                             "cudaFuncGetAttributes in skim::cuda::prefill (wgmma)"));
  yes = d.major == 9 && d.minor == 0 && body == 1;
  return status::success();
}

template <class T, class KV, class Index, int D, int BK>
inline constexpr auto kernel_of = prefill_sm90_kernel<T, KV, D, BK, Index>;

// Whether this kernel runs `p` with these types on the current device: head_dim 64/128, block_q
// 128, block_kv 64/128, contiguous K/V (wgmma_source_v), an sm_90 device, and the wgmma body built
// (sm_90a).
template <class T, class KV, class Index>
[[nodiscard]] status available(const skim::cuda::device_problem& p, bool& yes) noexcept {
  yes = false;
  if constexpr (wgmma_source_v<T, KV>) {
    if ((p.head_dim != 64 && p.head_dim != 128) || p.block_q != block_q || (p.block_kv != 64 && p.block_kv != 128)) {
      return status::success();
    }
    skim::cuda::device_facts d;
    SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::prefill: device attributes"));
    // One probe stands for the four tile shapes: they are built for the same targets.
    return has_wgmma_body<kernel_of<T, KV, kernel_index_t<Index>, 128, 128>>(d, yes);
  } else {
    return status::success();
  }
}

template <class T, class KV, class Index, int D, int BK>
[[nodiscard]] status launch(const tma_params<T, KV, Index>& prm, std::int64_t grid, cudaStream_t stream) noexcept {
  constexpr std::size_t smem = layout<D, BK>::bytes;
  constexpr auto kernel = kernel_of<T, KV, Index, D, BK>;
  skim::cuda::device_facts d;
  SKIM_TRY(skim::cuda::current_device(d, "skim::cuda::prefill: device attributes"));
  if (static_cast<std::size_t>(d.smem_optin) < smem) {
    return status::error(status_code::unsupported,
                         "prefill (wgmma): head_dim %d, block_kv %d need %zu bytes of shared memory, device %d "
                         "allows %d", D, BK, smem, d.device, d.smem_optin);
  }
  SKIM_TRY(skim::cuda::allow_dynamic_smem<kernel>(d, "cudaFuncSetAttribute in skim::cuda::prefill (wgmma)"));
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(prm);
  return skim::cuda::check_launch("skim::cuda::prefill (wgmma)");
}

// cuTensorMapEncodeTiled, fetched from the driver once.
[[nodiscard]] inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() noexcept {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Tensor map of a contiguous K or V: [tokens, heads_kv, D] with strides (elements), boxes of 64
// dims x BK tokens x 1 head, 128-byte swizzle. The token extent is the int32 range: addresses come
// from the device cu_seqlens as prefill's cp.async addresses do, and only whole tiles inside a
// sequence are copied through the map.
template <class T>
[[nodiscard]] status encode_kv_map(CUtensorMap& map, const T* data, std::int64_t token_stride,
                                   std::int64_t head_stride, const skim::cuda::device_problem& p) noexcept {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    return status::error(status_code::device_error, "prefill (wgmma): cuTensorMapEncodeTiled is not available");
  }
  const CUtensorMapDataType type =
      std::is_same_v<T, skim::bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // One head: its stride is never multiplied by a nonzero coordinate (and need not be aligned).
  const std::int64_t hs = p.heads_kv > 1 ? head_stride : token_stride;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(INT_MAX),
                              static_cast<cuuint64_t>(p.heads_kv)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(token_stride) * sizeof(T),
                                 static_cast<cuuint64_t>(hs) * sizeof(T)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(p.block_kv), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = encode(&map, type, 3, const_cast<T*>(data), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return status::error(status_code::unsupported,
                         "prefill (wgmma): K/V tensor map refused (CUresult %d; base %p, strides token %lld, head %lld)",
                         static_cast<int>(r), static_cast<const void*>(data), static_cast<long long>(token_stride),
                         static_cast<long long>(head_stride));
  }
  return status::success();
}

// Launches this kernel for `a` (checked by the caller, and available()).
template <class TQ, class KV, class Index, class TO>
[[nodiscard]] status run(const skim::cuda::device_attention_args<TQ, KV, Index, TO>& a, std::int64_t grid,
                         cudaStream_t stream) noexcept {
  using KI = kernel_index_t<Index>;
  const skim::cuda::device_problem& p = a.prob;
  tma_params<TQ, KV, KI> prm;
  if constexpr (!skim::cuda::is_device_quantized_kv_v<KV>) {  // codes are loaded by threads, not tensor copies
    SKIM_TRY(encode_kv_map(prm.k_map, a.kv.k, a.kv.token_stride, a.kv.head_stride, p));
    SKIM_TRY(encode_kv_map(prm.v_map, a.kv.v, a.kv.token_stride, a.kv.head_stride, p));
  }
  prefill_common::fill_params(prm, a);
  if (p.head_dim == 64) {
    return p.block_kv == 64 ? launch<TQ, KV, KI, 64, 64>(prm, grid, stream) : launch<TQ, KV, KI, 64, 128>(prm, grid, stream);
  }
  return p.block_kv == 64 ? launch<TQ, KV, KI, 128, 64>(prm, grid, stream) : launch<TQ, KV, KI, 128, 128>(prm, grid, stream);
}

}  // namespace detail::prefill_sm90

}  // namespace skim::cuda
