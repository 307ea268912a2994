// skim-eval — evaluate sparse-attention pipelines on a model's own Q, K, V (docs/design.md §12).
//
//   skim-eval --q Q.npy --k K.npy --v V.npy [--causal|--no-causal] [--recall 8,16,32] [--json]
//             [--min-position N] [--repeat N] [--head-table] --config SPEC [--config SPEC ...]
//
// Options and SPEC keys: options.hpp (or --help). What is measured and how: run.hpp. Output:
// report.hpp. Exit status: 0 on success, 2 for bad input (options, files, shapes, a
// configuration the data cannot run), 1 for a failure while evaluating; errors are one line on
// stderr, "skim-eval: <what was wrong>".

#include <cstdio>
#include <string>

#include "options.hpp"
#include "report.hpp"
#include "run.hpp"

int main(int argc, char** argv) {
  skim_eval::options opts;
  if (const std::string e = skim_eval::parse_options(argc, argv, opts); !e.empty()) {
    std::fprintf(stderr, "skim-eval: %s\n", e.c_str());
    return 2;
  }
  if (opts.help) {
    std::fwrite(skim_eval::usage_text.data(), 1, skim_eval::usage_text.size(), stdout);
    return 0;
  }
  skim_eval::run_result result;
  if (const skim_eval::outcome o = skim_eval::run(opts, result); !o.ok()) {
    std::fprintf(stderr, "skim-eval: %s\n", o.error.c_str());
    return o.exit_code;
  }
  if (opts.json) {
    const std::string j = skim_eval::to_json(result);
    std::fwrite(j.data(), 1, j.size(), stdout);
  } else {
    skim_eval::print_text(result, stdout);
  }
  return 0;
}
