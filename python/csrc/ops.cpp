// skim_torch's PyTorch operators (namespace torch.ops.skim), their CPU and Meta kernels; the CUDA
// kernels are in ops_cuda.cpp (built where CUDA is: scripts/python-cuda).
//
//   sparse_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
//                    row_ptr, col_idx, block_q, block_kv, causal, scale=0., impl="auto") -> (o, lse)
//   sparse_attention_table(... ids, count ... same otherwise) -> (o, lse)
//   sparse_attention_paged(q, k_pages, v_pages, page_indptr, page_indices, cu_seqlens_q, cu_seqlens_kv,
//                          max_seqlen_q, max_seqlen_kv, ids, count, block_q, block_kv, causal,
//                          scale=0., layout="NHD", impl="auto") -> (o, lse)
//   simd_arch() -> str
//
// Contract (skim's, docs/design.md §2 to §6):
//  - q [tokens_q, heads_q, head_dim], k and v [tokens_kv, heads_kv, head_dim], packed varlen as
//    flash-attn's varlen calls: sequence b owns tokens [cu_seqlens[b], cu_seqlens[b + 1]). Any
//    strides with a contiguous head dimension (stride(2) == 1) that skim accepts as token-major or
//    head-major; fp32, fp16 or bf16 (CUDA: fp16 or bf16), the same for all three; every tensor on
//    q's device.
//  - Paged K/V (sparse_attention_paged): k_pages and v_pages of one shape and strides, layout "NHD"
//    [num_pages, page_size, heads_kv, head_dim] or "HND" [num_pages, heads_kv, page_size, head_dim];
//    sequence b's key t in page page_indices[page_indptr[b] + t / page_size], slot t % page_size
//    (FlashInfer's page table); cu_seqlens_kv gives the sequences' key counts. A [B, H, N, D] cache is
//    the HND pool of B pages of N tokens with page_indices = arange(B) (skim_torch.bhnd_pages).
//  - cu_seqlens_q, cu_seqlens_kv: int32 [batch + 1]; max_seqlen_q / max_seqlen_kv bound every
//    sequence's length (checked on the CPU; on CUDA a longer sequence's rows are skipped, unwritten).
//  - The index is skim's index::block_csr (row_ptr [rows + 1], col_idx [nnz], int32) or
//    index::block_table (ids [rows, width], count [rows], int32), one row per (sequence, query block,
//    kv head) numbered row = (q_block_offset(b) + i) · heads_kv + h; ids relative to the sequence,
//    ascending, unique, below the row's visible blocks.
//  - causal: bottom-right aligned (query i of a sequence with n_q queries and n_kv keys sees key j
//    iff j <= i + n_kv - n_q); otherwise every key of the sequence.
//  - scale: the softmax scale, 0 for 1/sqrt(head_dim).
//  - impl on the CPU: "auto" or "simd" (exec::simd, the best compiled arch this CPU has,
//    at::get_num_threads() threads), "scalar" (exec::scalar) or "reference" (exec::reference: double
//    precision, for tests). On CUDA: "auto" (cuda::decode for 1 to 8 queries per sequence, else
//    cuda::prefill), "decode" or "prefill".
//  - Returns o like q (dtype, shape; densely packed) and lse float32 [tokens_q, heads_q], natural
//    log. A query that sees no key gets o = 0, lse = -inf.
//  - Errors raise RuntimeError: "skim: " + skim's status message for what skim checks, or a
//    message naming the bad argument for what is checked here (dtype, device, rank, strides).
//  - Forward only: no autograd formula is registered.
//
// The Meta kernels give outputs of the right shape and dtype without computing anything, for
// tracing with meta or fake tensors (make_fx with tracing_mode="fake", torch.compile).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "request.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "tensor_checks.hpp"

