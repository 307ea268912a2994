// skim_torch's CUDA kernels for the operators ops.cpp defines: cuda::decode or cuda::prefill
// (run_cuda.cu) on the current stream of q's device. No synchronisation and no allocation beyond
// the outputs and decode's workspace (PyTorch's caching allocator), so the operators can be captured
// in a CUDA graph. Device content is not read back: cu_seqlens, ids and page tables are checked by
// the kernels, which skip what is out of bounds (a sequence past max_seqlen leaves its rows unwritten).

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "cuda_request.hpp"
#include "tensor_checks.hpp"

namespace {

using namespace skim_torch;

gpu::executor executor_of(c10::string_view impl) {
  if (impl == "auto") return gpu::executor::automatic;
  if (impl == "decode") return gpu::executor::decode;
  if (impl == "prefill") return gpu::executor::prefill;
  TORCH_CHECK(false, "skim: impl on CUDA must be \"auto\", \"decode\" or \"prefill\", got \"", std::string(impl), "\"");
}

gpu::device_rows device_view(const rows& r) { return {r.data, r.token_stride, r.head_stride}; }

// The request's problem, q and index settings; K/V, the index tensors and the outputs are added by the callers.
gpu::request make_request(const at::Tensor& q, element_type type, std::int32_t heads_kv, const at::Tensor& cu_seqlens_q,
                          const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv,
                          std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
                          c10::string_view impl) {
  TORCH_CHECK(q.is_cuda(), "skim: q must be a CUDA tensor for the CUDA kernel, got ", q.device());
  const at::Device device = q.device();
  const rows qr = token_rows(q, device, "q");
  gpu::request r;
  r.type = type;
  r.q = device_view(qr);
  r.heads_q = qr.heads;
  r.heads_kv = heads_kv;
  r.head_dim = qr.head_dim;
  r.block_q = to_int32(block_q, "block_q");
  r.block_kv = to_int32(block_kv, "block_kv");
  r.causal = causal;
  r.scale = static_cast<float>(scale);
  r.cu_seqlens_q = int32_data(cu_seqlens_q, 1, device, "cu_seqlens_q");
  r.cu_seqlens_kv = int32_data(cu_seqlens_kv, 1, device, "cu_seqlens_kv");
  TORCH_CHECK(cu_seqlens_q.numel() >= 1 && cu_seqlens_kv.numel() == cu_seqlens_q.numel(),
              "skim: cu_seqlens_q and cu_seqlens_kv must both have batch + 1 >= 1 entries, got ", cu_seqlens_q.numel(),
              " and ", cu_seqlens_kv.numel());
  r.batch = to_int32(cu_seqlens_q.numel() - 1, "batch");
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_kv >= 0, "skim: max_seqlen_q ", max_seqlen_q, " / max_seqlen_kv ",
              max_seqlen_kv, " < 0");
  r.max_seqlen_q = to_int32(max_seqlen_q, "max_seqlen_q");
  r.max_seqlen_kv = to_int32(max_seqlen_kv, "max_seqlen_kv");
  r.exec = executor_of(impl);
  return r;
}

void set_table(gpu::request& r, const at::Tensor& ids, const at::Tensor& count, const at::Device& device) {
  r.index = index_kind::block_table;
  r.ids = int32_data(ids, 2, device, "ids");
  r.count = int32_data(count, 1, device, "count");
  TORCH_CHECK(count.size(0) == ids.size(0), "skim: count has ", count.size(0), " rows, ids ", ids.size(0));
  r.width = to_int32(ids.size(1), "ids width");
  r.rows = ids.size(0);
}

