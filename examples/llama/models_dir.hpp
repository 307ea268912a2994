#pragma once
// skim_llama::find_models_dir — where the real checkpoint and texts live.
//
// The models are not in the repository: they sit in shared/models beside the checkout
// (../shared/models from the repo root). Tests and tools find them through, in order:
//   1. $SKIM_MODELS_DIR, if set (and then only there);
//   2. <ancestor>/shared/models for every ancestor of each start directory given.
// On failure the message lists every place looked at.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <vector>

namespace skim_llama {

struct models_dir_result {
  std::filesystem::path dir;  // empty if not found
  std::string error;          // says where it looked; empty on success
};

inline constexpr const char* model_file_name = "stories260K.bin";

[[nodiscard]] inline models_dir_result find_models_dir(std::initializer_list<std::filesystem::path> starts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (const char* env = std::getenv("SKIM_MODELS_DIR"); env && *env) {
    if (fs::is_regular_file(fs::path(env) / model_file_name, ec)) return {fs::path(env), {}};
    return {{}, std::string("SKIM_MODELS_DIR=") + env + " holds no " + model_file_name};
  }
  std::vector<fs::path> looked;
  for (const fs::path& start : starts) {
    fs::path dir = fs::absolute(start, ec);
    if (ec) continue;
    for (;;) {
      const fs::path candidate = dir / "shared" / "models";
      if (fs::is_regular_file(candidate / model_file_name, ec)) return {candidate, {}};
      if (std::find(looked.begin(), looked.end(), candidate) == looked.end()) looked.push_back(candidate);
      if (!dir.has_parent_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  }
  std::string error = std::string("no shared/models/") + model_file_name + " found (set SKIM_MODELS_DIR to its directory); looked in:";
  for (const fs::path& p : looked) error += "\n  " + p.string();
  return {{}, error};
}

}  // namespace skim_llama
