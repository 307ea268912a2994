// skim-kv-error — what storing K/V as 16-bit floats or 8-bit codes costs in attention accuracy, on a
// model's own Q, K, V.
//
//   skim-kv-error --q Q.npy --k K.npy --v V.npy [--block N] [--layers N] [--threads N]
//   skim-kv-error --self-test DIR [--block N] [--threads N]
//
// Inputs: the layouts skim-eval reads (tensors.hpp): [tokens, heads, dim] (one layer) or
// [layers, heads, tokens, dim] (skim-dump-qkv), float32 or float16 .npy; every value finite.
// --self-test writes small random Q, K, V to DIR/{q,k,v}.npy and then evaluates those files as if
// they had been given (the smoke test, examples/eval/kv_error_test.cmake).
//
// Per layer, causal dense attention (index::causal_all, keys of --block, default 64):
//  - the baseline is exec::reference (double precision) on the fp32 K/V as read;
//  - each stored form of K/V then runs through exec::simd<xsimd::default_arch>, Q in fp32, O and lse
//    in fp32: fp32 itself (the executor's own rounding, the floor of every other row), bf16 and fp16
//    (round to nearest even), int8 and fp8 e4m3 codes with a float scale per (key block, kv head), and
//    both codes with one scale per kv head (over all the layer's tokens, which a cache being filled
//    does not know yet: an upper bound of what per-head scales can do). Scales are absmax:
//      int8: scale = max|x| / 127, code = round(x / scale) clamped to [-127, 127];
//      fp8:  scale = max|x| / 448, code = fp8_e4m3::from_float(x / scale) (round to nearest even);
//    an all-zero block or head gets scale 0 and codes 0. The executor reads scale · code in fp32.
//  - measured against the baseline, over every (query token, query head) row of the layer:
//      rel. L2 error of O = ‖O − O_ref‖ / ‖O_ref‖ over all rows together;
//      p99 row error = the 99th percentile of ‖o − o_ref‖ / ‖o_ref‖ per row (rows with o_ref = 0
//        skipped; numpy's interpolation, metrics/tail.hpp);
//      max |Δlse| = the largest |lse − lse_ref| (natural log).
// Output (stdout): one Markdown table, each number as the mean over the layers and the worst layer.
// Layers run concurrently on --threads threads (default 1); results do not depend on it.
//
// Exit status: 0 on success, 2 for bad input (options, files, shapes, non-finite values), 1 for a
// failure while evaluating; errors are one line on stderr, "skim-kv-error: <what was wrong>".

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "../common/npy.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/parallel.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/quantized.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/metrics/tail.hpp"
#include "tensors.hpp"

