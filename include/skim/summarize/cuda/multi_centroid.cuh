#pragma once
// multi_centroid summaries on the device (summarize/multi_centroid.hpp's records, bit for bit, kept
// next to a GPU KV cache): per (key block, kv head) M cluster sums and sizes; a complete block's
// clusters refined by LloydSteps Lloyd steps, as complete_block does on the CPU.
//
//  - build(): every complete and partial block of every sequence, from K (after prefill);
//  - append_newest(): a decode step: the block that each sequence's newest key (position
//    seq_len_kv(b) - 1, already counted by the device cu_seqlens_kv and written to K) falls in is
//    summarised afresh from its keys. That reads at most block_kv keys per (sequence, kv head) and
//    gives the bits of the CPU's key-by-key append (sums taken in slot order from zero either way),
//    and summarising a block twice writes the same record, so replaying a step whose sequences did
//    not grow is harmless.
//
// Layout (fixed capacity per sequence, so appending never moves a record and a CUDA graph can keep
// its pointers while the sequences grow):
//
//   records: [batch, max_kv_blocks, heads_kv, M * head_dim + M] fp32
//            block j of sequence b at row b * max_kv_blocks + j; a record is the CPU's: the M sums
//            [M, head_dim], then the M sizes
//
// Arithmetic follows the CPU code operation by operation, each rounded on its own (__fadd_rn,
// __fmul_rn, __fdiv_rn: never fused): sums in slot order, centroid = sum * (1 / size), squared
// distances summed in dimension order, ties to the lower centroid, a cluster left empty keeping its
// centroid. The CPU side does not fuse either (summarize::detail::product, docs/design.md §9).
//
// No allocation, no synchronisation: both launch one kernel on the caller's stream and can be
// captured in a CUDA graph. Device content is never trusted (core/cuda/common.cuh): a sequence longer than
// device_problem::max_seqlen_kv is skipped and reported (bad_seqlen); a block with a key that a paged
// source cannot give is left unwritten and reported (bad_page).

#include <cstddef>
#include <cstdint>

#include "skim/core/cuda/common.cuh"
#include "skim/summarize/cuda/max_bound.cuh"
#include "skim/summarize/multi_centroid.hpp"

namespace skim::cuda {

template <std::int32_t M, std::int32_t LloydSteps = 2>
struct device_multi_centroid {
  static_assert(M >= 1 && M <= 8, "device multi_centroid keeps 1 to 8 centroids per block");
  static_assert(LloydSteps >= 0, "Lloyd step count must not be negative");
  using host_summarizer = summarize::multi_centroid<M, LloydSteps>;  // the CPU policy it equals
  static constexpr std::int32_t centroids = M;
  static constexpr std::int32_t lloyd_steps = LloydSteps;

  float* records = nullptr;        // [batch, max_kv_blocks, heads_kv, record_floats(head_dim)]
  std::int32_t max_kv_blocks = 0;  // room per sequence, >= device_problem::max_kv_blocks()

  [[nodiscard]] SKIM_HOST_DEVICE static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return static_cast<std::int64_t>(M) * head_dim + M;
  }
  // First float of record (sequence b, block j, kv head h).
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t record(const device_problem& p, std::int32_t b,
                                                               std::int32_t j, std::int32_t h) const noexcept {
    return ((static_cast<std::int64_t>(b) * max_kv_blocks + j) * p.heads_kv + h) * record_floats(p.head_dim);
  }
  // Floats records must hold.
  [[nodiscard]] SKIM_HOST_DEVICE constexpr std::int64_t elements(const device_problem& p) const noexcept {
    return static_cast<std::int64_t>(p.batch) * max_kv_blocks * p.heads_kv * record_floats(p.head_dim);
  }
};

template <class S>
inline constexpr bool is_device_multi_centroid_v = false;
template <std::int32_t M, std::int32_t L>
inline constexpr bool is_device_multi_centroid_v<device_multi_centroid<M, L>> = true;

