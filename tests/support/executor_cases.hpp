#pragma once
// Cases the executor tests draw from (tests/exec/cpu/): the element-type sets of the typed tests,
// the shape walks (every head_dim, every pair of block sizes, GQA × index scope × storage), a random
// implicit index, and a random selection stored as a CSR.

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

// The shape walks. Each calls f(seed, spec, rng) once per shape, rng seeded with seed (the caller
// builds its random_case from it and INFOs the seed); `every` > 1 walks one shape in `every`
// (the NEON build under qemu runs fewer).

// head_dim 1..256, small odd and common block sizes, a prefill and a decode sequence.
template <class F>
void for_each_head_dim_case(F&& f, std::int32_t every = 1) {
  for (std::int32_t d = 1; d <= 256; d += every) {
    const std::uint32_t seed = 0xd1d1u + static_cast<std::uint32_t>(d);
    std::mt19937 rng(seed);
    case_spec spec;
    spec.head_dim = d;
    spec.heads_kv = 1;
    spec.heads_q = pick(rng, {1, 2, 4});
    spec.block_q = pick(rng, {3, 16, 17, 32});
    spec.block_kv = pick(rng, {5, 16, 24, 64});
    spec.mask = chance(rng, 0.7) ? mask_kind::causal : mask_kind::none;
    spec.seqs = {{uniform(rng, 1, 24), uniform(rng, 1, 48)}, {1, uniform(rng, 1, 90)}};
    spec.paged = chance(rng, 0.3);
    spec.page_size = 7;
    f(seed, spec, rng);
  }
}

// Every (bq, bk) of odd and common sizes, with lengths that are multiples of neither, a decode row
// and more queries than keys. f also gets the running case number n (for thinning extra checks).
template <class F>
void for_each_block_size_case(F&& f, std::int32_t every = 1) {
  const std::int32_t sizes[] = {1, 7, 16, 17, 32, 48, 64, 100, 128};
  int n = 0;
  for (std::int32_t bq : sizes) {
    for (std::int32_t bk : sizes) {
      const std::uint32_t seed = 0xb10c0u + static_cast<std::uint32_t>(n++);
      if (n % every != 0) continue;
      std::mt19937 rng(seed);
      case_spec spec;
      spec.head_dim = pick(rng, {16, 72, 80, 96, 100, 128});
      spec.heads_kv = 1;
      spec.heads_q = pick(rng, {1, 4});
      spec.block_q = bq;
      spec.block_kv = bk;
      spec.mask = chance(rng, 0.75) ? mask_kind::causal : mask_kind::none;
      spec.seqs = {{uniform(rng, 100, 160), uniform(rng, 150, 230)}, {1, uniform(rng, 1, 90)},
                   {uniform(rng, 20, 40), uniform(rng, 1, 19)}};
      spec.paged = chance(rng, 0.5);
      spec.page_size = bk == 16 ? 17 : 16;
      f(n, seed, spec, rng);
    }
  }
}

// GQA groups 1, 4, 8 × index scope × contiguous/paged, on a batch with empty sequences, decode rows
// (1 and 3 queries over long keys) and a prefill row.
template <class F>
void for_each_gqa_case(F&& f) {
  int n = 0;
  for (std::int32_t group : {1, 4, 8}) {
    for (index_scope scope : {index_scope::kv_head, index_scope::query_head}) {
      for (bool paged : {false, true}) {
        const std::uint32_t seed = 0x6aa0u + static_cast<std::uint32_t>(n++);
        std::mt19937 rng(seed);
        case_spec spec;
        spec.heads_kv = 2;
        spec.heads_q = 2 * group;
        spec.head_dim = 64;
        spec.block_q = 32;
        spec.block_kv = 16;
        spec.scope = scope;
        spec.seqs = {{70, 130}, {0, 40}, {1, 300}, {3, 200}, {45, 45}, {0, 0}};
        spec.paged = paged;
        spec.page_size = 16;
        f(seed, spec, rng);
      }
    }
  }
}

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