namespace {

using skim_eval::inputs;
using view_t = skim::strided_view<const float>;
using simd_exec = skim::exec::simd<xsimd::default_arch>;

// The stored forms of K/V, in table order.
enum class storage : std::uint8_t { fp32, bf16, fp16, int8_block, fp8_block, int8_head, fp8_head };
constexpr storage all_storages[] = {storage::fp32,      storage::bf16,     storage::fp16,    storage::int8_block,
                                    storage::fp8_block, storage::int8_head, storage::fp8_head};
constexpr std::size_t storage_count = std::size(all_storages);

const char* storage_name(storage s) {
  switch (s) {
    case storage::fp32: return "fp32";
    case storage::bf16: return "bf16";
    case storage::fp16: return "fp16";
    case storage::int8_block: return "int8, scale per block";
    case storage::fp8_block: return "fp8 e4m3, scale per block";
    case storage::int8_head: return "int8, scale per head";
    case storage::fp8_head: return "fp8 e4m3, scale per head";
  }
  return "?";
}

// Bytes per K or V element, scales included (a float per block × head_dim elements, or per head).
double storage_bytes(storage s, std::int32_t block, std::int32_t tokens, std::int32_t dim) {
  switch (s) {
    case storage::fp32: return 4.0;
    case storage::bf16:
    case storage::fp16: return 2.0;
    case storage::int8_block:
    case storage::fp8_block: return 1.0 + 4.0 / (static_cast<double>(std::min(block, tokens)) * dim);
    case storage::int8_head:
    case storage::fp8_head: return 1.0 + 4.0 / (static_cast<double>(tokens) * dim);
  }
  return 0.0;
}

struct options {
  std::string q, k, v, self_test_dir;
  std::int32_t block = 64;
  std::int32_t layers = std::numeric_limits<std::int32_t>::max();  // evaluate the first N
  std::int32_t threads = 1;
  bool help = false;
};

constexpr std::string_view usage_text =
    "usage: skim-kv-error --q Q.npy --k K.npy --v V.npy [--block N] [--layers N] [--threads N]\n"
    "       skim-kv-error --self-test DIR [--block N] [--threads N]\n"
    "Causal dense attention per layer: exec::reference (double) on fp32 K/V against exec::simd on K/V\n"
    "stored as fp32, bf16, fp16, int8 and fp8 e4m3 (absmax scales per key block of N, default 64, or per\n"
    "kv head); prints relative L2 error of O, its 99th-percentile row and max |delta lse|, mean and worst\n"
    "layer, as a Markdown table.\n";

// Parses argv into `out`. Returns "" or the error naming the bad item.
std::string parse_options(int argc, char** argv, options& out) {
  const auto int_value = [](std::string_view name, std::string_view s, std::int32_t lo, std::int32_t hi,
                            std::int32_t& v) -> std::string {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size() || v < lo || v > hi) {
      return std::string(name) + " '" + std::string(s) + "' is not an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]";
    }
    return {};
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      out.help = true;
      return {};
    }
    if (a != "--q" && a != "--k" && a != "--v" && a != "--self-test" && a != "--block" && a != "--layers" &&
        a != "--threads") {
      return "unknown option '" + std::string(a) + "' (--help lists them)";
    }
    if (i + 1 >= argc) return std::string(a) + " needs a value";
    const std::string_view value = argv[++i];
    std::string e;
    if (a == "--q") out.q = value;
    else if (a == "--k") out.k = value;
    else if (a == "--v") out.v = value;
    else if (a == "--self-test") out.self_test_dir = value;
    else if (a == "--block") e = int_value(a, value, 1, 1 << 20, out.block);
    else if (a == "--layers") e = int_value(a, value, 1, std::numeric_limits<std::int32_t>::max(), out.layers);
    else e = int_value(a, value, 1, skim::max_parallel_threads, out.threads);
    if (!e.empty()) return e;
  }
  if (out.self_test_dir.empty() && (out.q.empty() || out.k.empty() || out.v.empty())) {
    return "--q, --k and --v are required (or --self-test DIR)";
  }
  if (!out.self_test_dir.empty() && !(out.q.empty() && out.k.empty() && out.v.empty())) {
    return "--self-test DIR writes its own Q, K, V: leave out --q, --k and --v";
  }
  return {};
}

// Writes random Q [2, 4, 150, 16] and K, V [2, 2, 150, 16] (GQA 2, a partial last block at the
// default block of 64) to dir/{q,k,v}.npy and points `o` at them. Returns "" or the error.
std::string write_self_test(const std::string& dir, options& o) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return dir + ": cannot create (" + ec.message() + ")";
  std::mt19937 rng(0x6b76u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t layers = 2, heads_q = 4, heads_kv = 2, tokens = 150, dim = 16;
  for (const auto& [name, heads, path] : {std::tuple{"q", heads_q, &o.q}, std::tuple{"k", heads_kv, &o.k},
                                          std::tuple{"v", heads_kv, &o.v}}) {
    const std::int64_t shape[] = {layers, heads, tokens, dim};
    std::vector<float> data(static_cast<std::size_t>(layers * heads * tokens * dim));
    for (float& x : data) x = normal(rng);
    *path = (std::filesystem::path(dir) / (std::string(name) + ".npy")).string();
    if (const skim::status s = skim::npy::write(*path, shape, data); !s.ok()) return s.message();
  }
  return {};
}

// "" if every value of `a` is finite, else the error naming the file and the first bad element.
std::string check_finite(const skim::npy::array& a, const std::string& path) {
  const auto it = std::find_if(a.data.begin(), a.data.end(), [](float x) { return !std::isfinite(x); });
  if (it == a.data.end()) return {};
  return path + ": element " + std::to_string(it - a.data.begin()) + " is " + (std::isnan(*it) ? "NaN" : "infinite") +
         " (the inputs must be finite)";
}

