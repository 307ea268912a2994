#include "skim/index/transpose.hpp"

#include <doctest/doctest.h>

#include "index/index_testing.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/sink.hpp"

using namespace skim;
using namespace skim_test;

namespace {

// The kv->q model: for every q row (b, i, h) and id j, query block i joins kv row (off(b) + j) * H + h.
model transpose_model(const problem& p, const model& m) {
  std::vector<std::int64_t> kv_off(static_cast<std::size_t>(p.batch()) + 1, 0);
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const auto k = static_cast<std::size_t>(b);
    kv_off[k + 1] = kv_off[k] + p.kv_blocks(b);
  }
  model t(static_cast<std::size_t>(kv_off.back() * p.index_heads()));
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            for (std::int32_t j : m[static_cast<std::size_t>(r.row)]) {
              t[static_cast<std::size_t>((kv_off[static_cast<std::size_t>(r.seq)] + j) * p.index_heads() + r.head)]
                  .insert(r.q_block);
            }
          }).ok());
  return t;
}

std::vector<std::vector<std::int32_t>> csr_rows(const std::vector<std::int32_t>& row_ptr,
                                                const std::vector<std::int32_t>& col_idx) {
  std::vector<std::vector<std::int32_t>> rows;
  for (std::size_t r = 0; r + 1 < row_ptr.size(); ++r) {
    REQUIRE(row_ptr[r] <= row_ptr[r + 1]);
    REQUIRE(static_cast<std::size_t>(row_ptr[r + 1]) <= col_idx.size());
    rows.emplace_back(col_idx.begin() + row_ptr[r], col_idx.begin() + row_ptr[r + 1]);
  }
  return rows;
}

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("transpose: kv->q rows list each reading query block once, ascending, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m = random_model(p, rng);
    const owned_csr c = make_csr(as_rows(m));
    const model expected = transpose_model(p, m);
    REQUIRE(index::transposed_rows(p) == static_cast<std::int64_t>(expected.size()));
    std::vector<std::int32_t> row_ptr(static_cast<std::size_t>(index::transposed_rows(p)) + 1, 999);
    std::vector<std::int32_t> col_idx(static_cast<std::size_t>(index::count_nnz(p, c.view())), 999);
    const status s = index::transpose(p, c.view(), row_ptr, col_idx);
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(row_ptr.front() == 0);
    CHECK(row_ptr.back() == model_nnz(m));
    CHECK(csr_rows(row_ptr, col_idx) == as_rows(expected));  // as_rows: sorted, unique

    // Any block_index transposes: a union of the CSR with a sink.
    const auto u = index::make_union(c.view(), index::sink{1});
    std::vector<std::int32_t> col_u(static_cast<std::size_t>(index::count_nnz(p, u)));
    REQUIRE(index::transpose(p, u, row_ptr, col_u).ok());
    model mu = m;
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              if (r.visible_blocks > 0) mu[static_cast<std::size_t>(r.row)].insert(0);
            }).ok());
    CHECK(csr_rows(row_ptr, col_u) == as_rows(transpose_model(p, mu)));
  }
}

TEST_CASE("transpose: a fixed varlen example, per-query-head rows") {
  problem_case pc;  // seq 0: 6 queries, 9 keys; seq 1: empty; seq 2: 3 queries, 3 keys. bq 3, bk 3, heads 2/1.
  pc.heads_q = 2;
  pc.heads_kv = 1;
  pc.block_q = 3;
  pc.block_kv = 3;
  pc.scope = index_scope::query_head;
  pc.add_sequence(6, 9);
  pc.add_sequence(0, 0);
  pc.add_sequence(3, 3);
  const problem p = pc.get();
  REQUIRE(p.index_rows() == 6);  // (2 + 0 + 1) q blocks x 2 heads
  CHECK(index::kv_block_offset(p, 2) == 3);
  REQUIRE(index::transposed_rows(p) == 8);  // (3 + 0 + 1) kv blocks x 2 heads
  // q rows: (s0, i0, h0) (s0, i0, h1) (s0, i1, h0) (s0, i1, h1) (s2, i0, h0) (s2, i0, h1)
  const owned_csr c = make_csr({{0, 1}, {1}, {0, 2}, {1, 2}, {0}, {}});
  REQUIRE(c.view().validate(p).ok());
  std::vector<std::int32_t> row_ptr(9), col_idx(8);
  REQUIRE(index::transpose(p, c.view(), row_ptr, col_idx).ok());
  // kv rows: (s0, j0, h0) (s0, j0, h1) (s0, j1, h0) (s0, j1, h1) (s0, j2, h0) (s0, j2, h1) (s2, j0, h0) (s2, j0, h1)
  CHECK(csr_rows(row_ptr, col_idx) ==
        std::vector<std::vector<std::int32_t>>{{0, 1}, {}, {0}, {0, 1}, {1}, {1}, {0}, {}});
}

TEST_CASE("transpose: bad sizes and ids get exact messages") {
  const problem p = fixed_case().get();  // 15 kv blocks x 2 heads = 30 transposed rows
  REQUIRE(index::transposed_rows(p) == 30);
  const owned_csr c = make_csr({{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}});
  std::vector<std::int32_t> row_ptr(31), col_idx(12);
  check_error(index::transpose(p, c.view(), std::span<std::int32_t>(row_ptr).first(30), col_idx),
              status_code::shape_mismatch, "transpose row_ptr_out has 30 entries, needs transposed rows 30 + 1");
  check_error(index::transpose(p, c.view(), row_ptr, std::span<std::int32_t>(col_idx).first(11)),
              status_code::shape_mismatch, "transpose col_idx_out has 11 entries, needs 12");
  const owned_csr bad = make_csr({{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 5}});
  check_error(index::transpose(p, bad.view(), row_ptr, col_idx), status_code::invalid_index,
              "block id 5 >= kv blocks 5 of sequence 1 in row 5 (position 3)");
  const owned_csr future = make_csr({{0, 9}, {}, {}, {}, {}, {}});
  check_error(index::transpose(p, future.view(), row_ptr, col_idx), status_code::invalid_index,
              "block id 9 >= visible blocks 9 in row 0 (position 1): in the future under causality");
  REQUIRE(index::transpose(p, c.view(), row_ptr, col_idx).ok());
  // kv block 8 of seq 0, head 0 -> row 16: read by q block 0 (row 0); kv block 4 of seq 1, head 1 -> (10 + 4) * 2 + 1.
  CHECK(csr_rows(row_ptr, col_idx)[16] == std::vector<std::int32_t>{0});
  CHECK(csr_rows(row_ptr, col_idx)[29] == std::vector<std::int32_t>{0});
  CHECK(csr_rows(row_ptr, col_idx)[28] == std::vector<std::int32_t>{0});
}