namespace detail::centroid_impl {

inline constexpr int threads = 128;
inline constexpr std::int32_t max_block_kv = 256;  // slots per block: the CTA's shared assignment arrays
inline constexpr std::int32_t max_head_dim = 256;  // the CTA's shared centroids

// One CTA's shared memory: centroids, squared distances and each key's nearest centroid.
template <std::int32_t M>
struct block_smem {
  float centroid[M * max_head_dim];  // [M, head_dim]
  float d2[max_block_kv * M];        // [block_kv, M]
  std::int32_t nearest[max_block_kv];
};

// Sub-chunk of slot t in a block of block_kv keys: multi_centroid::sub_chunk (host-only constexpr).
template <std::int32_t M>
[[nodiscard]] __device__ __forceinline__ std::int32_t sub_chunk(std::int32_t t, std::int32_t block_kv) noexcept {
  return static_cast<std::int32_t>(((static_cast<std::int64_t>(t) + 1) * M - 1) / block_kv);
}

// Sizes and, for dimension d, sums of a block's len keys by cluster (cluster(t): slot t's cluster),
// taken in slot order from zero. Register arrays are indexed by compile-time indices only (unrolled
// loops), never by data.
template <std::int32_t M, class Cluster>
__device__ __forceinline__ void cluster_sizes(float (&size)[M], std::int32_t len, const Cluster& cluster) noexcept {
#pragma unroll
  for (int c = 0; c < M; ++c) size[c] = 0.0f;
  for (std::int32_t t = 0; t < len; ++t) {
    const std::int32_t n = cluster(t);
#pragma unroll
    for (int c = 0; c < M; ++c) size[c] += c == n ? 1.0f : 0.0f;
  }
}
template <std::int32_t M, class Key, class Cluster>
__device__ __forceinline__ void cluster_sums(float (&acc)[M], std::int32_t len, int d, const Key& key,
                                             const Cluster& cluster) noexcept {
#pragma unroll
  for (int c = 0; c < M; ++c) acc[c] = 0.0f;
  for (std::int32_t t = 0; t < len; ++t) {
    const std::int32_t n = cluster(t);
#pragma unroll
    for (int c = 0; c < M; ++c) {
      if (c == n) acc[c] = __fadd_rn(acc[c], key(t, d));
    }
  }
}

// Summarises block j of sequence b (r: its key_range, r.ok) for kv head h into its record, with the
// whole CTA (every thread must call it: it synchronises). Keys [j * block_kv, min((j + 1) * block_kv,
// kv_len)); nothing is written for a block past the sequence.
template <std::int32_t M, std::int32_t L, class KV>
__device__ __forceinline__ void summarize_block(const device_problem& p, const KV& kv,
                                                const device_multi_centroid<M, L>& s, const device_row& r,
                                                std::int32_t b, std::int32_t j, std::int32_t h,
                                                block_smem<M>& smem) noexcept {
  namespace si = summarize_impl;
  const std::int32_t first = j * p.block_kv;
  if (first >= r.kv_len) return;  // uniform over the CTA
  const std::int32_t len = min(p.block_kv, r.kv_len - first);
  for (std::int32_t t = 0; t < len; ++t) {  // every thread sees the same pages: a uniform exit
    if (si::key_row(p, kv, r, b, first + t, h).row == nullptr) {
      if (threadIdx.x == 0) report(p, bad_page);
      return;
    }
  }
  const int hd = p.head_dim;
  const int tid = static_cast<int>(threadIdx.x);
  float* centroid = smem.centroid;
  float* d2 = smem.d2;
  std::int32_t* nearest = smem.nearest;
  float* rec = s.records + s.record(p, b, j, h);
  float* count = rec + static_cast<std::ptrdiff_t>(M) * hd;
  const auto key = [=, &p, &kv, &r](std::int32_t slot, int d) {  // checked non-null above
    return si::key_row(p, kv, r, b, first + slot, h)(d);
  };
  // Appends in slot order: the sums of the sub-chunks (multi_centroid::append), sizes counted alike.
  const std::int32_t block_kv = p.block_kv;
  const auto chunk = [block_kv](std::int32_t t) { return sub_chunk<M>(t, block_kv); };
  float size[M];
  cluster_sizes(size, len, chunk);
  const bool refine = len == p.block_kv && L > 0;  // complete_block runs on complete blocks only
  unsigned live = 0;                               // bit c: cluster c had keys before the first step
#pragma unroll
  for (int c = 0; c < M; ++c) live |= size[c] > 0.0f ? 1u << c : 0u;
  for (int d = tid; d < hd; d += threads) {
    float acc[M];
    cluster_sums(acc, len, d, key, chunk);
#pragma unroll
    for (int c = 0; c < M; ++c) {
      if (refine) {
        if (live >> c & 1u) centroid[c * hd + d] = __fmul_rn(acc[c], __fdiv_rn(1.0f, size[c]));  // update_centroid
      } else {
        rec[c * hd + d] = acc[c];
      }
    }
  }
  const auto write_sizes = [&] {
#pragma unroll
    for (int c = 0; c < M; ++c) {
      if (tid == c) count[c] = size[c];
    }
  };
  if (!refine) {
    write_sizes();
    return;
  }
  for (std::int32_t step = 0; step < L; ++step) {
    __syncthreads();  // centroids written
    for (int i = tid; i < len * M; i += threads) {  // squared distances, dimension order
      const std::int32_t t = i / M;
      const int c = i % M;
      if (!(live >> c & 1u)) continue;
      float acc = 0.0f;
      for (int d = 0; d < hd; ++d) {
        const float diff = __fsub_rn(key(t, d), centroid[c * hd + d]);
        acc = __fadd_rn(acc, __fmul_rn(diff, diff));
      }
      d2[i] = acc;
    }
    __syncthreads();
    for (std::int32_t t = tid; t < len; t += threads) {  // strict: ties go to the lower centroid
      std::int32_t best = -1;
      float best_d2 = 0.0f;
      for (int c = 0; c < M; ++c) {
        if (!(live >> c & 1u)) continue;
        const float x = d2[t * M + c];
        if (best < 0 || x < best_d2) best = c, best_d2 = x;
      }
      nearest[t] = best;
    }
    __syncthreads();
    const auto assigned = [nearest](std::int32_t t) { return nearest[t]; };
    cluster_sizes(size, len, assigned);
    for (int d = tid; d < hd; d += threads) {
      float acc[M];
      cluster_sums(acc, len, d, key, assigned);
#pragma unroll
      for (int c = 0; c < M; ++c) {
        if (step + 1 == L) {
          rec[c * hd + d] = acc[c];
        } else if (size[c] > 0.0f) {  // an emptied cluster keeps its centroid
          centroid[c * hd + d] = __fmul_rn(acc[c], __fdiv_rn(1.0f, size[c]));
        }
      }
    }
  }
  write_sizes();
}

// Grid (block j, kv head h, sequence b).
template <std::int32_t M, std::int32_t L, class KV>
__global__ void __launch_bounds__(threads) centroid_build_kernel(device_problem p, KV kv, device_multi_centroid<M, L> s) {
  __shared__ block_smem<M> smem;
  const device_row r = summarize_impl::key_range(p, static_cast<std::int32_t>(blockIdx.z));
  if (!r.ok) return;
  summarize_block(p, kv, s, r, static_cast<std::int32_t>(blockIdx.z), static_cast<std::int32_t>(blockIdx.x),
                  static_cast<std::int32_t>(blockIdx.y), smem);
}

// Grid (kv head h, sequence b): the newest key's block.
template <std::int32_t M, std::int32_t L, class KV>
__global__ void __launch_bounds__(threads) centroid_append_kernel(device_problem p, KV kv, device_multi_centroid<M, L> s) {
  __shared__ block_smem<M> smem;
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.y);
  const device_row r = summarize_impl::key_range(p, b);
  if (!r.ok || r.kv_len == 0) return;
  summarize_block(p, kv, s, r, b, (r.kv_len - 1) / p.block_kv, static_cast<std::int32_t>(blockIdx.x),
                  smem);
}

}  // namespace detail::centroid_impl

