#pragma once
// skim::cuda::token_decode — decode attention over the key tokens a device token list names: the
// GPU counterpart of exec::token_gather (exec/cpu/token_gather.hpp), for the output of a token-level
// indexer (select::top_tokens, or an engine's own).
//
// It computes what exec::token_gather computes: for query q of sequence b and query head h, the row
// r = (q_block_offset(b) + q / block_q) · index_heads + index_head_of(h) of the list names key
// positions (relative to the sequence); q attends, with fp32 accumulation, over the listed positions
// it may see (bottom-right causal: j <= q + kv_len - q_len; mask_kind::none: every key). A query
// that sees no listed key gets O = 0 and lse = -inf.
//
// The device list (device_token_list below) is index::token_list's layout in device memory:
// positions [rows, width] and count [rows]. Canonical rows hold strictly ascending positions in
// [0, visible keys of the row's last query).
//
// Work: one CTA of 4 warps per unit, a unit being the rows that share one list row: with
// index_scope::kv_head the GQA group's query heads × the queries of the query block (so each listed
// K/V row is read from memory once per kv head, for the whole group), with query_head one head ×
// the queries. The row's n entries are cut into 4 contiguous chunks of ceil(n / 4), one per warp;
// each lane holds head_dim / 32 (rounded up) dimensions of the gathered K and V rows, the dot products
// reduce by butterfly shuffles (every lane gets the same bits), and each warp keeps an online-softmax
// state (m, l, o in fp32) for 4 rows of the unit at a time (a unit with more rows takes more passes).
// The warps' states merge through shared memory in warp order. The split depends on n only: O and
// lse are bit-identical run to run. P is not rounded before P·V: O matches the double reference to
// fp32 rounding plus the output's own rounding.
//
// Cost per unit: count · head_dim elements of K and of V read once per pass of 4 rows (a decode
// GQA group of 4 is one pass), scalar loads of 1, 2 or 4 bytes per lane (coalesced within a row; a
// quantised source adds its K and V scale per entry), and no tensor cores: a gather kernel for lists
// of thousands of tokens, not a dense one.
//
// Contracts
//  - Types: Q and K/V skim::bfloat16, skim::half or float (fp32 inside), O the same or float.
//    K/V may instead be quantised (core/cuda/quantized.cuh): a device_quantized_kv over a contiguous
//    or paged source of std::int8_t or skim::fp8_e4m3 codes, element e of key t of sequence b, kv head
//    h being fp32(scale(b, t / block_kv, h) · code) (exactly exec::reference's dequantised K/V); a
//    scale is read only for a listed position that passed the checks below (inside the row's
//    visible keys, in order, on a good page). Any strides (rows of head_dim elements,
//    element-aligned; scales float-aligned).
//  - head_dim <= 256; max_seqlen_q <= max_queries (decode and speculative rows; prefill belongs to
//    exec::token_gather or a prefill executor); grid: batch · max_q_blocks <= 2^31 - 1 units,
//    index_heads <= 65535 (status unsupported otherwise).
//  - Host checks (status): the problem, the K/V source's scalars (a quantised one's scale pointers
//    and strides too), Q and O views, the list's pointers and sizes (rows >= 0, width >= 0),
//    max_queries, head_dim, the pointers' element alignment.
//  - Device content is never trusted: a sequence longer than the host's bounds is skipped and its
//    outputs are not written (bad_seqlen); a list row at or past `rows`, or a count outside
//    [0, width], is clamped and reported (bad_count); a position outside [0, visible keys of the
//    row) is skipped (bad_block_id), a position not above its predecessor in the row is skipped
//    (bad_order), a position whose page is not in the sequence's page list or outside the pool is
//    skipped (bad_page) — nothing is read through any of them, and no address leaves the sequence's
//    own K/V. The bits go to the problem's optional error word (cuda::read_device_error).
//  - run() only checks and enqueues: no allocation, no synchronisation (graph-capturable). No
//    workspace (workspace_bytes is 0; any span is accepted).

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/launch.cuh"
#include "skim/core/cuda/quantized.cuh"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/cuda/device_index.cuh"

namespace skim::cuda {

// index::token_list in device memory. Rows are numbered as skim::problem numbers them.
struct device_token_list {
  const std::int32_t* positions = nullptr;  // [rows, width]
  const std::int32_t* count = nullptr;      // [rows]
  std::int32_t width = 0;
  std::int64_t rows = 0;

