// skim-llama — any llama2.c checkpoint on skim (engine.hpp): generation, perplexity and needle tables.
//
//   skim-llama generate   [--attention SPEC] [--prompt TEXT] [--tokens N] [--dump DIR] [COMMON]
//   skim-llama perplexity [--attention SPEC]... [--text FILE] [--window N] [--windows M] [--from P]
//                         [--measure] [--greedy N] [--prompts P] [--markdown] [COMMON]
//   skim-llama needle     [--attention SPEC]... [--text FILE] [--lengths 1024,2048,4096]
//                         [--depths 0.1,0.3,0.5,0.7,0.9] [--needles N] [--seed S] [--routed-prefill] [COMMON]
//   COMMON: [--model FILE] [--tokenizer FILE] [--models DIR] [--threads N]
//
// --model/--tokenizer default to stories260K.bin and tok512.bin in the models directory (found as
// models_dir.hpp says, or --models DIR); --threads runs the projections, the classifier and the dense
// executor on N threads.
// generate: greedy continuation of TEXT (default: BOS only) by N tokens (default 64); --dump DIR
// writes each layer's Q, K (after RoPE) and V of every processed token as DIR/{q,k,v}.npy,
// [layers, heads, tokens, head_dim] float32 (skim-eval's input).
// perplexity: the text (default tinystories_more.txt) is encoded and cut into M windows of N tokens
// (default 8 of 512), each starting with BOS; each window is prefilled (token by token under
// eviction) and scored by the mean next-token loss of positions >= P (default 0). Dense attention is
// always run first as the reference; each --attention SPEC gives one row: perplexity, change vs
// dense, keys read / causal keys, eviction loss, and with --greedy N the share of N greedy tokens
// equal to dense's, from P prompts (each window's first 16 tokens). --measure adds, for routed and
// oracle rows, the coverage of the true attention mass (mean, p5, worst layer and head) and
// recall@16 of each selection, over queries at positions >= P (block_mass.hpp).
// needle: N needles per (length, depth) (default 8) planted in the text (default kernel_val.c.txt;
// needle.hpp); one dense prefill of each haystack is shared by every row, whose policy then decodes
// the question and a 12-token greedy answer one token at a time (--routed-prefill: each row
// prefills with its own policy too). A row counts the needles it answers among those dense
// answers, per depth, how many of its answers are dense's token for token, its decode attention time
// per token and its time per needle.
// SPEC: engine.hpp's header (skim-eval's --config keys plus policy, exec, seed, evict, keep, kv, ...);
// kv=int8 or kv=fp8 stores that row's K/V cache as codes with a scale per (block, kv head)
// (kv_quant.hpp); the dense reference row keeps fp32.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/npy.hpp"
#include "common/read_file.hpp"
#include "llama/engine.hpp"
#include "llama/models_dir.hpp"
#include "llama/needle.hpp"
#include "llama/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace skim_llama;