// Host checks of the summaries' scalars against p (the size of records cannot be seen: it must hold
// elements(p) floats).
template <std::int32_t M, std::int32_t L>
[[nodiscard]] status validate(const device_multi_centroid<M, L>& s, const device_problem& p) noexcept {
  if (s.max_kv_blocks < p.max_kv_blocks()) {
    return status::error(status_code::shape_mismatch,
                         "multi_centroid summaries hold %d blocks per sequence, max_seqlen_kv %d needs %d (block_kv %d)",
                         s.max_kv_blocks, p.max_seqlen_kv, p.max_kv_blocks(), p.block_kv);
  }
  if (s.elements(p) > 0 && s.records == nullptr) {
    return status::error(status_code::invalid_argument, "multi_centroid summaries' records are null");
  }
  return status::success();
}

namespace detail::summarize_impl {

template <std::int32_t M, std::int32_t L, class KV>
[[nodiscard]] status check_summarize(const device_problem& p, const KV& kv, const device_multi_centroid<M, L>& s) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(validate(kv, p));
  SKIM_TRY(validate(s, p));
  if (p.batch > 65535 || p.heads_kv > 65535) {
    return status::error(status_code::unsupported, "multi_centroid summaries: batch %d or heads_kv %d > 65535 (grid)",
                         p.batch, p.heads_kv);
  }
  if (p.block_kv > centroid_impl::max_block_kv || p.head_dim > centroid_impl::max_head_dim) {
    return status::error(status_code::unsupported, "multi_centroid summaries: block_kv %d or head_dim %d > %d",
                         p.block_kv, p.head_dim, centroid_impl::max_block_kv);
  }
  return status::success();
}

}  // namespace detail::summarize_impl

