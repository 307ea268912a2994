#pragma once
// The tile kernels of exec::simd<Arch>: Q/K/V tiles in float, the two FMA microkernels, the
// vectorised online softmax, partial-state merge and the output. Private to simd.hpp.
//
// Register blocking (mr rows × nv registers): every kernel keeps mr·nv accumulators live and
// reloads one operand per register, broadcasting the other.
//   S = Q·Kᵀ  prefill: Kᵀ [head_dim, keys]; per d: nv loads of Kᵀ, mr broadcasts of Q, mr·nv FMAs.
//             decode:  K rows in the source, converted in registers; mr rows × (width/mr) keys of dot products fill `width` accumulators,
//                      reduced together by one sum_rows (haddp).
//   U = α·U + P·V     per key: nv loads of V, mr broadcasts of P, mr·nv FMAs; α applied once per tile.
// Arches with 32 vector registers (AVX-512, NEON64) use 4 × 4, the others 4 × 2.
//
// Padding contract of the tiles (all strides are multiples of 16 floats, so every row is aligned):
//  - Q rows beyond the unit's rows, and Q and V columns in [head_dim, dim_pad), are zero;
//  - K/V entries of keys beyond the tile hold anything: scores there are overwritten with -inf
//    before the softmax reads them (masking = a shorter row), so P is exactly 0 on them, the
//    P·V loop stops at the last key any row of the block sees, and on a partial tile each row
//    stops at its own last key (so a masked key's inf/NaN V never reaches a row as 0·inf).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <xsimd/xsimd.hpp>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/quantized.hpp"
#include "skim/core/softmax_state.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/simd_ops.hpp"

// SKIM_UNROLL is a hint. Where clang's optimizer does not take it (at -O1, or with sanitizers) it
// reports each such loop as a failed transformation; the loops are correct either way.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

namespace skim::exec::simd_detail {

// K/V whose rows are the rows of one strided view per matrix (evenly spaced within a sequence).
template <class KV>
inline constexpr bool is_contiguous_kv = false;
template <class T>
inline constexpr bool is_contiguous_kv<contiguous_kv<T>> = true;

template <class Arch>
struct kernels {
  using batch = fbatch<Arch>;
  static constexpr std::int32_t w = width<Arch>;
  static constexpr std::int32_t mr = 4;
  static constexpr std::int32_t nv = accumulators_per_row<Arch>;
  static constexpr std::int32_t decode_keys = w / mr;  // keys per dot-product block
  static_assert(w % mr == 0, "a decode block of mr rows must fill whole registers");
  static constexpr std::size_t floats_per_line = workspace_alignment / sizeof(float);

  [[nodiscard]] static std::size_t dim_stride(const problem& p) noexcept {
    return align_up(static_cast<std::size_t>(p.head_dim), floats_per_line);
  }
  [[nodiscard]] static std::int32_t dim_pad(const problem& p) noexcept {
    return (p.head_dim + w - 1) / w * w;
  }
  // Keys a tile holds (tiles::ks): block_kv rounded up to a cache line of floats.
  [[nodiscard]] static std::size_t key_stride(const problem& p) noexcept {
    return align_up(static_cast<std::size_t>(p.block_kv > 0 ? p.block_kv : 1), floats_per_line);
  }
  // Selected blocks one decode tile may run (simd.hpp, block_groups): as many as its keys hold (4
  // blocks of 4 keys, 2 of 8; 1 from 9 keys on, where nothing changes; floats_per_line at most). A
  // tile's fixed work (softmax, the rescale of the output rows) is then paid once per group instead
  // of once per small block.
  [[nodiscard]] static std::int32_t decode_group_blocks(const problem& p) noexcept {
    return p.block_kv > 0 ? static_cast<std::int32_t>(key_stride(p) / static_cast<std::size_t>(p.block_kv)) : 1;
  }

