#pragma once
// Shared helpers of the skim::index tests: random problems (varlen, empty sequences, causal or
// not, odd block sizes, partial tails, both index scopes), a std::set model of an index, and
// stored forms built from the model by hand (independently of convert.hpp).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "support/seed.hpp"

namespace skim_test {

using namespace skim;

// The test case's next seed (support/seed.hpp: replayed by SKIM_TEST_SEED), INFO'd by the caller.
inline std::uint32_t fresh_seed() { return skim::test::next_seed(); }

inline int uniform(std::mt19937& rng, int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// Owns the cu_seqlens a problem points into.
struct problem_case {
  std::vector<std::int32_t> cq{0}, ck{0};
  std::int32_t heads_q = 1, heads_kv = 1, block_q = 4, block_kv = 4;
  mask_kind mask = mask_kind::causal;
  index_scope scope = index_scope::kv_head;

  [[nodiscard]] problem get() const {
    return problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = 8, .block_q = block_q,
                   .block_kv = block_kv, .mask = mask, .cu_seqlens_q = cq, .cu_seqlens_kv = ck, .scope = scope};
  }
  void add_sequence(std::int32_t n_q, std::int32_t n_kv) {
    cq.push_back(cq.back() + n_q);
    ck.push_back(ck.back() + n_kv);
  }
};

// 1..4 sequences, one of them (when there are two or more) empty in q, kv or both; odd block sizes;
// sometimes one kv block per key (many columns: masks of several words).
inline problem_case random_problem(std::mt19937& rng) {
  problem_case c;
  static constexpr std::int32_t bqs[] = {1, 3, 4, 5, 7, 16};
  static constexpr std::int32_t bks[] = {1, 2, 3, 5, 7, 13, 64};
  c.block_q = bqs[uniform(rng, 0, 5)];
  c.block_kv = bks[uniform(rng, 0, 6)];
  c.heads_kv = uniform(rng, 1, 3);
  c.heads_q = c.heads_kv * uniform(rng, 1, 3);
  c.mask = uniform(rng, 0, 1) ? mask_kind::causal : mask_kind::none;
  c.scope = uniform(rng, 0, 1) ? index_scope::kv_head : index_scope::query_head;
  const int batch = uniform(rng, 1, 4);
  const int empty = batch >= 2 ? uniform(rng, 0, batch - 1) : -1;
  for (int b = 0; b < batch; ++b) {
    std::int32_t n_q = uniform(rng, 0, 3) == 0 ? 1 : uniform(rng, 1, 40);  // decode rows too
    std::int32_t n_kv = uniform(rng, 0, 4) == 0 ? uniform(rng, 65, 200) : uniform(rng, 0, 90);
    if (b == empty) {
      const int which = uniform(rng, 0, 2);
      if (which != 1) n_q = 0;
      if (which != 0) n_kv = 0;
    }
    c.add_sequence(n_q, n_kv);
  }
  return c;
}

// A fixed varlen causal case for exact messages: bq = bk = 4, heads 2/2 (rows = q block * 2 + head).
//   seq 0: 8 queries, 40 keys (10 kv blocks): rows 0, 1 see 9 blocks, rows 2, 3 see 10;
//   seq 1: 4 queries, 20 keys (5 kv blocks):  rows 4, 5 see 5 blocks.
inline const problem_case& fixed_case() {
  static const problem_case c = [] {
    problem_case f;
    f.heads_q = 2;
    f.heads_kv = 2;
    f.add_sequence(8, 40);
    f.add_sequence(4, 20);
    return f;
  }();
  return c;
}

inline std::string describe(const problem_case& c) {
  std::string s = "bq " + std::to_string(c.block_q) + " bk " + std::to_string(c.block_kv) + " heads " +
                  std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) +
                  (c.mask == mask_kind::causal ? " causal" : " none") +
                  (c.scope == index_scope::kv_head ? " kv_head" : " query_head") + " seqs";
  for (std::size_t b = 1; b < c.cq.size(); ++b) {
    s += " (" + std::to_string(c.cq[b] - c.cq[b - 1]) + "," + std::to_string(c.ck[b] - c.ck[b - 1]) + ")";
  }
  return s;
}

// The model: one std::set of ids per index row.
using model = std::vector<std::set<std::int32_t>>;

// Random ids in [0, visible_blocks) per row, with a per-case density.
inline model random_model(const problem& p, std::mt19937& rng) {
  model m(static_cast<std::size_t>(p.index_rows()));
  static constexpr double densities[] = {0.0, 0.1, 0.3, 0.7, 1.0};
  const double density = densities[uniform(rng, 0, 4)];
  std::bernoulli_distribution keep(density);
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            for (std::int32_t j = 0; j < r.visible_blocks; ++j) {
              if (keep(rng)) m[static_cast<std::size_t>(r.row)].insert(j);
            }
          }).ok());
  return m;
}

// What an index's cursors yield, row by row, in cursor order (duplicates kept).
template <block_index I>
std::vector<std::vector<std::int32_t>> read_rows(const problem& p, const I& idx) {
  std::vector<std::vector<std::int32_t>> rows(static_cast<std::size_t>(p.index_rows()));
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            std::size_t guard = 0;
            for (auto c = idx.cursor(r); !c.done(); c.next()) {
              rows[static_cast<std::size_t>(r.row)].push_back(static_cast<std::int32_t>(c.id()));
              if (++guard > 100000) FAIL("cursor of row ", r.row, " does not end");
            }
          }).ok());
  return rows;
}

inline std::vector<std::vector<std::int32_t>> as_rows(const model& m) {
  std::vector<std::vector<std::int32_t>> rows;
  for (const auto& s : m) rows.emplace_back(s.begin(), s.end());
  return rows;
}

