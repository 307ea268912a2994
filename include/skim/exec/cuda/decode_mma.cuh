#pragma once
// The tensor-core split kernel of skim::cuda::decode (decode_kernel::tensor_cores; decode.cuh
// holds the host API, decode_simt.cuh the CUDA-core kernel, decode_common.cuh the merge kernel and
// the parts both split kernels share). sm_80 and later; Q and K/V of one 16-bit type; head_dim 64 or 128.
//
// Same grid, units, splits, workspace partials and merge as the CUDA-core kernel: one CTA per
// (split, unit), the split's partial (m, l, o) or O and lse written by write_rows, so the merge
// kernel and the determinism argument are unchanged. What differs is the main loop:
//
//   M          the unit's rows (query heads of the index row × its queries, at most 64), padded to
//              16: one M tile of 16 rows per pass (decode with GQA 4 or 8: one pass). Q goes to
//              shared memory as 16-bit swizzled rows once, then into A fragments per pass.
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
//   per tile   S = Q·Kᵀ by mma.sync.m16n8k16 (K by ldmatrix), scaled into base 2, masked per
//              (row, key) by the key's token against the row's visible keys (keys past kv_len, past
//              a speculative row's causal limit, unloaded slots; padding rows see no key); online
//              softmax on the fragments (row max over the quad, acc rescaled only when some row's
//              max moved: a warp vote), P rounded to 16 bits as the A operand of P·V (V by
//              ldmatrix.trans), fp32 accumulators. The fragment layouts, swizzle and address
//              arithmetic are prefill_sm80.cuh's (tested on sm_90a), used here unchanged.
//   epilogue   each warp's (m, l, o) of its 16 rows through shared memory (aliasing the K/V
//              buffers), combined in warp order by write_rows; with the cluster merge (InCluster)
//              the row's splits then merge through distributed shared memory (finish_pass).
//
// The kernel is bound by instruction issue (two warps a scheduler), not by memory, so the loader is
// kept lean: contiguous K/V rows computed per lane from the tile's first token, tiles walked by a
// cursor without a division. In the SASS (d 128, contiguous K/V), a loader with an integer division
// per tile, 64-bit offsets shuffled per key and kernel parameters reloaded took ~200 of a tile's ~490
// instructions per warp (32 of them mma, 16 ldmatrix); the CUDA-core kernel spends ~1600 per two 4 KB
// tiles. docs/performance.md, "GPU sparse decode vs FlexAttention".
//
// P is rounded to the input type before P·V (as prefill and FlashAttention do): outputs differ from
// the reference by about that rounding (tests: 2e-2 relative for bf16, 5e-3 for fp16); lse is not
// affected (l sums the unrounded p).
//
// Quantised K/V (core/cuda/quantized.cuh, 8-bit codes with a K and a V scale per block): a tile's
// codes (2 KB of K, 2 KB of V) are copied into the first half of its K and V buffers, unswizzled;
// once they land, the warp widens them exactly to Q's 16-bit type into the swizzled layout above
// (every lane reads its codes before any lane writes), and the tile is computed as a 16-bit one
// with S scaled by scale_k and P by scale_v before P·V (P · scale_v rounded to 16 bits; l sums P).

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
// comb_o's row stride: 8 floats past D, so that the fragment stores of one warp (rows g, columns
// 8 jn + quad_col) fall in distinct banks for each half warp (a stride of D put the 8 rows of a
// column in one bank: 8-way conflicts, once the epilogue's largest cost).
template <int D>
inline constexpr int comb_stride = D + 8;
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

// A tile's 8-bit codes: 16-byte copies of 16 codes, [tile_keys][D] bytes in the buffer's first half.
template <int D>
struct code_geometry {
  static constexpr int chunks = D / 16;                 // 16-byte chunks per row
  static constexpr int keys_per_copy = 32 / chunks;     // rows one warp-wide copy covers
  static constexpr int copies = geometry<D>::tile_keys / keys_per_copy;
};