  // One slot's scratch. Rows of a unit are r = head_in_unit · queries + query.
  struct tiles {
    std::size_t ds = 0;  // dim stride
    std::size_t ks = 0;  // key stride
    std::span<float> q;      // [rows_pad, ds]  scale · Q
    std::span<float> kt;     // [head_dim, ks]  Kᵀ (prefill)
    std::span<const void*> kp;  // [ks]  K rows of the tile in the source (decode)
    std::span<const void*> vp;  // [ks]  V rows of the tile in the source (decode)
    std::span<const void*> kn;  // [ks]  K rows of the next tile (decode: prefetched while this one runs)
    std::span<const void*> vn;  // [ks]  V rows of the next tile
    std::span<float> v;      // [block_kv, ds]  V rows
    std::span<float> s;      // [mr, ks]        scores, then probabilities, of one row block
    std::span<float> u;      // [rows_pad, ds]  unnormalised output
    std::span<softmax_state> state;  // [rows_pad]
    std::span<std::int32_t> keys;    // [block_q] keys of the current tile each query sees
    std::span<float> k_scale;        // [ks] per-key scales of a quantised tile (0 beyond the tile)
    std::span<float> v_scale;        // [ks]

    [[nodiscard]] static tiles carve(const problem& p, std::int32_t max_rows, workspace_arena& arena) noexcept {
      tiles t;
      t.ds = dim_stride(p);
      t.ks = key_stride(p);
      const std::size_t rows_pad = align_up(static_cast<std::size_t>(max_rows), mr);
      t.q = arena.take<float>(rows_pad * t.ds);
      t.kt = arena.take<float>(static_cast<std::size_t>(p.head_dim) * t.ks);
      t.kp = arena.take<const void*>(t.ks);
      t.vp = arena.take<const void*>(t.ks);
      t.kn = arena.take<const void*>(t.ks);
      t.vn = arena.take<const void*>(t.ks);
      t.v = arena.take<float>(static_cast<std::size_t>(p.block_kv) * t.ds);
      t.s = arena.take<float>(static_cast<std::size_t>(mr) * t.ks);
      t.u = arena.take<float>(rows_pad * t.ds);
      t.state = arena.take<softmax_state>(rows_pad);
      t.keys = arena.take<std::int32_t>(static_cast<std::size_t>(p.block_q));
      t.k_scale = arena.take<float>(t.ks);
      t.v_scale = arena.take<float>(t.ks);
      return t;
    }

    // The same scratch with the row-indexed spans (q, u, state) starting at row r0: where one of
    // several kv groups of a unit keeps its rows. tile() wants r0 % mr == 0 (no block of mr rows
    // spans two groups); load_q, merge_partials and finish take any r0.
    [[nodiscard]] tiles rows_from(std::int32_t r0) const noexcept {
      tiles t = *this;
      const std::size_t r = static_cast<std::size_t>(r0);
      t.q = q.subspan(r * ds);
      t.u = u.subspan(r * ds);
      t.state = state.subspan(r);
      return t;
    }
  };

  // dst[0, dim_pad) = scale · src[0, d), zeros after d. Vector loads read only src[0, d).
  template <stored_element T>
  SKIM_FORCEINLINE static void convert_row(const T* src, float* dst, std::int32_t d, float scale) noexcept {
    std::int32_t e = 0;
    for (; e + w <= d; e += w) (load_float<Arch>(src + e) * batch(scale)).store_aligned(dst + e);
    if (e < d) (load_float_partial<Arch>(src + e, d - e) * batch(scale)).store_aligned(dst + e);
  }

  template <class TQ>
  static void load_q(const strided_view<const TQ>& qv, const tiles& t, const problem& p, std::int64_t q_first,
                     std::int32_t first_head, std::int32_t heads, std::int32_t queries) noexcept {
    const std::int32_t rows = heads * queries;
    const std::int32_t rows_pad = (rows + mr - 1) / mr * mr;
    const std::int32_t dp = dim_pad(p);
    const float scale = p.scale();
    for (std::int32_t r = 0; r < rows_pad; ++r) {
      float* q = t.q.data() + static_cast<std::size_t>(r) * t.ds;
      float* u = t.u.data() + static_cast<std::size_t>(r) * t.ds;
      if (r < rows) {
        convert_row(qv.row(q_first + r % queries, first_head + r / queries), q, p.head_dim, scale);
      } else {
        for (std::int32_t e = 0; e < dp; e += w) batch(0.0f).store_aligned(q + e);
      }
      for (std::int32_t e = 0; e < dp; e += w) batch(0.0f).store_aligned(u + e);
      t.state[static_cast<std::size_t>(r)] = softmax_state{};
    }
  }

