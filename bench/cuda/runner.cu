// skim_bench_cuda: times skim's CUDA executors on one shape and prints one JSON line per result.
// bench/cuda/compare.py runs it next to PyTorch's peers (SDPA cuDNN and flash, FlexAttention with
// the same block mask) and prints the table; scripts/cuda runs both on the GPU machine.
//
//   skim_bench_cuda decode  --batch 8 --n 131072 --blocks 16   (--blocks 0: every block, dense)
//   skim_bench_cuda prefill --n 32768 --blocks 16              (--blocks 0: every causal block)
//   skim_bench_cuda step    --batch 8 --n 131072 --blocks 16   (append + route + decode, one CUDA graph;
//                                                               --fuse-append 0: append in its own launch;
//                                                               graph_ms: reps steps back to back in one graph;
//                                                               --share 1: one selection per sequence for all
//                                                               its kv heads, decode over device_head_shared;
//                                                               --fuse-select 2: the score kernel keeps each
//                                                               tile's best candidates, decode selects its
//                                                               rows among them (the default); 1: decode
//                                                               selects from the scores; 0: the router's
//                                                               select kernel)
//   common: --heads-q 32 --heads-kv 8 --dim 128 --bk 128 --bq 128 --dtype bf16|fp16
//           --layout hnd|nhd (K/V head-major [heads_kv, tokens, dim], as the PyTorch peers hold them,
//           or token-major [tokens, heads_kv, dim]; printed as "layout")
//           --sets 4 (index sets rotated between timed runs) --reps 50 --index-out FILE
//   decode, prefill, step: --kv same|fp8|int8 (K/V in Q's type, or 8-bit codes with a scale per block
//           and kv head; printed as "kv"; decode's rate counts the codes' bytes and the scales')
//   step: --summaries kv|float (max_bound records in K's own type, 16-bit or codes, the default; or,
//           over codes, float; printed as "summaries"); codes under --dtype bf16, without --share
//   decode, step: --kernel simt|mma|auto (decode's split kernel: CUDA cores, tensor cores, or the
//           executor's choice; printed as "kernel" in the JSON line) --chunk-blocks C (printed as
//           "chunk_blocks": the executor's choice when 0) --cluster-merge 0|1 (decode::merge_in_cluster)
//   decode, step: --page P (0, the default: contiguous K/V; P > 0: skim's paged source, pages of P
//           tokens over a pool whose page table is a random permutation, so a sequence's pages are
//           scattered; --layout within a page; 16-bit K/V only); --pages 0,16,64: one run (one line)
//           per page size in one process
//   prefill: --kernel mma|wgmma|auto (cuda::prefill's kernel: mma.sync, wgmma on sm_90a, or
//           the executor's choice, the default; printed as "kernel" in the JSON line)
//
// Method (docs/design.md §12): random inputs (never zeros), a warm-up, device events around each run, the
// median over reps (decode also prints graph_ms: reps launches back to back in one CUDA graph, per
// launch, as an engine's captured decode step runs them); each rep uses the next of --sets random index sets over the same K/V, so the
// selected bytes of one rep are not left in L2 by the previous one. --index-out writes the index
// sets (int32, [sets, rows, blocks]) so compare.py builds FlexAttention's mask from the same ids.
// Rates: decode counts the selected K+V bytes read once; prefill counts 4·pairs·head_dim·heads_q
// over the (causally) visible pairs of the selected blocks.
// Decode and step lines end with the shape: heads_q, heads_kv, dim, bk, page, dtype. A shape or a
// run the executor refuses prints one line with "error" (the status message) and exits with 3.
//
// The shape sweep (batch 1..64, head_dim 64 and 128, GQA 1/4/8, paged K/V with pages of 16 and 64,
// each against SDPA cuDNN / flash and FlexAttention) is compare.py's --only sweep:
//   python3 bench/cuda/compare.py --runner build/cuda-device/skim_bench_cuda --out OUT --only sweep [--quick]
//   SKIM_CUDA_BENCH_ARGS='--only sweep' scripts/cuda bench
#include "runner.cuh"

