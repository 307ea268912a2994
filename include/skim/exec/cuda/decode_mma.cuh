#pragma once
// The tensor-core split kernel of skim::cuda::decode (decode_kernel::tensor_cores; decode.cuh
// holds the host API, decode_simt.cuh the CUDA-core kernel, decode_common.cuh the merge kernel and
// the parts both split kernels share). sm_80 and later; Q and K/V of one 16-bit type; head_dim 64 or 128.
//
// Same grid, units, splits, workspace partials and merge as the CUDA-core kernel: one CTA per
// (split, unit), the split's partial (m, l, o) or O and lse written by write_rows, so the merge
// kernel and the determinism argument are unchanged. What differs is the main loop:
//
//   rows       the unit's rows (query heads of the index row × its queries, at most 64) in passes
//              of 16; a pass computes one or two n tiles of 8 rows (one for decode with GQA up
//              to 8). Q goes to shared memory as 16-bit swizzled rows once, then into B fragments
//              per pass. The keys are the mma's M (Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ): a GQA group of 4 or 8
//              rows fills half or all of N = 8, where rows as M padded it to 16 (half the mma).
//   keys       8 warps share the split's keys: tiles of tile_keys keys (16 at d 128, 32 at d 64:
//              4 KB of K and 4 KB of V) that never straddle a block; warp w takes tiles w, w + 8,
//              ... (as the CUDA-core kernel's slices do). Each warp streams its tiles through its own
//              `stages` swizzled K and V buffers by cp.async (stages - 1 tiles, 16 KB, in flight per
//              warp); each 16-byte copy of the warp covers whole 256- or 128-byte rows. Contiguous
//              K/V: a tile's keys are consecutive tokens, so each lane computes its rows from the
//              tile's first token and how many keys may be read; paged K/V: lanes [0, tile_keys)
//              resolve one key each (id, causal limit, page) and hand its offset to the copying lanes
//              by shuffle. A warp walks its tiles with a (block, first key) cursor, no division. A
//              slot with nothing to load is zero-filled (its token is no_key), so P·V never
//              multiplies stale bits.
//   per tile   Sᵀ = K·Qᵀ by mma.sync.m16n8k16 (K by ldmatrix as A, the dims in two interleaved
//              accumulators to halve the dependent mma chain), scaled into base 2, masked per
//              (key, row) by the key's token against the row's visible keys (keys past kv_len,
//              past a speculative row's causal limit, unloaded slots; padding rows see no key);
//              online softmax on the fragments (a row's max over the 8 lanes holding its keys, acc
//              rescaled only when some row's max moved: a warp vote), P rounded to 16 bits and
//              each 8 × 8 half transposed by movmatrix into the B operand of Oᵀ = Vᵀ·Pᵀ (V by
//              ldmatrix.trans as A), fp32 accumulators. The swizzle and address arithmetic are
//              prefill_sm80.cuh's (tested on sm_90a).
//   epilogue   each warp's (m, l, o) of its 16 rows through shared memory (aliasing the K/V
//              buffers), combined in warp order by write_rows; with the cluster merge (InCluster)
//              the row's splits then merge through distributed shared memory (finish_pass).
//
// The kernel is bound by instruction issue (two warps a scheduler), not by memory, so the loader is
// kept lean: contiguous K/V rows computed per lane from the tile's first token, tiles walked by a
// cursor without a division. In the SASS (d 128, contiguous K/V, rows then as the M), a loader with
// an integer division per tile, 64-bit offsets shuffled per key and kernel parameters reloaded took
// ~200 of a tile's ~490 instructions per warp (32 of them mma, 16 ldmatrix; keys as the M halve the
// mma); the CUDA-core kernel spends ~1600 per two 4 KB tiles. docs/performance.md, "GPU sparse decode
// vs FlexAttention".
//
// P is rounded to the input type before P·V (as prefill and FlashAttention do): outputs differ from
// the reference by about that rounding (tests: 2e-2 relative for bf16, 5e-3 for fp16); lse is not
// affected (l sums the unrounded p).
//
// Quantised K/V (core/cuda/quantized.cuh, 8-bit codes with a K and a V scale per block): a tile's
// codes (2 KB of K, 2 KB of V) are copied into the first half of its K and V buffers (swizzled 16-byte
// chunks, code_geometry) and read by ldmatrix as 16-bit pairs straight into registers, where they
// are widened exactly to Q's 16-bit type (quantized.cuh's widen2) as the mma's A fragments: no
// 16-bit tile is written. K's fragments then hold each 16-dim step's dims in another order, which
// Q's B fragments follow (the dot product is the same sum); V's give Oᵀ's rows in another dim order,
// which the epilogue undoes (out_dim). S is scaled by scale_k and P by scale_v before P·V (P ·
// scale_v rounded to 16 bits; l sums P).

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/exec/cuda/decode_common.cuh"
#include "skim/exec/cuda/prefill_sm80.cuh"

