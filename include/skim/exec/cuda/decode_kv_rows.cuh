#pragma once
// K/V rows of one (sequence, kv head) for skim::cuda::decode's split kernels (decode_simt.cuh,
// decode_mma.cuh), with the per-sequence lookups hoisted out of the key loop: a contiguous source's
// base pointers, or a paged source's page list. rows() gives a token's K and V rows, offset() the
// same as one element offset from k_base() / v_base() (the tensor-core kernel hands one offset per
// key to its copying lanes). A quantised source (core/cuda/quantized.cuh) has its codes' rows and the
// scales of the (sequence, kv head): k_scale(j) / v_scale(j) of key block j.

#include <cstdint>

#include "skim/core/cuda/common.cuh"
#include "skim/core/cuda/quantized.cuh"

namespace skim::cuda::detail::decode_impl {

using skim::cuda::device_row;

template <class KV>
struct kv_rows;

template <class T>
struct kv_rows<skim::cuda::device_contiguous_kv<T>> {
  const T* k = nullptr;
  const T* v = nullptr;
  std::int64_t token_stride = 0;

  __device__ __forceinline__ kv_rows(const skim::cuda::device_contiguous_kv<T>& s, const device_row& r, std::int32_t,
                                     std::int32_t kv_head) noexcept
      : k(s.k + static_cast<std::int64_t>(r.kv_offset) * s.token_stride + kv_head * s.head_stride),
        v(s.v + static_cast<std::int64_t>(r.kv_offset) * s.token_stride + kv_head * s.head_stride),
        token_stride(s.token_stride) {}

  // Rows of token t; false when they cannot be read (never, here). @pre 0 <= t < kv_len
  [[nodiscard]] __device__ __forceinline__ bool rows(std::int32_t t, const T*& kr, const T*& vr) const noexcept {
    kr = k + t * token_stride;
    vr = v + t * token_stride;
    return true;
  }
  // The same rows as k_base() + off and v_base() + off (the tensor-core kernel passes one offset per key).
  [[nodiscard]] __device__ __forceinline__ bool offset(std::int32_t t, std::int64_t& off) const noexcept {
    off = t * token_stride;
    return true;
  }
  [[nodiscard]] __device__ __forceinline__ const T* k_base() const noexcept { return k; }
  [[nodiscard]] __device__ __forceinline__ const T* v_base() const noexcept { return v; }
};

template <class T>
struct kv_rows<skim::cuda::device_paged_kv<T>> {
  const T* k_pages = nullptr;
  const T* v_pages = nullptr;
  const std::int32_t* page_indices = nullptr;
  std::int64_t page_stride = 0, token_stride = 0, head_offset = 0;
  std::int32_t page_size = 1, num_pages = 0;
  std::int32_t first_slot = 0, last_slot = 0;  // the sequence's page list [first_slot, last_slot)

  __device__ __forceinline__ kv_rows(const skim::cuda::device_paged_kv<T>& s, const device_row&, std::int32_t b,
                                     std::int32_t kv_head) noexcept
      : k_pages(s.k_pages), v_pages(s.v_pages), page_indices(s.page_indices), page_stride(s.page_stride),
        token_stride(s.token_stride), head_offset(kv_head * s.head_stride), page_size(s.page_size),
        num_pages(s.num_pages), first_slot(s.page_indptr[b]), last_slot(s.page_indptr[b + 1]) {}

  // false (nothing may be read) when the page list does not cover t or names a page outside the pool.
  // @pre 0 <= t < kv_len
  [[nodiscard]] __device__ __forceinline__ bool rows(std::int32_t t, const T*& kr, const T*& vr) const noexcept {
    const std::int32_t slot = first_slot + t / page_size;
    if (first_slot < 0 || slot >= last_slot) return false;
    const std::int32_t page = page_indices[slot];
    if (page < 0 || page >= num_pages) return false;
    const std::int64_t off = page * page_stride + (t % page_size) * token_stride + head_offset;
    kr = k_pages + off;
    vr = v_pages + off;
    return true;
  }
  // rows() as one offset from k_base() / v_base(); false under the same conditions. @pre 0 <= t < kv_len
  [[nodiscard]] __device__ __forceinline__ bool offset(std::int32_t t, std::int64_t& off) const noexcept {
    const std::int32_t slot = first_slot + t / page_size;
    if (first_slot < 0 || slot >= last_slot) return false;
    const std::int32_t page = page_indices[slot];
    if (page < 0 || page >= num_pages) return false;
    off = page * page_stride + (t % page_size) * token_stride + head_offset;
    return true;
  }
  [[nodiscard]] __device__ __forceinline__ const T* k_base() const noexcept { return k_pages; }
  [[nodiscard]] __device__ __forceinline__ const T* v_base() const noexcept { return v_pages; }
};

template <class Source>
struct kv_rows<skim::cuda::device_quantized_kv<Source>> : kv_rows<Source> {
  const float* k_scales = nullptr;  // block 0 of (b, kv head)
  const float* v_scales = nullptr;
  std::int64_t block_stride = 0;

  __device__ __forceinline__ kv_rows(const skim::cuda::device_quantized_kv<Source>& s, const device_row& r,
                                     std::int32_t b, std::int32_t kv_head) noexcept
      : kv_rows<Source>(s.codes, r, b, kv_head),
        k_scales(s.k_scales + s.scale_index(b, 0, kv_head)),
        v_scales(s.v_scales + s.scale_index(b, 0, kv_head)),
        block_stride(s.scale_block_stride) {}

  // @pre 0 <= j < the row's visible blocks
  [[nodiscard]] __device__ __forceinline__ float k_scale(std::int32_t j) const noexcept { return k_scales[j * block_stride]; }
  [[nodiscard]] __device__ __forceinline__ float v_scale(std::int32_t j) const noexcept { return v_scales[j * block_stride]; }
};

}  // namespace skim::cuda::detail::decode_impl