  // [first, first + n) of row r; n clamped to [0, width]; clamped is true when the row is past
  // `rows` or its count was outside [0, width] (the kernel reports bad_count).
  struct span {
    const std::int32_t* first = nullptr;
    std::int32_t n = 0;
    bool clamped = false;
  };
  [[nodiscard]] __device__ __forceinline__ span row(std::int64_t r) const noexcept {
    if (r < 0 || r >= rows) return {nullptr, 0, true};
    const std::int32_t c = count[r];
    const std::int32_t n = c < 0 ? 0 : (c > width ? width : c);
    return {positions + r * width, n, n != c};
  }

  [[nodiscard]] status validate() const noexcept {
    if (width < 0) return status::error(status_code::invalid_argument, "token_list width %d < 0", width);
    if (rows < 0) {
      return status::error(status_code::invalid_argument, "token_list rows %lld < 0", static_cast<long long>(rows));
    }
    if (rows > 0 && (count == nullptr || (width > 0 && positions == nullptr))) {
      return status::error(status_code::invalid_argument, "token_list positions/count are null with %lld rows",
                           static_cast<long long>(rows));
    }
    return status::success();
  }
};

// What token_decode::run takes: device_attention_args with a token list for the block index.
template <class TQ, class KV, class TO>
struct device_token_args {
  device_problem prob;
  device_view<const TQ> q;   // [tokens_q, heads_q, head_dim]
  KV kv;                     // device_contiguous_kv, device_paged_kv or device_quantized_kv of either
  device_token_list tokens;  // one row per (sequence, query block, index head)
  device_view<TO> o;         // [tokens_q, heads_q, head_dim]
  float* lse = nullptr;      // optional [tokens_q, heads_q] token-major
};

namespace detail::token_decode_impl {

inline constexpr int warps = 4;
inline constexpr int threads = warps * 32;
inline constexpr int rows_per_pass = 4;            // unit rows a warp keeps in registers at once
inline constexpr int max_head_dim = 256;
inline constexpr int max_dims_per_lane = max_head_dim / 32;
inline constexpr float neg_inf = -INFINITY;

// K and V rows of token t of the sequence (kv head h): false when they cannot be read.
template <class T>
__device__ __forceinline__ bool kv_rows(const device_contiguous_kv<T>& s, const device_row& r, std::int32_t b,
                                        std::int32_t t, std::int32_t h, const T*& k, const T*& v) noexcept {
  k = s.k_row(r, b, t, h);
  v = s.v_row(r, b, t, h);
  return true;
}
template <class T>
__device__ __forceinline__ bool kv_rows(const device_paged_kv<T>& s, const device_row&, std::int32_t b, std::int32_t t,
                                        std::int32_t h, const T*& k, const T*& v) noexcept {
  const std::int64_t off = s.offset(b, t, h);
  if (off < 0) return false;
  k = s.k_pages + off;
  v = s.v_pages + off;
  return true;
}
// A quantised source: its codes' rows, and the K and V scales of the token's key block.
// @pre 0 <= t < the row's visible keys (no scale is read for a token that fails the source's check)
template <class Source>
__device__ __forceinline__ bool kv_rows(const device_quantized_kv<Source>& s, const device_row& r, std::int32_t b,
                                        std::int32_t t, std::int32_t h, std::int32_t block_kv,
                                        const typename Source::value_type*& k, const typename Source::value_type*& v,
                                        float& k_scale, float& v_scale) noexcept {
  if (!kv_rows(s.codes, r, b, t, h, k, v)) return false;
  const std::int64_t at = s.scale_index(b, t / block_kv, h);
  k_scale = s.k_scales[at];
  v_scale = s.v_scales[at];
  return true;
}

// q_block_offset(p, b) by a whole warp (lanes stride over the sequences). @pre all lanes call it.
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

// Sum over the warp; every lane gets the same bits (each butterfly step adds a pair both ways).
[[nodiscard]] __device__ __forceinline__ float warp_sum(float x) noexcept {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Grid: x = sequence · q_blocks + query block, y = index head.
template <class TQ, class KV, class TO>
__global__ void __launch_bounds__(threads) token_decode_kernel(device_token_args<TQ, KV, TO> a, std::int32_t q_blocks,
                                                               float scale) {
  __shared__ float part_o[warps][rows_per_pass][max_head_dim];
  __shared__ float part_m[warps][rows_per_pass];
  __shared__ float part_l[warps][rows_per_pass];
  constexpr bool quantized = is_device_quantized_kv_v<KV>;

  const device_problem& p = a.prob;
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.x / static_cast<unsigned>(q_blocks));
  const std::int32_t i = static_cast<std::int32_t>(blockIdx.x % static_cast<unsigned>(q_blocks));
  const std::int32_t ih = static_cast<std::int32_t>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const bool reporter = threadIdx.x == 0;  // one thread reports what the whole CTA sees

  const device_row row = make_device_row(p, b, i);  // reports bad_seqlen
  const std::int64_t block_offset = warp_q_block_offset(p, b);
  if (!row.ok) return;  // no query here, or a sequence past the bounds: uniform over the CTA

  const std::int32_t group = p.heads_q / p.heads_kv;
  const bool group_unit = p.scope == index_scope::kv_head;
  const std::int32_t heads = group_unit ? group : 1;
  const std::int32_t first_head = group_unit ? ih * group : ih;
  const std::int32_t kv_head = first_head / group;
  const std::int32_t queries = row.q_end - row.q_begin;
  const std::int32_t unit_rows = heads * queries;  // row u: query u / heads, head first_head + u % heads
  const std::int32_t d = p.head_dim;
  const std::int32_t visible = row.visible_keys(row.q_end - 1, p.mask);

  const std::int64_t list_row = (block_offset + i) * p.index_heads() + ih;
  const device_token_list::span list = a.tokens.row(list_row);
  if (reporter && list.clamped) report(p, bad_count);
  const std::int32_t n = list.n;
  const std::int32_t chunk = (n + warps - 1) / warps;
  const std::int32_t entry_first = warp * chunk < n ? warp * chunk : n;
  const std::int32_t entry_last = entry_first + chunk < n ? entry_first + chunk : n;

  for (std::int32_t r0 = 0; r0 < unit_rows; r0 += rows_per_pass) {
    float q[rows_per_pass][max_dims_per_lane];
    float o[rows_per_pass][max_dims_per_lane];
    float m[rows_per_pass], l[rows_per_pass];
    std::int32_t sees[rows_per_pass];
#pragma unroll
    for (int r = 0; r < rows_per_pass; ++r) {
      const std::int32_t u = r0 + r;
      m[r] = neg_inf;
      l[r] = 0.0f;
      sees[r] = 0;  // a padding row sees nothing
      const TQ* qr = nullptr;
      if (u < unit_rows) {
        const std::int32_t qq = u / heads;
        sees[r] = row.visible_keys(row.q_begin + qq, p.mask);
        qr = a.q.row(static_cast<std::int64_t>(row.q_offset) + row.q_begin + qq, first_head + u % heads);
      }
#pragma unroll
      for (int c = 0; c < max_dims_per_lane; ++c) {
        const std::int32_t e = lane + 32 * c;
        q[r][c] = qr != nullptr && e < d ? skim::cuda::to_float(qr[e]) * scale : 0.0f;
        o[r][c] = 0.0f;
      }
    }

    for (std::int32_t at = entry_first; at < entry_last; ++at) {
      const std::int32_t pos = list.first[at];  // the same entry in every lane: branches stay uniform
      if (pos < 0 || pos >= visible) {
        if (lane == 0 && r0 == 0) report(p, bad_block_id);
        continue;
      }
      if (at > 0 && pos <= list.first[at - 1]) {
        if (lane == 0 && r0 == 0) report(p, bad_order);
        continue;
      }
      const typename KV::value_type* kr = nullptr;
      const typename KV::value_type* vr = nullptr;
      float k_scale = 1.0f, v_scale = 1.0f;  // a quantised source's scales of pos's key block
      bool readable = false;
      if constexpr (quantized) {
        readable = kv_rows(a.kv, row, b, pos, kv_head, p.block_kv, kr, vr, k_scale, v_scale);
      } else {
        readable = kv_rows(a.kv, row, b, pos, kv_head, kr, vr);
      }
      if (!readable) {
        if (lane == 0 && r0 == 0) report(p, bad_page);
        continue;
      }
      float k[max_dims_per_lane], v[max_dims_per_lane];
#pragma unroll
      for (int c = 0; c < max_dims_per_lane; ++c) {
        const std::int32_t e = lane + 32 * c;
        if constexpr (quantized) {  // fp32(scale · code): the reference's dequantised values
          k[c] = e < d ? k_scale * skim::cuda::to_float(kr[e]) : 0.0f;
          v[c] = e < d ? v_scale * skim::cuda::to_float(vr[e]) : 0.0f;
        } else {
          k[c] = e < d ? skim::cuda::to_float(kr[e]) : 0.0f;
          v[c] = e < d ? skim::cuda::to_float(vr[e]) : 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < rows_per_pass; ++r) {
        if (pos >= sees[r]) continue;  // the causal mask inside a multi-query row (uniform per warp)
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < max_dims_per_lane; ++c) dot += q[r][c] * k[c];
        const float s = warp_sum(dot);
        const float m_new = s > m[r] ? s : m[r];
        const float alpha = expf(m[r] - m_new);  // 0 on the row's first key (m = -inf)
        const float w = expf(s - m_new);
        l[r] = l[r] * alpha + w;
#pragma unroll
        for (int c = 0; c < max_dims_per_lane; ++c) o[r][c] = o[r][c] * alpha + w * v[c];
        m[r] = m_new;
      }
    }

#pragma unroll
    for (int r = 0; r < rows_per_pass; ++r) {
#pragma unroll
      for (int c = 0; c < max_dims_per_lane; ++c) {
        const std::int32_t e = lane + 32 * c;
        if (e < d) part_o[warp][r][e] = o[r][c];
      }
      if (lane == 0) {
        part_m[warp][r] = m[r];
        part_l[warp][r] = l[r];
      }
    }
    __syncthreads();

    // Merge the warps' states in warp order (deterministic), normalise, write.
    for (std::int32_t x = static_cast<std::int32_t>(threadIdx.x); x < rows_per_pass * d; x += threads) {
      const std::int32_t r = x / d, e = x % d;
      const std::int32_t u = r0 + r;
      if (u >= unit_rows) continue;
      float mx = neg_inf;
      for (int w = 0; w < warps; ++w) {
        if (part_l[w][r] > 0.0f) mx = part_m[w][r] > mx ? part_m[w][r] : mx;
      }
      float lsum = 0.0f, acc = 0.0f;
      if (mx != neg_inf) {
        for (int w = 0; w < warps; ++w) {
          if (!(part_l[w][r] > 0.0f)) continue;
          const float f = expf(part_m[w][r] - mx);
          lsum += f * part_l[w][r];
          acc += f * part_o[w][r][e];
        }
      }
      const bool empty = !(lsum > 0.0f);
      const std::int64_t token = static_cast<std::int64_t>(row.q_offset) + row.q_begin + u / heads;
      const std::int32_t head = first_head + u % heads;
      a.o.row(token, head)[e] = from_float_device<TO>(empty ? 0.0f : acc / lsum);
      if (e == 0 && a.lse != nullptr) a.lse[token * p.heads_q + head] = empty ? neg_inf : mx + logf(lsum);
    }
    __syncthreads();  // part_* are rewritten by the next pass
  }
}

}  // namespace detail::token_decode_impl

struct token_decode {
  // Queries per sequence this executor accepts (decode, speculative decoding).
  std::int32_t max_queries = 8;