namespace {

using namespace skim_torch;

tensor_view cpu_view(const at::Tensor& t, const char* name) {
  const rows r = token_rows(t, at::Device(at::kCPU), name);
  return {r.data, r.tokens, r.heads, r.head_dim, r.token_stride, r.head_stride};
}

std::span<const std::int32_t> cpu_int32(const at::Tensor& t, std::int64_t dims, const char* name) {
  return {int32_data(t, dims, at::Device(at::kCPU), name), static_cast<std::size_t>(t.numel())};
}

// Every sequence's length is at most max_seqlen (skim checks that cu_seqlens starts at 0 and ascends).
void check_max_seqlen(std::span<const std::int32_t> cu, std::int64_t max_seqlen, const char* name) {
  TORCH_CHECK(max_seqlen >= 0, "skim: ", name, " = ", max_seqlen, " < 0");
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    const std::int64_t len = static_cast<std::int64_t>(cu[b + 1]) - cu[b];
    TORCH_CHECK(len <= max_seqlen, "skim: ", name, " = ", max_seqlen, " < length ", len, " of sequence ", b);
  }
}

// A request's problem, q, o and lse; K/V and the index are the caller's to add.
struct call {
  request r;
  at::Tensor o, lse;
};

call make_call(const at::Tensor& q, element_type type, std::int32_t heads_kv, const at::Tensor& cu_seqlens_q,
               const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv,
               std::int64_t block_q, std::int64_t block_kv, bool causal, double scale) {
  call c;
  request& r = c.r;
  r.type = type;
  r.q = cpu_view(q, "q");
  const auto cu_q = cpu_int32(cu_seqlens_q, 1, "cu_seqlens_q");
  const auto cu_kv = cpu_int32(cu_seqlens_kv, 1, "cu_seqlens_kv");
  check_max_seqlen(cu_q, max_seqlen_q, "max_seqlen_q");
  check_max_seqlen(cu_kv, max_seqlen_kv, "max_seqlen_kv");
  r.prob = {.heads_q = r.q.heads,
            .heads_kv = heads_kv,
            .head_dim = r.q.head_dim,
            .block_q = to_int32(block_q, "block_q"),
            .block_kv = to_int32(block_kv, "block_kv"),
            .mask = causal ? skim::mask_kind::causal : skim::mask_kind::none,
            .softmax_scale = static_cast<float>(scale),
            .cu_seqlens_q = cu_q,
            .cu_seqlens_kv = cu_kv};
  c.o = output_like(q);
  c.lse = lse_like(q);
  r.o = c.o.data_ptr();
  r.lse = {c.lse.data_ptr<float>(), static_cast<std::size_t>(c.lse.numel())};
  return c;
}

// The contiguous K/V of a call.
call make_contiguous_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q,
                          std::int64_t max_seqlen_kv, std::int64_t block_q, std::int64_t block_kv, bool causal,
                          double scale) {
  const element_type type = element_of(q, k, v);
  const tensor_view kv = cpu_view(k, "k");
  call c = make_call(q, type, kv.heads, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv,
                     causal, scale);
  c.r.k = kv;
  c.r.v = cpu_view(v, "v");
  return c;
}

void set_table(request& r, const at::Tensor& ids, const at::Tensor& count) {
  r.index = index_kind::block_table;
  r.ids = cpu_int32(ids, 2, "ids");
  r.count = cpu_int32(count, 1, "count");
  r.width = to_int32(ids.size(1), "ids width");
}

