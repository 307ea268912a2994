// Every C++ snippet of the README and docs/ is code the test suite compiles: each ```cpp block
// must equal (indentation and #include lines aside) a block between "// snippet begin" and
// "// snippet end" in tests/docs/*_test.cpp (compiled and run here) or tests/cuda/docs_test.cu
// (compiled wherever nvcc is, run on a GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef SKIM_SOURCE_DIR
#error "SKIM_SOURCE_DIR names skim's source tree (tests/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Without #include lines and surrounding blank lines, dedented by the smallest indentation.
std::string normalised(std::vector<std::string> block) {
  std::erase_if(block, [](const std::string& l) { return l.rfind("#include", l.find_first_not_of(' ')) == 0; });
  while (!block.empty() && block.front().find_first_not_of(' ') == std::string::npos) block.erase(block.begin());
  while (!block.empty() && block.back().find_first_not_of(' ') == std::string::npos) block.pop_back();
  std::size_t indent = std::string::npos;
  for (const std::string& l : block) {
    if (const std::size_t i = l.find_first_not_of(' '); i != std::string::npos) indent = std::min(indent, i);
  }
  std::string out;
  for (const std::string& l : block) out += (l.size() > indent ? l.substr(indent) : std::string()) + "\n";
  return out;
}

// Blocks between two marker lines (trimmed) of a file.
std::vector<std::string> blocks_between(const std::vector<std::string>& lines, const std::string& open,
                                        const std::string& close) {
  std::vector<std::string> blocks;
  std::vector<std::string> current;
  bool inside = false;
  for (const std::string& raw : lines) {
    const std::size_t first = raw.find_first_not_of(' ');
    const std::string l = first == std::string::npos ? std::string() : raw.substr(first);
    if (!inside && l == open) {
      inside = true;
      current.clear();
    } else if (inside && l == close) {
      inside = false;
      blocks.push_back(normalised(current));
    } else if (inside) {
      current.push_back(raw);
    }
  }
  return blocks;
}

}  // namespace

TEST_CASE("every ```cpp snippet of the README and docs/ is compiled by the tests") {
  const fs::path root = SKIM_SOURCE_DIR;
  std::vector<std::string> compiled;
  for (const fs::path& source : {root / "tests/docs/readme_test.cpp", root / "tests/cuda/docs_test.cu"}) {
    REQUIRE_MESSAGE(fs::exists(source), source.string());
    for (std::string& b : blocks_between(lines_of(source), "// snippet begin", "// snippet end")) {
      compiled.push_back(std::move(b));
    }
  }
  std::vector<fs::path> docs{root / "README.md"};
  for (const fs::directory_entry& e : fs::directory_iterator(root / "docs")) {
    if (e.path().extension() == ".md") docs.push_back(e.path());
  }
  std::sort(docs.begin(), docs.end());
  int snippets = 0;
  for (const fs::path& doc : docs) {
    const std::vector<std::string> blocks = blocks_between(lines_of(doc), "```cpp", "```");
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      ++snippets;
      INFO(doc.filename().string(), " snippet ", i + 1, ":\n", blocks[i]);
      CHECK(std::find(compiled.begin(), compiled.end(), blocks[i]) != compiled.end());
    }
  }
  CHECK(snippets >= 3);  // the README's quick start and its two decode steps, at least
}