  [[nodiscard]] std::size_t workspace_bytes(const device_problem&) const noexcept { return 0; }

  [[nodiscard]] status can_implement(const device_problem& p) const noexcept {
    SKIM_TRY(validate(p));
    if (p.head_dim > detail::token_decode_impl::max_head_dim) {
      return status::error(status_code::unsupported, "cuda::token_decode: head_dim %d > %d", p.head_dim,
                           detail::token_decode_impl::max_head_dim);
    }
    if (max_queries < 1) {
      return status::error(status_code::invalid_argument, "cuda::token_decode: max_queries %d < 1", max_queries);
    }
    if (p.max_seqlen_q > max_queries) {
      return status::error(status_code::unsupported, "cuda::token_decode: max_seqlen_q %d > max_queries %d (prefill rows)",
                           p.max_seqlen_q, max_queries);
    }
    const std::int64_t units = static_cast<std::int64_t>(p.batch) * p.max_q_blocks();
    if (p.index_heads() > 65535 || units > 0x7fffffff) {
      return status::error(status_code::unsupported, "cuda::token_decode: grid of %d index heads x %lld query blocks too large",
                           p.index_heads(), static_cast<long long>(units));
    }
    return status::success();
  }

  template <class TQ, class KV, class TO>
  [[nodiscard]] status run(const device_token_args<TQ, KV, TO>& a, std::span<std::byte> workspace,
                           cudaStream_t stream) const noexcept {
    using TKV = typename KV::value_type;
    static_assert(is_device_element_v<TQ> || std::is_same_v<TQ, float>,
                  "cuda::token_decode: Q must be skim::bfloat16, skim::half or float");
    static_assert(is_device_quantized_kv_v<KV> ? is_device_code_v<TKV>
                                               : (is_device_element_v<TKV> || std::is_same_v<TKV, float>),
                  "cuda::token_decode: K/V must be skim::bfloat16, skim::half or float, or a device_quantized_kv of "
                  "std::int8_t / skim::fp8_e4m3 codes");
    static_assert(is_device_element_v<TO> || std::is_same_v<TO, float>,
                  "cuda::token_decode: O must be skim::bfloat16, skim::half or float");
    const device_problem& p = a.prob;
    // The shared checks (problem, K/V scalars, Q and O views), with an index that has none of its own.
    const device_attention_args<TQ, KV, device_causal_all, TO> shared{
        .prob = a.prob, .q = a.q, .kv = a.kv, .index = {}, .o = a.o, .lse = a.lse};
    SKIM_TRY(check_args(shared));
    SKIM_TRY(can_implement(p));
    SKIM_TRY(a.tokens.validate());
    SKIM_TRY(check_alignment(a));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    if (p.batch == 0 || p.max_seqlen_q == 0) return status::success();  // no query anywhere
    launch_shape shape;
    shape.grid = dim3(static_cast<unsigned>(static_cast<std::int64_t>(p.batch) * p.max_q_blocks()),
                      static_cast<unsigned>(p.index_heads()), 1);
    shape.block = dim3(detail::token_decode_impl::threads, 1, 1);
    return launch(detail::token_decode_impl::token_decode_kernel<TQ, KV, TO>, shape, stream,
                  "skim::cuda::token_decode", a, p.max_q_blocks(), p.scale());
  }