namespace skim::cuda::detail::decode_impl::mma {

namespace sm80 = skim::cuda::detail::prefill_sm80;

inline constexpr int stages = 3;             // K/V buffers per warp: 2 tiles (16 KB) in flight per warp
inline constexpr int tile_bytes = 4096;      // K (and V) bytes of one tile
inline constexpr int m_tile = 16;            // rows per pass (the mma's M)
inline constexpr int max_tile_keys = 32;     // tile_keys at d 64
inline constexpr int alignment = 128;        // the swizzle's XOR addressing needs 128-byte tile bases
static_assert(warps * 32 == threads && max_chunk_blocks <= threads, "one id per thread, as in split_kernel");

template <int D>
struct geometry {
  static_assert(D == 64 || D == 128, "decode supports head_dim 64 and 128");
  static constexpr int tile_keys = tile_bytes / (D * 2);  // 16 (d 128) or 32 (d 64)
  static constexpr int sn = tile_keys / 8;                // 8-key n tiles of S
  static constexpr int pk = tile_keys / 16;               // 16-key k steps of P·V
  static constexpr int dn = D / 8;                        // 8-dim n tiles of O
  static constexpr int chunks = D / sm80::chunk_elems;    // 16-byte chunks per row
  static constexpr int keys_per_copy = 32 / chunks;       // rows one warp-wide 16-byte copy covers
  static constexpr int copies = tile_keys / keys_per_copy;
  static_assert(tile_keys % 16 == 0 && tile_keys <= 32 && tile_keys <= max_tile_keys);
};

// Shared memory (dynamic, from the first 128-byte boundary), in this order:
//   kv   [warps][stages][2 (K, V)][tile_keys][D] 16-bit, rows swizzled (prefill_sm80::swizzle)
//   tok  [warps][stages][max_tile_keys] int32: token of each key slot, no_key if nothing loaded
//   q    [q16(max_rows)][D] 16-bit, swizzled; rows past the unit's are zero
//   ids  [chunk_blocks] int32
// The epilogue's per-warp states alias kv (between barriers):
//   comb_o [warps · m_tile][comb_stride] float, comb_m [warps · m_tile], comb_l [warps · m_tile],
//   then the pass's partial for the cluster merge: [m_tile][D + 2] float (finish_pass)
inline constexpr std::size_t kv_bytes = static_cast<std::size_t>(warps) * stages * 2 * tile_bytes;
inline constexpr std::size_t tok_bytes = static_cast<std::size_t>(warps) * stages * max_tile_keys * 4;
// comb_o's row stride: 4 floats past D, so that the epilogue's stores of one warp (rows quad_col +
// {0, 2, 4, 6}, dims g + const) fall in distinct banks (a stride of D puts a dim's rows in one bank:
// 4-way conflicts).
template <int D>
inline constexpr int comb_stride = D + 4;
static_assert(static_cast<std::size_t>(warps) * m_tile * (comb_stride<128> + 2) * 4 +
                      static_cast<std::size_t>(m_tile) * (128 + 2) * 4 <=
                  kv_bytes,
              "the epilogue's states and a pass's partial (cluster merge) fit in the K/V buffers");
static_assert(kv_bytes >= detail::decode_impl::kv_bytes, "a routed table's selection fits the K/V buffers of both kernels");
static_assert((kv_bytes + tok_bytes) % alignment == 0, "q starts on a 128-byte boundary (ldmatrix's XOR addressing)");

[[nodiscard]] constexpr std::int32_t q16(std::int32_t rows) noexcept { return (rows + m_tile - 1) / m_tile * m_tile; }
// scales: a quantised source's (K, V) scales per id follow the ids.
[[nodiscard]] constexpr std::size_t shared_bytes(std::int32_t head_dim, std::int32_t max_rows,
                                                 std::int32_t chunk_blocks, bool scales = false) noexcept {
  return alignment + kv_bytes + tok_bytes + static_cast<std::size_t>(q16(max_rows)) * head_dim * 2 +
         ids_bytes(chunk_blocks) + (scales ? 2 * ids_bytes(chunk_blocks) : 0);
}

// A tile's 8-bit codes: [tile_keys][D] bytes from the buffer's start, 16-byte chunks of 16 codes
// swizzled so that ldmatrix's 8 rows of one chunk fall in distinct banks (chunk ^ key % 8 for
// 128-byte rows; 64-byte rows share a 128-byte line in pairs: chunk ^ (key / 2) % 4).
template <int D>
struct code_geometry {
  static constexpr int chunks = D / 16;                 // 16-byte chunks per row
  static constexpr int keys_per_copy = 32 / chunks;     // rows one warp-wide copy covers
  static constexpr int copies = geometry<D>::tile_keys / keys_per_copy;
  [[nodiscard]] __device__ __forceinline__ static int swizzle(int key) noexcept { return D == 128 ? key % 8 : (key / 2) % 4; }
  // Byte offset of chunk `chunk` of row `key`.
  [[nodiscard]] __device__ __forceinline__ static int offset(int key, int chunk) noexcept {
    return key * D + ((chunk ^ swizzle(key)) << 4);
  }
};

// Q of a unit as 16-byte chunks (8 elements of a row; rows past the unit's are zero), chunk x =
// j + k · threads in qv[k]: loaded before the kernel waits on anything else, stored swizzled later.
// A chunk whose address is not 16-byte aligned (Q views may have any stride) is read element-wise.
template <int D>
inline constexpr int q_loads = (q16(max_unit_rows) * (D / sm80::chunk_elems) + threads - 1) / threads;

template <int D, class T>
__device__ __forceinline__ void load_q(const skim::cuda::device_view<const T>& q, const unit& u, std::int32_t qr,
                                       std::int32_t j, uint4 (&qv)[q_loads<D>]) noexcept {
  constexpr int chunks = D / sm80::chunk_elems;
#pragma unroll
  for (int k = 0; k < q_loads<D>; ++k) {
    const std::int32_t x = j + k * threads, row = x / chunks, c = x % chunks;
    qv[k] = make_uint4(0u, 0u, 0u, 0u);
    if (x < qr * chunks && row < u.rows) {
      const std::int64_t token = static_cast<std::int64_t>(u.row.q_offset) + u.row.q_begin + row / u.heads;
      const T* src = q.row(token, u.first_head + row % u.heads) + c * sm80::chunk_elems;
      if (reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
        qv[k] = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        T* e = reinterpret_cast<T*>(&qv[k]);
#pragma unroll
        for (int i = 0; i < sm80::chunk_elems; ++i) e[i] = src[i];
      }
    }
  }
}

template <int D, class T>
__device__ __forceinline__ void store_q(const uint4 (&qv)[q_loads<D>], std::int32_t qr, std::int32_t j, T* q_s) noexcept {
  constexpr int chunks = D / sm80::chunk_elems;
#pragma unroll
  for (int k = 0; k < q_loads<D>; ++k) {
    const std::int32_t x = j + k * threads;
    if (x < qr * chunks) *reinterpret_cast<uint4*>(q_s + sm80::swizzle<D>(x / chunks, x % chunks)) = qv[k];
  }
}

template <int D, bool InCluster, class TQ, class KV, class Index, class TO>
__global__ void __launch_bounds__(threads, 1)
    split_kernel(const __grid_constant__ device_attention_args<TQ, KV, Index, TO> a, const launch_params lp) {
  using Code = typename KV::value_type;  // K/V elements: T, or 8-bit codes
  using T = TQ;                          // the mma's 16-bit type
  constexpr bool quantized = skim::cuda::is_device_quantized_kv_v<KV>;
  static_assert(std::is_same_v<TQ, Code> || quantized, "the tensor-core kernel needs Q and K/V of one type");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched: decode::run picks the CUDA-core kernel below sm_80
#else
  using G = geometry<D>;
  using CG = code_geometry<D>;  // a tile of codes (quantised K/V)
  const device_problem& p = a.prob;
  extern __shared__ __align__(16) unsigned char skim_decode_mma_smem[];
  unsigned char* const smem =
      skim_decode_mma_smem + (alignment - sm80::smem_u32(skim_decode_mma_smem) % alignment) % alignment;

  unit u;
  if (!make_unit(p, lp.q_blocks, u)) return;  // CTA-uniform
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t j = static_cast<std::int32_t>(threadIdx.x);
  const std::int32_t entry = split * lp.chunk_blocks + j;  // this thread's entry of the row

  T* const q_s = reinterpret_cast<T*>(smem + kv_bytes + tok_bytes);
  std::int32_t* const ids_s = reinterpret_cast<std::int32_t*>(smem + kv_bytes + tok_bytes +
                                                              static_cast<std::size_t>(q16(lp.max_rows)) * D * 2);
  float2* const scales_s = reinterpret_cast<float2*>(reinterpret_cast<unsigned char*>(ids_s) + ids_bytes(lp.chunk_blocks));
  const std::int32_t qr = q16(u.rows);

  // Global loads before anything waits on them: Q first (its rows are known from the unit), then
  // the row (count, or a routed table's selection), page list and ids; Q is stored once they are in.
  uint4 qv[q_loads<D>];
  load_q<D>(a.q, u, qr, j, qv);
  entry_ids e;
  // A routed table's row is selected in the K/V buffers (free until the pipeline starts).
  const skim::cuda::device_block_table::span span =
      split_row_span(p, a.index, u, split, entry, e, smem);
  const kv_rows<KV> src(a.kv, u.row, static_cast<std::int32_t>(blockIdx.z) / lp.q_blocks, u.kv_head);
  load_ids_early(a.index, u, lp, j, entry, e);

  const std::int32_t n = span.n > 0 ? span.n : 0;
  const std::int32_t nsplit = used_splits(n, lp);
  if (split >= nsplit) return;  // CTA-uniform, before any barrier
  const std::int32_t first_entry = split * lp.chunk_blocks;
  const std::int32_t entries = n - first_entry < lp.chunk_blocks ? n - first_entry : lp.chunk_blocks;
  load_ids_late<Index>(span, j, entry, entries, e);
  check_ids(p, u, span, n, lp, split, j, entry, entries, e, ids_s);
  if constexpr (quantized) load_scales(src, j, entries, ids_s, scales_s);
  store_q<D>(qv, qr, j, q_s);
  __syncthreads();  // ids, scales and Q visible to every warp

  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int32_t block_kv = p.block_kv;
  const std::int32_t tiles_per_block = (block_kv + G::tile_keys - 1) / G::tile_keys;
  const std::int32_t tiles = entries * tiles_per_block;
  const std::int32_t mine = warp < tiles ? (tiles - warp + warps - 1) / warps : 0;  // tiles warp, warp + 8, ...
  const std::int32_t load_end = u.row.visible_keys(u.row.q_end - 1, p.mask);  // the unit's widest view
  const Code* const k_base = src.k_base();
  const Code* const v_base = src.v_base();
  std::uint32_t page_bits = 0;

  const std::uint32_t kv_warp = sm80::smem_u32(smem) + static_cast<std::uint32_t>(warp * stages * 2 * tile_bytes);
  std::int32_t* const tok_warp = reinterpret_cast<std::int32_t*>(smem + kv_bytes) + warp * stages * max_tile_keys;

  // The warp's next tile (warp, warp + warps, ... in order): its block's entry jb and its first key
  // in the block, advanced by `warps` tiles without a division per tile.
  struct tile_cursor {
    std::int32_t jb = 0, sub = 0;
  };
  const tile_cursor start{warp / tiles_per_block, warp % tiles_per_block};
  const tile_cursor stride{warps / tiles_per_block, warps % tiles_per_block};
  tile_cursor next_tile = start;
  tile_cursor compute_tile = start;  // the tile compute() reads (its block's scales)
  const int c = lane % (quantized ? CG::chunks : G::chunks);
  // Element offset of this lane's 16-byte chunk in its row of copy step 0, and the rows between
  // copy steps (contiguous K/V: a tile's keys are consecutive tokens of one block).
  const std::int64_t lane_off = static_cast<std::int64_t>(lane / G::chunks) * src.token_stride + c * sm80::chunk_elems;
  const std::int64_t step_off = static_cast<std::int64_t>(G::keys_per_copy) * src.token_stride;

  // Key slot `lane` of the tile (block entry id, first key `first`) resolved one key per lane (paged
  // K/V, and any source of codes): its token into tok_warp (no_key if nothing may be read) and the
  // element offset of its K and V rows, returned to be shuffled to the copying lanes (-1: nothing to
  // load; a page the source cannot give is reported once per launch through page_bits).
  const auto slot_offset = [&](std::int32_t id, std::int32_t first, int st) {
    long long off = -1;
    if (lane < G::tile_keys) {
      std::int32_t tok = no_key;
      const std::int32_t o = first + lane;
      if (id >= 0 && o < block_kv) {
        const std::int32_t t = id * block_kv + o;
        if (t < load_end) {
          std::int64_t x = 0;
          if (src.offset(t, x)) {
            off = x;
            tok = t;
          } else {
            page_bits |= skim::cuda::bad_page;
          }
        }
      }
      tok_warp[st * max_tile_keys + lane] = tok;
    }
    return off;
  };

  // The warp's next tile into buffer st. Lane k < tile_keys writes key slot k's token; the copy of
  // step i moves chunk lane % chunks of slot i · keys_per_copy + lane / chunks. K/V are read once a
  // launch: where it streams past L2 (lp.stream_kv), their lines go first (Stream; issue_tile picks).
  const std::uint64_t kv_policy = skim::cuda::ptx::l2_policy(true);
  const auto issue = [&]<bool Stream>(int st) {
    const auto copy = [&](std::uint32_t dst, const auto* from) {
      if constexpr (Stream) {
        sm80::cp_async_16(dst, from, kv_policy);
      } else {
        sm80::cp_async_16(dst, from);
      }
    };
    const std::int32_t jb = next_tile.jb;
    const std::int32_t first = next_tile.sub * G::tile_keys;  // offset in the block
    next_tile.jb += stride.jb;
    next_tile.sub += stride.sub;
    if (next_tile.sub >= tiles_per_block) {
      next_tile.sub -= tiles_per_block;
      ++next_tile.jb;
    }
    const std::int32_t id = ids_s[jb];
    const std::uint32_t k_st = kv_warp + static_cast<std::uint32_t>(st * 2 * tile_bytes);
    const std::uint32_t v_st = k_st + tile_bytes;
    if constexpr (quantized) {  // codes, swizzled [tile_keys][D] bytes from each buffer's start
      const long long off = slot_offset(id, first, st);
#pragma unroll
      for (int i = 0; i < CG::copies; ++i) {
        const int key = i * CG::keys_per_copy + lane / CG::chunks;
        const long long ko = __shfl_sync(0xffffffffu, off, key);
        const std::uint32_t dst = static_cast<std::uint32_t>(CG::offset(key, c));
        if (ko >= 0) {
          copy(k_st + dst, k_base + ko + c * 16);
          copy(v_st + dst, v_base + ko + c * 16);
        } else {
          sm80::zero_16(k_st + dst);
          sm80::zero_16(v_st + dst);
        }
      }
      return;
    } else if constexpr (std::is_same_v<KV, skim::cuda::device_contiguous_kv<T>>) {
      // Keys [t0, t0 + limit) of the tile can be read; no shuffles, one 64-bit row offset a tile.
      const std::int32_t t0 = id * block_kv + first;
      const std::int32_t room = block_kv - first < load_end - t0 ? block_kv - first : load_end - t0;
      const std::int32_t limit = id < 0 ? 0 : room;
      if (lane < G::tile_keys) tok_warp[st * max_tile_keys + lane] = lane < limit ? t0 + lane : no_key;
      const std::int64_t row0 = static_cast<std::int64_t>(t0) * src.token_stride + lane_off;
#pragma unroll
      for (int i = 0; i < G::copies; ++i) {
        const int key = i * G::keys_per_copy + lane / G::chunks;
        const std::uint32_t dst = static_cast<std::uint32_t>(sm80::swizzle<D>(key, c) * 2);
        if (key < limit) {
          copy(k_st + dst, k_base + row0 + i * step_off);
          copy(v_st + dst, v_base + row0 + i * step_off);
        } else {
          sm80::zero_16(k_st + dst);
          sm80::zero_16(v_st + dst);
        }
      }
      return;
    }
    const long long off = slot_offset(id, first, st);
#pragma unroll
    for (int i = 0; i < G::copies; ++i) {
      const int key = i * G::keys_per_copy + lane / G::chunks;
      const long long ko = __shfl_sync(0xffffffffu, off, key);
      const std::uint32_t dst = static_cast<std::uint32_t>(sm80::swizzle<D>(key, c) * 2);
      if (ko >= 0) {
        copy(k_st + dst, k_base + ko + c * sm80::chunk_elems);
        copy(v_st + dst, v_base + ko + c * sm80::chunk_elems);
      } else {
        sm80::zero_16(k_st + dst);
        sm80::zero_16(v_st + dst);
      }
    }
  };
  const auto issue_tile = [&](int st) {  // CTA-uniform: plain copies where K/V fit half of L2
    if (lp.stream_kv) {
      issue.template operator()<true>(st);
    } else {
      issue.template operator()<false>(st);
    }
  };

  // Fragment lane addresses in buffer 0 (the swizzle of prefill_sm80). K as the A operand of Sᵀ
  // (keys (lane % 8) + 8 ((lane / 8) % 2), chunk parity lane / 16: a0..a3 = keys 0-7 / 8-15 ×
  // dims 0-7 / 8-15 of a 16 × 16 step), V as the A operand of Oᵀ, transposed (keys (lane % 8) +
  // 8 (lane / 16), chunk parity (lane / 8) % 2: a0..a3 = dims 0-7 / 8-15 × keys 0-7 / 8-15).
  const std::uint32_t k_lane0 = sm80::lane_address<D>(kv_warp, (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
  const std::uint32_t v_lane0 = sm80::lane_address<D>(kv_warp + tile_bytes, (lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
  // The same for codes (code_geometry's swizzle, 16 codes a chunk): K's keys (lane % 8) + 8 ((lane / 8)
  // % 2), chunk lane / 16; V's keys (lane % 8) + 8 (lane / 16), chunk (lane / 8) % 2.
  const int kc_key = (lane % 8) + 8 * ((lane / 8) % 2), vc_key = (lane % 8) + 8 * (lane / 16);
  const std::uint32_t kc_lane0 = kv_warp + static_cast<std::uint32_t>(CG::offset(kc_key, lane / 16));
  const std::uint32_t vc_lane0 = kv_warp + tile_bytes + static_cast<std::uint32_t>(CG::offset(vc_key, (lane / 8) % 2));
  const int g = lane / 4;               // the thread's keys g, g + 8 of Sᵀ, dims g, g + 8 of Oᵀ
  // Oᵀ's m tile dp: the thread's M rows g and g + 8 are dims out_dim(dp) and out_dim(dp) + 8 (+ 16
  // over codes: see compute).
  const auto out_dim = [&](int dp) { return quantized ? 32 * (dp / 2) + 2 * g + dp % 2 : 16 * dp + g; };
  const int quad_col = 2 * (lane % 4);  // its rows quad_col, quad_col + 1 of each 8-row n tile
  const float scale_log2 = lp.scale_log2;

  float* const comb_o = reinterpret_cast<float*>(smem);  // aliases kv: used between barriers only
  float* const comb_m = comb_o + warps * m_tile * comb_stride<D>;
  float* const comb_l = comb_m + warps * m_tile;
  float* const partial_s = comb_l + warps * m_tile;  // a pass's partial for the cluster merge (finish_pass)

  // One pass over rows [row0, row0 + 8 NT) of the unit (NT n tiles of 8 rows; rows_here of them real).
  const auto run_pass = [&](auto nt_c, std::int32_t row0, std::int32_t rows_here) {
    constexpr int NT = decltype(nt_c)::value;
    constexpr int MT = G::tile_keys / 16;  // 16-key m tiles of Sᵀ a tile (k steps of Oᵀ)
    // Qᵀ as B fragments: qb[nt][kk] = {b0, b1} = rows 8 nt + g, dims 16 kk + quad_col (+1) and + 8.
    // One ldmatrix.x4 gives two k steps: lane rows 8 nt + lane % 8, chunks 4j + lane / 8 (an odd
    // lane chunk is fine: at_chunk then moves by multiples of 4, which never carry into it).
    std::uint32_t qb[NT][D / 16][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if constexpr (quantized) {
        // K's codes come in with their dims permuted (see compute): k step kk's b0 is dims
        // 16 kk + 4 (lane % 4) + {0, 1}, b1 the next two, of row 8 nt + g.
        const int row = row0 + 8 * nt + g;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint2 b = *reinterpret_cast<const uint2*>(q_s + sm80::swizzle<D>(row, 2 * kk + (lane % 4) / 2) + 4 * (lane % 2));
          qb[nt][kk][0] = b.x;
          qb[nt][kk][1] = b.y;
        }
      } else {
        const std::uint32_t qa = sm80::lane_address<D>(sm80::smem_u32(q_s), row0 + 8 * nt + lane % 8, lane / 8);
        sm80::static_for<D / 32>([&](auto jj) {
          std::uint32_t r[4];
          sm80::ldmatrix_x4(r, sm80::at_chunk<4 * jj>(qa));
          qb[nt][2 * jj][0] = r[0];
          qb[nt][2 * jj][1] = r[1];
          qb[nt][2 * jj + 1][0] = r[2];
          qb[nt][2 * jj + 1][1] = r[3];
        });
      }
    }
    std::int32_t vis[NT][2];  // keys [0, vis) visible to the thread's rows; 0 for a padding row
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::int32_t row = row0 + 8 * nt + quad_col + r;
        vis[nt][r] = row < u.rows ? u.row.visible_keys(u.row.q_begin + row / u.heads, p.mask) : 0;
      }
    }
    float acc[G::dn / 2][NT][4];  // Oᵀ: dims out_dim(dp) (+ 8, or + 16 over codes) × the thread's rows
#pragma unroll
    for (int dp = 0; dp < G::dn / 2; ++dp) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[dp][nt][0] = acc[dp][nt][1] = acc[dp][nt][2] = acc[dp][nt][3] = 0.0f;
    }
    float m[NT][2], l[NT][2];  // running row max (base-2 units, equal over g) and this thread's share of the sum
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      m[nt][0] = m[nt][1] = -INFINITY;
      l[nt][0] = l[nt][1] = 0.0f;
    }

    // Online softmax of the tile in buffer st into (m, l, acc).
    const auto compute = [&](int st) {
      const std::uint32_t so = static_cast<std::uint32_t>(st * 2 * tile_bytes);
      float s_scale = scale_log2, p_scale = 1.0f;  // a quantised tile's block: S · scale_k, P · scale_v
      if constexpr (quantized) {
        const float2 sc = scales_s[compute_tile.jb];
        s_scale = scale_log2 * sc.x;
        p_scale = sc.y;
        compute_tile.jb += stride.jb;
        compute_tile.sub += stride.sub;
        if (compute_tile.sub >= tiles_per_block) {
          compute_tile.sub -= tiles_per_block;
          ++compute_tile.jb;
        }
      }
      // Sᵀ = K · Qᵀ, the dims in two interleaved halves (even and odd k steps) so that no chain
      // of dependent mma is longer than D / 32.
      float s[MT][NT][4], s_odd[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = s_odd[mt][nt][e] = 0.0f;
        }
      }
      if constexpr (quantized) {
        // One ldmatrix.x4 over the codes as 16-bit pairs gives two k steps (chunks 2 jj, 2 jj + 1)
        // of the m tile: a lane's 32 bits are codes 4 (lane % 4) + [0, 4) of a key, widened into
        // a0 (or a1) and a2 (or a3). So logical dims (2c, 2c + 1) of a step are its dims
        // (4c, 4c + 1), and (2c + 8, 2c + 9) its dims (4c + 2, 4c + 3): Q's B fragments match.
        sm80::static_for<D / 32>([&](auto jj) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            std::uint32_t r[4];  // keys 0-7 / 8-15 of chunk 2 jj, then of chunk 2 jj + 1
            sm80::ldmatrix_x4(r, sm80::at_chunk<2 * jj>(kc_lane0) + so + static_cast<std::uint32_t>(mt * 16 * D));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const std::uint32_t kf[4] = {skim::cuda::widen2<T, Code>(r[2 * h]), skim::cuda::widen2<T, Code>(r[2 * h + 1]),
                                           skim::cuda::widen2<T, Code>(r[2 * h] >> 16),
                                           skim::cuda::widen2<T, Code>(r[2 * h + 1] >> 16)};
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                sm80::mma_16816<T>(h == 0 ? s[mt][nt] : s_odd[mt][nt], kf, qb[nt][2 * jj + h][0], qb[nt][2 * jj + h][1]);
              }
            }
          }
        });
      } else {
        sm80::static_for<D / 16>([&](auto kk) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            std::uint32_t kf[4];  // keys 16 mt + [0, 16), dims 16 kk + [0, 16)
            sm80::ldmatrix_x4(kf, sm80::at_chunk<2 * kk>(k_lane0) + so + static_cast<std::uint32_t>(mt * 16 * D * 2));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              sm80::mma_16816<T>(kk % 2 == 0 ? s[mt][nt] : s_odd[mt][nt], kf, qb[nt][kk][0], qb[nt][kk][1]);
            }
          }
        });
      }

      // Scale into base 2 first, then mask (a negative scale must not turn -inf into +inf). A slot
      // with nothing loaded has token no_key, above every limit. Element e is key g + 8 (e / 2),
      // row quad_col + e % 2.
      const std::int32_t* tok = tok_warp + st * max_tile_keys + g;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const std::int32_t key[2] = {tok[16 * mt], tok[16 * mt + 8]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = s[mt][nt][e] + s_odd[mt][nt][e];
            s[mt][nt][e] = key[e / 2] < vis[nt][e % 2] ? x * s_scale : -INFINITY;
          }
        }
      }

      float m_use[NT][2], alpha[NT][2];
      bool moved = false;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[nt][r];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mx = fmaxf(mx, fmaxf(s[mt][nt][r], s[mt][nt][2 + r]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
          // -inf - -inf: a row with no visible key so far subtracts 0 instead (every p is 0). An
          // unchanged max (the common case, and a padding row's -inf) needs no rescale.
          m_use[nt][r] = mx == -INFINITY ? 0.0f : mx;
          const bool changed = mx != m[nt][r];
          alpha[nt][r] = changed ? sm80::exp2_approx(m[nt][r] - m_use[nt][r]) : 1.0f;
          moved = moved || changed;
          m[nt][r] = mx;
          l[nt][r] *= alpha[nt][r];
        }
      }
      if (__any_sync(0xffffffffu, moved)) {  // multiplying by 1 elsewhere changes no bit
#pragma unroll
        for (int dp = 0; dp < G::dn / 2; ++dp) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            acc[dp][nt][0] *= alpha[nt][0];
            acc[dp][nt][1] *= alpha[nt][1];
            acc[dp][nt][2] *= alpha[nt][0];
            acc[dp][nt][3] *= alpha[nt][1];
          }
        }
      }

      // Pᵀ as the B operand of Oᵀ = Vᵀ · Pᵀ: the thread holds (key g, rows quad_col, +1), the B
      // fragment wants (keys quad_col, +1, row g): each 8 × 8 half is transposed by movmatrix.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        std::uint32_t pb[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nt][e] = sm80::exp2_approx(s[mt][nt][e] - m_use[nt][e % 2]);
            l[nt][e % 2] += s[mt][nt][e];
          }
          const auto pw = [&](int e) { return quantized ? s[mt][nt][e] * p_scale : s[mt][nt][e]; };
          pb[nt][0] = skim::cuda::ptx::movmatrix_trans(sm80::pack2<T>(pw(0), pw(1)));
          pb[nt][1] = skim::cuda::ptx::movmatrix_trans(sm80::pack2<T>(pw(2), pw(3)));
        }
        if constexpr (quantized) {
          // ldmatrix.x4.trans over the codes as 16-bit pairs (keys 0-7 / 8-15 × chunks 2j, 2j + 1):
          // a lane's 32 bits are dims (2g, 2g + 1) of keys (2c, 2c + 1), c = lane % 4; a byte
          // permute pairs the keys per dim, widened into the A fragments of two mma: acc[2j] over
          // dims 32 j + 2g (+ 16), acc[2j + 1] over the next dims (out_dim below).
          sm80::static_for<D / 32>([&](auto jj) {
            std::uint32_t r[4];
            sm80::ldmatrix_x4_trans(r, sm80::at_chunk<2 * jj>(vc_lane0) + so + static_cast<std::uint32_t>(mt * 16 * D));
            std::uint32_t va[2][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const std::uint32_t x = __byte_perm(r[i], 0u, 0x3120u);  // (k0 d0, k1 d0, k0 d1, k1 d1)
              va[0][i] = skim::cuda::widen2<T, Code>(x);
              va[1][i] = skim::cuda::widen2<T, Code>(x >> 16);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              sm80::mma_16816<T>(acc[2 * jj][nt], va[0], pb[nt][0], pb[nt][1]);
              sm80::mma_16816<T>(acc[2 * jj + 1][nt], va[1], pb[nt][0], pb[nt][1]);
            }
          });
        } else {
          sm80::static_for<D / 16>([&](auto dp) {
            std::uint32_t vf[4];  // dims 16 dp + [0, 16) × keys 16 mt + [0, 16)
            sm80::ldmatrix_x4_trans(vf, sm80::at_chunk<2 * dp>(v_lane0) + so + static_cast<std::uint32_t>(mt * 16 * D * 2));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) sm80::mma_16816<T>(acc[dp][nt], vf, pb[nt][0], pb[nt][1]);
          });
        }
      }
    };

    // The warp's tiles through its cp.async pipeline: one commit group per step (empty ones at the
    // end), so wait_group<stages - 1> means "tile k landed" for this lane; __syncwarp then makes
    // every lane's copies (and zero fills, and tokens) visible to the warp's ldmatrix.
    next_tile = start;
    compute_tile = start;
