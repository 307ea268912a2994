// skim-dump-qkv — run a llama2.c checkpoint (default: the real stories260K Llama) over a text and
// write each layer's Q, K (after RoPE) and V as .npy files, for skim-eval and the benchmarks.
//
//   skim-dump-qkv --out DIR [--tokens N] [--models DIR] [--model FILE] [--tokenizer FILE] [--threads N] [TEXT]
//
// --model/--tokenizer default to stories260K.bin and tok512.bin in the models directory; the
// forward pass runs its products and skim's dense executor on --threads threads.
//
// TEXT defaults to tinystories_sample.txt in the models directory (found as in
// models_dir.hpp: $SKIM_MODELS_DIR, else shared/models above the working directory or
// this program). The text is encoded with BOS and cut to its first N tokens (default 512,
// at most the model's seq_len). Writes, all float32:
//   DIR/q.npy  [layers, heads,    tokens, head_dim]
//   DIR/k.npy  [layers, kv_heads, tokens, head_dim]
//   DIR/v.npy  [layers, kv_heads, tokens, head_dim]

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/npy.hpp"
#include "common/read_file.hpp"
#include "llama/engine.hpp"
#include "llama/forward.hpp"
#include "llama/model.hpp"
#include "llama/models_dir.hpp"
#include "llama/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace skim_llama;

namespace {

int usage(const char* msg) {
  std::fprintf(stderr, "skim-dump-qkv: %s\nusage: skim-dump-qkv --out DIR [--tokens N] [--models DIR] [--model FILE] [--tokenizer FILE] [--threads N] [TEXT]\n", msg);
  return 2;
}

int fail(const skim::status& s) {
  std::fprintf(stderr, "skim-dump-qkv: %s\n", s.message());
  return 1;
}

// Token-major [tokens, heads, dim] rows of one layer into the head-major slice
// [heads, tokens, dim] of `dst` (layer `layer` of [layers, heads, tokens, dim]).
void scatter(std::vector<float>& dst, std::span<const float> src, int layer, int heads, int tokens, int first, int n, int dim) {
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* s = src.data() + (static_cast<std::size_t>(t) * heads + h) * dim;
      float* d = dst.data() + ((static_cast<std::size_t>(layer) * heads + h) * tokens + first + t) * dim;
      std::copy(s, s + dim, d);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  fs::path out_dir, text_path, models;
  fs::path model_path, tokenizer_path;
  int n_tokens = 512, threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--out" && has_value) {
      out_dir = argv[++i];
    } else if (a == "--models" && has_value) {
      models = argv[++i];
    } else if (a == "--model" && has_value) {
      model_path = argv[++i];
    } else if (a == "--tokenizer" && has_value) {
      tokenizer_path = argv[++i];
    } else if (a == "--threads" && has_value) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v <= 0 || v > 64) return usage("--threads needs an integer in [1, 64]");
      threads = static_cast<int>(v);
    } else if (a == "--tokens" && has_value) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v <= 0 || v > 1 << 20) return usage("--tokens needs a positive integer");
      n_tokens = static_cast<int>(v);
    } else if (a == "-h" || a == "--help") {
      return usage("dump per-layer Q, K, V of a llama2.c checkpoint as .npy");
    } else if (!a.starts_with("--") && text_path.empty()) {
      text_path = a;
    } else {
      return usage(("unexpected argument " + std::string(a)).c_str());
    }
  }
  if (out_dir.empty()) return usage("--out DIR is required");
  if (models.empty()) {
    const models_dir_result found = find_models_dir({fs::current_path(), fs::path(argv[0]).parent_path()});
    if (found.dir.empty()) return usage(found.error.c_str());
    models = found.dir;
  }
  if (text_path.empty()) text_path = models / "tinystories_sample.txt";

  model m;
  if (model_path.empty()) model_path = models / "stories260K.bin";
  if (tokenizer_path.empty()) tokenizer_path = models / "tok512.bin";
  if (const auto s = load(model_path, m); !s.ok()) return fail(s);
  tokenizer tok;
  if (const auto s = tokenizer::load(tokenizer_path, m.cfg.vocab_size, tok); !s.ok()) return fail(s);
  if (n_tokens > m.cfg.seq_len) return usage(("--tokens " + std::to_string(n_tokens) + " > the model's seq_len " + std::to_string(m.cfg.seq_len)).c_str());

  std::vector<std::byte> text;
  if (const auto s = skim::examples::read_file(text_path, text); !s.ok()) return fail(s);
  std::vector<int> ids = tok.encode(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  if (static_cast<int>(ids.size()) < n_tokens) {
    std::fprintf(stderr, "skim-dump-qkv: %s has only %zu tokens; using all\n", text_path.string().c_str(), ids.size());
    n_tokens = static_cast<int>(ids.size());
  }
  ids.resize(static_cast<std::size_t>(n_tokens));

  const config& c = m.cfg;
  const int hd = c.head_dim();
  std::vector<float> q(static_cast<std::size_t>(c.n_layers) * c.n_heads * n_tokens * hd);
  std::vector<float> k(static_cast<std::size_t>(c.n_layers) * c.n_kv_heads * n_tokens * hd), v(k.size());
  engine_options dense;  // dense attention through skim's executor
  dense.threads = threads;
  engine e(m, dense, n_tokens);
  e.on_qkv = [&](const qkv_view& x) {
    scatter(q, x.q, x.layer, c.n_heads, n_tokens, x.first_token, x.n, hd);
    scatter(k, x.k, x.layer, c.n_kv_heads, n_tokens, x.first_token, x.n, hd);
    scatter(v, x.v, x.layer, c.n_kv_heads, n_tokens, x.first_token, x.n, hd);
  };
  if (const auto s = e.run(ids, {}); !s.ok()) return fail(s);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return usage(("cannot create " + out_dir.string() + ": " + ec.message()).c_str());
  const std::vector<std::int64_t> q_shape = {c.n_layers, c.n_heads, n_tokens, hd};
  const std::vector<std::int64_t> kv_shape = {c.n_layers, c.n_kv_heads, n_tokens, hd};
  if (const auto s = skim::npy::write(out_dir / "q.npy", q_shape, q); !s.ok()) return fail(s);
  if (const auto s = skim::npy::write(out_dir / "k.npy", kv_shape, k); !s.ok()) return fail(s);
  if (const auto s = skim::npy::write(out_dir / "v.npy", kv_shape, v); !s.ok()) return fail(s);
  std::printf("%s: %d tokens, %d layers, %d heads (%d kv), head_dim %d -> %s/{q,k,v}.npy\n", text_path.string().c_str(), n_tokens,
              c.n_layers, c.n_heads, c.n_kv_heads, hd, out_dir.string().c_str());
  return 0;
}