// A token-major [tokens, heads, dim] copy of x with each element converted by T::from_float.
template <class T>
void convert(const view_t& x, std::vector<T>& out) {
  out.resize(static_cast<std::size_t>(x.tokens) * x.heads * x.head_dim);
  std::size_t i = 0;
  for (std::int32_t t = 0; t < x.tokens; ++t) {
    for (std::int32_t h = 0; h < x.heads; ++h) {
      const float* row = x.row(t, h);
      for (std::int32_t e = 0; e < x.head_dim; ++e) out[i++] = T::from_float(row[e]);
    }
  }
}

// Codes of x, token-major [tokens, heads, dim], and scales [blocks of `block` tokens, heads] as
// quantized_kv reads them (one sequence). per_head: every block of a head gets the head's scale
// (absmax over all tokens); else each (block, head) its own. The scale and code rules: the header.
template <class Code>
void quantise(const view_t& x, std::int32_t block, bool per_head, std::vector<Code>& codes, std::vector<float>& scales) {
  constexpr bool is_int8 = std::is_same_v<Code, std::int8_t>;
  constexpr float code_max = is_int8 ? 127.0f : 448.0f;
  const std::int32_t blocks = (x.tokens + block - 1) / block;
  codes.resize(static_cast<std::size_t>(x.tokens) * x.heads * x.head_dim);
  scales.assign(static_cast<std::size_t>(blocks) * x.heads, 0.0f);
  const auto absmax = [&](std::int32_t h, std::int32_t t0, std::int32_t t1) {
    float m = 0.0f;
    for (std::int32_t t = t0; t < t1; ++t) {
      for (std::int32_t e = 0; e < x.head_dim; ++e) m = std::max(m, std::abs(x.row(t, h)[e]));
    }
    return m;
  };
  for (std::int32_t h = 0; h < x.heads; ++h) {
    const float head_scale = per_head ? absmax(h, 0, x.tokens) / code_max : 0.0f;
    for (std::int32_t j = 0; j < blocks; ++j) {
      const std::int32_t t0 = j * block, t1 = std::min(t0 + block, x.tokens);
      const float scale = per_head ? head_scale : absmax(h, t0, t1) / code_max;
      scales[static_cast<std::size_t>(j) * x.heads + h] = scale;
      for (std::int32_t t = t0; t < t1; ++t) {
        const float* row = x.row(t, h);
        Code* out = codes.data() + (static_cast<std::size_t>(t) * x.heads + h) * x.head_dim;
        for (std::int32_t e = 0; e < x.head_dim; ++e) {
          const float v = scale > 0.0f ? row[e] / scale : 0.0f;
          if constexpr (is_int8) {
            out[e] = static_cast<std::int8_t>(std::clamp(std::lround(v), -127L, 127L));
          } else {
            out[e] = skim::fp8_e4m3::from_float(v);
          }
        }
      }
    }
  }
}

// One layer's numbers for one storage.
struct metrics {
  double rel_l2 = 0.0, p99 = 0.0, max_dlse = 0.0;
};

// O and lse of a run against the baseline's; O token-major [rows, dim], lse [rows].
metrics compare(std::span<const float> o, std::span<const float> o_ref, std::span<const float> lse,
                std::span<const float> lse_ref, std::int32_t dim, std::vector<double>& row_error) {
  const std::size_t rows = lse.size();
  row_error.resize(rows);
  double err2 = 0.0, ref2 = 0.0, max_dlse = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    double e2 = 0.0, n2 = 0.0;
    for (std::int32_t e = 0; e < dim; ++e) {
      const double a = o[r * dim + e], b = o_ref[r * dim + e];
      e2 += (a - b) * (a - b);
      n2 += b * b;
    }
    err2 += e2;
    ref2 += n2;
    row_error[r] = n2 > 0.0 ? std::sqrt(e2 / n2) : std::numeric_limits<double>::quiet_NaN();
    max_dlse = std::max(max_dlse, std::abs(static_cast<double>(lse[r]) - static_cast<double>(lse_ref[r])));
  }
  const auto tail = skim::metrics::summarize_tail(row_error, skim::metrics::tail_side::high_is_bad);
  return {.rel_l2 = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::numeric_limits<double>::quiet_NaN(),
          .p99 = tail.p1,
          .max_dlse = max_dlse};
}