 private:
  // K and V base pointers of a contiguous or paged source.
  template <class T>
  static void kv_pointers(const device_contiguous_kv<T>& s, const void*& k, const void*& v) noexcept {
    k = s.k;
    v = s.v;
  }
  template <class T>
  static void kv_pointers(const device_paged_kv<T>& s, const void*& k, const void*& v) noexcept {
    k = s.k_pages;
    v = s.v_pages;
  }

  // Element alignment of every pointer the kernel reads or writes through (cudaMalloc gives more):
  // a quantised source's codes are bytes, its scales floats.
  template <class TQ, class KV, class TO>
  [[nodiscard]] static status check_alignment(const device_token_args<TQ, KV, TO>& a) noexcept {
    using TKV = typename KV::value_type;
    const auto misaligned = [](const void* ptr, std::size_t n) {
      return reinterpret_cast<std::uintptr_t>(ptr) % n != 0;
    };
    const void* k = nullptr;
    const void* v = nullptr;
    bool scales_misaligned = false;
    if constexpr (is_device_quantized_kv_v<KV>) {
      kv_pointers(a.kv.codes, k, v);
      scales_misaligned = misaligned(a.kv.k_scales, sizeof(float)) || misaligned(a.kv.v_scales, sizeof(float));
    } else {
      kv_pointers(a.kv, k, v);
    }
    if (misaligned(a.q.data, sizeof(TQ)) || misaligned(a.o.data, sizeof(TO)) || misaligned(k, sizeof(TKV)) ||
        misaligned(v, sizeof(TKV)) || misaligned(a.lse, sizeof(float)) || scales_misaligned) {
      return status::error(status_code::misaligned,
                           "cuda::token_decode: Q, K, V, O, lse or K/V scales not aligned to its element");
    }
    return status::success();
  }
};

}  // namespace skim::cuda