namespace {

int usage(const std::string& msg) {
  std::fprintf(stderr,
               "skim-llama: %s\nusage: skim-llama generate [--attention SPEC] [--prompt TEXT] [--tokens N] [--dump DIR] [COMMON]\n"
               "       skim-llama perplexity [--attention SPEC]... [--text FILE] [--window N] [--windows M] [--from P] [--measure]\n"
               "                             [--greedy N] [--prompts P] [--markdown] [COMMON]\n"
               "       skim-llama needle [--attention SPEC]... [--text FILE] [--lengths L,L] [--depths D,D] [--needles N]\n"
               "                         [--seed S] [--routed-prefill] [COMMON]\n"
               "COMMON: [--model FILE] [--tokenizer FILE] [--models DIR] [--threads N]\n"
               "SPEC e.g. dense | policy=skim,budget=0.125 | policy=skim,summarizer=max_bound,block=16,budget=0.25,sink=1 |\n"
               "          policy=recency,budget=0.25,sink=1 | policy=random,budget=0.25,sink=1 | policy=oracle,budget=0.125 |\n"
               "          policy=dense,evict=attention_mass|recency|summary_score,keep=0.5,block=16 |\n"
               "          policy=skim,budget=0.125,kv=int8 (kv=fp32|int8|fp8: the K/V cache's storage)\n",
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
  double nll = 0, ppl = 0, density = 0, kv_density = 0, evict_loss = 0, greedy_same = -1, seconds = 0;
  bool evicts = false;
};


// needle: one row per configuration (dense first), one table per prompt length.
struct needle_setup {
  std::vector<int> lengths{1024, 2048, 4096};
  std::vector<double> depths{0.1, 0.3, 0.5, 0.7, 0.9};
  int per_cell = 8;          // needles per (length, depth)
  std::uint64_t seed = 1;
  int answer_tokens = 12;
  bool routed_prefill = false;  // prefill the haystack with each policy too (default: one dense prefill)
  bool markdown = false;
};

struct needle_row {
  std::string spec;
  std::vector<int> found, asked;  // per depth: found among the needles dense found
  int found_all = 0, asked_all = 0;
  int same_as_dense = 0;  // needles whose 12-token answer is dense's, token for token
  double decode_attention_s = 0, total_s = 0;
  std::int64_t steps = 0;
  int needles = 0;
};

// Greedy answer after the question, decoded one token at a time (routed decode).
skim::status answer(engine& e, const tokenizer& tok, const needle& n, int answer_tokens, int vocab, std::string& text) {
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  for (const int t : n.question) SKIM_TRY(e.run(std::span<const int>(&t, 1), logits));
  int prev = n.question.back();
  text.clear();
  for (int i = 0; i < answer_tokens; ++i) {
    const int next = argmax(logits);
    text += tok.decode(prev, next);
    prev = next;
    if (i + 1 < answer_tokens) SKIM_TRY(e.run(std::span<const int>(&next, 1), logits));
  }
  return skim::status::success();
}

int run_needles(const model& m, const tokenizer& tok, const corpus& c, std::vector<engine_options> configs, const needle_setup& ns,
                int threads) {
  const int vocab = m.cfg.vocab_size;
  engine_options dense;
  dense.spec = "dense";
  dense.threads = threads;
  configs.insert(configs.begin(), dense);
  for (const int length : ns.lengths) {
    std::vector<needle_row> rows(configs.size());
    std::vector<std::unique_ptr<engine>> engines;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      rows[i].spec = configs[i].spec;
      rows[i].found.assign(ns.depths.size(), 0);
      rows[i].asked.assign(ns.depths.size(), 0);
      engines.push_back(std::make_unique<engine>(m, configs[i], length));
    }
    engine base(m, configs[0], length);
    std::mt19937_64 rng(ns.seed * 1000003u + static_cast<std::uint64_t>(length));
    int distance_min = length, distance_max = 0;
    for (std::size_t d = 0; d < ns.depths.size(); ++d) {
      for (int k = 0; k < ns.per_cell; ++k) {
        const std::optional<needle> n = make_needle(tok, c, length - ns.answer_tokens, ns.depths[d], rng);  // the answer fits too
        if (!n) {
          std::fprintf(stderr, "skim-llama: the text is too short for %d-token needles\n", length);
          return 1;
        }
        distance_min = std::min(distance_min, n->distance());
        distance_max = std::max(distance_max, n->distance());
        const std::span<const int> hay = std::span<const int>(n->prompt).first(n->prompt.size() - n->question.size());
        if (!ns.routed_prefill) {  // one dense prefill of the haystack, shared by every row
          base.reset();
          if (const auto s = base.run(hay, {}); !s.ok()) return fail(s);
        }
        bool dense_found = false;
        std::string dense_text;
        for (std::size_t i = 0; i < configs.size(); ++i) {
          engine& e = *engines[i];
          const auto t0 = std::chrono::steady_clock::now();
          const double att0 = e.stats.decode_attention_seconds;
          const std::int64_t steps0 = e.stats.decode_steps;
          e.reset();
          if (ns.routed_prefill) {
            if (const auto s = e.run(hay, {}); !s.ok()) return fail(s);
          } else if (const auto s = e.start_from(base.cache()); !s.ok()) {
            return fail(s);
          }
          std::string text;
          if (const auto s = answer(e, tok, *n, ns.answer_tokens, vocab, text); !s.ok()) return fail(s);
          const bool hit = n->found(text);
          if (i == 0) dense_found = hit, dense_text = text;
          rows[i].same_as_dense += text == dense_text;
          needle_row& r = rows[i];
          r.total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          r.decode_attention_s += e.stats.decode_attention_seconds - att0;
          r.steps += e.stats.decode_steps - steps0;
          ++r.needles;
          if (i == 0 || dense_found) {
            ++r.asked[d], ++r.asked_all;
            r.found[d] += hit, r.found_all += hit;
          }
        }
      }
    }
    std::printf("\n%d tokens (prompt and answer): %d needles, %d per depth, needle %d..%d tokens before the question%s\n\n", length,
                rows[0].needles, ns.per_cell, distance_min, distance_max, ns.routed_prefill ? " (prefill routed too)" : "");
    std::printf("| attention | found | ");
    for (const double d : ns.depths) std::printf("depth %.0f%% | ", 100 * d);
    std::printf("answer = dense's | decode attention ms/token | total ms/needle |\n|---|---|");
    for (std::size_t d = 0; d < ns.depths.size(); ++d) std::printf("---|");
    std::printf("---|---|---|\n");
    for (const needle_row& r : rows) {
      std::printf("| `%s` | %d/%d | ", r.spec.c_str(), r.found_all, r.asked_all);
      for (std::size_t d = 0; d < ns.depths.size(); ++d) std::printf("%d/%d | ", r.found[d], r.asked[d]);
      std::printf("%d/%d | %.3f | %.0f |\n", r.same_as_dense, r.needles, r.steps > 0 ? 1e3 * r.decode_attention_s / static_cast<double>(r.steps) : 0.0,
                  1e3 * r.total_s / std::max(r.needles, 1));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("a command is required");
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") return usage("sparse attention on a llama2.c checkpoint");
  if (cmd != "generate" && cmd != "perplexity" && cmd != "needle") return usage("unknown command " + std::string(cmd));
  std::vector<engine_options> configs;
  fs::path models, model_path, tokenizer_path, text_path, dump;
  std::string prompt;
  int n_tokens = 64, window = 512, windows = 8, greedy = 0, prompts = 4, threads = 1;
  bool markdown = false, measure = false;
  needle_setup ns;
  const auto list = [](std::string_view text) {  // "a,b,c" as numbers; empty on a bad item
    std::vector<double> out;
    std::size_t at = 0;
    while (at <= text.size()) {
      const std::size_t end = std::min(text.find(',', at), text.size());
      double v = 0;
      if (!skim_eval::detail::parse_float(text.substr(at, end - at), v)) return std::vector<double>{};
      out.push_back(v);
      at = end + 1;
    }
    return out;
  };
  int from = 0;  // perplexity and coverage over positions >= from
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
    else if (a == "--model" && has) model_path = argv[++i];
    else if (a == "--tokenizer" && has) tokenizer_path = argv[++i];
    else if (a == "--threads" && has) { if (!integer(threads, 1)) return usage("--threads needs a positive integer"); }
    else if (a == "--text" && has) text_path = argv[++i];
    else if (a == "--dump" && has) dump = argv[++i];
    else if (a == "--prompt" && has) prompt = argv[++i];
    else if (a == "--tokens" && has) { if (!integer(n_tokens, 1)) return usage("--tokens needs a positive integer"); }
    else if (a == "--window" && has) { if (!integer(window, 2)) return usage("--window needs an integer >= 2"); }
    else if (a == "--windows" && has) { if (!integer(windows, 1)) return usage("--windows needs a positive integer"); }
    else if (a == "--greedy" && has) { if (!integer(greedy, 0)) return usage("--greedy needs an integer >= 0"); }
    else if (a == "--prompts" && has) { if (!integer(prompts, 1)) return usage("--prompts needs a positive integer"); }
    else if (a == "--markdown") markdown = true;
    else if (a == "--lengths" && has) {
      ns.lengths.clear();
      for (const double v : list(argv[++i])) ns.lengths.push_back(static_cast<int>(v));
      if (ns.lengths.empty() || std::any_of(ns.lengths.begin(), ns.lengths.end(), [](int v) { return v < 64 || v > (1 << 20); }))
        return usage("--lengths needs a comma list of integers >= 64");
    } else if (a == "--depths" && has) {
      ns.depths = list(argv[++i]);
      if (ns.depths.empty() || std::any_of(ns.depths.begin(), ns.depths.end(), [](double v) { return !(v >= 0 && v <= 1); }))
        return usage("--depths needs a comma list of numbers in [0, 1]");
    } else if (a == "--needles" && has) { if (!integer(ns.per_cell, 1)) return usage("--needles needs a positive integer"); }
    else if (a == "--seed" && has) { int v = 0; if (!integer(v, 0)) return usage("--seed needs an integer >= 0"); ns.seed = static_cast<std::uint64_t>(v); }
    else if (a == "--answer" && has) { if (!integer(ns.answer_tokens, 10)) return usage("--answer needs an integer >= 10"); }
    else if (a == "--routed-prefill") ns.routed_prefill = true;
    else if (a == "--measure") measure = true;
    else if (a == "--from" && has) { if (!integer(from, 0)) return usage("--from needs an integer >= 0"); }
    else return usage("unexpected argument " + std::string(a));
  }
  for (engine_options& o : configs) o.threads = threads, o.measure = measure, o.measure_from = from;
  if (models.empty()) {
    const models_dir_result found = find_models_dir({fs::current_path(), fs::path(argv[0]).parent_path()});
    if (found.dir.empty()) return usage(found.error);
    models = found.dir;
  }
  model m;
  if (model_path.empty()) model_path = models / "stories260K.bin";
  if (tokenizer_path.empty()) tokenizer_path = models / "tok512.bin";
  if (const auto s = load(model_path, m); !s.ok()) return fail(s);
  tokenizer tok;
  if (const auto s = tokenizer::load(tokenizer_path, m.cfg.vocab_size, tok); !s.ok()) return fail(s);
  const config& c = m.cfg;
  const auto vocab = static_cast<std::size_t>(c.vocab_size);

  if (cmd == "generate") {
    if (configs.size() > 1) return usage("generate takes one --attention");
    engine_options o = configs.empty() ? engine_options{} : configs[0];
    o.threads = threads;
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

  if (cmd == "needle") {
    if (text_path.empty()) text_path = models / "kernel_val.c.txt";
    std::vector<std::byte> text;
    if (const auto s = skim::examples::read_file(text_path, text); !s.ok()) return fail(s);
    const corpus cor = corpus::encode(tok, std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
    for (const int l : ns.lengths) {
      if (l > c.seq_len) std::fprintf(stderr, "skim-llama: %d-token contexts run beyond the trained context (%d)\n", l, c.seq_len);
    }
    ns.markdown = markdown;
    return run_needles(m, tok, cor, configs, ns, threads);
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
  dense.threads = threads;
  configs.insert(configs.begin(), dense);
  std::vector<std::vector<int>> dense_greedy;
  std::vector<row> rows;
  std::vector<float> logits(static_cast<std::size_t>(window) * vocab);
  for (const engine_options& o : configs) {
    engine e(m, o, std::max(window, 16 + greedy));
    row r{.spec = o.spec, .evicts = o.evict != eviction::none};
    double sum = 0, n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& w : wins) {
      e.reset();
      if (const auto s = e.run(w, logits); !s.ok()) return fail(s);
      const std::size_t skip = std::min<std::size_t>(static_cast<std::size_t>(from), w.size() - 1);
      double part = 0;
      (void)next_token_nll(std::span<const float>(logits).subspan(skip * vocab), std::span(w).subspan(skip), c.vocab_size, &part);
      sum += part;
      n += static_cast<double>(w.size() - 1 - skip);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.nll = sum / n;
    r.ppl = std::exp(r.nll);
    r.density = e.stats.density();
    r.kv_density = e.stats.kv_density();
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
    if (markdown && measure) {  // the quality table: coverage of the true mass and recall
      const coverage_stats& cs = e.stats.coverage;
      int wl = 0, wh = 0;
      const double worst = cs.worst_head(wl, wh);
      if (cs.all.empty()) {
        std::printf("| `%s` | %.4f | %+.2f%% | %.3f | %.3f | - | - | - | - |\n", r.spec.c_str(), r.ppl, change, r.density, r.kv_density);
      } else {
        std::printf("| `%s` | %.4f | %+.2f%% | %.3f | %.3f | %.3f | %.3f | %.3f (L%d H%d) | %.3f |\n", r.spec.c_str(), r.ppl, change,
                    r.density, r.kv_density, cs.mean(), cs.quantile(0.05), worst, wl, wh, cs.recall());
      }
    } else if (markdown) {
      std::printf("| `%s` | %.4f | %+.2f%% | %.3f | %s | %s |\n", r.spec.c_str(), r.ppl, change, r.density,
                  greedy > 0 ? (std::to_string(static_cast<int>(std::lround(100 * r.greedy_same))) + "%").c_str() : "-",
                  r.evicts ? (std::to_string(r.evict_loss).substr(0, 6)).c_str() : "-");
    } else {
      std::printf("%-70s ppl %.4f (%+.2f%% vs dense)  keys read/causal %.3f  K/V read %.3f  %.2f s", r.spec.c_str(), r.ppl, change,
                  r.density, r.kv_density, r.seconds);
      if (greedy > 0) std::printf("  greedy same %.1f%%", 100 * r.greedy_same);
      if (r.evicts) std::printf("  eviction loss %.4f", r.evict_loss);
      if (!e.stats.coverage.all.empty()) {
        int wl = 0, wh = 0;
        const double worst = e.stats.coverage.worst_head(wl, wh);
        std::printf("  coverage mean %.4f p5 %.4f worst L%dH%d %.4f recall@%d %.4f", e.stats.coverage.mean(), e.stats.coverage.quantile(0.05),
                    wl, wh, worst, recall_keys, e.stats.coverage.recall());
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::fprintf(stderr, "skim-llama: %zu windows of %d tokens from %s%s\n", wins.size(), window, text_path.string().c_str(),
               window > c.seq_len ? " (beyond the trained context)" : "");
  return 0;
}