// Every storage on layer `layer`: out[storage index]. Returns "" or the error.
std::string evaluate_layer(const inputs& in, std::int32_t layer, std::int32_t block, std::span<metrics> out) {
  const skim_eval::input_shape& sh = in.shape;
  const std::int32_t cu[2] = {0, sh.tokens};
  const skim::problem p{.heads_q = sh.heads_q, .heads_kv = sh.heads_kv, .head_dim = sh.dim, .block_q = block,
                        .block_kv = block, .mask = skim::mask_kind::causal, .cu_seqlens_q = cu, .cu_seqlens_kv = cu};
  const std::size_t rows = static_cast<std::size_t>(sh.tokens) * sh.heads_q;
  std::vector<float> o_ref(rows * sh.dim), lse_ref(rows), o(rows * sh.dim), lse(rows);
  const auto o_view = [&](std::vector<float>& buf) {
    return skim::strided_view<float>::token_major(buf.data(), sh.tokens, sh.heads_q, sh.dim);
  };
  const view_t q = in.q_view(layer), k = in.k_view(layer), v = in.v_view(layer);
  const std::string where = "layer " + std::to_string(layer) + ": ";

  const skim::attention_args<float, skim::contiguous_kv<float>, skim::index::causal_all, float> base{
      .prob = p, .q = q, .kv = {.k = k, .v = v}, .index = {}, .o = o_view(o_ref), .lse = lse_ref};
  if (const skim::status s = skim::exec::reference{}.run(base, {}); !s.ok()) return where + "reference: " + s.message();

  const simd_exec exec;
  skim::workspace_buffer ws(exec.workspace_bytes(p));
  std::vector<double> row_error;
  // Runs exec::simd on the source `kv` and records the comparison in out[i].
  const auto measure = [&](std::size_t i, const auto& kv) -> std::string {
    using kv_type = std::remove_cvref_t<decltype(kv)>;
    const skim::attention_args<float, kv_type, skim::index::causal_all, float> a{
        .prob = p, .q = q, .kv = kv, .index = {}, .o = o_view(o), .lse = lse};
    if (const skim::status s = exec.run(a, ws.span()); !s.ok()) {
      return where + storage_name(all_storages[i]) + ": " + s.message();
    }
    out[i] = compare(o, o_ref, lse, lse_ref, sh.dim, row_error);
    return {};
  };
  const auto tm = [&](const auto& buf) {
    using T = typename std::remove_cvref_t<decltype(buf)>::value_type;
    return skim::strided_view<const T>::token_major(buf.data(), sh.tokens, sh.heads_kv, sh.dim);
  };
  std::vector<skim::bfloat16> kb, vb;
  std::vector<skim::half> kh, vh;
  std::vector<std::int8_t> k8, v8;
  std::vector<skim::fp8_e4m3> kf, vf;
  std::vector<float> ks, vs;
  for (std::size_t i = 0; i < storage_count; ++i) {
    std::string e;
    switch (all_storages[i]) {
      case storage::fp32:
        e = measure(i, skim::contiguous_kv<float>{.k = k, .v = v});
        break;
      case storage::bf16:
        convert(k, kb);
        convert(v, vb);
        e = measure(i, skim::contiguous_kv<skim::bfloat16>{.k = tm(kb), .v = tm(vb)});
        break;
      case storage::fp16:
        convert(k, kh);
        convert(v, vh);
        e = measure(i, skim::contiguous_kv<skim::half>{.k = tm(kh), .v = tm(vh)});
        break;
      case storage::int8_block:
      case storage::int8_head: {
        const bool per_head = all_storages[i] == storage::int8_head;
        quantise(k, block, per_head, k8, ks);
        quantise(v, block, per_head, v8, vs);
        e = measure(i, skim::int8_kv{.k = tm(k8), .v = tm(v8), .k_scales = ks, .v_scales = vs});
        break;
      }
      case storage::fp8_block:
      case storage::fp8_head: {
        const bool per_head = all_storages[i] == storage::fp8_head;
        quantise(k, block, per_head, kf, ks);
        quantise(v, block, per_head, vf, vs);
        e = measure(i, skim::fp8_kv{.k = tm(kf), .v = tm(vf), .k_scales = ks, .v_scales = vs});
        break;
      }
    }
    if (!e.empty()) return e;
  }
  return {};
}

