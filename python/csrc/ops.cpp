// skim_torch's PyTorch operators (namespace torch.ops.skim):
//
//   sparse_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
//                    row_ptr, col_idx, block_q, block_kv, causal, scale=0., impl="simd") -> (o, lse)
//   sparse_attention_table(... ids, count ... same otherwise) -> (o, lse)
//   simd_arch() -> str
//
// Contract (skim's, docs/design.md §2 to §6):
//  - q [tokens_q, heads_q, head_dim], k and v [tokens_kv, heads_kv, head_dim], packed varlen as
//    flash-attn's varlen calls: sequence b owns tokens [cu_seqlens[b], cu_seqlens[b + 1]). Any
//    strides with a contiguous head dimension (stride(2) == 1) that skim accepts as token-major or
//    head-major; fp32, fp16 or bf16, the same for all three; CPU tensors.
//  - cu_seqlens_q, cu_seqlens_kv: int32 [batch + 1]; max_seqlen_q / max_seqlen_kv bound every
//    sequence's length (checked; the CPU executors do not need them).
//  - The index is skim's index::block_csr (row_ptr [rows + 1], col_idx [nnz], int32) or
//    index::block_table (ids [rows, width], count [rows], int32), one row per (sequence, query block,
//    kv head) numbered row = (q_block_offset(b) + i) · heads_kv + h; ids relative to the sequence,
//    ascending, unique, below the row's visible blocks.
//  - causal: bottom-right aligned (query i of a sequence with n_q queries and n_kv keys sees key j
//    iff j <= i + n_kv - n_q); otherwise every key of the sequence.
//  - scale: the softmax scale, 0 for 1/sqrt(head_dim).
//  - impl: "simd" (exec::simd, the best compiled arch this CPU has, at::get_num_threads() threads),
//    "scalar" (exec::scalar) or "reference" (exec::reference: double precision, for tests).
//  - Returns o like q (dtype, shape; densely packed) and lse float32 [tokens_q, heads_q], natural
//    log. A query that sees no key gets o = 0, lse = -inf.
//  - Errors raise RuntimeError: "skim: " + skim's status message for what skim checks, or a
//    message naming the bad argument for what is checked here (dtype, device, rank, strides).
//  - Forward only: no autograd formula is registered.
//
// The Meta kernels give outputs of the right shape and dtype without computing anything, for
// tracing with meta or fake tensors (torch.fx.experimental.proxy_tensor.make_fx with
// tracing_mode="fake" on PyTorch 1.13; symbolic shapes need a Python meta function, not provided).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "request.hpp"

namespace {

using skim_torch::element_type;
using skim_torch::index_kind;
using skim_torch::request;
using skim_torch::tensor_view;

constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();

std::int32_t to_int32(std::int64_t v, const char* name) {
  TORCH_CHECK(v >= std::numeric_limits<std::int32_t>::min() && v <= int32_max, "skim: ", name, " = ", v,
              " does not fit in int32");
  return static_cast<std::int32_t>(v);
}

element_type element_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
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

// A [tokens, heads, head_dim] CPU tensor with a contiguous head dimension, as a skim view.
tensor_view token_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3, "skim: ", name, " must be [tokens, heads, head_dim], got ", t.dim(), " dimensions");
  TORCH_CHECK(t.device().is_cpu(), "skim: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.stride(2) == 1 || t.size(2) <= 1, "skim: ", name,
              " must have a contiguous head dimension (stride(2) == 1), got stride ", t.stride(2));
  return {t.data_ptr(), to_int32(t.size(0), "tokens"), to_int32(t.size(1), "heads"), to_int32(t.size(2), "head_dim"),
          t.stride(0), t.stride(1)};
}

// A contiguous int32 CPU tensor of `dims` dimensions, as a span.
std::span<const std::int32_t> int32_tensor(const at::Tensor& t, std::int64_t dims, const char* name) {
  TORCH_CHECK(t.dim() == dims, "skim: ", name, " must have ", dims, " dimension(s), got ", t.dim());
  TORCH_CHECK(t.scalar_type() == at::kInt, "skim: ", name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), "skim: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "skim: ", name, " must be contiguous");
  return {t.data_ptr<std::int32_t>(), static_cast<std::size_t>(t.numel())};
}

// Every sequence's length is at most max_seqlen (skim checks that cu_seqlens starts at 0 and ascends).
void check_max_seqlen(std::span<const std::int32_t> cu, std::int64_t max_seqlen, const char* name) {
  TORCH_CHECK(max_seqlen >= 0, "skim: ", name, " = ", max_seqlen, " < 0");
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    const std::int64_t len = static_cast<std::int64_t>(cu[b + 1]) - cu[b];
    TORCH_CHECK(len <= max_seqlen, "skim: ", name, " = ", max_seqlen, " < length ", len, " of sequence ", b);
  }
}

// The request's problem and tensors, with o and lse allocated; the index is the caller's to add.
struct call {
  request r;
  at::Tensor o, lse;
};