// Plans, allocates o, lse and the workspace, and enqueues the call on q's device's current stream.
std::tuple<at::Tensor, at::Tensor> run(gpu::request& r, const at::Tensor& q) {
  const c10::cuda::CUDAGuard guard(q.device());
  gpu::executor chosen = gpu::executor::automatic;
  std::size_t bytes = 0;
  const skim::status planned = gpu::plan(r, chosen, bytes);
  TORCH_CHECK(planned.ok(), "skim: ", planned.message());
  at::Tensor o = output_like(q), lse = lse_like(q);
  at::Tensor workspace;
  if (bytes > 0) workspace = at::empty({static_cast<std::int64_t>(bytes)}, q.options().dtype(at::kByte));
  r.o = o.data_ptr();
  r.lse = lse.data_ptr<float>();
  const skim::status s =
      gpu::run(r, chosen, bytes > 0 ? workspace.data_ptr() : nullptr, bytes, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  return {o, lse};
}

// A request over contiguous K/V [tokens, heads_kv, head_dim]: one stride pair for K and V (skim's
// device source has one).
gpu::request contiguous_request(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv,
                                std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, std::int64_t block_q,
                                std::int64_t block_kv, bool causal, double scale, c10::string_view impl) {
  const element_type type = element_of(q, k, v);
  gpu::request r = make_request(q, type, to_int32(k.dim() == 3 ? k.size(1) : 0, "heads_kv"), cu_seqlens_q,
                                cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q, block_kv, causal, scale, impl);
  const rows kr = token_rows(k, q.device(), "k"), vr = token_rows(v, q.device(), "v");
  TORCH_CHECK(kr.tokens == vr.tokens && kr.heads == vr.heads && kr.head_dim == vr.head_dim &&
                  kr.token_stride == vr.token_stride && kr.head_stride == vr.head_stride,
              "skim: on CUDA, k and v must have one shape and the same strides, got ", k.sizes(), " / ", k.strides(),
              " and ", v.sizes(), " / ", v.strides());
  r.kv = kv_kind::contiguous;
  r.k = device_view(kr);
  r.v = device_view(vr);
  return r;
}

// A request over paged K/V: k_pages and v_pages in `layout` with a page table of batch + 1 entries.
gpu::request paged_request(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                           const at::Tensor& page_indptr, const at::Tensor& page_indices, c10::string_view layout,
                           const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q,
                           std::int64_t max_seqlen_kv, std::int64_t block_q, std::int64_t block_kv, bool causal,
                           double scale, c10::string_view impl) {
  const element_type type = element_of(q, k_pages, v_pages);
  const pages g = paged_rows(k_pages, v_pages, layout, q.device());
  TORCH_CHECK(g.head_dim == q.size(2), "skim: k_pages' head_dim ", g.head_dim, " is not q's ", q.size(2));
  gpu::request r = make_request(q, type, g.heads, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q,
                                block_kv, causal, scale, impl);
  TORCH_CHECK(page_indptr.numel() == cu_seqlens_kv.numel(), "skim: page_indptr has ", page_indptr.numel(),
              " entries, expected batch + 1 = ", cu_seqlens_kv.numel());
  r.kv = kv_kind::paged;
  r.pages = {.pool = g.pool,
             .page_indptr = int32_data(page_indptr, 1, q.device(), "page_indptr"),
             .page_indices = int32_data(page_indices, 1, q.device(), "page_indices")};
  return r;
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& row_ptr,
    const at::Tensor& col_idx, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  gpu::request r = contiguous_request(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q,
                                      block_kv, causal, scale, impl);
  r.index = index_kind::block_csr;
  r.row_ptr = int32_data(row_ptr, 1, q.device(), "row_ptr");
  r.col_idx = int32_data(col_idx, 1, q.device(), "col_idx");
  TORCH_CHECK(row_ptr.numel() >= 1, "skim: row_ptr must have rows + 1 >= 1 entries");
  r.rows = row_ptr.numel() - 1;
  r.nnz = col_idx.numel();
  return run(r, q);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_table_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& ids,
    const at::Tensor& count, std::int64_t block_q, std::int64_t block_kv, bool causal, double scale,
    c10::string_view impl) {
  gpu::request r = contiguous_request(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, block_q,
                                      block_kv, causal, scale, impl);
  set_table(r, ids, count, q.device());
  return run(r, q);
}

std::tuple<at::Tensor, at::Tensor> sparse_attention_paged_cuda(
    const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages, const at::Tensor& page_indptr,
    const at::Tensor& page_indices, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_kv,
    std::int64_t max_seqlen_q, std::int64_t max_seqlen_kv, const at::Tensor& ids, const at::Tensor& count,
    std::int64_t block_q, std::int64_t block_kv, bool causal, double scale, c10::string_view layout,
    c10::string_view impl) {
  gpu::request r = paged_request(q, k_pages, v_pages, page_indptr, page_indices, layout, cu_seqlens_q, cu_seqlens_kv,
                                 max_seqlen_q, max_seqlen_kv, block_q, block_kv, causal, scale, impl);
  set_table(r, ids, count, q.device());
  return run(r, q);
}

// --- The routed decode step ---------------------------------------------------------------------------

// A step's request: q [batch, heads_q, head_dim] (one query per sequence), K/V contiguous
// [tokens, heads_kv, head_dim] or, with page_indptr, pages in `layout`. cu_seqlens_q receives the
// one-query-per-sequence offsets the request points to (kept alive by the caller through the launch).
gpu::step_request make_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_kv, std::int64_t block_kv,
                            std::int64_t top_k, std::int64_t sink_blocks, std::int64_t local_blocks,
                            const optional_tensor& page_indptr, const optional_tensor& page_indices,
                            c10::string_view layout, double scale, at::Tensor& cu_seqlens_q) {
  cu_seqlens_q = at::arange(cu_seqlens_kv.numel(), cu_seqlens_kv.options());  // 0, 1, ..., batch: capturable
  gpu::step_request r;
  if (page_indptr.has_value()) {
    TORCH_CHECK(page_indices.has_value(), "skim: page_indptr without page_indices");
    r.attention = paged_request(q, k, v, *page_indptr, *page_indices, layout, cu_seqlens_q, cu_seqlens_kv, 1,
                                max_seqlen_kv, 1, block_kv, true, scale, "decode");
  } else {
    r.attention = contiguous_request(q, k, v, cu_seqlens_q, cu_seqlens_kv, 1, max_seqlen_kv, 1, block_kv, true, scale,
                                     "decode");
  }
  TORCH_CHECK(q.size(0) == r.attention.batch, "skim: q has ", q.size(0), " tokens, the decode step one per sequence: ",
              r.attention.batch);
  r.top_k = to_int32(top_k, "top_k");
  r.sink_blocks = to_int32(sink_blocks, "sink_blocks");
  r.local_blocks = to_int32(local_blocks, "local_blocks");
  return r;
}

