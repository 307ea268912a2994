// The CUDA snippets of the README and docs/cuda.md, compiled as they are printed there (between the
// snippet markers; tests/docs/snippets_test.cpp checks that every ```cpp block is one of these) and
// run on the device: around each, the buffers it assumes and a check that it ran cleanly.
#include <doctest/doctest.h>

#include "cuda/support.cuh"

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include <skim/cuda.cuh>

namespace {

namespace tc = skim::test::cuda;
using skim::bfloat16;

// A decode batch of one sequence (32 query heads, 8 kv heads, head dim 128) on the device.
struct decode_data {
  static constexpr std::int32_t heads_q = 32, heads_kv = 8, dim = 128, max_len = 1500;
  std::int32_t len = 1200;
  tc::buffer<std::int32_t> cu_q, cu_kv;
  tc::buffer<std::uint32_t> error{1};
  tc::buffer<bfloat16> k, v, q, o;

  decode_data() : cu_q(std::vector<std::int32_t>{0, 1}), cu_kv(std::vector<std::int32_t>{0, 1200}) {
    std::mt19937 rng(1500);
    std::normal_distribution<float> normal;
    const auto random = [&](std::size_t n) {
      std::vector<bfloat16> x(n);
      for (bfloat16& e : x) e = bfloat16::from_float(normal(rng));
      return tc::buffer<bfloat16>(x);
    };
    k = random(std::size_t(max_len) * heads_kv * dim);
    v = random(std::size_t(max_len) * heads_kv * dim);
    q = random(std::size_t(heads_q) * dim);
    o = tc::buffer<bfloat16>(std::size_t(heads_q) * dim);
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof(std::uint32_t)));
  }
  void grow() {
    ++len;
    cu_kv.upload({0, len});
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());  // a pageable copy may return before it lands
  }
  [[nodiscard]] bool output_finite() const {
    for (const bfloat16 x : o.download()) {
      if (!std::isfinite(x.to_float())) return false;
    }
    return true;
  }
};

// docs/cuda.md, "Device indices": the one read interface of every device index.
template <class Index>
__device__ std::int32_t count_ids(const Index& index, std::int64_t row, const skim::cuda::device_row& geometry) {
  std::int32_t n = 0;
  const auto use = [&](std::int32_t) { ++n; };
  // snippet begin
  for (auto c = index.cursor(row, geometry); !c.done(); c.next()) use(c.id());
  // snippet end
  return n;
}
__global__ void count_window(std::int32_t* out) {
  skim::cuda::device_row geometry{};
  geometry.visible_blocks = 10;
  *out = count_ids(skim::cuda::make_device_union(skim::cuda::device_sink{2}, skim::cuda::device_sliding_window{3}), 0,
                   geometry);
}

// README: the routed decode step through the facade.
skim::status readme_step(const skim::cuda::device_problem& prob, const skim::cuda::device_paged_kv<bfloat16>& kv,
                         skim::cuda::device_view<const bfloat16> q, skim::cuda::device_view<bfloat16> o,
                         cudaStream_t stream, std::byte*& memory) {
  // snippet begin
  skim::cuda::decode_step<skim::bfloat16> gpu_step;           // multi_centroid<2> summaries
  const skim::cuda::decode_step_config config{.prob = prob, .top_k = 64};
  cudaMalloc(&memory, gpu_step.device_bytes(config));         // once
  SKIM_TRY(gpu_step.plan(config, {memory, gpu_step.device_bytes(config)}));
  SKIM_TRY(gpu_step.prefill(kv, stream));                     // after prefill
  SKIM_TRY(gpu_step.run(q, kv, o, nullptr, stream));          // each token, or once in a CUDA graph
  // snippet end
  return skim::status::success();
}

}  // namespace

TEST_CASE("docs small: the device cursor loop walks a sink and a window") {
  tc::buffer<std::int32_t> out(1);
  count_window<<<1, 1>>>(out.data());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(out.download()[0] == 5);
}