#pragma unroll
    for (int k = 0; k < stages - 1; ++k) {
      if (k < mine) issue_tile(k);
      sm80::cp_async_commit();
    }
    for (std::int32_t k = 0; k < mine; ++k) {
      const std::int32_t next = k + stages - 1;
      __syncwarp();  // every lane is done reading buffer next % stages (tile k - 1's)
      if (next < mine) issue_tile(static_cast<int>(next % stages));
      sm80::cp_async_commit();
      sm80::cp_async_wait<stages - 1>();
      __syncwarp();
      compute(static_cast<int>(k % stages));
    }
    sm80::cp_async_wait<0>();

#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[nt][r] += __shfl_xor_sync(0xffffffffu, l[nt][r], 4);
        l[nt][r] += __shfl_xor_sync(0xffffffffu, l[nt][r], 8);
        l[nt][r] += __shfl_xor_sync(0xffffffffu, l[nt][r], 16);
      }
    }
    __syncthreads();  // every warp is done with its K/V buffers: comb may overwrite them
    // The pass's real rows only (GQA 4 fills 4 of the 8): write_rows reads no other.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int rel = 8 * nt + quad_col + r;
        if (rel >= rows_here) continue;
        float* const o = comb_o + (warp * m_tile + rel) * comb_stride<D>;