// Summarises every key block (complete or partial) of every sequence and kv head of K.
// Records of blocks past a sequence's keys are not written.
template <std::int32_t M, std::int32_t L, class KV>
[[nodiscard]] status build(const device_problem& p, const KV& kv, const device_multi_centroid<M, L>& s,
                           cudaStream_t stream) noexcept {
  namespace impl = detail::centroid_impl;
  SKIM_TRY(detail::summarize_impl::check_summarize(p, kv, s));
  if (p.batch == 0 || p.max_kv_blocks() == 0 || p.heads_kv == 0) return status::success();
  const dim3 grid(static_cast<unsigned>(p.max_kv_blocks()), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  impl::centroid_build_kernel<M, L, KV><<<grid, impl::threads, 0, stream>>>(p, kv, s);
  return check_launch("centroid_build_kernel");
}

// Decode step: summarises afresh the block of every sequence's newest key (every kv head).
// @pre the records of the sequence's earlier blocks are there (build() of the shorter prefix, or
// earlier steps), and the new key is in K.
template <std::int32_t M, std::int32_t L, class KV>
[[nodiscard]] status append_newest(const device_problem& p, const KV& kv, const device_multi_centroid<M, L>& s,
                                   cudaStream_t stream) noexcept {
  namespace impl = detail::centroid_impl;
  SKIM_TRY(detail::summarize_impl::check_summarize(p, kv, s));
  if (p.batch == 0 || p.heads_kv == 0) return status::success();
  const dim3 grid(static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
  impl::centroid_append_kernel<M, L, KV><<<grid, impl::threads, 0, stream>>>(p, kv, s);
  return check_launch("centroid_append_kernel");
}

}  // namespace skim::cuda