std::tuple<at::Tensor, at::Tensor> run(call& c, c10::string_view impl) {
  skim::status s;
  if (impl == "auto" || impl == "simd") {
    s = run_simd(c.r, static_cast<std::int32_t>(at::get_num_threads()));
  } else if (impl == "scalar") {
    s = run_scalar(c.r);
  } else if (impl == "reference") {
    s = run_reference(c.r);
  } else {
    TORCH_CHECK(false, "skim: impl on the CPU must be \"auto\", \"simd\", \"scalar\" or \"reference\", got \"",
                std::string(impl), "\"");
  }
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  return {c.o, c.lse};
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& row_ptr,
    const at::Tensor& col_idx, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  call c = make_contiguous_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv,
                                causal, scale);
  c.r.index = index_kind::block_csr;
  c.r.row_ptr = cpu_int32(row_ptr, 1, "row_ptr");
  c.r.col_idx = cpu_int32(col_idx, 1, "col_idx");
  return run(c, impl);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_table_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& ids,
    const at::Tensor& count, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  call c = make_contiguous_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv,
                                causal, scale);
  set_table(c.r, ids, count);
  return run(c, impl);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_paged_cpu(
    const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages, const at::Tensor& page_indptr,
    const at::Tensor& page_indices, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv,
    std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& ids, const at::Tensor& count,
    std::int64_t block_q, std::int64_t block_kv, bool causal, double scale, c10::string_view layout,
    c10::string_view impl) {
  const element_type type = element_of(q, k_pages, v_pages);
  const pages g = paged_rows(k_pages, v_pages, layout, at::Device(at::kCPU));
  TORCH_CHECK(g.head_dim == q.size(2), "skim: k_pages' head_dim ", g.head_dim, " is not q's ", q.size(2));
  call c = make_call(q, type, g.heads, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv,
                     causal, scale);
  c.r.kv = kv_kind::paged;
  c.r.pages = {.pool = g.pool,
               .page_indptr = cpu_int32(page_indptr, 1, "page_indptr"),
               .page_indices = cpu_int32(page_indices, 1, "page_indices")};
  set_table(c.r, ids, count);
  return run(c, impl);
}

// Shapes only: o like q, lse float32 [tokens_q, heads_q]; checks the dtypes, q's rank and that every
// tensor is a meta tensor (what can be checked without data).
std::tuple<at::Tensor, at::Tensor> outputs_meta(std::initializer_list<const at::Tensor*> tensors,
                                                const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->is_meta(), "skim: the Meta kernel takes meta tensors only, got one on ", t->device());
  }
  element_of(q, k, v);
  TORCH_CHECK(q.dim() == 3, "skim: q must be [tokens, heads, head_dim], got ", q.dim(), " dimensions");
  return {output_like(q), lse_like(q)};
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv,
                                                         std::int64_t, std::int64_t, const at::Tensor& index_a,
                                                         const at::Tensor& index_b, std::int64_t, std::int64_t, bool,
                                                         double, c10::string_view) {
  return outputs_meta({&q, &k, &v, &cu_seqlens_q, &cu_seqlens_kv, &index_a, &index_b}, q, k, v);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_paged_meta(
    const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages, const at::Tensor& page_indptr,
    const at::Tensor& page_indices, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv, std::int64_t,
    std::int64_t, const at::Tensor& ids, const at::Tensor& count, std::int64_t, std::int64_t, bool, double,
    c10::string_view, c10::string_view) {
  return outputs_meta({&q, &k_pages, &v_pages, &page_indptr, &page_indices, &cu_seqlens_q, &cu_seqlens_kv, &ids, &count},
                      q, k_pages, v_pages);
}

// The decode step's outputs: o like q, lse, and the selection table's ids [batch · heads_kv, width]
// and count, width as skim::cuda::decode_step sizes it (reserved<top_k>'s most ids of the longest row).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decode_step_meta(
    const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_kv, std::int64_t block_kv, std::int64_t top_k,
    std::int64_t sink_blocks, std::int64_t local_blocks, const optional_tensor& page_indptr,
    const optional_tensor& page_indices, c10::string_view layout, double) {
  outputs_meta({&state, &q, &k, &v, &cu_seqlens_kv}, q, k, v);
  TORCH_CHECK(block_kv > 0 && max_seqlen_kv >= 0, "skim: block_kv ", block_kv, " <= 0 or max_seqlen_kv ",
              max_seqlen_kv, " < 0");
  std::int64_t heads_kv = k.dim() == 3 ? k.size(1) : 0;
  if (page_indptr.has_value()) {
    TORCH_CHECK(page_indices.has_value() && page_indptr->is_meta() && page_indices->is_meta(),
                "skim: the Meta kernel takes meta page_indptr and page_indices");
    heads_kv = paged_rows(k, v, layout, k.device()).heads;
  }
  const skim::select::reserved<skim::select::top_k> selector{
      .sink = to_int32(sink_blocks, "sink_blocks"),
      .local = to_int32(local_blocks, "local_blocks"),
      .dynamic = {.k = to_int32(top_k, "top_k")}};
  const std::int32_t width =
      std::max(selector.max_count(to_int32((max_seqlen_kv + block_kv - 1) / block_kv, "kv blocks")), 1);
  const std::int64_t rows = (cu_seqlens_kv.size(0) - 1) * heads_kv;
  return {output_like(q), lse_like(q), at::empty({rows, width}, cu_seqlens_kv.options()),
          at::empty({rows}, cu_seqlens_kv.options())};
}