  // S[0..mr)[j0, j0 + NV·w) = Q[r0..r0+mr) · Kᵀ[:, j0 ...).
  template <int NV>
  SKIM_FORCEINLINE static void scores_kt(const float* SKIM_RESTRICT q, const float* SKIM_RESTRICT kt, std::size_t ds,
                                         std::size_t ks, std::int32_t d, float* SKIM_RESTRICT s,
                                         std::int32_t j0) noexcept {
    batch acc[mr][NV];
    for (int r = 0; r < mr; ++r)
      for (int n = 0; n < NV; ++n) acc[r][n] = batch(0.0f);
    const float* k = kt + j0;
    for (std::int32_t e = 0; e < d; ++e, k += ks) {
      batch kv[NV];
      for (int n = 0; n < NV; ++n) kv[n] = batch::load_aligned(k + n * w);
      for (int r = 0; r < mr; ++r) {
        const batch qb(q[static_cast<std::size_t>(r) * ds + static_cast<std::size_t>(e)]);
        for (int n = 0; n < NV; ++n) acc[r][n] = fmadd<Arch>(qb, kv[n], acc[r][n]);
      }
    }
    for (int r = 0; r < mr; ++r)
      for (int n = 0; n < NV; ++n) acc[r][n].store_aligned(s + static_cast<std::size_t>(r) * ks + j0 + n * w);
  }

  // Asks for the cache lines of bytes [0, n) at p, into L2 (a hint: never faults). Into L2, not
  // L1: a tile ahead is 16-64 KiB per kv head, as much as L1 holds (L1 hints measured no faster).
  SKIM_FORCEINLINE static void prefetch_row(const void* p, std::size_t n) noexcept {
    const char* c = static_cast<const char*>(p);
    for (std::size_t b = 0; b < n; b += 64) SKIM_PREFETCH_L2(c + b);
  }

  // S[0..mr)[0, keys) by dot products with K rows read from the source (converted in registers):
  // mr rows × decode_keys keys per sum_rows. kp[j] for j in [keys, keys rounded up to decode_keys)
  // must be readable rows too (their scores are ignored).
  // Also asks for the rows kn[j] of the next tile, j < next_keys, as it passes key j (see tile()).
  template <stored_element T>
  static void scores_rows(const float* SKIM_RESTRICT q, const void* const* kp, std::size_t ds, std::size_t ks,
                          std::int32_t d, float* SKIM_RESTRICT s, std::int32_t keys, const void* const* kn,
                          std::int32_t next_keys) noexcept {
    constexpr int kg = decode_keys;
    const std::size_t row_bytes = static_cast<std::size_t>(d) * sizeof(T);
    for (std::int32_t j = 0; j < keys; j += kg) {
      const T* k[kg];
      for (int i = 0; i < kg; ++i) k[i] = static_cast<const T*>(kp[j + i]);
      for (int i = 0; i < kg && j + i < next_keys; ++i) prefetch_row(kn[j + i], row_bytes);
      batch acc[w];
      for (int i = 0; i < w; ++i) acc[i] = batch(0.0f);
      const auto step = [&](std::int32_t e, auto load)  {
        batch kv[kg];
        for (int i = 0; i < kg; ++i) kv[i] = load(k[i] + e);
        for (int r = 0; r < mr; ++r) {
          const batch qv = batch::load_aligned(q + static_cast<std::size_t>(r) * ds + e);
          for (int i = 0; i < kg; ++i) acc[r * kg + i] = fmadd<Arch>(qv, kv[i], acc[r * kg + i]);
        }
      };
      std::int32_t e = 0;
      SKIM_UNROLL(8)  // head_dim 128 at AVX-512 width: the whole dot product, no loop overhead between steps
      for (; e + w <= d; e += w) step(e, [](const T* x) { return load_float<Arch>(x); });
      if (e < d) step(e, [n = d - e](const T* x) { return load_float_partial<Arch>(x, n); });
      alignas(64) float sums[w];
      sum_rows<Arch>(acc).store_aligned(sums);
      for (int r = 0; r < mr; ++r) std::memcpy(s + static_cast<std::size_t>(r) * ks + j, sums + r * kg, sizeof(float) * kg);
    }
    // A next tile longer than this one (a partial tile before a full one): the rest of its rows.
    for (std::int32_t j = (keys + kg - 1) / kg * kg; j < next_keys; ++j) prefetch_row(kn[j], row_bytes);
  }