// "1.2e-03 (L4)" style cells: the mean over layers, then the worst layer's value and index.
void print_table(const options& o, const inputs& in, std::int32_t layers, const std::vector<metrics>& m) {
  const skim_eval::input_shape& sh = in.shape;
  std::printf("%d layers, %d tokens, %d query heads over %d kv heads, head dim %d; causal dense attention, "
              "key blocks of %d.\n",
              layers, sh.tokens, sh.heads_q, sh.heads_kv, sh.dim, o.block);
  std::printf("Baseline: exec::reference (double) on fp32 K/V. Rows: exec::simd<%s>, Q fp32, K/V stored as named.\n\n",
              xsimd::default_arch::name());
  std::printf("| K/V | bytes/elem | rel. L2 error of O | worst layer | p99 row error | worst layer | max \\|Δlse\\| | "
              "worst layer |\n");
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|\n");
  for (std::size_t i = 0; i < storage_count; ++i) {
    std::printf("| %s | %.3f", storage_name(all_storages[i]),
                storage_bytes(all_storages[i], o.block, sh.tokens, sh.dim));
    for (double metrics::*field : {&metrics::rel_l2, &metrics::p99, &metrics::max_dlse}) {
      double sum = 0.0, worst = -std::numeric_limits<double>::infinity();
      std::int32_t worst_layer = 0;
      for (std::int32_t l = 0; l < layers; ++l) {
        const double x = m[static_cast<std::size_t>(l) * storage_count + i].*field;
        sum += x;
        if (!std::isnan(worst) && (std::isnan(x) || x > worst)) {  // the first NaN is the worst
          worst = x;
          worst_layer = l;
        }
      }
      std::printf(" | %.2e | %.2e (L%d)", sum / layers, worst, worst_layer);
    }
    std::printf(" |\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (const std::string e = parse_options(argc, argv, o); !e.empty()) {
    std::fprintf(stderr, "skim-kv-error: %s\n", e.c_str());
    return 2;
  }
  if (o.help) {
    std::fwrite(usage_text.data(), 1, usage_text.size(), stdout);
    return 0;
  }
  if (!o.self_test_dir.empty()) {
    if (const std::string e = write_self_test(o.self_test_dir, o); !e.empty()) {
      std::fprintf(stderr, "skim-kv-error: %s\n", e.c_str());
      return 2;
    }
  }
  inputs in;
  std::string err = skim_eval::load_inputs(o.q, o.k, o.v, in);
  for (const auto& [array, path] : {std::pair{&in.q, &o.q}, std::pair{&in.k, &o.k}, std::pair{&in.v, &o.v}}) {
    if (err.empty()) err = check_finite(*array, *path);
  }
  if (err.empty() && in.shape.tokens > (std::numeric_limits<std::int32_t>::max() / in.shape.heads_q)) {
    err = "too many tokens × query heads for one problem";
  }
  if (!err.empty()) {
    std::fprintf(stderr, "skim-kv-error: %s\n", err.c_str());
    return 2;
  }

  const std::int32_t layers = std::min(o.layers, in.shape.layers);
  std::vector<metrics> results(static_cast<std::size_t>(layers) * storage_count);
  std::vector<std::string> errors(static_cast<std::size_t>(layers));
  skim::parallel_for(layers, o.threads, [&](std::int32_t, std::int64_t first, std::int64_t last) {
    for (std::int64_t l = first; l < last; ++l) {
      const auto li = static_cast<std::size_t>(l);
      try {  // parallel_for's body must not throw; the buffers above allocate
        errors[li] = evaluate_layer(in, static_cast<std::int32_t>(l), o.block,
                                    std::span(results).subspan(li * storage_count, storage_count));
      } catch (const std::exception& e) {
        errors[li] = "layer " + std::to_string(l) + ": " + e.what();
      }
    }
  });
  for (const std::string& e : errors) {
    if (!e.empty()) {
      std::fprintf(stderr, "skim-kv-error: %s\n", e.c_str());
      return 1;
    }
  }
  print_table(o, in, layers, results);
  return 0;
}
