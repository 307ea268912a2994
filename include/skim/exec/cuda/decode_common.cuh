#pragma once
// What both split kernels of skim::cuda::decode share (decode.cuh holds the host API and the
// contracts; decode_simt.cuh and decode_mma.cuh the two split kernels): launch parameters and
// shared-memory sizes, the unit a CTA computes, the row it reads (selected here for a routed table),
// the chunk's id checks, the epilogue's combine (write_rows) into O or a split partial, and the two
// ways a row's splits merge. The K/V row lookups are decode_kv_rows.cuh's.
//
// merge_kernel: one CTA per unit whose row has more than one split; combines the workspace's
// partials in split order (deterministic) and writes O and lse.
// finish_pass<true> (the cluster merge, sm_90+): the splits of a row run as one thread block cluster
// and merge each pass's partials through distributed shared memory, with merge_kernel's arithmetic
// (merge_splits): no second launch, no workspace traffic, the same bits.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/exec/cuda/decode_kv_rows.cuh"
#include "skim/exec/cuda/ptx.cuh"
#include "skim/select/cuda/select_kernel.cuh"

namespace skim::cuda::detail::decode_impl {

using skim::cuda::device_attention_args;
using skim::cuda::device_problem;
using skim::cuda::device_row;

inline constexpr int warps = 8;
inline constexpr int threads = warps * 32;
inline constexpr int stages = 3;          // cp.async buffers per warp: 2 tiles (8 KB) in flight per warp
inline constexpr int rows_per_warp = 4;   // rows a warp keeps in registers (o: 4 × 16 floats per lane)
inline constexpr int max_unit_rows = 64;  // heads per unit × queries per unit
inline constexpr int max_chunk_blocks = 256;
inline constexpr int combine_rows = 32;   // (slices × rows) of one pass: 8 warps × rows_per_warp
inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;
inline constexpr std::int32_t no_key = 0x7fffffff;  // token of a tile slot with nothing loaded: above every limit

// Lane geometry for head_dim D and K/V elements of Bytes bytes (2: fp16/bf16; 1: 8-bit codes):
// each lane owns 16 dims of one key, as two chunks of 8 dims (16 or 8 bytes). A tile moves 4 KB of
// K + V per warp either way: 8-bit tiles have twice the steps.
template <int D, int Bytes = 2>
struct geometry {
  static_assert(D == 64 || D == 128, "decode supports head_dim 64 and 128");
  static_assert(Bytes == 1 || Bytes == 2, "decode reads 16-bit elements or 8-bit codes");
  static constexpr int dims_per_lane = 16;
  static constexpr int lanes_per_key = D / dims_per_lane;  // 8 (d128) or 4 (d64)
  static constexpr int keys_per_step = 32 / lanes_per_key; // 4 or 8 keys per warp-wide chunk load
  static constexpr int steps = 4 / Bytes;                  // steps per tile: 2, or 4 for 8-bit codes
  static constexpr int tile_keys = steps * keys_per_step;  // 8 or 16 (16-bit), 16 or 32 (8-bit)
  static constexpr int chunk_bytes = 8 * Bytes;            // one lane's 8 dims
};

// Shared memory (dynamic), in this order:
//   kv     [warps][stages][2 (K, V)][steps][2 (chunk c, c + lanes_per_key)][32 lanes] chunks of
//          chunk_bytes (4 KB per stage for either element size)
//   tok    [warps][stages][steps][32 lanes] int32: token of the lane's key, no_key if nothing loaded
//   q      [q_rows][4][lanes_per_key][4] float: row u's dims as lane c reads them (conflict-free)
//   ids    [chunk_blocks] int32
//   scales [chunk_blocks][2] float: K and V scales of each id (quantised sources only)
// The epilogue's per-slice states alias kv (after a barrier):
//   comb_o [combine_rows][D] float, comb_m [combine_rows], comb_l [combine_rows]
inline constexpr std::size_t stage_uint4 = 2 * 2 * 2 * 32;  // one stage's K and V, in uint4
inline constexpr std::size_t kv_uint4_per_warp = static_cast<std::size_t>(stages) * stage_uint4;
inline constexpr std::size_t kv_bytes = warps * kv_uint4_per_warp * 16;
[[nodiscard]] constexpr std::size_t tok_bytes_for(int steps) noexcept {
  return static_cast<std::size_t>(warps) * stages * steps * 32 * 4;
}
static_assert(2 * combine_rows * (128 + 2) * 4 <= kv_bytes,
              "the epilogue's states and a pass's partial (cluster merge) fit in the K/V buffers");
static_assert(combine_rows == warps * rows_per_warp);

[[nodiscard]] constexpr std::int32_t q_rows(std::int32_t unit_rows) noexcept {
  return (unit_rows + rows_per_warp - 1) / rows_per_warp * rows_per_warp;
}
[[nodiscard]] constexpr std::size_t ids_bytes(std::int32_t chunk_blocks) noexcept {
  return (static_cast<std::size_t>(chunk_blocks) * 4 + 15) / 16 * 16;
}
// The CUDA-core kernel's shared memory for K/V elements of code_bytes bytes (scales: a quantised source).
[[nodiscard]] constexpr std::size_t shared_bytes(std::int32_t head_dim, std::int32_t max_rows, std::int32_t chunk_blocks,
                                                 int code_bytes = 2, bool scales = false) noexcept {
  return kv_bytes + tok_bytes_for(4 / code_bytes) + static_cast<std::size_t>(q_rows(max_rows)) * head_dim * 4 +
         ids_bytes(chunk_blocks) + (scales ? 2 * ids_bytes(chunk_blocks) : 0);
}

// What the host computed for a launch.
struct launch_params {
  std::int32_t chunk_blocks = 8;
  std::int32_t splits = 1;     // grid.x; rows with more ids than splits · chunk_blocks are bad_count
  std::int32_t max_rows = 0;   // bound on unit rows (stride of the partials)
  std::int32_t q_blocks = 0;   // max_q_blocks; grid.z = batch · q_blocks
  float scale_log2 = 0.0f;     // softmax scale · log2(e)
  float* partial_o = nullptr;  // [units, splits, max_rows, head_dim] when splits > 1
  float* partial_ml = nullptr; // [units, splits, max_rows, 2]: m (log2 domain), l
  bool stream_kv = false;      // the tensor-core kernel's K/V copies evict-first in L2 (launch.cuh: streams_past_l2)
};

// ---------------------------------------------------------------------------------------------
// Small device helpers

using skim::cuda::ptx::cp_async_16;  // ptx.cuh, shared with the prefill and tensor-core kernels
using skim::cuda::ptx::cp_async_8;
using skim::cuda::ptx::cp_async_commit;
using skim::cuda::ptx::cp_async_wait;
using skim::cuda::ptx::exp2_approx;  // 2^-inf = 0: the masked and empty cases rely on it

// Eight 16-bit elements (one uint4) to floats.
template <class T>
__device__ __forceinline__ void widen8(const uint4& w, float* f) noexcept {
  const float2 a = skim::cuda::to_float2<T>(w.x), b = skim::cuda::to_float2<T>(w.y);
  const float2 c = skim::cuda::to_float2<T>(w.z), d = skim::cuda::to_float2<T>(w.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

// q_block_offset(p, b) computed by a whole warp (lanes stride over the sequences): O(b / 32).
// @pre all 32 lanes call it with the same b.
[[nodiscard]] __device__ __forceinline__ std::int64_t warp_q_block_offset(const device_problem& p,
                                                                          std::int32_t b) noexcept {
  long long n = 0;
  for (std::int32_t s = static_cast<std::int32_t>(threadIdx.x % 32); s < b; s += 32) {
    const std::int32_t len = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    n += len > 0 ? (len + p.block_q - 1) / p.block_q : 0;
  }
#pragma unroll
  for (int x = 16; x > 0; x /= 2) n += __shfl_xor_sync(0xffffffffu, n, x);
  return n;
}

// The unit of a CTA: (index head ih, sequence b, query block i). The split and merge kernels compute
// it the same way, so they agree on rows and on the number of splits.
struct unit {
  device_row row;
  std::int64_t index_row = 0;
  std::int32_t seq = 0;         // the sequence b
  std::int32_t heads = 1;       // query heads of the unit
  std::int32_t first_head = 0;  // first query head
  std::int32_t kv_head = 0;
  std::int32_t queries = 0;     // q_end - q_begin
  std::int32_t rows = 0;        // heads · queries; row u is query u / heads, head first_head + u % heads
  std::int64_t id = 0;          // unit number (partials are stored per unit)
};

// false when the unit has no query (or its sequence breaks the bounds: reported by make_device_row).
// @pre called by whole warps (warp_q_block_offset).
[[nodiscard]] __device__ __forceinline__ bool make_unit(const device_problem& p, std::int32_t q_blocks,
                                                        unit& u) noexcept {
  const std::int32_t ih = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.z) / q_blocks;
  const std::int32_t i = static_cast<std::int32_t>(blockIdx.z) % q_blocks;
  u.id = static_cast<std::int64_t>(blockIdx.z) * gridDim.y + ih;
  u.seq = b;
  u.row = skim::cuda::make_device_row(p, b, i);
  const std::int64_t offset = warp_q_block_offset(p, b);  // every lane: keep the warp converged
  if (!u.row.ok) return false;
  const std::int32_t group = p.heads_q / p.heads_kv;
  if (p.scope == index_scope::kv_head) {
    u.heads = group;
    u.first_head = ih * group;
    u.kv_head = ih;
  } else {
    u.heads = 1;
    u.first_head = ih;
    u.kv_head = ih / group;
  }
  u.index_row = (offset + i) * p.index_heads() + ih;
  u.queries = u.row.q_end - u.row.q_begin;
  u.rows = u.heads * u.queries;
  return true;
}

// Splits a row of n ids uses: ceil(n / chunk_blocks), at least 1 (an empty row still writes O = 0),
// at most the grid's.
[[nodiscard]] __device__ __forceinline__ std::int32_t used_splits(std::int32_t n, const launch_params& lp) noexcept {
  if (n <= lp.chunk_blocks) return 1;
  const std::int32_t s = (n - 1) / lp.chunk_blocks + 1;
  return s < lp.splits ? s : lp.splits;
}

// ---------------------------------------------------------------------------------------------
// The chunk's ids and the epilogue's combine, shared by this kernel and the tensor-core one
// (decode_mma.cuh). Thread j < chunk_blocks owns entry split · chunk_blocks + j of the row.

struct entry_ids {
  std::int32_t id = 0;
  std::int32_t pred = -1;  // the entry before it in the row (-1: none)
};

// The unit's index row as (first, n, clamped). Stored forms: index.row(). Indices read only through
// a cursor (implicit rules, unions, shared rows of them): the ids are computed from the cursor, first
// is null and e holds this thread's entry's id and predecessor. A rule's range gives them at once; a
// union is walked by every thread in step (the same ids, no barrier), so it costs one step per id of
// the row (a dependent load per id of a stored part: decode_router writes its reserved blocks into
// the table instead).
template <class Index>
__device__ __forceinline__ skim::cuda::device_block_table::span row_span(const Index& index, const unit& u,
                                                                         std::int32_t entry, entry_ids& e) noexcept {
  if constexpr (skim::cuda::is_positional_device_index_v<Index>) {
    return index.row(u.index_row);
  } else {
    auto c = index.cursor(u.index_row, u.row);
    if constexpr (std::is_same_v<decltype(c), skim::cuda::device_range_cursor>) {
      const std::int32_t n = c.last > c.first ? c.last - c.first : 0;
      if (entry >= 0 && entry < n) {
        e.id = c.first + entry;
        e.pred = entry > 0 ? e.id - 1 : -1;
      }
      return {nullptr, n, false};
    } else {
      std::int32_t n = 0;
      for (; !c.done(); c.next(), ++n) {
        if (n == entry - 1) e.pred = c.id();
        if (n == entry) e.id = c.id();
      }
      return {nullptr, n, c.malformed()};
    }
  }
}

// The row a split kernel reads. A device_routed_table's row is selected here by the whole CTA
// (select/cuda/select_row.cuh's select_row over the scores, or candidates.cuh's select_candidates over the score
// kernel's candidates: the select kernel's ids, bit for bit) into shared memory at `scratch`
// (device_routed_table::scratch_bytes, 16-byte aligned, free until the kernel's first barrier after
// check_ids), and split 0 writes it to the table for the merge kernel and the engine.
// Every other index: row_span. @pre called by all threads of the CTA (barriers inside for a routed
// table), before anything else uses `scratch`
template <class Index>
__device__ __forceinline__ skim::cuda::device_block_table::span split_row_span(const device_problem& p,
                                                                               const Index& index, const unit& u,
                                                                               std::int32_t split, std::int32_t entry,
                                                                               entry_ids& e,
                                                                               unsigned char* scratch) noexcept {
  if constexpr (skim::cuda::is_routed_device_index_v<Index>) {
    namespace impl = skim::cuda::detail::route_impl;
    const skim::cuda::mutable_device_block_table& t = index.table;
    if (u.index_row < 0 || u.index_row >= t.rows) return {nullptr, 0, true};  // reported by check_ids (bad_count)
    const impl::row_plan plan = impl::plan_row(u.row.visible_blocks, index.select);
    using routed = skim::cuda::device_routed_table;
    auto& s = *reinterpret_cast<impl::select_scratch*>(scratch);
    std::int32_t* const ids = reinterpret_cast<std::int32_t*>(scratch + routed::ids_offset);
    unsigned char* const keys = scratch + routed::keys_offset(t.width);
    const int h = static_cast<int>(blockIdx.y);
    int count = 0;
    if constexpr (std::is_same_v<Index, skim::cuda::device_kept_table>) {
      const std::int64_t row = static_cast<std::int64_t>(u.seq) * p.index_heads() + h;
      count = impl::select_candidates<threads>(plan, index.candidates + row * index.candidate_stride, index.slots, ids,
                                               t.width, reinterpret_cast<std::uint64_t*>(keys), s);
    } else {
      count = impl::select_row<threads, false>(p, index.scores, u.seq, h, plan, index.select, ids, t.width,
                                               reinterpret_cast<std::uint32_t*>(keys), s);
    }
    __syncthreads();  // the row's ids are complete
    if (split == 0) {
      for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < t.width; i += threads) {
        t.ids[u.index_row * t.width + i] = ids[i];
      }
      if (threadIdx.x == 0) t.count[u.index_row] = count;
    }
    return {ids, count, false};
  } else {
    (void)p, (void)split, (void)scratch;
    return row_span(index, u, entry, e);
  }
}

// A block_table's entries, loaded before the count is known: the row's address does not depend on
// it (loaded speculatively, inside the table). A CSR's wait for load_ids_late.
template <class Index>
__device__ __forceinline__ void load_ids_early(const Index& index, const unit& u, const launch_params& lp,
                                               std::int32_t j, std::int32_t entry, entry_ids& e) noexcept {
  if constexpr (std::is_same_v<Index, skim::cuda::device_block_table>) {
    if (j < lp.chunk_blocks && entry < index.width && u.index_row >= 0 && u.index_row < index.rows) {
      const std::int32_t* ids = index.ids + u.index_row * index.width;
      e.id = ids[entry];
      if (entry > 0) e.pred = ids[entry - 1];
    }
  }
}
template <class Index>
__device__ __forceinline__ void load_ids_late(const skim::cuda::device_block_table::span& span, std::int32_t j,
                                              std::int32_t entry, std::int32_t entries, entry_ids& e) noexcept {
  if constexpr (skim::cuda::is_positional_device_index_v<Index> && !std::is_same_v<Index, skim::cuda::device_block_table>) {
    if (j < entries) {
      e.id = span.first[entry];
      if (entry > 0) e.pred = span.first[entry - 1];
    }
  }
}

// Index: bad count (clamped span, or more ids than the grid's splits cover) once per unit; each id
// of the chunk against its row's visible blocks and its predecessor in the row (bad ids become -1
// in ids_s). @post ids_s[j] for j < entries (a barrier must follow before anyone reads it)
__device__ __forceinline__ void check_ids(const device_problem& p, const unit& u,
                                          const skim::cuda::device_block_table::span& span, std::int32_t n,
                                          const launch_params& lp, std::int32_t split, std::int32_t j,
                                          std::int32_t entry, std::int32_t entries, const entry_ids& e,
                                          std::int32_t* ids_s) noexcept {
  if (split == 0 && j == 0 &&
      (span.clamped || static_cast<std::int64_t>(n) > static_cast<std::int64_t>(lp.splits) * lp.chunk_blocks)) {
    skim::cuda::report(p, skim::cuda::bad_count);
  }
  if (j < entries) {
    std::int32_t keep = e.id;
    if (e.id < 0 || e.id >= u.row.visible_blocks) {
      skim::cuda::report(p, skim::cuda::bad_block_id);
      keep = -1;
    } else if (entry > 0 && e.id <= e.pred) {
      skim::cuda::report(p, skim::cuda::bad_order);
      keep = -1;
    }
    ids_s[j] = keep;
  }
}

// A quantised source's (K, V) scales of each checked id of the chunk, by the id's thread (a skipped
// id's keys are never loaded, so its scales are never used: 0). @pre check_ids wrote ids_s[j]
template <class Rows>
__device__ __forceinline__ void load_scales(const Rows& src, std::int32_t j, std::int32_t entries,
                                            const std::int32_t* ids_s, float2* scales_s) noexcept {
  if (j < entries) {
    const std::int32_t id = ids_s[j];
    scales_s[j] = id >= 0 ? make_float2(src.k_scale(id), src.v_scale(id)) : make_float2(0.0f, 0.0f);
  }
}

// Output element (row, d) of unit u: O = o / l (0 when l = 0) and, for d = 0, lse = (mx + log2 l) ln 2
// (-inf when l = 0), from a state in the log2 domain.
template <class TO>
__device__ __forceinline__ void store_output(const device_problem& p, const skim::cuda::device_view<TO>& out, float* lse,
                                             const unit& u, std::int32_t row, std::int32_t d, float mx, float l,
                                             float o) noexcept {
  const std::int64_t token = static_cast<std::int64_t>(u.row.q_offset) + u.row.q_begin + row / u.heads;
  const std::int32_t h = u.first_head + row % u.heads;
  out.row(token, h)[d] = skim::cuda::from_float_device<TO>(l > 0.0f ? o / l : 0.0f);
  if (d == 0 && lse != nullptr) lse[token * p.heads_q + h] = l > 0.0f ? (mx + log2f(l)) * ln2 : -INFINITY;
}

// One output element from the partial states of splits [0, nsplit), combined in split order: ml(s)
// is split s's (m, l), o(s) its o. The merge kernel and the cluster merge both use it, so they give
// the same bits.
template <class ML, class O>
__device__ __forceinline__ void merge_splits(std::int32_t nsplit, const ML& ml, const O& o, float& mx, float& l,
                                             float& acc) noexcept {
  mx = -INFINITY;
  for (std::int32_t s = 0; s < nsplit; ++s) mx = fmaxf(mx, ml(s).x);
  const float m_use = mx == -INFINITY ? 0.0f : mx;
  l = 0.0f;
  acc = 0.0f;
  for (std::int32_t s = 0; s < nsplit; ++s) {
    const float2 st = ml(s);
    const float f = exp2_approx(st.x - m_use);
    l = fmaf(st.y, f, l);
    acc = fmaf(o(s), f, acc);
  }
}

// The partial states of one pass in shared memory, `slices` per row (the warps, or groups of warps,
// that split the keys): state (slice sl, row rel of the pass) is m[sl · rows + rel], l[sl · rows +
// rel] and o[(sl · rows + rel) · o_stride, + D). The tensor-core kernel pads o_stride past D so that
// its fragment stores do not meet in a bank.
struct slice_states {
  const float* o = nullptr;
  const float* m = nullptr;
  const float* l = nullptr;
  std::int32_t slices = 1;
  std::int32_t rows = 0;      // pass rows
  std::int32_t o_stride = 0;  // floats between two states' o

