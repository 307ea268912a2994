#pragma once
// Index cases every executor test draws from (scalar, simd, stored formats): the element-type
// sets of the typed tests, a random implicit index, and a random selection stored as a CSR.

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "skim/core/problem.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/random_case.hpp"

namespace skim::test {

// Element types of Q, K/V and O for TEST_CASE_TEMPLATE.
template <class Q, class KV, class O>
struct types {
  using q = Q;
  using kv = KV;
  using o = O;
};

// Calls f(index, name) with a random implicit index: causal_all, sink or sliding_window.
template <class F>
void with_implicit_index(std::mt19937& rng, F&& f) {
  switch (uniform(rng, 0, 2)) {
    case 0: f(index::causal_all{}, std::string("causal_all")); break;
    case 1: {
      const std::int32_t n = uniform(rng, 0, 3);
      f(index::sink{n}, "sink " + std::to_string(n));
      break;
    }
    default: {
      const std::int32_t n = uniform(rng, 0, 4);
      f(index::sliding_window{n}, "sliding_window " + std::to_string(n));
      break;
    }
  }
}

// A CSR index built from per-row id sets (kept sorted by std::set).
struct csr_storage {
  std::vector<std::int32_t> row_ptr{0};
  std::vector<std::int32_t> col_idx;

  void add_row(const std::set<std::int32_t>& ids) {
    col_idx.insert(col_idx.end(), ids.begin(), ids.end());
    row_ptr.push_back(static_cast<std::int32_t>(col_idx.size()));
  }
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
};

// Each visible block of each row with probability `density`; some rows left empty.
inline csr_storage random_selection(const problem& p, std::mt19937& rng, double density) {
  csr_storage csr;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            std::set<std::int32_t> ids;
            if (!chance(rng, 0.1)) {
              for (std::int32_t id = 0; id < r.visible_blocks; ++id) {
                if (chance(rng, density)) ids.insert(id);
              }
            }
            csr.add_row(ids);
          }).ok());
  return csr;
}

}  // namespace skim::test