using namespace skim_bench;

namespace {

options parse(int argc, char** argv) {
  options o;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s decode|prefill [--batch B] [--n N] [--blocks K] ...\n", argv[0]);
    std::exit(2);
  }
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--batch") o.batch = std::atoi(v);
    else if (k == "--n") o.n = std::atoi(v);
    else if (k == "--heads-q") o.heads_q = std::atoi(v);
    else if (k == "--heads-kv") o.heads_kv = std::atoi(v);
    else if (k == "--dim") o.dim = std::atoi(v);
    else if (k == "--bq") o.bq = std::atoi(v);
    else if (k == "--bk") o.bk = std::atoi(v);
    else if (k == "--blocks") o.blocks = std::atoi(v);
    else if (k == "--sets") o.sets = std::atoi(v);
    else if (k == "--reps") o.reps = std::atoi(v);
    else if (k == "--chunk-blocks") o.chunk_blocks = std::atoi(v);
    else if (k == "--dtype") o.dtype = v;
    else if (k == "--kernel") o.kernel = v;
    else if (k == "--layout") o.layout = v;
    else if (k == "--kv") o.kv = v;
    else if (k == "--summaries") o.summaries = v;
    else if (k == "--fuse-append") o.fuse_append = std::atoi(v);
    else if (k == "--cluster-merge") o.cluster_merge = std::atoi(v);
    else if (k == "--share") o.share = std::atoi(v);
    else if (k == "--fuse-select") o.fuse_select = std::atoi(v);
    else if (k == "--index-out") o.index_out = v;
    else if (k == "--page") o.page = std::atoi(v);
    else if (k == "--pages") o.pages = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

void write_index(const options& o, const std::vector<std::int32_t>& ids) {
  if (o.index_out.empty()) return;
  FILE* f = std::fopen(o.index_out.c_str(), "wb");
  if (f == nullptr || std::fwrite(ids.data(), sizeof(std::int32_t), ids.size(), f) != ids.size()) {
    std::fprintf(stderr, "cannot write %s\n", o.index_out.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

// `k` distinct sorted ids from [0, visible), always including the last one (the query's own block,
// as a local branch would); all of them when visible <= k.
void pick_blocks(std::mt19937& rng, int visible, int k, std::int32_t* out) {
  if (visible <= k) {
    std::iota(out, out + visible, 0);
    return;
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(visible - 1));
  std::iota(all.begin(), all.end(), 0);
  for (int i = 0; i < k - 1; ++i) {
    std::uniform_int_distribution<int> d(i, visible - 2);
    std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(d(rng))]);
  }
  std::sort(all.begin(), all.begin() + (k - 1));
  std::copy(all.begin(), all.begin() + (k - 1), out);
  out[k - 1] = visible - 1;
}

// Paged: K/V read through decode_batch::paged (--page P), else contiguous or quantised (--kv).
template <class T, class Code = T, bool Paged = false>
int run_decode(const options& o) {
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const bool dense = o.blocks <= 0;
  const int width = dense ? kv_blocks : std::min(o.blocks, kv_blocks);
  const int sets = dense ? 1 : o.sets;
  const std::int64_t rows = std::int64_t(o.batch) * o.heads_kv;

  std::vector<std::int32_t> ids(std::size_t(sets) * rows * width), count(std::size_t(rows), width);
  std::mt19937 rng(1234);
  for (int s = 0; s < sets; ++s)
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int32_t* row = ids.data() + (std::size_t(s) * rows + r) * width;
      if (dense) std::iota(row, row + width, 0);
      else pick_blocks(rng, kv_blocks, width, row);
    }
  write_index(o, ids);

  const decode_batch<T> d(o);
  const decode_kv<T, Code> kv(o, d);
  const skim::cuda::device_problem& p = d.prob;
  device_array<std::int32_t> d_ids(ids.size()), d_count(count.size());
  d_ids.upload(ids);
  d_count.upload(count);

  const skim::cuda::decode exec = decode_of(o);
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p, width);
  device_array<std::byte> ws(ws_bytes);
  const auto source = [&] {
    if constexpr (Paged) return d.paged(o);
    else return kv.source(o, d);
  };
  using args_t = skim::cuda::device_attention_args<T, decltype(source()), skim::cuda::device_block_table, T>;
  const auto args = [&](int rep) {
    return args_t{.prob = p,
                  .q = d.q_view(o),
                  .kv = source(),
                  .index = {.ids = d_ids.p + std::size_t(rep % sets) * rows * width, .count = d_count.p, .width = width,
                            .rows = rows},
                  .o = d.o_view(o)};
  };
  // One checked run first: a shape run() rejects is reported as a JSON line, not a crash.
  if (const skim::status s = exec.run(args(0), std::span<std::byte>(ws.p, ws_bytes), nullptr); !s.ok()) {
    return refuse(o, s.message());
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  const auto run = [&](int rep, cudaStream_t stream) {
    BENCH_STATUS(exec.run(args(rep), std::span<std::byte>(ws.p, ws_bytes), stream));
  };
  const double ms = time_median(o.reps, run);
  const double graph_ms = time_graph(o.reps, run);
  const bool quantized = !std::is_same_v<T, Code>;
  const double bytes = 2.0 * double(rows) * width * (double(o.bk) * o.dim * sizeof(Code) + (quantized ? 4.0 : 0.0));
  std::printf("{\"bench\": \"decode\", \"impl\": \"skim\", \"batch\": %d, \"n\": %d, \"blocks\": %d, \"ms\": %.5f, "
              "\"bytes\": %.0f, \"tb_per_s\": %.3f, \"graph_ms\": %.5f, \"graph_tb_per_s\": %.3f, \"kernel\": \"%s\", "
              "\"layout\": \"%s\", \"chunk_blocks\": %d, \"cluster_merge\": %d, \"kv\": \"%s\", %s}\n",
              o.batch, o.n, dense ? 0 : width, ms, bytes, bytes / ms * 1e-9, graph_ms, bytes / graph_ms * 1e-9,
              o.kernel.c_str(), o.layout.c_str(), exec.chunk(p, width, quantized), o.cluster_merge, o.kv.c_str(),
              shape_fields(o).c_str());
  return 0;
}

skim::cuda::prefill_kernel prefill_kernel_of(const options& o) {
  if (o.kernel == "mma") return skim::cuda::prefill_kernel::mma_sync;
  if (o.kernel == "wgmma") return skim::cuda::prefill_kernel::wgmma;
  return skim::cuda::prefill_kernel::automatic;
}

// Code = T: K/V in Q's type; else 8-bit codes with a scale per (block, kv head) (--kv fp8|int8).
template <class T, class Code = T>
int run_prefill(const options& o) {
  const int q_blocks = (o.n + o.bq - 1) / o.bq;
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const bool dense = o.blocks <= 0;
  const int width = dense ? kv_blocks : std::min(o.blocks, kv_blocks);
  const int sets = dense ? 1 : o.sets;
  const std::int64_t rows = std::int64_t(q_blocks) * o.heads_kv;  // batch 1, index_scope kv_head

  std::vector<std::int32_t> cu{0, o.n};
  std::vector<std::int32_t> ids(std::size_t(sets) * rows * width, -1), count(std::size_t(sets) * rows);
  std::mt19937 rng(4321);
  double pairs = 0;  // visible (query, key) pairs of the first set, per kv head row
  for (int s = 0; s < sets; ++s)
    for (int i = 0; i < q_blocks; ++i)
      for (int h = 0; h < o.heads_kv; ++h) {
        const std::int64_t r = std::int64_t(i) * o.heads_kv + h;
        // Blocks visible to query block i under bottom-right causality with n_q == n_kv.
        const int q_last = std::min(o.n, (i + 1) * o.bq) - 1;
        const int visible = q_last / o.bk + 1;
        std::int32_t* row = ids.data() + (std::size_t(s) * rows + r) * width;
        const int c = std::min(width, visible);
        if (dense) std::iota(row, row + visible, 0);
        else pick_blocks(rng, visible, c, row);
        count[std::size_t(s) * rows + r] = c;
        if (s == 0) {
          for (int j = 0; j < c; ++j)
            for (int qq = i * o.bq; qq <= q_last; ++qq) {
              const int k0 = row[j] * o.bk, k1 = std::min(o.n, k0 + o.bk);
              pairs += std::max(0, std::min(k1, qq + 1) - k0);
            }
        }
      }
  write_index(o, ids);
  // (count is [sets, rows]; compare.py recomputes counts from the -1 padding.)

  constexpr bool quantized = !std::is_same_v<T, Code>;
  const std::size_t elems = std::size_t(o.n) * o.heads_kv * o.dim;
  device_array<T> q(std::size_t(o.n) * o.heads_q * o.dim), out(std::size_t(o.n) * o.heads_q * o.dim);
  device_array<Code> k(elems), v(elems);
  device_array<float> ks(quantized ? std::size_t(kv_blocks) * o.heads_kv : 1), vs(ks.n);
  fill_random(q, 1);
  if constexpr (quantized) {
    fill_codes(k, 2);
    fill_codes(v, 3);
    const float unit = std::is_same_v<Code, std::int8_t> ? 1.0f / 48.0f : 1.0f / 16.0f;
    fill_scales(ks, unit, 4);
    fill_scales(vs, unit, 5);
  } else {
    fill_random(k, 2);
    fill_random(v, 3);
  }
  const auto source = [&] {
    if constexpr (quantized) {
      return skim::cuda::device_quantized_kv<skim::cuda::device_contiguous_kv<Code>>::per_block(
          kv_of<Code>(o, k.p, v.p, o.n), ks.p, vs.p, kv_blocks, o.heads_kv);
    } else {
      return kv_of<T>(o, k.p, v.p, o.n);
    }
  }();
  device_array<std::int32_t> d_cu(cu.size()), d_ids(ids.size()), d_count(count.size());
  d_cu.upload(cu);
  d_ids.upload(ids);
  d_count.upload(count);
  skim::cuda::device_problem p{.batch = 1, .heads_q = o.heads_q, .heads_kv = o.heads_kv, .head_dim = o.dim,
                               .block_q = o.bq, .block_kv = o.bk, .mask = skim::mask_kind::causal,
                               .cu_seqlens_q = d_cu.p, .cu_seqlens_kv = d_cu.p, .max_seqlen_q = o.n,
                               .max_seqlen_kv = o.n};
  const skim::cuda::prefill exec{.kernel = prefill_kernel_of(o)};
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p);
  device_array<std::byte> ws(ws_bytes);
  using args_t = skim::cuda::device_attention_args<T, std::remove_const_t<decltype(source)>, skim::cuda::device_block_table, T>;
  const auto run = [&](int rep, cudaStream_t stream) {
    const std::size_t s = std::size_t(rep % sets);
    args_t a{.prob = p,
             .q = skim::cuda::device_view<const T>::token_major(q.p, o.heads_q, o.dim),
             .kv = source,
             .index = {.ids = d_ids.p + s * rows * width, .count = d_count.p + s * rows, .width = width, .rows = rows},
             .o = skim::cuda::device_view<T>::token_major(out.p, o.heads_q, o.dim)};
    BENCH_STATUS(exec.run(a, std::span<std::byte>(ws.p, ws_bytes), stream));
  };
  const double ms = time_median(o.reps, run);
  const double flops = 4.0 * pairs * o.dim * (o.heads_q / o.heads_kv);
  std::printf("{\"bench\": \"prefill\", \"impl\": \"skim\", \"n\": %d, \"blocks\": %d, \"ms\": %.5f, \"flops\": %.0f, "
              "\"tflop_per_s\": %.2f, \"kernel\": \"%s\", \"layout\": \"%s\", \"kv\": \"%s\"}\n",
              o.n, dense ? 0 : width, ms, flops, flops / ms * 1e-9, o.kernel.c_str(), o.layout.c_str(), o.kv.c_str());
  return 0;
}


}  // namespace