  [[nodiscard]] __device__ __forceinline__ std::int32_t at(std::int32_t sl, std::int32_t rel) const noexcept {
    return sl * rows + rel;
  }
};

// Rows [row0, row0 + rows_here) of the unit from the pass's slice states, combined in slice order.
// Writes O and lse (nsplit 1), or this split's partial: into the workspace (for the merge kernel),
// or, when `shared` is not null, into st.rows · (D + 2) floats of shared memory (for the cluster
// merge): o at shared[rel · D + d], (m, l) at shared[st.rows · D + 2 rel + {0, 1}].
// @pre called by all `threads` threads of the CTA (they stride over rows_here · D elements)
template <int D, class TQ, class KV, class Index, class TO>
__device__ __forceinline__ void write_rows(const device_attention_args<TQ, KV, Index, TO>& a, const launch_params& lp,
                                           const unit& u, std::int32_t split, std::int32_t nsplit,
                                           const slice_states& st, std::int32_t row0, std::int32_t rows_here,
                                           float* shared = nullptr) noexcept {
  const std::int32_t pass_rows = st.rows;
  for (std::int32_t x = static_cast<std::int32_t>(threadIdx.x); x < rows_here * D; x += threads) {
    const std::int32_t rel = x / D, d = x % D, row = row0 + rel;
    float mx = -INFINITY;
    for (std::int32_t sl = 0; sl < st.slices; ++sl) mx = fmaxf(mx, st.m[st.at(sl, rel)]);
    const float m_use = mx == -INFINITY ? 0.0f : mx;
    float l = 0.0f, o = 0.0f;
    for (std::int32_t sl = 0; sl < st.slices; ++sl) {
      const std::int32_t i = st.at(sl, rel);
      const float f = exp2_approx(st.m[i] - m_use);
      l = fmaf(st.l[i], f, l);
      o = fmaf(st.o[i * st.o_stride + d], f, o);
    }
    if (nsplit == 1) {
      store_output(a.prob, a.o, a.lse, u, row, d, mx, l, o);
    } else if (shared != nullptr) {
      shared[rel * D + d] = o;
      if (d == 0) {
        shared[pass_rows * D + 2 * rel] = mx;
        shared[pass_rows * D + 2 * rel + 1] = l;
      }
    } else {
      const std::int64_t prow = (u.id * lp.splits + split) * lp.max_rows + row;
      lp.partial_o[prow * D + d] = o;
      if (d == 0) {
        lp.partial_ml[prow * 2] = mx;
        lp.partial_ml[prow * 2 + 1] = l;
      }
    }
  }
}

// The end of a pass: write_rows, and with the cluster merge (InCluster, more than one split) the
// merge of the row's splits through distributed shared memory. The splits of a row are one thread
// block cluster (rank = split); each leaves its partial in its own `shared` (write_rows' layout),
// then the splits share out the pass's elements and merge them as the merge kernel does
// (merge_splits, split order: the same bits). A split past the row's last has exited; the cluster
// barriers wait for the threads that have not. @pre called by all threads of the CTA
template <bool InCluster, int D, class TQ, class KV, class Index, class TO>
__device__ __forceinline__ void finish_pass(const device_attention_args<TQ, KV, Index, TO>& a, const launch_params& lp,
                                            const unit& u, std::int32_t split, std::int32_t nsplit,
                                            const slice_states& st, std::int32_t row0, std::int32_t rows_here,
                                            float* shared) noexcept {
  if constexpr (InCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (nsplit > 1) {
      write_rows<D>(a, lp, u, split, nsplit, st, row0, rows_here, shared);
      namespace cg = cooperative_groups;
      const cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // every split's partial of the pass is in its shared memory
      for (std::int32_t x = split * threads + static_cast<std::int32_t>(threadIdx.x); x < rows_here * D;
           x += nsplit * threads) {
        const std::int32_t rel = x / D, d = x % D;
        float mx, l, o;
        merge_splits(
            nsplit,
            [&](std::int32_t s) {
              const float* r = cluster.map_shared_rank(shared, static_cast<unsigned>(s)) + st.rows * D + 2 * rel;
              return make_float2(r[0], r[1]);
            },
            [&](std::int32_t s) { return cluster.map_shared_rank(shared, static_cast<unsigned>(s))[rel * D + d]; }, mx,
            l, o);
        store_output(a.prob, a.o, a.lse, u, row0 + rel, d, mx, l, o);
      }
      cluster.sync();  // no split refills or leaves its shared memory while another reads it
      return;
    }
#else
    __trap();  // never launched: decode::run merges in a cluster on sm_90 and later only
#endif
  }
  write_rows<D>(a, lp, u, split, nsplit, st, row0, rows_here);
}

// ---------------------------------------------------------------------------------------------
// Merge kernel

inline constexpr int merge_threads = 128;

template <class Index, class TO>
__global__ void __launch_bounds__(merge_threads)
    merge_kernel(const __grid_constant__ device_problem p, const Index index, const skim::cuda::device_view<TO> out,
                 float* lse, const launch_params lp) {
  unit u;
  if (!make_unit(p, lp.q_blocks, u)) return;
  entry_ids unused;
  const skim::cuda::device_block_table::span span = row_span(index, u, -1, unused);
  const std::int32_t nsplit = used_splits(span.n > 0 ? span.n : 0, lp);
  if (nsplit <= 1) return;  // the split kernel wrote O
  const std::int32_t D = p.head_dim;
  for (std::int32_t x = static_cast<std::int32_t>(threadIdx.x); x < u.rows * D; x += merge_threads) {
    const std::int32_t row = x / D, d = x % D;
    const std::int64_t first = u.id * lp.splits * lp.max_rows + row;  // partial row of split 0
    const std::int64_t stride = lp.max_rows;                          // rows between splits
    float mx, l, o;
    merge_splits(
        nsplit,
        [&](std::int32_t s) {
          const std::int64_t prow = first + s * stride;
          return make_float2(lp.partial_ml[prow * 2], lp.partial_ml[prow * 2 + 1]);
        },
        [&](std::int32_t s) { return lp.partial_o[(first + s * stride) * D + d]; }, mx, l, o);
    store_output(p, out, lse, u, row, d, mx, l, o);
  }
}

}  // namespace skim::cuda::detail::decode_impl
