#pragma once
// What a skim_torch call asks for, in words both the CPU request (request.hpp) and the CUDA request
// (cuda_request.hpp) use; free of PyTorch and of skim's headers.

#include <cstdint>

namespace skim_torch {

enum class element_type : std::uint8_t { f32, f16, bf16 };  // torch.float32, float16, bfloat16
enum class index_kind : std::uint8_t { block_csr, block_table };
enum class kv_kind : std::uint8_t { contiguous, paged };

}  // namespace skim_torch