void decode_step_prefill_meta(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& cu_seqlens_kv, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                              std::int64_t, const optional_tensor&, const optional_tensor&, c10::string_view) {
  outputs_meta({&state, &q, &k, &v, &cu_seqlens_kv}, q, k, v);  // writes only the state: nothing to shape
}

std::string simd_arch_name() { return skim_torch::simd_arch(); }

}  // namespace

TORCH_LIBRARY(skim, m) {
  m.def(
      "sparse_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, Tensor row_ptr, Tensor col_idx, int block_q, int block_kv, "
      "bool causal, float scale=0., str impl=\"auto\") -> (Tensor o, Tensor lse)");
  m.def(
      "sparse_attention_table(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, Tensor ids, Tensor count, int block_q, int block_kv, "
      "bool causal, float scale=0., str impl=\"auto\") -> (Tensor o, Tensor lse)");
  m.def(
      "sparse_attention_paged(Tensor q, Tensor k_pages, Tensor v_pages, Tensor page_indptr, Tensor page_indices, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, Tensor ids, Tensor count, "
      "int block_q, int block_kv, bool causal, float scale=0., str layout=\"NHD\", str impl=\"auto\") "
      "-> (Tensor o, Tensor lse)");
  // The routed decode step (CUDA): state is a uint8 tensor of decode_step_state_bytes(...) bytes the
  // caller keeps between steps (skim's summaries, the selection table, workspaces).
  m.def(
      "decode_step_state_bytes(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_kv, int max_seqlen_kv, int block_kv, "
      "int top_k, int sink_blocks=1, int local_blocks=8, Tensor? page_indptr=None, Tensor? page_indices=None, "
      "str layout=\"NHD\") -> int");
  m.def(
      "decode_step_prefill(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_kv, int max_seqlen_kv, "
      "int block_kv, int top_k, int sink_blocks=1, int local_blocks=8, Tensor? page_indptr=None, "
      "Tensor? page_indices=None, str layout=\"NHD\") -> ()");
  m.def(
      "decode_step(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_kv, int max_seqlen_kv, "
      "int block_kv, int top_k, int sink_blocks=1, int local_blocks=8, Tensor? page_indptr=None, "
      "Tensor? page_indices=None, str layout=\"NHD\", float scale=0.) -> (Tensor o, Tensor lse, Tensor ids, "
      "Tensor count)");
  m.def("simd_arch() -> str", &simd_arch_name);
}

TORCH_LIBRARY_IMPL(skim, CPU, m) {
  m.impl("sparse_attention", &sparse_attention_cpu);
  m.impl("sparse_attention_table", &sparse_attention_table_cpu);
  m.impl("sparse_attention_paged", &sparse_attention_paged_cpu);
}

TORCH_LIBRARY_IMPL(skim, Meta, m) {
  m.impl("sparse_attention", &sparse_attention_meta);
  m.impl("sparse_attention_table", &sparse_attention_meta);
  m.impl("sparse_attention_paged", &sparse_attention_paged_meta);
  m.impl("decode_step", &decode_step_meta);
  m.impl("decode_step_prefill", &decode_step_prefill_meta);
}

// PyTorch 1.13 has no autograd fallthrough for meta tensors (it has one for CPU): without these,
// meta inputs stop at AutogradMeta before reaching the Meta kernels.
TORCH_LIBRARY_IMPL(skim, AutogradMeta, m) {
  m.impl("sparse_attention", torch::CppFunction::makeFallthrough());
  m.impl("sparse_attention_table", torch::CppFunction::makeFallthrough());
  m.impl("sparse_attention_paged", torch::CppFunction::makeFallthrough());
  m.impl("decode_step", torch::CppFunction::makeFallthrough());
  m.impl("decode_step_prefill", torch::CppFunction::makeFallthrough());
}