// One measurement (one JSON line) of o.
int run_one(const options& o) {
  const bool bf16 = o.dtype == "bf16";
  if (!bf16 && o.dtype != "fp16") {
    std::fprintf(stderr, "--dtype %s: bf16 or fp16\n", o.dtype.c_str());
    return 2;
  }
  if (o.layout != "hnd" && o.layout != "nhd") {
    std::fprintf(stderr, "--layout %s: hnd or nhd\n", o.layout.c_str());
    return 2;
  }
  if (o.page < 0) {
    std::fprintf(stderr, "--page %d: 0 (contiguous K/V) or a page size\n", o.page);
    return 2;
  }
  if (o.page > 0 && o.mode != "decode" && o.mode != "step") return refuse(o, "--page: decode and step only");
  if (o.mode == "prefill") {
    if (o.kernel != "mma" && o.kernel != "wgmma" && o.kernel != "auto") {
      std::fprintf(stderr, "--kernel %s: mma, wgmma or auto for prefill\n", o.kernel.c_str());
      return 2;
    }
    if (o.kv == "fp8") return bf16 ? run_prefill<skim::bfloat16, skim::fp8_e4m3>(o) : run_prefill<skim::half, skim::fp8_e4m3>(o);
    if (o.kv == "int8") return bf16 ? run_prefill<skim::bfloat16, std::int8_t>(o) : run_prefill<skim::half, std::int8_t>(o);
    if (o.kv != "same") {
      std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
      return 2;
    }
    return bf16 ? run_prefill<skim::bfloat16>(o) : run_prefill<skim::half>(o);
  }
  if (o.kernel != "simt" && o.kernel != "mma" && o.kernel != "auto") {
    std::fprintf(stderr, "--kernel %s: simt, mma or auto\n", o.kernel.c_str());
    return 2;
  }
  if (o.page > 0 && o.kv != "same") return refuse(o, "--page with --kv fp8|int8: quantised paged K/V not built in this runner");
  if (o.mode == "decode" && o.page > 0) return bf16 ? run_decode<skim::bfloat16, skim::bfloat16, true>(o) : run_decode<skim::half, skim::half, true>(o);
  if (o.mode == "decode") {
    if (o.kv == "fp8") return bf16 ? run_decode<skim::bfloat16, skim::fp8_e4m3>(o) : run_decode<skim::half, skim::fp8_e4m3>(o);
    if (o.kv == "int8") return bf16 ? run_decode<skim::bfloat16, std::int8_t>(o) : run_decode<skim::half, std::int8_t>(o);
    if (o.kv != "same") {
      std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
      return 2;
    }
    return bf16 ? run_decode<skim::bfloat16>(o) : run_decode<skim::half>(o);
  }
  if (o.mode == "step") return run_step(o);  // step.cu
  std::fprintf(stderr, "unknown mode %s\n", o.mode.c_str());
  return 2;
}

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.pages.empty()) return run_one(o);
  // --pages P1,P2,...: one measurement per page size (0: contiguous) in this process, a line each.
  int rc = 0;
  for (std::size_t at = 0; at <= o.pages.size();) {
    const std::size_t end = std::min(o.pages.find(',', at), o.pages.size());
    options one = o;
    one.page = std::atoi(o.pages.substr(at, end - at).c_str());
    rc = std::max(rc, run_one(one));
    std::fflush(stdout);
    at = end + 1;
  }
  return rc;
}
