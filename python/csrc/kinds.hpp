#pragma once
// What a skim_torch call asks for, in words both the CPU request (request.hpp) and the CUDA request
// (cuda_request.hpp) use; free of PyTorch and of skim's headers.

#include <cstdint>

namespace skim_torch {

enum class element_type : std::uint8_t { f32, f16, bf16 };  // torch.float32, float16, bfloat16
enum class index_kind : std::uint8_t { block_csr, block_table };
enum class kv_kind : std::uint8_t { contiguous, paged };

// A pool of K and V pages (skim::paged_kv's layout, FlashInfer's NHD or HND): key slot s of page p,
// kv head h at p·page_stride + s·token_stride + h·head_stride elements from k_pages (v_pages).
struct page_pool {
  const void* k_pages = nullptr;
  const void* v_pages = nullptr;
  std::int32_t num_pages = 0, page_size = 0;
  std::int64_t page_stride = 0, token_stride = 0, head_stride = 0;
};

}  // namespace skim_torch