inline std::int64_t model_nnz(const model& m) {
  std::int64_t n = 0;
  for (const auto& s : m) n += static_cast<std::int64_t>(s.size());
  return n;
}

inline std::int32_t model_width(const model& m) {
  std::size_t w = 0;
  for (const auto& s : m) w = std::max(w, s.size());
  return static_cast<std::int32_t>(w);
}

// Stored forms built by hand from rows of ids (kept in the given order), owning their buffers.
struct owned_table {
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;
  [[nodiscard]] index::block_table view() const { return {ids, count, width}; }
  [[nodiscard]] index::mutable_block_table mut() { return {ids, count, width}; }
};
inline owned_table make_table(const std::vector<std::vector<std::int32_t>>& rows, std::int32_t extra_width = 0) {
  owned_table t;
  std::size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.size());
  t.width = static_cast<std::int32_t>(w) + extra_width;
  t.ids.assign(rows.size() * static_cast<std::size_t>(t.width), -7);  // padding content must not matter
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), t.ids.begin() + static_cast<std::ptrdiff_t>(r * t.width));
    t.count.push_back(static_cast<std::int32_t>(rows[r].size()));
  }
  return t;
}

struct owned_csr {
  std::vector<std::int32_t> row_ptr, col_idx;
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
  [[nodiscard]] index::mutable_block_csr mut() { return {row_ptr, col_idx}; }
};
inline owned_csr make_csr(const std::vector<std::vector<std::int32_t>>& rows) {
  owned_csr c;
  c.row_ptr.push_back(0);
  for (const auto& r : rows) {
    c.col_idx.insert(c.col_idx.end(), r.begin(), r.end());
    c.row_ptr.push_back(static_cast<std::int32_t>(c.col_idx.size()));
  }
  return c;
}

struct owned_mask {
  std::vector<std::uint64_t> words;
  std::int32_t cols = 0;
  [[nodiscard]] index::dense_block_mask view() const { return {words, cols}; }
};
inline owned_mask make_mask(const std::vector<std::vector<std::int32_t>>& rows, std::int32_t cols) {
  owned_mask m;
  m.cols = cols;
  const std::size_t wpr = (static_cast<std::size_t>(cols) + 63) / 64;
  m.words.assign(rows.size() * wpr, 0);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::int32_t id : rows[r]) {
      m.words[r * wpr + static_cast<std::size_t>(id) / 64] |= std::uint64_t{1} << (id % 64);
    }
  }
  return m;
}

inline std::string_view msg(const status& s) { return s.message(); }

// Visible blocks of every index row, from first principles rather than row_info: rows in the
// problem's order ((q_block_offset(b) + i) * index_heads + h), and a key block visible to a row when
// some query of the row's block may see some key of it (every key under mask_kind::none; under
// causality query q of n_q sees key j of n_kv when j <= q + n_kv - n_q).
inline std::vector<std::int32_t> brute_visible_blocks(const problem_case& c) {
  const std::int32_t index_heads = c.scope == index_scope::kv_head ? c.heads_kv : c.heads_q;
  std::vector<std::int32_t> rows;
  for (std::size_t b = 1; b < c.cq.size(); ++b) {
    const std::int32_t n_q = c.cq[b] - c.cq[b - 1], n_kv = c.ck[b] - c.ck[b - 1];
    for (std::int32_t first = 0; first < n_q; first += c.block_q) {
      std::int32_t visible = 0;
      for (std::int32_t q = first; q < std::min(n_q, first + c.block_q); ++q) {
        for (std::int32_t j = 0; j < n_kv; ++j) {
          if (c.mask == mask_kind::none || j <= q + n_kv - n_q) visible = std::max(visible, j / c.block_kv + 1);
        }
      }
      rows.insert(rows.end(), static_cast<std::size_t>(index_heads), visible);
    }
  }
  return rows;
}

// Checks an implicit rule on a random problem: every row's ids (in cursor order) equal
// want(visible blocks of the row, brute force), validate() is ok, and skip(n) on a fresh cursor
// lands where n next() calls do.
template <block_index I, class Want>
void check_rule(const problem_case& pc, const I& idx, Want&& want, std::mt19937& rng) {
  const problem p = pc.get();
  REQUIRE(validate(p).ok());
  const std::vector<std::int32_t> visible = brute_visible_blocks(pc);
  REQUIRE(visible.size() == static_cast<std::size_t>(p.index_rows()));
  std::vector<std::vector<std::int32_t>> expected;
  for (const std::int32_t v : visible) expected.push_back(want(v));
  CHECK(read_rows(p, idx) == expected);
  const status s = idx.validate(p);
  CHECK_MESSAGE(s.ok(), s.message());
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            const auto& ids = expected[static_cast<std::size_t>(r.row)];
            const std::int32_t n = uniform(rng, 0, static_cast<int>(ids.size()) + 2);
            auto c = idx.cursor(r);
            c.skip(n);
            std::vector<std::int32_t> rest;
            for (; !c.done(); c.next()) rest.push_back(static_cast<std::int32_t>(c.id()));
            const std::size_t from = std::min(ids.size(), static_cast<std::size_t>(n));
            CHECK(rest == std::vector<std::int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end()));
          }).ok());
}

// The ids [first, last) as a row.
inline std::vector<std::int32_t> id_range(std::int32_t first, std::int32_t last) {
  std::vector<std::int32_t> ids;
  for (std::int32_t id = first; id < last; ++id) ids.push_back(id);
  return ids;
}

}  // namespace skim_test

// Seeds the case's generator afresh and prints the seed (and the problem) on failure.
#define SKIM_RANDOM_CASE(rng)                   \
  const std::uint32_t seed_ = ::skim_test::fresh_seed(); \
  INFO("seed ", seed_);                         \
  std::mt19937 rng(seed_)
