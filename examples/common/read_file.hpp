#pragma once
// skim::examples::read_file — a whole file into memory, errors as values (no exceptions:
// iostreams throw on some errors, e.g. reading a directory).

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "skim/core/status.hpp"

namespace skim::examples {

// @post on success `out` holds the file's bytes; messages name `path` as given.
[[nodiscard]] inline status read_file(const std::filesystem::path& path, std::vector<std::byte>& out) {
  const std::string name = path.string();
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(name.c_str(), "rb"), &std::fclose);
  if (!f) return status::error(status_code::invalid_argument, "%s: cannot open (%s)", name.c_str(), std::strerror(errno));
  out.clear();
  std::byte chunk[1 << 16];
  std::size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof chunk, f.get())) > 0) out.insert(out.end(), chunk, chunk + got);
  if (std::ferror(f.get())) return status::error(status_code::invalid_argument, "%s: read error (%s)", name.c_str(), std::strerror(errno));
  return status::success();
}

}  // namespace skim::examples