call make_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
               const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv,
               std::int64_t block_q, std::int64_t block_kv, bool causal, double scale) {
  call c;
  request& r = c.r;
  r.type = element_of(q, k, v);
  r.q = token_tensor(q, "q");
  r.k = token_tensor(k, "k");
  r.v = token_tensor(v, "v");
  const auto cu_q = int32_tensor(cu_seqlens_q, 1, "cu_seqlens_q");
  const auto cu_kv = int32_tensor(cu_seqlens_kv, 1, "cu_seqlens_kv");
  check_max_seqlen(cu_q, max_seqlen_q, "max_seqlen_q");
  check_max_seqlen(cu_kv, max_seqlen_kv, "max_seqlen_kv");
  r.prob = {.heads_q = r.q.heads,
            .heads_kv = r.k.heads,
            .head_dim = r.q.head_dim,
            .block_q = to_int32(block_q, "block_q"),
            .block_kv = to_int32(block_kv, "block_kv"),
            .mask = causal ? skim::mask_kind::causal : skim::mask_kind::none,
            .softmax_scale = static_cast<float>(scale),
            .cu_seqlens_q = cu_q,
            .cu_seqlens_kv = cu_kv};
  c.o = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  c.lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  r.o = c.o.data_ptr();
  r.lse = {c.lse.data_ptr<float>(), static_cast<std::size_t>(c.lse.numel())};
  return c;
}

std::tuple<at::Tensor, at::Tensor> run(call& c, c10::string_view impl) {
  skim::status s;
  if (impl == "simd") {
    s = skim_torch::run_simd(c.r, static_cast<std::int32_t>(at::get_num_threads()));
  } else if (impl == "scalar") {
    s = skim_torch::run_scalar(c.r);
  } else if (impl == "reference") {
    s = skim_torch::run_reference(c.r);
  } else {
    TORCH_CHECK(false, "skim: impl must be \"simd\", \"scalar\" or \"reference\", got \"", std::string(impl), "\"");
  }
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  return {c.o, c.lse};
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& row_ptr,
    const at::Tensor& col_idx, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv, causal,
                     scale);
  c.r.index = index_kind::block_csr;
  c.r.row_ptr = int32_tensor(row_ptr, 1, "row_ptr");
  c.r.col_idx = int32_tensor(col_idx, 1, "col_idx");
  return run(c, impl);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_table_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& ids,
    const at::Tensor& count, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv, causal,
                     scale);
  c.r.index = index_kind::block_table;
  c.r.ids = int32_tensor(ids, 2, "ids");
  c.r.count = int32_tensor(count, 1, "count");
  c.r.width = to_int32(ids.size(1), "ids width");
  return run(c, impl);
}

// Shapes only: o like q, lse float32 [tokens_q, heads_q]; checks the dtypes, ranks and that every
// tensor is a meta tensor (what can be checked without data).
std::tuple<at::Tensor, at::Tensor> outputs_meta(std::initializer_list<const at::Tensor*> tensors,
                                                const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->is_meta(), "skim: the Meta kernel takes meta tensors only, got one on ", t->device());
  }
  element_of(q, k, v);
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    TORCH_CHECK(t->dim() == 3, "skim: ", name, " must be [tokens, heads, head_dim], got ", t->dim(), " dimensions");
  }
  return {at::empty({q.size(0), q.size(1), q.size(2)}, q.options()),
          at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv,
                                                         std::int64_t, std::int64_t, const at::Tensor& index_a,
                                                         const at::Tensor& index_b, std::int64_t, std::int64_t, bool,
                                                         double, c10::string_view) {
  return outputs_meta({&q, &k, &v, &cu_seqlens_q, &cu_seqlens_kv, &index_a, &index_b}, q, k, v);
}

std::string simd_arch() { return skim_torch::simd_arch(); }

}  // namespace

TORCH_LIBRARY(skim, m) {
  m.def(
      "sparse_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, Tensor row_ptr, Tensor col_idx, int block_q, int block_kv, "
      "bool causal, float scale=0., str impl=\"simd\") -> (Tensor o, Tensor lse)");
  m.def(
      "sparse_attention_table(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, Tensor ids, Tensor count, int block_q, int block_kv, "
      "bool causal, float scale=0., str impl=\"simd\") -> (Tensor o, Tensor lse)");
  m.def("simd_arch() -> str", &simd_arch);
}

TORCH_LIBRARY_IMPL(skim, CPU, m) {
  m.impl("sparse_attention", &sparse_attention_cpu);
  m.impl("sparse_attention_table", &sparse_attention_table_cpu);
}

TORCH_LIBRARY_IMPL(skim, Meta, m) {
  m.impl("sparse_attention", &sparse_attention_meta);
  m.impl("sparse_attention_table", &sparse_attention_meta);
}

// PyTorch 1.13 has no autograd fallthrough for meta tensors (it has one for CPU): without these,
// meta inputs stop at AutogradMeta before reaching the Meta kernels.
TORCH_LIBRARY_IMPL(skim, AutogradMeta, m) {
  m.impl("sparse_attention", torch::CppFunction::makeFallthrough());
  m.impl("sparse_attention_table", torch::CppFunction::makeFallthrough());
}