#pragma unroll
        for (int dp = 0; dp < G::dn / 2; ++dp) {
          o[out_dim(dp)] = acc[dp][nt][r];
          o[out_dim(dp) + (quantized ? 16 : 8)] = acc[dp][nt][2 + r];
        }
        if (g == 0) {
          comb_m[warp * m_tile + rel] = m[nt][r];
          comb_l[warp * m_tile + rel] = l[nt][r];
        }
      }
    }
    __syncthreads();
    const slice_states st{
        .o = comb_o, .m = comb_m, .l = comb_l, .slices = warps, .rows = m_tile, .o_stride = comb_stride<D>};
    finish_pass<InCluster, D>(a, lp, u, split, nsplit, st, row0, rows_here, partial_s);
    __syncthreads();  // comb is read before the next pass refills the K/V buffers
  };

  for (std::int32_t row0 = 0; row0 < qr; row0 += m_tile) {
    const std::int32_t rows_here = u.rows - row0 < m_tile ? u.rows - row0 : m_tile;
    if (rows_here > 8) {  // CTA-uniform
      run_pass(std::integral_constant<int, 2>{}, row0, rows_here);
    } else {
      run_pass(std::integral_constant<int, 1>{}, row0, rows_here);
    }
  }

  if (page_bits != 0) skim::cuda::report(p, page_bits);
#endif
}

}  // namespace skim::cuda::detail::decode_impl::mma