// Widens the codes of K (or V) buffer `buf` in place into Q's type T16, swizzled as a 16-bit tile.
// @pre the warp's copies into buf landed and are visible to the warp (__syncwarp); the caller
// synchronises the warp again before reading the tile.
template <int D, class T16, class Code>
__device__ __forceinline__ void widen_tile(unsigned char* buf, int lane) noexcept {
  using CG = code_geometry<D>;
  uint4 codes[CG::copies];
#pragma unroll
  for (int i = 0; i < CG::copies; ++i) codes[i] = reinterpret_cast<const uint4*>(buf)[i * 32 + lane];
  __syncwarp();  // every lane holds its codes before any lane overwrites them
#pragma unroll
  for (int i = 0; i < CG::copies; ++i) {
    const int x = i * 32 + lane, key = x / CG::chunks, cc = x % CG::chunks;
    uint4 lo, hi;
    skim::cuda::widen16_codes<T16, Code>(codes[i], lo, hi);
    *reinterpret_cast<uint4*>(buf + 2 * sm80::swizzle<D>(key, 2 * cc)) = lo;
    *reinterpret_cast<uint4*>(buf + 2 * sm80::swizzle<D>(key, 2 * cc + 1)) = hi;
  }
}

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
  const int c = lane % (quantized ? code_geometry<D>::chunks : G::chunks);
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
  // step i moves chunk lane % chunks of slot i · keys_per_copy + lane / chunks.
  const auto issue = [&](int st) {
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
    if constexpr (quantized) {  // codes, [tile_keys][D] bytes from each buffer's start (widen_tile's input)
      using CG = code_geometry<D>;
      const long long off = slot_offset(id, first, st);
#pragma unroll
      for (int i = 0; i < CG::copies; ++i) {
        const int key = i * CG::keys_per_copy + lane / CG::chunks;
        const long long ko = __shfl_sync(0xffffffffu, off, key);
        const std::uint32_t dst = static_cast<std::uint32_t>(key * D + c * 16);
        if (ko >= 0) {
          sm80::cp_async_16(k_st + dst, k_base + ko + c * 16);
          sm80::cp_async_16(v_st + dst, v_base + ko + c * 16);
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
          sm80::cp_async_16(k_st + dst, k_base + row0 + i * step_off);
          sm80::cp_async_16(v_st + dst, v_base + row0 + i * step_off);
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
        sm80::cp_async_16(k_st + dst, k_base + ko + c * sm80::chunk_elems);
        sm80::cp_async_16(v_st + dst, v_base + ko + c * sm80::chunk_elems);
      } else {
        sm80::zero_16(k_st + dst);
        sm80::zero_16(v_st + dst);
      }
    }
  };

  // Fragment lane addresses in buffer 0 (prefill_sm80's): K non-transposed (keys (lane % 8) +
  // 8 (lane / 16), chunk parity (lane / 8) % 2), V transposed (keys (lane % 8) + 8 ((lane / 8) % 2),
  // chunk parity lane / 16).
  const std::uint32_t k_lane0 = sm80::lane_address<D>(kv_warp, (lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
  const std::uint32_t v_lane0 = sm80::lane_address<D>(kv_warp + tile_bytes, (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
  const int g = lane / 4;               // the thread's rows g, g + 8 of the M tile
  const int quad_col = 2 * (lane % 4);  // its columns quad_col, quad_col + 1 of each n tile
  const float scale_log2 = lp.scale_log2;

  float* const comb_o = reinterpret_cast<float*>(smem);  // aliases kv: used between barriers only
  float* const comb_m = comb_o + warps * m_tile * comb_stride<D>;
  float* const comb_l = comb_m + warps * m_tile;
  float* const partial_s = comb_l + warps * m_tile;  // a pass's partial for the cluster merge (finish_pass)

  for (std::int32_t pass = 0; pass < qr / m_tile; ++pass) {
    const std::int32_t row0 = pass * m_tile;
    std::uint32_t qf[D / 16][4];
    {
      const std::uint32_t qa =
          sm80::lane_address<D>(sm80::smem_u32(q_s), row0 + (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
      sm80::static_for<D / 16>([&](auto kk) { sm80::ldmatrix_x4(qf[kk], sm80::at_chunk<2 * kk>(qa)); });
    }
    std::int32_t vis[2];  // keys [0, vis) visible to the thread's rows; 0 for a padding row
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int32_t row = row0 + g + 8 * r;
      vis[r] = row < u.rows ? u.row.visible_keys(u.row.q_begin + row / u.heads, p.mask) : 0;
    }
    float acc[G::dn][4];
#pragma unroll
    for (int jn = 0; jn < G::dn; ++jn) acc[jn][0] = acc[jn][1] = acc[jn][2] = acc[jn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY};  // running row max, base-2 units (equal on the quad)
    float l[2] = {0.0f, 0.0f};            // this thread's share of the row sum (quad-reduced below)

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
      float s[G::sn][4];
#pragma unroll
      for (int jn = 0; jn < G::sn; ++jn) s[jn][0] = s[jn][1] = s[jn][2] = s[jn][3] = 0.0f;
      sm80::static_for<D / 16>([&](auto kk) {
#pragma unroll
        for (int np = 0; np < G::sn / 2; ++np) {
          // Keys 16np + [0, 16), dims 16kk + [0, 16): b0/b1 of n tiles 2np and 2np + 1.
          std::uint32_t kf[4];
          sm80::ldmatrix_x4(kf, sm80::at_chunk<2 * kk>(k_lane0) + so + static_cast<std::uint32_t>(np * 16 * D * 2));
          sm80::mma_16816<T>(s[2 * np], qf[kk], kf[0], kf[1]);
          sm80::mma_16816<T>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
        }
      });

      // Scale into base 2 first, then mask (a negative scale must not turn -inf into +inf). A slot
      // with nothing loaded has token no_key, above every limit.
      const std::int32_t* tok = tok_warp + st * max_tile_keys + quad_col;
#pragma unroll
      for (int jn = 0; jn < G::sn; ++jn) {
        const int2 t = *reinterpret_cast<const int2*>(tok + 8 * jn);
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          const std::int32_t key = (e2 & 1) ? t.y : t.x;
          s[jn][e2] = key < vis[e2 / 2] ? s[jn][e2] * s_scale : -INFINITY;
        }
      }

      // Row r's elements are e = 2r, 2r + 1 of each n tile.
      float m_use[2], alpha[2];
      bool moved = false;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[r];
#pragma unroll
        for (int jn = 0; jn < G::sn; ++jn) mx = fmaxf(mx, fmaxf(s[jn][2 * r], s[jn][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // -inf - -inf: a row with no visible key so far subtracts 0 instead (every p is 0). An
        // unchanged max (the common case, and a padding row's -inf) needs no rescale.
        m_use[r] = mx == -INFINITY ? 0.0f : mx;
        const bool changed = mx != m[r];
        alpha[r] = changed ? sm80::exp2_approx(m[r] - m_use[r]) : 1.0f;
        moved = moved || changed;
        m[r] = mx;
        l[r] *= alpha[r];
      }
      if (__any_sync(0xffffffffu, moved)) {  // multiplying by 1 elsewhere changes no bit
#pragma unroll
        for (int jn = 0; jn < G::dn; ++jn) {
          acc[jn][0] *= alpha[0];
          acc[jn][1] *= alpha[0];
          acc[jn][2] *= alpha[1];
          acc[jn][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int jn = 0; jn < G::sn; ++jn) {
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          s[jn][e2] = sm80::exp2_approx(s[jn][e2] - m_use[e2 / 2]);
          l[e2 / 2] += s[jn][e2];
        }
      }

      // P·V: the S fragments of n tiles 2kk, 2kk + 1 are the A fragment of k step kk.
#pragma unroll
      for (int kk = 0; kk < G::pk; ++kk) {
        const auto pw = [&](int jn, int e2) { return quantized ? s[jn][e2] * p_scale : s[jn][e2]; };
        const std::uint32_t pa[4] = {sm80::pack2<T>(pw(2 * kk, 0), pw(2 * kk, 1)), sm80::pack2<T>(pw(2 * kk, 2), pw(2 * kk, 3)),
                                     sm80::pack2<T>(pw(2 * kk + 1, 0), pw(2 * kk + 1, 1)),
                                     sm80::pack2<T>(pw(2 * kk + 1, 2), pw(2 * kk + 1, 3))};
        sm80::static_for<D / 16>([&](auto dp) {
          // Keys 16kk + [0, 16), dims 16dp + [0, 16), transposed: b0/b1 of O n tiles 2dp, 2dp + 1.
          std::uint32_t vf[4];
          sm80::ldmatrix_x4_trans(vf, sm80::at_chunk<2 * dp>(v_lane0) + so + static_cast<std::uint32_t>(kk * 16 * D * 2));
          sm80::mma_16816<T>(acc[2 * dp], pa, vf[0], vf[1]);
          sm80::mma_16816<T>(acc[2 * dp + 1], pa, vf[2], vf[3]);
        });
      }
    };

    // The warp's tiles through its cp.async pipeline: one commit group per step (empty ones at the
    // end), so wait_group<stages - 1> means "tile k landed" for this lane; __syncwarp then makes
    // every lane's copies (and zero fills, and tokens) visible to the warp's ldmatrix.
    next_tile = start;
    compute_tile = start;
#pragma unroll
    for (int k = 0; k < stages - 1; ++k) {
      if (k < mine) issue(k);
      sm80::cp_async_commit();
    }
    for (std::int32_t k = 0; k < mine; ++k) {
      const std::int32_t next = k + stages - 1;
      __syncwarp();  // every lane is done reading buffer next % stages (tile k - 1's)
      if (next < mine) issue(static_cast<int>(next % stages));
      sm80::cp_async_commit();
      sm80::cp_async_wait<stages - 1>();
      __syncwarp();
      if constexpr (quantized) {  // codes → 16-bit tile, in place
        unsigned char* const buf = smem + (warp * stages + k % stages) * 2 * tile_bytes;
        widen_tile<D, T, Code>(buf, lane);
        widen_tile<D, T, Code>(buf + tile_bytes, lane);
        __syncwarp();
      }
      compute(static_cast<int>(k % stages));
    }
    sm80::cp_async_wait<0>();

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    __syncthreads();  // every warp is done with its K/V buffers: comb may overwrite them
    // The pass's real rows only (GQA 4 fills 4 of the 16): write_rows reads no other.
    const std::int32_t rows_here = u.rows - row0 < m_tile ? u.rows - row0 : m_tile;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (g + 8 * r >= rows_here) continue;
      const int slot = warp * m_tile + g + 8 * r;
#pragma unroll
      for (int jn = 0; jn < G::dn; ++jn) {
        *reinterpret_cast<float2*>(comb_o + slot * comb_stride<D> + 8 * jn + quad_col) =
            make_float2(acc[jn][2 * r], acc[jn][2 * r + 1]);
      }
      if (lane % 4 == 0) {
        comb_m[slot] = m[r];
        comb_l[slot] = l[r];
      }
    }
    __syncthreads();
    const slice_states st{
        .o = comb_o, .m = comb_m, .l = comb_l, .slices = warps, .rows = m_tile, .o_stride = comb_stride<D>};
    finish_pass<InCluster, D>(a, lp, u, split, nsplit, st, row0, rows_here, partial_s);
    __syncthreads();  // comb is read before the next pass refills the K/V buffers
  }

  if (page_bits != 0) skim::cuda::report(p, page_bits);
#endif
}

}  // namespace skim::cuda::detail::decode_impl::mma
