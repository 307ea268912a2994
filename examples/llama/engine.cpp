// skim-llama — the stories260K Llama on skim (engine.hpp): generation and perplexity tables.
//
//   skim-llama generate   [--attention SPEC] [--prompt TEXT] [--tokens N] [--dump DIR] [--models DIR]
//   skim-llama perplexity [--attention SPEC]... [--text FILE] [--window N] [--windows M]
//                         [--greedy N] [--prompts P] [--markdown] [--models DIR]
//
// generate: greedy continuation of TEXT (default: BOS only) by N tokens (default 64); --dump DIR
// writes each layer's Q, K (after RoPE) and V of every processed token as DIR/{q,k,v}.npy,
// [layers, heads, tokens, head_dim] float32 (skim-eval's input).
// perplexity: the text (default tinystories_more.txt) is encoded and cut into M windows of N tokens
// (default 8 of 512), each starting with BOS; each window is prefilled (token by token under
// eviction) and scored by the mean next-token loss. Dense attention is always run first as the
// reference; each --attention SPEC gives one row: perplexity, change vs dense, keys read / causal
// keys, eviction loss, and with --greedy N the share of N greedy tokens equal to dense's, from P
// prompts (each window's first 16 tokens).
// SPEC: engine.hpp's header (skim-eval's --config keys plus policy, exec, seed, evict, keep, ...).

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/npy.hpp"
#include "common/read_file.hpp"
#include "llama/engine.hpp"
#include "llama/models_dir.hpp"
#include "llama/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace skim_llama;

namespace {

int usage(const std::string& msg) {
  std::fprintf(stderr,
               "skim-llama: %s\nusage: skim-llama generate [--attention SPEC] [--prompt TEXT] [--tokens N] [--dump DIR] [--models DIR]\n"
               "       skim-llama perplexity [--attention SPEC]... [--text FILE] [--window N] [--windows M] [--greedy N]\n"
               "                             [--prompts P] [--markdown] [--models DIR]\n"
               "SPEC e.g. dense | policy=skim,summarizer=max_bound,block=16,budget=0.25,sink=1 |\n"
               "          policy=recency,budget=0.25,sink=1 | policy=random,budget=0.25,sink=1 |\n"
               "          policy=dense,evict=attention_mass|recency|summary_score,keep=0.5,block=16\n",
               msg.c_str());
  return 2;
}
int fail(const skim::status& s) {
  std::fprintf(stderr, "skim-llama: %s\n", s.message());
  return 1;
}

void scatter(std::vector<float>& dst, std::span<const float> src, int layer, int heads, int tokens, int first, int n, int dim) {
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* s = src.data() + (static_cast<std::size_t>(t) * heads + h) * dim;
      std::copy(s, s + dim, dst.data() + ((static_cast<std::size_t>(layer) * heads + h) * tokens + first + t) * dim);
    }
  }
}