TEST_CASE("docs small: the README's decode step runs through the facade") {
  decode_data d;
  // One page per 16 tokens, in order: a paged view of the same cache.
  const std::int32_t pages = decode_data::max_len / 16 + 1;
  std::vector<std::int32_t> indices(static_cast<std::size_t>(pages));
  for (std::int32_t i = 0; i < pages; ++i) indices[static_cast<std::size_t>(i)] = i;
  tc::buffer<std::int32_t> indptr(std::vector<std::int32_t>{0, pages}), page_indices(indices);
  tc::buffer<bfloat16> k_pages(std::size_t(pages) * 16 * decode_data::heads_kv * decode_data::dim),
      v_pages(k_pages.size());
  SKIM_CUDA_REQUIRE(cudaMemcpy(k_pages.data(), d.k.data(), d.k.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
  SKIM_CUDA_REQUIRE(cudaMemcpy(v_pages.data(), d.v.data(), d.v.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
  const std::int64_t ts = std::int64_t(decode_data::heads_kv) * decode_data::dim;
  const skim::cuda::device_paged_kv<bfloat16> kv{
      .k_pages = k_pages.data(), .v_pages = v_pages.data(), .num_pages = pages, .page_size = 16,
      .page_stride = ts * 16, .token_stride = ts, .head_stride = decode_data::dim, .page_indptr = indptr.data(),
      .page_indices = page_indices.data()};
  const skim::cuda::device_problem prob{
      .batch = 1, .heads_q = decode_data::heads_q, .heads_kv = decode_data::heads_kv, .head_dim = decode_data::dim,
      .block_q = 1, .block_kv = skim::defaults::block_kv, .cu_seqlens_q = d.cu_q.data(), .cu_seqlens_kv = d.cu_kv.data(),
      .max_seqlen_q = 1, .max_seqlen_kv = decode_data::max_len, .error = d.error.data()};
  std::byte* memory = nullptr;
  const skim::status st = readme_step(
      prob, kv, skim::cuda::device_view<const bfloat16>::token_major(d.q.data(), decode_data::heads_q, decode_data::dim),
      skim::cuda::device_view<bfloat16>::token_major(d.o.data(), decode_data::heads_q, decode_data::dim), nullptr,
      memory);
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  if (memory != nullptr) SKIM_CUDA_REQUIRE(cudaFree(memory));
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(skim::cuda::read_device_error(d.error.data(), nullptr).ok());
  CHECK(d.output_finite());
}

TEST_CASE("docs small: docs/cuda.md's decode steps run (facade in a graph, parts, routed table)") {
  decode_data d;
  namespace sc = skim::cuda;
  const std::int32_t B = 1, max_len = decode_data::max_len;
  const std::int32_t* d_cu_q = d.cu_q.data();
  const std::int32_t* d_cu_kv = d.cu_kv.data();
  std::uint32_t* d_error_word = d.error.data();
  const bfloat16* d_k = d.k.data();
  const bfloat16* d_v = d.v.data();
  const auto q_view = sc::device_view<const bfloat16>::token_major(d.q.data(), 32, 128);
  const auto o_view = sc::device_view<bfloat16>::token_major(d.o.data(), 32, 128);
  cudaStream_t stream = nullptr;
  SKIM_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;

  SUBCASE("the facade, captured in a graph") {
    const auto run = [&](std::byte* d_memory, std::size_t bytes) -> skim::status {
      // snippet begin
      const sc::device_problem prob{.batch = B, .heads_q = 32, .heads_kv = 8, .head_dim = 128, .block_q = 1,
                                    .block_kv = 4, .cu_seqlens_q = d_cu_q, .cu_seqlens_kv = d_cu_kv,
                                    .max_seqlen_q = 1, .max_seqlen_kv = max_len, .error = d_error_word};
      const sc::device_contiguous_kv<skim::bfloat16> kv{.k = d_k, .v = d_v, .token_stride = 8 * 128, .head_stride = 128};
      sc::decode_step<skim::bfloat16> step;   // skim::defaults: multi_centroid<2> summaries, sum, sink 1, local 8
      const sc::decode_step_config config{.prob = prob, .top_k = 256};  // + the top 256 blocks of 4 keys
      SKIM_TRY(step.plan(config, {d_memory, step.device_bytes(config)}));  // d_memory: cudaMalloc'd once
      SKIM_TRY(step.prefill(kv, stream));                                    // after prefill

      cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);  // one step: no sync, no allocation
      const skim::status captured = step.run(q_view, kv, o_view, nullptr, stream);
      cudaStreamEndCapture(stream, &graph);
      SKIM_TRY(captured);
      // every token: write K/V and cu_seqlens_kv on the device, then cudaGraphLaunch(graph_exec, stream);
      // now and then: sc::read_device_error(d_error_word, stream) turns bad device content into a status.
      // snippet end
      REQUIRE(bytes >= step.device_bytes(config));
      return skim::status::success();
    };
    const sc::device_problem sizing{.batch = B, .heads_q = 32, .heads_kv = 8, .head_dim = 128, .block_q = 1,
                                    .block_kv = 4, .cu_seqlens_q = d_cu_q, .cu_seqlens_kv = d_cu_kv,
                                    .max_seqlen_q = 1, .max_seqlen_kv = max_len, .error = d_error_word};
    const std::size_t bytes = sc::decode_step<bfloat16>::device_bytes({.prob = sizing, .top_k = 256});
    REQUIRE(bytes > 0);
    REQUIRE(sc::decode_step<bfloat16>::device_bytes({.prob = sizing, .top_k = -1}) == 0);  // refused: no size
    tc::buffer<std::byte> memory(bytes);
    const skim::status st = run(memory.data(), bytes);
    REQUIRE_MESSAGE(st.ok(), st.message());
    cudaGraphExec_t graph_exec = nullptr;
    SKIM_CUDA_REQUIRE(cudaGraphInstantiate(&graph_exec, graph, 0));
    for (int token = 0; token < 3; ++token) {
      d.grow();  // the new key: its K/V rows are already in the cache, cu_seqlens_kv counts it
      SKIM_CUDA_REQUIRE(cudaGraphLaunch(graph_exec, stream));
      CHECK(sc::read_device_error(d_error_word, stream).ok());
    }
    SKIM_CUDA_REQUIRE(cudaGraphExecDestroy(graph_exec));
    SKIM_CUDA_REQUIRE(cudaGraphDestroy(graph));
    CHECK(d.output_finite());
  }

  SUBCASE("the parts, and decode selecting as it reads") {
    const sc::device_problem prob{.batch = B, .heads_q = 32, .heads_kv = 8, .head_dim = 128, .block_q = 1,
                                  .block_kv = 16, .cu_seqlens_q = d_cu_q, .cu_seqlens_kv = d_cu_kv,
                                  .max_seqlen_q = 1, .max_seqlen_kv = max_len, .error = d_error_word};
    const sc::device_contiguous_kv<bfloat16> kv{.k = d_k, .v = d_v, .token_stride = 8 * 128, .head_stride = 128};
    const std::size_t records = std::size_t(prob.max_kv_blocks()) * 8 * 128;
    tc::buffer<bfloat16> lo(records), hi(records);
    tc::buffer<std::int32_t> ids(std::size_t(8) * prob.max_kv_blocks()), count(8);
    bfloat16* d_lo = lo.data();
    bfloat16* d_hi = hi.data();
    std::int32_t* d_ids = ids.data();
    std::int32_t* d_count = count.data();
    tc::buffer<std::byte> route_memory(std::size_t(8) * (prob.max_kv_blocks() * 4 + 2048));  // scores, candidates
    tc::buffer<std::byte> decode_memory(std::size_t(1) << 22);
    const std::span<std::byte> route_ws = route_memory.bytes(route_memory.size());
    const std::span<std::byte> decode_ws = decode_memory.bytes(decode_memory.size());
    const auto parts = [&]() -> skim::status {
      // snippet begin
      using kv_t = sc::device_contiguous_kv<skim::bfloat16>;
      const sc::device_max_bound<skim::bfloat16> sums{.lo = d_lo, .hi = d_hi, .max_kv_blocks = prob.max_kv_blocks()};
      sc::decode_router router;                                   // skim::defaults: reduce sum, sink 1, local 8
      router.selector.dynamic.k = 13;                             // + the top 13
      const sc::mutable_device_block_table table{.ids = d_ids, .count = d_count, .width = router.width(prob),
                                                 .rows = B * 8};
      const sc::decode attend;                                    // tensor cores where available
      // workspaces: route_ws of router.workspace_bytes(prob), decode_ws of attend.workspace_bytes(prob, table.width)
      SKIM_TRY(sc::build(prob, kv, sums, stream));                // after prefill
      // each token: the new key into its block's summary, score, select (one launch with kv), attend
      const sc::decode_route_args<skim::bfloat16, skim::bfloat16> route{
          .prob = prob, .q = q_view, .summaries = sums, .index = table};
      SKIM_TRY(router.run(route, kv, route_ws, stream));
      const sc::device_attention_args<skim::bfloat16, kv_t, sc::device_block_table, skim::bfloat16> args{
          .prob = prob, .q = q_view, .kv = kv, .index = table, .o = o_view};
      SKIM_TRY(attend.run(args, decode_ws, stream));
      // snippet end
      REQUIRE(route_ws.size() >= router.workspace_bytes(prob));
      REQUIRE(decode_ws.size() >= attend.workspace_bytes(prob, table.width));
      // snippet begin
      // Or two launches: the router scores, each score CTA keeping its tile's best candidates, and
      // decode selects each row among them as it reads it.
      sc::device_routed_table routed;                             // the table, the candidates, the selection
      SKIM_TRY(router.score_routed(route, kv, route_ws, routed, stream));
      const sc::device_attention_args<skim::bfloat16, kv_t, sc::device_routed_table, skim::bfloat16> fused{
          .prob = prob, .q = q_view, .kv = kv, .index = routed, .o = o_view};
      SKIM_TRY(attend.run(fused, decode_ws, stream));
      // snippet end
      return skim::status::success();
    };
    const skim::status st = parts();
    REQUIRE_MESSAGE(st.ok(), st.message());
    CHECK(sc::read_device_error(d_error_word, stream).ok());
    CHECK(d.output_finite());
  }

  SUBCASE("a routed prefill over a union, never materialised") {
    const std::int32_t n = 512, k = 2, rows = 4 * 8;  // 4 query blocks of 128, kv-head rows
    tc::buffer<std::int32_t> cu(std::vector<std::int32_t>{0, n});
    std::vector<std::int32_t> host_ids(std::size_t(rows) * k), host_count(std::size_t(rows), 1);
    for (std::int32_t r = 0; r < rows; ++r) host_ids[std::size_t(r) * k] = (r / 8) / 2;  // a visible block
    tc::buffer<std::int32_t> ids(host_ids), count(host_count);
    const std::int32_t* d_ids = ids.data();
    const std::int32_t* d_count = count.data();
    tc::buffer<float> out(std::size_t(n) * 32 * 128);
    const sc::device_problem p{.batch = 1, .heads_q = 32, .heads_kv = 8, .head_dim = 128, .block_q = 128,
                               .block_kv = 64, .cu_seqlens_q = cu.data(), .cu_seqlens_kv = cu.data(),
                               .max_seqlen_q = n, .max_seqlen_kv = n, .error = d_error_word};
    tc::buffer<bfloat16> queries(std::size_t(n) * 32 * 128);  // the cache's values as queries: 1.5 M, then 0.5 M again
    SKIM_CUDA_REQUIRE(cudaMemcpy(queries.data(), d.k.data(), d.k.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
    SKIM_CUDA_REQUIRE(cudaMemcpy(queries.data() + d.k.size(), d.k.data(), (queries.size() - d.k.size()) * sizeof(bfloat16),
                                 cudaMemcpyDeviceToDevice));
    const auto q = sc::device_view<const bfloat16>::token_major(queries.data(), 32, 128);
    const sc::device_contiguous_kv<bfloat16> kv{.k = d_k, .v = d_v, .token_stride = 8 * 128, .head_stride = 128};
    const auto o = sc::device_view<float>::token_major(out.data(), 32, 128);
    const auto prefill = [&]() -> skim::status {
      // snippet begin
      namespace sc = skim::cuda;
      sc::device_block_table routed{.ids = d_ids, .count = d_count, .width = k, .rows = rows};
      const auto index = sc::make_device_union(routed, sc::device_sink{1}, sc::device_sliding_window{4});
      sc::device_attention_args<skim::bfloat16, sc::device_contiguous_kv<skim::bfloat16>,
                                std::remove_const_t<decltype(index)>, float>
          args{.prob = p, .q = q, .kv = kv, .index = index, .o = o};
      SKIM_TRY(skim::cuda::prefill{}.run(args, {}, stream));
      // StreamingLLM-style attention (sink + window alone): make_device_union(sc::device_sink{1}, sc::device_sliding_window{8});
      // dense causal attention: sc::device_causal_all{}. cuda::decode takes the same indices.
      // snippet end
      return skim::status::success();
    };
    const skim::status st = prefill();
    REQUIRE_MESSAGE(st.ok(), st.message());
    CHECK(sc::read_device_error(d_error_word, stream).ok());
    for (const float x : out.download()) REQUIRE(std::isfinite(x));
  }
  SKIM_CUDA_REQUIRE(cudaStreamDestroy(stream));
}
