#include <doctest/doctest.h>

#include <array>
#include <numeric>
#include <string_view>
#include <vector>

#include "skim/core/views.hpp"

using namespace skim;

TEST_CASE("strided_view addresses token-major and head-major layouts") {
  std::vector<float> buf(3 * 2 * 5);
  std::iota(buf.begin(), buf.end(), 0.0f);
  const auto tm = strided_view<float>::token_major(buf.data(), 3, 2, 5);
  CHECK(*tm.row(2, 1) == 25.0f);  // (2*2 + 1) * 5
  const auto hm = strided_view<float>::head_major(buf.data(), 3, 2, 5);
  CHECK(*hm.row(2, 1) == 25.0f);  // (1*3 + 2) * 5
  CHECK(*hm.row(1, 0) == 5.0f);
  const auto [lo, hi] = tm.extent();
  CHECK(hi - lo == static_cast<std::ptrdiff_t>(buf.size() * sizeof(float)));
}

TEST_CASE("check_view names the view and the mismatch") {
  std::vector<float> buf(24);
  const auto v = strided_view<const float>::token_major(buf.data(), 4, 2, 3);
  CHECK(check_view(v, 4, 2, 3, "K").ok());
  const status s = check_view(v, 5, 2, 3, "K");
  CHECK(s.code() == status_code::shape_mismatch);
  CHECK(std::string_view(s.message()) == "K is [4, 2, 3], expected [5, 2, 3]");
  auto neg = v;
  neg.token_stride = -6;
  CHECK(std::string_view(check_view(neg, 4, 2, 3, "V").message()) == "V has negative strides (token -6, head 3)");
}

TEST_CASE("contiguous_kv reads each sequence's own tokens") {
  std::array<std::int32_t, 3> cq{0, 1, 2}, ck{0, 3, 7};
  problem p{.heads_q = 2, .heads_kv = 2, .head_dim = 4, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  std::vector<float> k(7 * 2 * 4), v(7 * 2 * 4);
  std::iota(k.begin(), k.end(), 100.0f);
  std::iota(v.begin(), v.end(), -100.0f);
  contiguous_kv<float> kv{.k = strided_view<const float>::token_major(k.data(), 7, 2, 4),
                          .v = strided_view<const float>::token_major(v.data(), 7, 2, 4)};
  REQUIRE(kv.validate(p).ok());
  const auto bound = kv.bind(p);
  CHECK(*bound.k_row(1, 2, 1) == 100.0f + (5 * 2 + 1) * 4);  // sequence 1 starts at token 3
  CHECK(*bound.v_row(0, 2, 0) == -100.0f + 2 * 2 * 4);
}

TEST_CASE("paged_kv maps logical tokens through the page table and validates it") {
  // Two sequences of 5 and 2 keys, page size 2, 1 head, dim 3; pages given out of order.
  std::array<std::int32_t, 3> cq{0, 1, 2}, ck{0, 5, 7};
  problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 3, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  const std::int32_t pages = 5, page_size = 2;
  std::vector<float> k(pages * page_size * 3), v(k.size());
  std::iota(k.begin(), k.end(), 0.0f);
  std::iota(v.begin(), v.end(), 1000.0f);
  std::array<std::int32_t, 3> indptr{0, 3, 4};
  std::array<std::int32_t, 4> indices{4, 0, 2, 1};
  auto kv = paged_kv<float>::packed(k.data(), v.data(), pages, page_size, 1, 3, indptr, indices);
  REQUIRE(kv.validate(p).ok());
  CHECK(*kv.k_row(0, 0, 0) == 4 * 6.0f);          // page 4, slot 0
  CHECK(*kv.k_row(0, 3, 0) == 0 * 6.0f + 3.0f);   // page 0, slot 1
  CHECK(*kv.k_row(0, 4, 0) == 2 * 6.0f);          // page 2, slot 0
  CHECK(*kv.v_row(1, 1, 0) == 1000.0f + 6.0f + 3.0f);  // page 1, slot 1

  std::array<std::int32_t, 4> bad = indices;
  bad[2] = 5;
  auto kv_bad = paged_kv<float>::packed(k.data(), v.data(), pages, page_size, 1, 3, indptr, bad);
  const status s = kv_bad.validate(p);
  CHECK(s.code() == status_code::invalid_index);
  CHECK(std::string_view(s.message()) == "page_indices[2] = 5 out of [0, 5) for sequence 0");

  std::array<std::int32_t, 3> short_indptr{0, 2, 3};
  auto kv_short = paged_kv<float>::packed(k.data(), v.data(), pages, page_size, 1, 3, short_indptr, indices);
  CHECK(std::string_view(kv_short.validate(p).message()) == "sequence 0 has 2 pages, needs 3 for 5 keys");

  auto kv_overlap = kv;
  kv_overlap.token_stride = 2;  // rows of 3 elements 2 apart
  CHECK(kv_overlap.validate(p).code() == status_code::invalid_argument);
}

TEST_CASE("paged_kv reads head-major pages, [pages, heads_kv, page_size, head_dim]") {
  // One sequence of 5 keys, 2 kv heads, dim 3, page size 2, pages 2, 0, 1.
  std::array<std::int32_t, 2> cq{0, 1}, ck{0, 5};
  problem p{.heads_q = 2, .heads_kv = 2, .head_dim = 3, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  const std::int32_t pages = 3, page_size = 2;
  std::vector<float> k(pages * 2 * page_size * 3), v(k.size());
  std::iota(k.begin(), k.end(), 0.0f);
  std::iota(v.begin(), v.end(), 1000.0f);
  std::array<std::int32_t, 2> indptr{0, 3};
  std::array<std::int32_t, 3> indices{2, 0, 1};
  auto kv = paged_kv<float>::packed_head_major(k.data(), v.data(), pages, page_size, 2, 3, indptr, indices);
  REQUIRE(kv.validate(p).ok());
  CHECK(kv.page_stride == 12);
  CHECK(kv.head_stride == 6);
  CHECK(kv.token_stride == 3);
  CHECK(*kv.k_row(0, 0, 0) == 2 * 12.0f);                 // page 2, head 0, slot 0
  CHECK(*kv.k_row(0, 1, 1) == 2 * 12.0f + 6.0f + 3.0f);   // page 2, head 1, slot 1
  CHECK(*kv.v_row(0, 4, 1) == 1000.0f + 12.0f + 6.0f);    // page 1, head 1, slot 0

  auto short_head = kv;
  short_head.head_stride = 5;  // head 1's tokens start inside head 0's second row
  CHECK(short_head.validate(p).code() == status_code::invalid_argument);
  auto short_page = kv;
  short_page.page_stride = 11;  // the next page starts inside head 1's last row
  CHECK(short_page.validate(p).code() == status_code::invalid_argument);
}