struct row {
  std::string spec;
  double nll = 0, ppl = 0, density = 0, evict_loss = 0, greedy_same = -1;
  bool evicts = false;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("a command is required");
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") return usage("sparse attention on the stories260K Llama");
  if (cmd != "generate" && cmd != "perplexity") return usage("unknown command " + std::string(cmd));
  std::vector<engine_options> configs;
  fs::path models, text_path, dump;
  std::string prompt;
  int n_tokens = 64, window = 512, windows = 8, greedy = 0, prompts = 4;
  bool markdown = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has = i + 1 < argc;
    const auto integer = [&](int& dst, int lo) -> bool {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < lo || v > (1 << 20)) return false;
      dst = static_cast<int>(v);
      return true;
    };
    if (a == "--attention" && has) {
      engine_options o;
      if (const std::string e = parse_attention(argv[++i], o); !e.empty()) return usage(e);
      configs.push_back(o);
    } else if (a == "--models" && has) models = argv[++i];
    else if (a == "--text" && has) text_path = argv[++i];
    else if (a == "--dump" && has) dump = argv[++i];
    else if (a == "--prompt" && has) prompt = argv[++i];
    else if (a == "--tokens" && has) { if (!integer(n_tokens, 1)) return usage("--tokens needs a positive integer"); }
    else if (a == "--window" && has) { if (!integer(window, 2)) return usage("--window needs an integer >= 2"); }
    else if (a == "--windows" && has) { if (!integer(windows, 1)) return usage("--windows needs a positive integer"); }
    else if (a == "--greedy" && has) { if (!integer(greedy, 0)) return usage("--greedy needs an integer >= 0"); }
    else if (a == "--prompts" && has) { if (!integer(prompts, 1)) return usage("--prompts needs a positive integer"); }
    else if (a == "--markdown") markdown = true;
    else return usage("unexpected argument " + std::string(a));
  }
  if (models.empty()) {
    const models_dir_result found = find_models_dir({fs::current_path(), fs::path(argv[0]).parent_path()});
    if (found.dir.empty()) return usage(found.error);
    models = found.dir;
  }
  model m;
  if (const auto s = load(models / "stories260K.bin", m); !s.ok()) return fail(s);
  tokenizer tok;
  if (const auto s = tokenizer::load(models / "tok512.bin", m.cfg.vocab_size, tok); !s.ok()) return fail(s);
  const config& c = m.cfg;
  const auto vocab = static_cast<std::size_t>(c.vocab_size);

  if (cmd == "generate") {
    if (configs.size() > 1) return usage("generate takes one --attention");
    const engine_options o = configs.empty() ? engine_options{} : configs[0];
    std::vector<int> ids = prompt.empty() ? std::vector<int>{tokenizer::bos} : tok.encode(prompt);
    engine e(m, o, static_cast<int>(ids.size()) + n_tokens);
    const int total = static_cast<int>(ids.size()) + n_tokens, hd = c.head_dim();
    std::vector<float> q, k, v;
    if (!dump.empty()) {
      q.assign(static_cast<std::size_t>(c.n_layers) * c.n_heads * total * hd, 0.0f);
      k.assign(static_cast<std::size_t>(c.n_layers) * c.n_kv_heads * total * hd, 0.0f);
      v.assign(k.size(), 0.0f);
      e.on_qkv = [&](const qkv_view& x) {
        scatter(q, x.q, x.layer, c.n_heads, total, x.first_token, x.n, hd);
        scatter(k, x.k, x.layer, c.n_kv_heads, total, x.first_token, x.n, hd);
        scatter(v, x.v, x.layer, c.n_kv_heads, total, x.first_token, x.n, hd);
      };
    }
    std::vector<int> out;
    if (const auto s = e.generate(ids, n_tokens, out); !s.ok()) return fail(s);
    std::string textout;
    int prev = ids.back();
    for (const int t : out) {
      textout += tok.decode(prev, t);
      prev = t;
    }
    std::printf("%s%s\n", prompt.c_str(), textout.c_str());
    std::fprintf(stderr, "skim-llama: %zu tokens, keys read / causal %.3f\n", out.size(), e.stats.density());
    if (!dump.empty()) {
      const int done = e.tokens();  // the last generated token is not run
      std::error_code ec;
      fs::create_directories(dump, ec);
      const auto cut = [&](std::vector<float>& x, int heads) {  // [layers, heads, total, hd] -> [..., done, hd]
        std::vector<float> y(static_cast<std::size_t>(c.n_layers) * heads * done * hd);
        for (int l = 0; l < c.n_layers * heads; ++l) {
          std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(l) * total * hd, done * hd, y.begin() + static_cast<std::ptrdiff_t>(l) * done * hd);
        }
        return y;
      };
      const std::vector<std::int64_t> qs = {c.n_layers, c.n_heads, done, hd}, ks = {c.n_layers, c.n_kv_heads, done, hd};
      if (const auto s = skim::npy::write(dump / "q.npy", qs, cut(q, c.n_heads)); !s.ok()) return fail(s);
      if (const auto s = skim::npy::write(dump / "k.npy", ks, cut(k, c.n_kv_heads)); !s.ok()) return fail(s);
      if (const auto s = skim::npy::write(dump / "v.npy", ks, cut(v, c.n_kv_heads)); !s.ok()) return fail(s);
      std::fprintf(stderr, "skim-llama: wrote %s/{q,k,v}.npy (%d tokens)\n", dump.string().c_str(), done);
    }
    return 0;
  }

  // perplexity
  if (text_path.empty()) text_path = models / "tinystories_more.txt";
  std::vector<std::byte> bytes;
  if (const auto s = skim::examples::read_file(text_path, bytes); !s.ok()) return fail(s);
  const std::vector<int> all = tok.encode(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  std::vector<std::vector<int>> wins;
  for (std::size_t at = 1; wins.size() < static_cast<std::size_t>(windows) && at + window - 1 <= all.size(); at += window - 1) {
    std::vector<int> w{tokenizer::bos};
    w.insert(w.end(), all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + window - 1));
    wins.push_back(std::move(w));
  }
  if (wins.empty()) return usage(text_path.string() + " holds fewer than --window tokens");
  engine_options dense;  // the reference row
  dense.spec = "dense";
  configs.insert(configs.begin(), dense);
  std::vector<std::vector<int>> dense_greedy;
  std::vector<row> rows;
  std::vector<float> logits(static_cast<std::size_t>(window) * vocab);
  for (const engine_options& o : configs) {
    engine e(m, o, std::max(window, 16 + greedy));
    row r{.spec = o.spec, .evicts = o.evict != eviction::none};
    double sum = 0, n = 0;
    for (const auto& w : wins) {
      e.reset();
      if (const auto s = e.run(w, logits); !s.ok()) return fail(s);
      double part = 0;
      (void)next_token_nll(logits, w, c.vocab_size, &part);
      sum += part;
      n += static_cast<double>(w.size() - 1);
    }
    r.nll = sum / n;
    r.ppl = std::exp(r.nll);
    r.density = e.stats.density();
    r.evict_loss = e.stats.eviction_loss();
    if (greedy > 0) {
      long same = 0, total = 0;
      for (int p = 0; p < prompts && p < static_cast<int>(wins.size()); ++p) {
        std::vector<int> out;
        if (const auto s = e.generate(std::span<const int>(wins[static_cast<std::size_t>(p)]).first(16), greedy, out); !s.ok()) return fail(s);
        if (rows.empty()) dense_greedy.push_back(out);
        const auto& d = dense_greedy[static_cast<std::size_t>(p)];
        for (std::size_t i = 0; i < out.size() && i < d.size(); ++i) same += out[i] == d[i];
        total += static_cast<long>(d.size());
      }
      r.greedy_same = total > 0 ? static_cast<double>(same) / total : 0;
    }
    rows.push_back(r);
    const row& d = rows.front();
    const double change = 100.0 * (r.ppl / d.ppl - 1.0);
    if (markdown) {
      std::printf("| `%s` | %.4f | %+.2f%% | %.3f | %s | %s |\n", r.spec.c_str(), r.ppl, change, r.density,
                  greedy > 0 ? (std::to_string(static_cast<int>(std::lround(100 * r.greedy_same))) + "%").c_str() : "-",
                  r.evicts ? (std::to_string(r.evict_loss).substr(0, 6)).c_str() : "-");
    } else {
      std::printf("%-70s ppl %.4f (%+.2f%% vs dense)  keys read/causal %.3f", r.spec.c_str(), r.ppl, change, r.density);
      if (greedy > 0) std::printf("  greedy same %.1f%%", 100 * r.greedy_same);
      if (r.evicts) std::printf("  eviction loss %.4f", r.evict_loss);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::fprintf(stderr, "skim-llama: %zu windows of %d tokens from %s%s\n", wins.size(), window, text_path.string().c_str(),
               window > c.seq_len ? " (beyond the trained context)" : "");
  return 0;
}