  // acc[r][·] += P[r][j] · vv for the mr rows of a block (a row past its own key count n_rows[r]
  // takes no term when Ragged), then, at the end of a key loop, U = α·U + acc.
  template <int NV, bool Ragged>
  SKIM_FORCEINLINE static void fma_rows(batch (&acc)[mr][NV], const batch (&vv)[NV], const float* SKIM_RESTRICT pr,
                                        std::size_t ks, std::int32_t j, const std::int32_t* n_rows) noexcept {
    for (int r = 0; r < mr; ++r) {
      if (Ragged && j >= n_rows[r]) continue;
      const batch pb(pr[static_cast<std::size_t>(r) * ks + static_cast<std::size_t>(j)]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fmadd<Arch>(pb, vv[n], acc[r][n]);
    }
  }
  template <int NV>
  SKIM_FORCEINLINE static void rescale_add(const batch (&acc)[mr][NV], const float* alpha, float* SKIM_RESTRICT u,
                                           std::size_t ds, std::int32_t e0) noexcept {
    for (int r = 0; r < mr; ++r) {
      float* ur = u + static_cast<std::size_t>(r) * ds + e0;
      const batch a(alpha[r]);
      for (int n = 0; n < NV; ++n) fmadd<Arch>(a, batch::load_aligned(ur + n * w), acc[r][n]).store_aligned(ur + n * w);
    }
  }

  // accumulate() with V rows read from the source: U[0..mr)[e0, e0 + NV·w) = α·U + P·V[vp[j]].
  // Partial: the block's last register covers only d - (e0 + (NV-1)·w) columns (read no further).
  // Ragged: rows see different key counts n_rows[r] (a partial tile); a row then takes no term of
  // the keys it does not see, not even 0·v (an inf or NaN in a masked V row must not reach it).
  // Also asks for the same columns of the rows vn[j] of the next tile, j < next_keys, as it passes
  // key j: each pass over the keys requests its own part of the next rows, so the requests are spread
  // over every pass at the rate the score loop issues K's (requesting whole rows in the first pass
  // read fp16 decode slower from DRAM, likely requests dropped or stalled in bursts). A full pass's
  // part is NV·w elements, known at compile time, so prefetch_row's loop unrolls: the same requests
  // with a length computed at run time (a loop) were slower still (docs/performance.md, CPU decode).
  template <int NV, bool Partial, bool Ragged, stored_element T>
  SKIM_FORCEINLINE static void accumulate_rows(const float* SKIM_RESTRICT pr, const void* const* vp, std::size_t ds,
                                               std::size_t ks, std::int32_t keys, const std::int32_t* n_rows,
                                               const float* alpha, float* SKIM_RESTRICT u, std::int32_t e0,
                                               std::int32_t d, const void* const* vn, std::int32_t next_keys) noexcept {
    batch acc[mr][NV];
    for (int r = 0; r < mr; ++r)
      for (int n = 0; n < NV; ++n) acc[r][n] = batch(0.0f);
    const std::size_t part_offset = static_cast<std::size_t>(e0) * sizeof(T);
    const std::size_t part_bytes = static_cast<std::size_t>(Partial ? d - e0 : NV * w) * sizeof(T);
    const auto next_part = [&](std::int32_t j) { return static_cast<const char*>(vn[j]) + part_offset; };
    for (std::int32_t j = keys; j < next_keys; ++j) prefetch_row(next_part(j), part_bytes);
    SKIM_UNROLL(2)  // two keys' loads in flight (faster decode on AVX-512; 4 is no better)
    for (std::int32_t j = 0; j < keys; ++j) {
      if (j < next_keys) prefetch_row(next_part(j), part_bytes);
      const T* vj = static_cast<const T*>(vp[j]) + e0;
      batch vv[NV];
      for (int n = 0; n < NV; ++n) {
        if (Partial && n == NV - 1) vv[n] = load_float_partial<Arch>(vj + n * w, d - e0 - n * w);
        else vv[n] = load_float<Arch>(vj + n * w);
      }
      fma_rows<NV, Ragged>(acc, vv, pr, ks, j, n_rows);
    }
    rescale_add<NV>(acc, alpha, u, ds, e0);
  }

  // U[0..mr)[e0, e0 + NV·w) = α·U + P[0..mr)[0, keys) · V[0, keys)[e0 ...).
  // Ragged as in accumulate_rows().
  template <int NV, bool Ragged>
  SKIM_FORCEINLINE static void accumulate(const float* SKIM_RESTRICT pr, const float* SKIM_RESTRICT v, std::size_t ds,
                                          std::size_t ks, std::int32_t keys, const std::int32_t* n_rows,
                                          const float* alpha, float* SKIM_RESTRICT u, std::int32_t e0) noexcept {
    batch acc[mr][NV];
    for (int r = 0; r < mr; ++r)
      for (int n = 0; n < NV; ++n) acc[r][n] = batch(0.0f);
    const float* vj = v + e0;
    for (std::int32_t j = 0; j < keys; ++j, vj += ds) {
      batch vv[NV];
      for (int n = 0; n < NV; ++n) vv[n] = batch::load_aligned(vj + n * w);
      fma_rows<NV, Ragged>(acc, vv, pr, ks, j, n_rows);
    }
    rescale_add<NV>(acc, alpha, u, ds, e0);
  }

  // Calls kernel<NV>(offset) over `vectors` registers: blocks of nv, then the remainder.
  template <class F>
  SKIM_FORCEINLINE static void over_vectors(std::int32_t vectors, F&& kernel) noexcept {
    std::int32_t i = 0;
    for (; i + nv <= vectors; i += nv) kernel.template operator()<nv>(i * w);
    switch (vectors - i) {
      case 1: kernel.template operator()<1>(i * w); break;
      case 2: if constexpr (nv > 2) kernel.template operator()<2>(i * w); break;
      case 3: if constexpr (nv > 3) kernel.template operator()<3>(i * w); break;
      default: break;
    }
  }

  // Online-softmax update of row state st with the scores s[0, n) (n = 0: the row sees none of
  // the tile). Writes P to s[0, n_pad) (0 beyond n) and returns the rescale α of the row's U.
  SKIM_FORCEINLINE static float softmax_row(softmax_state& st, float* SKIM_RESTRICT s, std::int32_t n,
                                            std::int32_t n_pad) noexcept {
    if (n == 0) {
      for (std::int32_t j = 0; j < n_pad; j += w) batch(0.0f).store_aligned(s + j);
      return 1.0f;
    }
    for (std::int32_t j = n; j < n_pad; ++j) s[j] = neg_inf;
    batch vmax = batch::load_aligned(s);
    for (std::int32_t j = w; j < n_pad; j += w) vmax = xsimd::max(vmax, batch::load_aligned(s + j));
    const float tile_max = reduce_max<Arch>(vmax);
    const float m = st.m > tile_max ? st.m : tile_max;
    const float alpha = std::exp(st.m - m);  // 0 on the row's first tile (st.m = -inf, m finite)
    const batch mb(m);
    batch sum(0.0f);
    for (std::int32_t j = 0; j < n_pad; j += w) {
      const batch e = xsimd::exp(batch::load_aligned(s + j) - mb);  // exp(-inf) = 0 on masked keys
      e.store_aligned(s + j);
      sum += e;
    }
    st.m = m;
    st.l = mul_add(alpha, st.l, xsimd::hadd(sum));
    return alpha;
  }

  // The K and V rows of tokens [t0, t0 + n) of sequence b, kv head h, into kp[0, n) and vp[0, n).
  // Contiguous K/V: one lookup and a stride (the rows of a view are evenly spaced); other sources
  // resolve each row.
  template <class KV>
  SKIM_FORCEINLINE static void rows_of(const KV& kv, std::int32_t b, std::int32_t t0, std::int32_t n, std::int32_t h,
                                       const void** kp, const void** vp) noexcept {
    if constexpr (is_contiguous_kv<KV>) {
      if (n <= 0) return;
      const auto* k = kv.k_row(b, t0, h);
      const auto* v = kv.v_row(b, t0, h);
      for (std::int32_t j = 0; j < n; ++j, k += kv.k.token_stride, v += kv.v.token_stride) {
        kp[j] = k;
        vp[j] = v;
      }
    } else {
      for (std::int32_t j = 0; j < n; ++j) {
        kp[j] = kv.k_row(b, t0 + j, h);
        vp[j] = kv.v_row(b, t0 + j, h);
      }
    }
  }

  // Keys of block id in its sequence: block_kv, or fewer for the sequence's last block.
  [[nodiscard]] SKIM_FORCEINLINE static std::int32_t block_keys(const problem& p, const row_info& row,
                                                                std::int32_t id) noexcept {
    const std::int32_t k0 = id * p.block_kv;
    return row.kv_len - k0 < p.block_kv ? row.kv_len - k0 : p.block_kv;
  }
  // f(key0, at, n) for each block of a tile's `blocks`, in order: its first key in the sequence, its
  // first key in the tile, its keys. Returns the tile's keys.
  template <class F>
  SKIM_FORCEINLINE static std::int32_t for_blocks(const problem& p, const row_info& row,
                                                  std::span<const std::int32_t> blocks, F&& f) noexcept {
    std::int32_t at = 0;
    for (const std::int32_t id : blocks) {
      const std::int32_t n = block_keys(p, row, id);
      f(id * p.block_kv, at, n);
      at += n;
    }
    return at;
  }

  // Converts the tile's K (transposed for prefill, rows for decode) and V to float, then runs
  // every block of mr rows of the unit through S, softmax and P·V.
  // A prefill tile runs one block (ids[0]); a decode tile runs ids, ascending, at most
  // decode_group_blocks(p) of them, its keys those of its blocks in order. As keys
  // rise with the ids, the keys a query sees are a prefix of the tile's, as in a single block.
  // Decode also asks for the K and V rows (of kv_head) of the blocks `next`, the tile the unit runs
  // next: row j of it as the first block of rows passes key j, so the requests are spread over the
  // tile's work and arrive a tile ahead. Without them the hardware prefetchers restart at every
  // tile (selected blocks are apart, rows of one head are strided).
  template <class KV>
  static void tile(const KV& kv, const tiles& t, const problem& p, const row_info& row, std::int32_t kv_head,
                   std::span<const std::int32_t> ids, std::int32_t rows, std::int32_t queries, bool decode,
                   std::span<const std::int32_t> next = {}) noexcept {
    SKIM_DASSERT(ids.size() == 1 || (decode && !ids.empty() &&
                                     ids.size() <= static_cast<std::size_t>(decode_group_blocks(p))));
    const std::int32_t d = p.head_dim;
    const std::int32_t dp = dim_pad(p);
    const std::int32_t k0 = ids[0] * p.block_kv;  // a prefill tile's first key
    const std::int32_t tile_keys = for_blocks(p, row, ids, [](std::int32_t, std::int32_t, std::int32_t) {});

    using T = typename KV::value_type;
    constexpr bool quantized = is_quantized_kv<KV>;
    if constexpr (quantized) {
      // Scales per key (a page-wise scale may change inside a tile); 0 beyond it, so P·scale stays 0.
      for_blocks(p, row, ids, [&](std::int32_t key0, std::int32_t at, std::int32_t n) {
        for (std::int32_t j = 0; j < n; ++j) {
          t.k_scale[static_cast<std::size_t>(at + j)] = kv.k_scale(row.seq, key0 + j, kv_head);
          t.v_scale[static_cast<std::size_t>(at + j)] = kv.v_scale(row.seq, key0 + j, kv_head);
        }
      });
      for (std::size_t j = static_cast<std::size_t>(tile_keys); j < t.ks; ++j) t.k_scale[j] = t.v_scale[j] = 0.0f;
    }
    const auto scale_of = [&](std::span<float> scales, std::int32_t j) {
      if constexpr (quantized) return scales[static_cast<std::size_t>(j)];
      else return 1.0f;
    };
    std::int32_t next_keys = 0;  // rows of the next tile to prefetch (decode)
    if (decode) {
      // Few rows: read K and V where they are, converting in registers (each row is used once).
      for_blocks(p, row, ids, [&](std::int32_t key0, std::int32_t at, std::int32_t n) {
        rows_of(kv, row.seq, key0, n, kv_head, t.kp.data() + at, t.vp.data() + at);
      });
      for (std::int32_t j = tile_keys; j % decode_keys != 0; ++j) t.kp[static_cast<std::size_t>(j)] = t.kp[0];
      next_keys = for_blocks(p, row, next, [&](std::int32_t key0, std::int32_t at, std::int32_t n) {
        rows_of(kv, row.seq, key0, n, kv_head, t.kn.data() + at, t.vn.data() + at);
      });
    } else {
      // Many rows: convert once per tile, K transposed so the score kernel needs no reduction.
      for (std::int32_t j = 0; j < tile_keys; ++j) {
        const T* k = kv.k_row(row.seq, k0 + j, kv_head);
        float* kt = t.kt.data() + j;
        if constexpr (quantized) {
          const float ks = scale_of(t.k_scale, j);
          for (std::int32_t e = 0; e < d; ++e) kt[static_cast<std::size_t>(e) * t.ks] = ks * value_of(k[e]);
        } else {
          for (std::int32_t e = 0; e < d; ++e) kt[static_cast<std::size_t>(e) * t.ks] = value_of(k[e]);
        }
        convert_row(kv.v_row(row.seq, k0 + j, kv_head), t.v.data() + static_cast<std::size_t>(j) * t.ds, d,
                    scale_of(t.v_scale, j));
      }
    }

    // Keys of the tile each query sees: all of them on a full tile, a prefix on a partial one (a
    // tile is full where its last block is: earlier blocks are seen by at least as many queries).
    if (row.is_full(ids.back())) {
      for (std::int32_t qq = 0; qq < queries; ++qq) t.keys[static_cast<std::size_t>(qq)] = tile_keys;
    } else {
      for (std::int32_t qq = 0; qq < queries; ++qq) {
        const std::int32_t visible = row.visible_keys(row.q_begin + qq, p.mask);
        std::int32_t seen = 0;
        for_blocks(p, row, ids, [&](std::int32_t key0, std::int32_t, std::int32_t n) {
          const std::int32_t m = visible - key0;
          seen += m < 0 ? 0 : (m > n ? n : m);
        });
        t.keys[static_cast<std::size_t>(qq)] = seen;
      }
    }

    const std::int32_t rows_pad = (rows + mr - 1) / mr * mr;
    for (std::int32_t r0 = 0; r0 < rows_pad; r0 += mr) {
      std::int32_t n[mr];
      std::int32_t n_max = 0;
      for (int r = 0; r < mr; ++r) {
        n[r] = r0 + r < rows ? t.keys[static_cast<std::size_t>((r0 + r) % queries)] : 0;
        n_max = n[r] > n_max ? n[r] : n_max;
      }
      if (n_max == 0) continue;
      const std::int32_t n_pad = (n_max + w - 1) / w * w;
      const float* q = t.q.data() + static_cast<std::size_t>(r0) * t.ds;
      float* s = t.s.data();
      if (decode) {
        scores_rows<T>(q, t.kp.data(), t.ds, t.ks, d, s, n_max, t.kn.data(), r0 == 0 ? next_keys : 0);
        if constexpr (quantized) {  // S = scale_j · (q · k_j)
          for (int r = 0; r < mr; ++r)
            for (std::int32_t j = 0; j < n_pad; j += w) {
              float* sr = s + static_cast<std::size_t>(r) * t.ks + j;
              (batch::load_aligned(sr) * batch::load_aligned(t.k_scale.data() + j)).store_aligned(sr);
            }
        }
      } else {
        over_vectors(n_pad / w, [&]<int NV>(std::int32_t j0) { scores_kt<NV>(q, t.kt.data(), t.ds, t.ks, d, s, j0); });
      }
      float alpha[mr];
      for (int r = 0; r < mr; ++r) {
        alpha[r] = softmax_row(t.state[static_cast<std::size_t>(r0 + r)], s + static_cast<std::size_t>(r) * t.ks, n[r],
                               n_pad);
      }
      float* u = t.u.data() + static_cast<std::size_t>(r0) * t.ds;
      if constexpr (quantized) {  // P·(scale_j · v_j) = (P_j · scale_j) · v_j; l already summed P
        if (decode) {
          for (int r = 0; r < mr; ++r)
            for (std::int32_t j = 0; j < n_pad; j += w) {
              float* pr = s + static_cast<std::size_t>(r) * t.ks + j;
              (batch::load_aligned(pr) * batch::load_aligned(t.v_scale.data() + j)).store_aligned(pr);
            }
        }
      }
      bool ragged = false;  // rows of the block see different key counts: a partial tile
      for (int r = 0; r < mr; ++r) ragged = ragged || n[r] != n_max;
      const auto pv = [&]<bool Ragged>() {
        if (decode) {
          // The next tile's V rows: once, in the passes over the keys of the first block of rows,
          // each pass its own columns.
          const std::int32_t vn_keys = r0 == 0 ? next_keys : 0;
          over_vectors(d / w, [&]<int NV>(std::int32_t e0) {
            accumulate_rows<NV, false, Ragged, T>(s, t.vp.data(), t.ds, t.ks, n_max, n, alpha, u, e0, d, t.vn.data(),
                                                  vn_keys);
          });
          if (d % w != 0) {
            accumulate_rows<1, true, Ragged, T>(s, t.vp.data(), t.ds, t.ks, n_max, n, alpha, u, d / w * w, d,
                                                t.vn.data(), vn_keys);
          }
        } else {
          over_vectors(dp / w, [&]<int NV>(std::int32_t e0) {
            accumulate<NV, Ragged>(s, t.v.data(), t.ds, t.ks, n_max, n, alpha, u, e0);
          });
        }
      };
      if (ragged) {
        pv.template operator()<true>();
      } else {
        pv.template operator()<false>();
      }
    }
  }

  static void copy(const float* src, float* dst, std::int32_t d) noexcept {
    for (std::int32_t e = 0; e < d; ++e) dst[e] = src[e];
  }

  // t.u, t.state of rows [0, rows) = the LSE merge of the chunks' partials, in chunk order.
  // states: [chunks, rows]; u: [chunks, rows, ds].
  static void merge_partials(const softmax_state* states, const float* u, std::int32_t chunks, std::int32_t rows,
                             const tiles& t, const problem& p) noexcept {
    const std::int32_t d = p.head_dim;
    for (std::int32_t r = 0; r < rows; ++r) {
      softmax_state st{};
      float* dst = t.u.data() + static_cast<std::size_t>(r) * t.ds;
      for (std::int32_t e = 0; e < d; ++e) dst[e] = 0.0f;
      for (std::int32_t c = 0; c < chunks; ++c) {
        const softmax_state& b = states[static_cast<std::size_t>(c) * rows + r];
        if (b.l == 0.0f) continue;  // an empty chunk (also keeps -inf - -inf away)
        const float* src = u + (static_cast<std::size_t>(c) * rows + r) * t.ds;
        const float m = st.m > b.m ? st.m : b.m;
        const float ca = std::exp(st.m - m);  // 0 while st is empty
        const float cb = std::exp(b.m - m);
        st.m = m;
        st.l = mul_add(cb, b.l, ca * st.l);  // as the rows of U below: cb·src + (ca·dst)
        std::int32_t e = 0;
        for (; e + w <= d; e += w) {
          fmadd<Arch>(batch(cb), batch::load_aligned(src + e), batch(ca) * batch::load_aligned(dst + e))
              .store_aligned(dst + e);
        }
        for (; e < d; ++e) dst[e] = mul_add(cb, src[e], ca * dst[e]);
      }
      t.state[static_cast<std::size_t>(r)] = st;
    }
  }

  // O = U / l and lse = m + log l for the unit's rows; O = 0, lse = -inf for a row that saw no key.
  template <class TO>
  static void finish(const strided_view<TO>& o, std::span<float> lse, const tiles& t, const problem& p,
                     std::int64_t q_first, std::int32_t first_head, std::int32_t heads, std::int32_t queries) noexcept {
    const std::int32_t d = p.head_dim;
    for (std::int32_t r = 0; r < heads * queries; ++r) {
      const std::int32_t qq = r % queries, hh = r / queries;
      const softmax_state& st = t.state[static_cast<std::size_t>(r)];
      const float* u = t.u.data() + static_cast<std::size_t>(r) * t.ds;
      TO* dst = o.row(q_first + qq, first_head + hh);
      const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
      std::int32_t e = 0;
      if constexpr (std::is_same_v<TO, float>) {
        for (; e + w <= d; e += w) (batch::load_aligned(u + e) * batch(inv)).store_unaligned(dst + e);
      }
      for (; e < d; ++e) dst[e] = from_float<TO>(st.l > 0.0f ? u[e] * inv : 0.0f);
      if (!lse.empty()) {
        lse[static_cast<std::size_t>((q_first + qq) * p.heads_q + first_head + hh)] =
            st.l > 0.0f ? st.m + std::log(st.l) : neg_inf;
      }
    }
  }
};

}  // namespace skim::exec::simd_detail

#if defined(__clang__)
#pragma clang diagnostic pop
#endif