void attach_state(gpu::step_request& r, const at::Tensor& state, const at::Tensor& q) {
  std::size_t bytes = 0;
  const skim::status s = gpu::step_state_bytes(r, bytes);
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  check_device(state, q.device(), "state");
  TORCH_CHECK(state.scalar_type() == at::kByte && state.dim() == 1 && state.is_contiguous(),
              "skim: state must be a contiguous uint8 tensor of decode_step_state_bytes(...) bytes");
  TORCH_CHECK(static_cast<std::size_t>(state.numel()) >= bytes, "skim: state has ", state.numel(),
              " bytes, this decode step needs ", bytes);
  r.state = state.data_ptr();
  r.state_bytes = static_cast<std::size_t>(state.numel());
}

std::int64_t decode_step_state_bytes_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_kv,
                                          std::int64_t block_kv, std::int64_t top_k, std::int64_t sink_blocks,
                                          std::int64_t local_blocks, const optional_tensor& page_indptr,
                                          const optional_tensor& page_indices, c10::string_view layout) {
  at::Tensor cu_q;
  const gpu::step_request r = make_step(q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks,
                                        local_blocks, page_indptr, page_indices, layout, 0.0, cu_q);
  std::size_t bytes = 0;
  const skim::status s = gpu::step_state_bytes(r, bytes);
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  return static_cast<std::int64_t>(bytes);
}

void decode_step_prefill_cuda(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_kv, std::int64_t block_kv,
                              std::int64_t top_k, std::int64_t sink_blocks, std::int64_t local_blocks,
                              const optional_tensor& page_indptr,
                              const optional_tensor& page_indices, c10::string_view layout) {
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor cu_q;
  gpu::step_request r = make_step(q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks, local_blocks,
                                  page_indptr, page_indices, layout, 0.0, cu_q);
  attach_state(r, state, q);
  const skim::status s = gpu::step_prefill(r, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(s.ok(), "skim: ", s.message());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decode_step_cuda(
    const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_kv, std::int64_t max_seqlen_kv, std::int64_t block_kv, std::int64_t top_k,
    std::int64_t sink_blocks, std::int64_t local_blocks, const optional_tensor& page_indptr,
    const optional_tensor& page_indices, c10::string_view layout, double scale) {
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor cu_q;
  gpu::step_request r = make_step(q, k, v, cu_seqlens_kv, max_seqlen_kv, block_kv, top_k, sink_blocks, local_blocks,
                                  page_indptr, page_indices, layout, scale, cu_q);
  attach_state(r, state, q);
  std::int32_t width = 0;
  const skim::status w = gpu::step_width(r, width);
  TORCH_CHECK(w.ok(), "skim: ", w.message());
  const std::int64_t rows = static_cast<std::int64_t>(r.attention.batch) * r.attention.heads_kv;
  at::Tensor o = output_like(q), lse = lse_like(q);
  at::Tensor ids = at::empty({rows, width}, cu_seqlens_kv.options());
  at::Tensor count = at::empty({rows}, cu_seqlens_kv.options());
  r.attention.o = o.data_ptr();
  r.attention.lse = lse.data_ptr<float>();
  const skim::status s = gpu::step_run(r, ids.data_ptr<std::int32_t>(), count.data_ptr<std::int32_t>(), width,
                                       at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(s.ok(), "skim: ", s.message());
  return {o, lse, ids, count};
}

}  // namespace

TORCH_LIBRARY_IMPL(skim, CUDA, m) {
  m.impl("sparse_attention", &sparse_attention_cuda);
  m.impl("sparse_attention_table", &sparse_attention_table_cuda);
  m.impl("sparse_attention_paged", &sparse_attention_paged_cuda);
  m.impl("decode_step_state_bytes", &decode_step_state_bytes_cuda);
  m.impl("decode_step_prefill", &decode_step_prefill_cuda);
  m.impl("decode_step", &decode_step_cuda);
}
