#pragma once
// The real stories260K checkpoint for tests: where it is, loading it once, and skipping the
// real-model cases (saying so once, with where it looked) when a checkout has no
// ../shared/models beside it. scripts/test prints the same warning.
//
//   TEST_CASE("..." * doctest::skip(skim::test::real::model_missing())) { const auto& [m, tok] = real_model(); }

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../../examples/llama/model.hpp"
#include "../../examples/llama/models_dir.hpp"
#include "../../examples/llama/tokenizer.hpp"

namespace skim::test::real {

namespace fs = std::filesystem;

inline skim_llama::models_dir_result find_models() {
  return skim_llama::find_models_dir({fs::current_path(), fs::path(__FILE__).parent_path()});
}

inline bool model_missing() {
  static const bool missing = [] {
    const skim_llama::models_dir_result r = find_models();
    if (r.dir.empty()) std::fprintf(stderr, "skim_tests: skipping the real-model cases: %s\n", r.error.c_str());
    return r.dir.empty();
  }();
  return missing;
}

// The models directory, or a failed test naming where it looked.
inline fs::path models_dir() {
  const skim_llama::models_dir_result r = find_models();
  if (r.dir.empty()) FAIL(r.error);
  return r.dir;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open ", p.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct loaded {
  skim_llama::model m;
  skim_llama::tokenizer tok;
};

// Loaded once per test binary.
inline const loaded& real_model() {
  static const loaded* l = [] {
    auto* x = new loaded;
    const fs::path dir = models_dir();
    const skim::status s = skim_llama::load(dir / "stories260K.bin", x->m);
    REQUIRE_MESSAGE(s.ok(), s.message());
    const skim::status t = skim_llama::tokenizer::load(dir / "tok512.bin", x->m.cfg.vocab_size, x->tok);
    REQUIRE_MESSAGE(t.ok(), t.message());
    return x;
  }();
  return *l;
}

}  // namespace skim::test::real
