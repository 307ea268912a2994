#pragma once
// What ops.cpp (CPU and Meta kernels) and ops_cuda.cpp (CUDA kernels) check of their tensors before
// skim sees them: dtypes, devices, ranks, a contiguous head dimension, int32 index tensors, and
// integers that must fit in int32. Each failure raises RuntimeError("skim: ..."), naming the argument.

#include <ATen/ATen.h>
#include <c10/util/string_view.h>
#include <torch/version.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "kinds.hpp"

namespace skim_torch {

// `Tensor?` arguments: c10::optional before PyTorch 2 (where it became std::optional).
#if TORCH_VERSION_MAJOR >= 2
using optional_tensor = std::optional<at::Tensor>;
#else
using optional_tensor = c10::optional<at::Tensor>;
#endif

inline std::int32_t to_int32(std::int64_t v, const char* name) {
  TORCH_CHECK(v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max(),
              "skim: ", name, " = ", v, " does not fit in int32");
  return static_cast<std::int32_t>(v);
}

inline element_type element_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "skim: q, k and v must have one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), " and ",
              v.scalar_type());
  switch (q.scalar_type()) {
    case at::kFloat: return element_type::f32;
    case at::kHalf: return element_type::f16;
    case at::kBFloat16: return element_type::bf16;
    default: TORCH_CHECK(false, "skim: q, k and v must be float32, float16 or bfloat16, got ", q.scalar_type());
  }
}

inline void check_device(const at::Tensor& t, const at::Device& device, const char* name) {
  TORCH_CHECK(t.device() == device, "skim: ", name, " must be on ", device, " (q's device), got ", t.device());
}

// A [tokens, heads, head_dim] tensor on `device` with a contiguous head dimension.
struct rows {
  const void* data = nullptr;
  std::int32_t tokens = 0, heads = 0, head_dim = 0;
  std::int64_t token_stride = 0, head_stride = 0;
};
inline rows token_rows(const at::Tensor& t, const at::Device& device, const char* name) {
  TORCH_CHECK(t.dim() == 3, "skim: ", name, " must be [tokens, heads, head_dim], got ", t.dim(), " dimensions");
  check_device(t, device, name);
  TORCH_CHECK(t.stride(2) == 1 || t.size(2) <= 1, "skim: ", name,
              " must have a contiguous head dimension (stride(2) == 1), got stride ", t.stride(2));
  return {t.data_ptr(), to_int32(t.size(0), "tokens"), to_int32(t.size(1), "heads"), to_int32(t.size(2), "head_dim"),
          t.stride(0), t.stride(1)};
}

// Paged K/V: k_pages and v_pages of one shape and strides, NHD [num_pages, page_size, heads_kv,
// head_dim] or HND [num_pages, heads_kv, page_size, head_dim] (FlashInfer's names), head dimension
// contiguous.
struct pages {
  page_pool pool;
  std::int32_t heads = 0, head_dim = 0;
};
inline pages paged_rows(const at::Tensor& k, const at::Tensor& v, c10::string_view layout, const at::Device& device) {
  const bool nhd = layout == "NHD";
  TORCH_CHECK(nhd || layout == "HND", "skim: layout must be \"NHD\" or \"HND\", got \"", std::string(layout), "\"");
  TORCH_CHECK(k.dim() == 4, "skim: k_pages must be ", nhd ? "[num_pages, page_size, heads_kv, head_dim]"
                                                          : "[num_pages, heads_kv, page_size, head_dim]",
              ", got ", k.dim(), " dimensions");
  TORCH_CHECK(v.sizes() == k.sizes() && v.strides() == k.strides(), "skim: v_pages must have k_pages' shape and "
              "strides, got ", v.sizes(), " / ", v.strides(), " against ", k.sizes(), " / ", k.strides());
  check_device(k, device, "k_pages");
  check_device(v, device, "v_pages");
  TORCH_CHECK(k.stride(3) == 1 || k.size(3) <= 1,
              "skim: k_pages and v_pages must have a contiguous head dimension (stride(3) == 1), got stride ",
              k.stride(3));
  const int token_dim = nhd ? 1 : 2, head_dim = nhd ? 2 : 1;
  return {.pool = {.k_pages = k.data_ptr(),
                   .v_pages = v.data_ptr(),
                   .num_pages = to_int32(k.size(0), "num_pages"),
                   .page_size = to_int32(k.size(token_dim), "page_size"),
                   .page_stride = k.stride(0),
                   .token_stride = k.stride(token_dim),
                   .head_stride = k.stride(head_dim)},
          .heads = to_int32(k.size(head_dim), "heads_kv"),
          .head_dim = to_int32(k.size(3), "head_dim")};
}

// A contiguous int32 tensor of `dims` dimensions on `device`.
inline const std::int32_t* int32_data(const at::Tensor& t, std::int64_t dims, const at::Device& device,
                                      const char* name) {
  TORCH_CHECK(t.dim() == dims, "skim: ", name, " must have ", dims, " dimension(s), got ", t.dim());
  TORCH_CHECK(t.scalar_type() == at::kInt, "skim: ", name, " must be int32, got ", t.scalar_type());
  check_device(t, device, name);
  TORCH_CHECK(t.is_contiguous(), "skim: ", name, " must be contiguous");
  return t.data_ptr<std::int32_t>();
}

// o like q ([tokens_q, heads_q, head_dim], q's dtype and device, densely packed) and lse float32
// [tokens_q, heads_q].
inline at::Tensor output_like(const at::Tensor& q) { return at::empty({q.size(0), q.size(1), q.size(2)}, q.options()); }
inline at::Tensor lse_like(const at::Tensor& q) {
  return at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
}

}  // namespace skim_torch
