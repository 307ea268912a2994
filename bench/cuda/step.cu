// skim_bench_cuda's `step` mode (runner.cu has the usage and method): a whole routed decode step,
// captured in a CUDA graph. Its own translation unit, so that it builds beside runner.cu's decode and
// prefill.
#include "runner.cuh"

using namespace skim_bench;

namespace {

// One whole sparse decode step on the device, captured in a CUDA graph and timed by replays:
// append the newest token's key to its block summary, score every block, select sink + local + top-k
// (16 blocks of bk per kv head by default), and attend over them. K/V of the new token are taken as
// already written (the engine's cache write); replaying an append of the same token is idempotent.
// Paged: K/V (read by the summaries' build, the append and decode) through decode_batch::paged.
// Code != T: 8-bit codes with a scale per (block, kv head) (--kv fp8|int8). TS: the summaries' element
// (K's own type, exact for min/max, or float).
template <class T, class Code = T, class TS = Code, bool Paged = false>
int step_of(const options& o) {
  if (!std::is_same_v<T, Code> && o.share) return refuse(o, "--share with --kv fp8|int8: not built in this runner");
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const decode_batch<T> d(o);
  const skim::cuda::device_problem& p = d.prob;
  const decode_kv<T, Code> codes(o, d);
  const auto kv = [&] {
    if constexpr (std::is_same_v<T, Code>) return d.template source<Paged>(o);
    else return codes.source(o, d);
  }();
  using kv_t = std::remove_const_t<decltype(kv)>;
  const std::size_t records = std::size_t(o.batch) * kv_blocks * o.heads_kv;
  device_array<TS> lo(records * o.dim), hi(lo.n);
  device_array<float> scale(skim::cuda::is_device_code_v<TS> ? records : 0);
  const skim::cuda::device_max_bound<TS> sums{.lo = lo.p, .hi = hi.p, .max_kv_blocks = kv_blocks, .scale = scale.p};
  if (const skim::status s = skim::cuda::build(p, kv, sums, nullptr); !s.ok()) return refuse(o, s.message());

  skim::cuda::decode_router router;
  router.selector.sink = 1;
  router.selector.local = 2;
  router.selector.dynamic.k = std::max(0, o.blocks - 3);
  router.share_heads = o.share != 0;  // one selection per sequence, read by every kv head
  if (const skim::status s = router.can_implement(p); !s.ok()) return refuse(o, s.message());
  const int width = router.width(p);
  const std::int64_t rows = std::int64_t(o.batch) * (o.share ? 1 : o.heads_kv);
  device_array<std::int32_t> ids{std::size_t(rows) * width}, count{std::size_t(rows)};
  const skim::cuda::mutable_device_block_table table{.ids = ids.p, .count = count.p, .width = width, .rows = rows};
  device_array<std::byte> route_ws(router.workspace_bytes(p));
  const std::span<std::byte> route_span(route_ws.p, route_ws.n);

  const skim::cuda::decode exec = decode_of(o);
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p, width);
  device_array<std::byte> ws(ws_bytes);
  using args_t = skim::cuda::device_attention_args<T, kv_t, skim::cuda::device_block_table, T>;
  const args_t a{.prob = p,
                 .q = d.q_view(o),
                 .kv = kv,
                 .index = table,
                 .o = d.o_view(o)};
  const skim::cuda::decode_route_args<T, TS> ra{.prob = p, .q = a.q, .summaries = sums, .index = table};
  // --fuse-select 1 or 2 (not with --share): decode selects each row where it reads it and writes the
  // same table; the router only scores (1: decode_router::routed, decode selects from the scores) or
  // scores and keeps each tile's best candidates (2: decode_router::score_routed, decode selects among
  // them; skim::cuda::decode_step's form).
  const int fuse_select = o.share ? 0 : o.fuse_select;
  const std::span<float> scores = router.scores_in(route_span, p);
  skim::cuda::device_routed_table routed;
  const auto score_status = [&](cudaStream_t st) {  // the score launch of modes 1 and 2
    skim::cuda::device_routed_table kept;
    if (fuse_select == 2) {
      return o.fuse_append ? router.score_routed(ra, kv, route_span, kept, st) : router.score_routed(ra, route_span, kept, st);
    }
    return o.fuse_append ? router.score(ra, kv, scores, st) : router.score(ra, scores, st);
  };
  if (fuse_select != 0) {
    const skim::status s = fuse_select == 2 ? router.score_routed(ra, route_span, routed, nullptr)
                                            : router.routed(p, scores, table, routed);
    if (!s.ok()) return refuse(o, s.message());
  }
  const skim::cuda::device_attention_args<T, kv_t, skim::cuda::device_routed_table, T> ar{
      .prob = p, .q = a.q, .kv = kv, .index = routed, .o = a.o};
  const auto attend_status = [&](cudaStream_t st) {
    if constexpr (std::is_same_v<T, Code>) {  // shared selections: 16-bit K/V only (fewer kernels to build)
      using shared_t = skim::cuda::device_head_shared<skim::cuda::device_block_table>;
      const skim::cuda::device_attention_args<T, kv_t, shared_t, T> as{
          .prob = p, .q = a.q, .kv = kv, .index = shared_t{table, p.index_heads()}, .o = a.o};
      if (o.share) return exec.run(as, std::span<std::byte>(ws.p, ws_bytes), st);
    }
    if (fuse_select != 0) return exec.run(ar, std::span<std::byte>(ws.p, ws_bytes), st);
    return exec.run(a, std::span<std::byte>(ws.p, ws_bytes), st);
  };

  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto append_status = [&](cudaStream_t st) {  // its own launch, or nothing: the router appends
    return o.fuse_append ? skim::status::success() : skim::cuda::append_newest(p, kv, sums, st);
  };
  const auto route_status = [&](cudaStream_t st) {
    if (fuse_select != 0) return score_status(st);
    return o.fuse_append ? router.run(ra, kv, route_span, st) : router.run(ra, route_span, st);
  };
  // One checked step first: a shape a stage rejects is reported as a JSON line, not a crash.
  skim::status checked = append_status(stream);
  if (checked.ok()) checked = route_status(stream);
  if (checked.ok()) checked = attend_status(stream);
  if (!checked.ok()) return refuse(o, checked.message());
  BENCH_CHECK(cudaStreamSynchronize(stream));
  const auto append = [&](cudaStream_t st) { BENCH_STATUS(append_status(st)); };
  const auto route = [&](cudaStream_t st) { BENCH_STATUS(route_status(st)); };
  const auto attend = [&](cudaStream_t st) { BENCH_STATUS(attend_status(st)); };
  const auto step = [&](cudaStream_t st) {
    append(st);
    route(st);
    attend(st);
  };
  cudaGraph_t graph;
  cudaGraphExec_t graph_exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step(stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&graph_exec, graph, 0));

  // Stage times (uncaptured launches, events around each), then the graph.
  cudaEvent_t e[4];
  for (auto& ev : e) BENCH_CHECK(cudaEventCreate(&ev));
  std::vector<float> t_append, t_route, t_attend;
  for (int rep = 0; rep < o.reps + 3; ++rep) {
    BENCH_CHECK(cudaEventRecord(e[0], stream));
    append(stream);
    BENCH_CHECK(cudaEventRecord(e[1], stream));
    route(stream);
    BENCH_CHECK(cudaEventRecord(e[2], stream));
    attend(stream);
    BENCH_CHECK(cudaEventRecord(e[3], stream));
    BENCH_CHECK(cudaEventSynchronize(e[3]));
    if (rep < 3) continue;
    float x;
    BENCH_CHECK(cudaEventElapsedTime(&x, e[0], e[1]));
    t_append.push_back(x);
    BENCH_CHECK(cudaEventElapsedTime(&x, e[1], e[2]));
    t_route.push_back(x);
    BENCH_CHECK(cudaEventElapsedTime(&x, e[2], e[3]));
    t_attend.push_back(x);
  }
  const auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<float> t_graph;
  for (int rep = 0; rep < o.reps + 3; ++rep) {
    BENCH_CHECK(cudaEventRecord(e[0], stream));
    BENCH_CHECK(cudaGraphLaunch(graph_exec, stream));
    BENCH_CHECK(cudaEventRecord(e[1], stream));
    BENCH_CHECK(cudaEventSynchronize(e[1]));
    float x;
    BENCH_CHECK(cudaEventElapsedTime(&x, e[0], e[1]));
    if (rep >= 3) t_graph.push_back(x);
  }
  // The same stages with reps steps back to back in one graph (time_graph: as decode's graph_ms), and
  // the score kernel and the routing alone that way: what a step costs inside an engine's captured
  // forward pass, where no graph launch of its own precedes it.
  const double g_step = time_graph(o.reps, [&](int, cudaStream_t st) { step(st); });
  const double g_route = time_graph(o.reps, [&](int, cudaStream_t st) { append(st), route(st); });
  const double g_score = time_graph(o.reps, [&](int, cudaStream_t st) { BENCH_STATUS(score_status(st)); });
  std::printf("{\"bench\": \"step\", \"impl\": \"skim\", \"batch\": %d, \"n\": %d, \"blocks\": %d, \"ms\": %.5f, "
              "\"append_ms\": %.5f, \"route_ms\": %.5f, \"attend_ms\": %.5f, \"graph_ms\": %.5f, "
              "\"graph_route_ms\": %.5f, \"graph_score_ms\": %.5f, \"kernel\": \"%s\", "
              "\"layout\": \"%s\", \"fuse_append\": %d, \"chunk_blocks\": %d, \"cluster_merge\": %d, \"share\": %d, \"fuse_select\": %d, "
              "\"kv\": \"%s\", \"summaries\": \"%s\", %s}\n",
              o.batch, o.n, width, median(t_graph), median(t_append), median(t_route), median(t_attend),
              g_step, g_route, g_score, o.kernel.c_str(), o.layout.c_str(), o.fuse_append,
              exec.chunk(p, width, skim::cuda::is_device_code_v<Code>), o.cluster_merge, o.share, fuse_select,
              o.kv.c_str(), std::is_same_v<TS, float> ? "float" : o.kv == "same" ? o.dtype.c_str() : o.kv.c_str(),
              shape_fields(o).c_str());
  for (auto& ev : e) cudaEventDestroy(ev);
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int skim_bench::run_step(const options& o) {
  const bool bf16 = o.dtype == "bf16";
  if (o.page > 0) {
    return bf16 ? step_of<skim::bfloat16, skim::bfloat16, skim::bfloat16, true>(o)
                : step_of<skim::half, skim::half, skim::half, true>(o);
  }
  if (o.summaries != "kv" && o.summaries != "float") {
    std::fprintf(stderr, "--summaries %s: kv or float\n", o.summaries.c_str());
    return 2;
  }
  // Fewer variants than decode's (each builds its own decode kernels): codes under bf16 Q, float
  // summaries over codes only.
  const bool f = o.summaries == "float";
  if (o.kv == "fp8" || o.kv == "int8") {
    if (!bf16) return refuse(o, "step over --kv fp8|int8: --dtype bf16 only in this runner");
    if (o.kv == "fp8") return f ? step_of<skim::bfloat16, skim::fp8_e4m3, float>(o) : step_of<skim::bfloat16, skim::fp8_e4m3>(o);
    return f ? step_of<skim::bfloat16, std::int8_t, float>(o) : step_of<skim::bfloat16, std::int8_t>(o);
  }
  if (o.kv != "same") {
    std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
    return 2;
  }
  if (f) return refuse(o, "--summaries float: over --kv fp8|int8 only in this runner");
  return bf16 ? step_of<skim::bfloat16>(o) : step_of<skim::half>(o);
}
