#include "skim/select/top_tokens.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

using namespace skim;
using skim::select::top_tokens;
using skim::test::case_spec;
using skim::test::chance;
using skim::test::pick;
using skim::test::random_case;
using skim::test::uniform;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// Decode-heavy random shapes: mostly one query per sequence (block_q 1 or more), some chunked
// prefill rows, empty sequences, GQA 1/4/8, odd head dims, paged K/V.
case_spec decode_spec(std::mt19937& rng) {
  case_spec s;
  s.head_dim = pick(rng, {1, 2, 3, 5, 8, 13, 32, 33, 64, 80, 128});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {1, 1, 1, 3, 16});
  s.block_kv = pick(rng, {1, 7, 16, 64});
  s.mask = chance(rng, 0.8) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.7) ? index_scope::kv_head : index_scope::query_head;
  s.seqs.clear();
  const std::int32_t batch = uniform(rng, 1, 4);
  for (std::int32_t b = 0; b < batch; ++b) {
    const int kind = uniform(rng, 0, 7);
    const std::int32_t kv = uniform(rng, 1, 260);
    if (kind == 0) {
      s.seqs.push_back({0, chance(rng, 0.5) ? 0 : kv});
    } else if (kind == 1) {
      s.seqs.push_back({1, 0});  // a decode row with no keys
    } else if (kind == 2) {
      s.seqs.push_back({uniform(rng, 1, std::min(kv, 40)), kv});
    } else {
      s.seqs.push_back({1, kv});
    }
  }
  s.paged = chance(rng, 0.5);
  s.page_size = pick(rng, {1, 3, 16, 17});
  s.q_head_major = chance(rng, 0.25);
  return s;
}

top_tokens random_selector(std::mt19937& rng) {
  top_tokens sel;
  sel.t = pick(rng, {0, 1, 3, 16, 64, 1000});
  sel.sink = pick(rng, {0, 0, 1, 4});
  sel.window = pick(rng, {0, 0, 1, 8, 300});
  return sel;
}

// The model's rows: enumerated from the lengths, scored in fp32 in dimension order (the header's
// contract), heads reduced by max with NaN as -inf, reserved tokens added, the rest ranked by a
// stable sort on score descending over ascending positions (ties to the lower position).
template <class TQ, class TKV>
std::vector<std::vector<std::int32_t>> model_rows(const random_case<TQ, TKV>& rc, const top_tokens& sel) {
  const case_spec& s = rc.spec;
  const std::int32_t d = s.head_dim;
  const std::int32_t group = s.heads_q / s.heads_kv;
  const std::int32_t index_heads = s.scope == index_scope::kv_head ? s.heads_kv : s.heads_q;
  const auto q = rc.q_view();
  std::vector<std::vector<std::int32_t>> rows;
  for (std::size_t b = 0; b < s.seqs.size(); ++b) {
    const std::int32_t n_q = s.seqs[b].q, n_kv = s.seqs[b].kv;
    for (std::int32_t i = 0; i * s.block_q < n_q; ++i) {
      const std::int32_t last = std::min((i + 1) * s.block_q, n_q) - 1;
      const std::int32_t v = s.mask == mask_kind::none ? n_kv : std::clamp(last + n_kv - n_q + 1, 0, n_kv);
      for (std::int32_t h = 0; h < index_heads; ++h) {
        std::vector<std::int32_t> heads;
        if (s.scope == index_scope::kv_head) {
          for (std::int32_t g = 0; g < group; ++g) heads.push_back(h * group + g);
        } else {
          heads.push_back(h);
        }
        const std::int32_t kv_head = heads[0] / group;
        std::vector<float> score(static_cast<std::size_t>(v));
        for (std::int32_t j = 0; j < v; ++j) {
          float best = -inf;
          for (std::int32_t g : heads) {
            const TQ* qr = q.row(rc.cu_q[b] + last, g);
            const TKV* kr = rc.k.data() + (static_cast<std::size_t>(rc.cu_kv[b] + j) * s.heads_kv + kv_head) * d;
            float acc = 0.0f;
            for (std::int32_t e = 0; e < d; ++e) acc += to_float(qr[e]) * to_float(kr[e]);
            if (std::isnan(acc)) acc = -inf;
            best = std::max(best, acc);
          }
          score[static_cast<std::size_t>(j)] = best;
        }
        std::vector<std::int32_t> keep, rest;
        for (std::int32_t j = 0; j < v; ++j) {
          if (j < sel.sink || j >= v - sel.window) {
            keep.push_back(j);
          } else {
            rest.push_back(j);
          }
        }
        std::stable_sort(rest.begin(), rest.end(),
                         [&](std::int32_t a, std::int32_t c) { return score[static_cast<std::size_t>(a)] > score[static_cast<std::size_t>(c)]; });
        rest.resize(std::min(rest.size(), static_cast<std::size_t>(sel.t)));
        keep.insert(keep.end(), rest.begin(), rest.end());
        std::sort(keep.begin(), keep.end());
        rows.push_back(keep);
      }
    }
  }
  return rows;
}

struct owned_list {
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;
  owned_list(std::int64_t rows, std::int32_t w)
      : positions(static_cast<std::size_t>(rows) * static_cast<std::size_t>(w), 12345),
        count(static_cast<std::size_t>(rows), 777),
        width(w) {}
  [[nodiscard]] index::mutable_token_list mut() { return {positions, count, width}; }
  [[nodiscard]] index::token_list view() const { return {positions, count, width}; }
  [[nodiscard]] std::vector<std::int32_t> row(std::size_t r) const {
    return {positions.begin() + static_cast<std::ptrdiff_t>(r * width),
            positions.begin() + static_cast<std::ptrdiff_t>(r * width) + count[r]};
  }
};

// A width one wider than needed on some runs: the pad after count is written then too.
bool chance_fill(std::byte fill) { return fill == std::byte{0x00}; }

template <class TQ, class TKV>
void check_against_model(const random_case<TQ, TKV>& rc, const top_tokens& sel, std::byte fill) {
  const problem p = rc.prob();
  REQUIRE(validate(p).ok());
  const auto model = model_rows(rc, sel);
  REQUIRE(model.size() == static_cast<std::size_t>(p.index_rows()));
  owned_list list(p.index_rows(), sel.max_count(p) + (chance_fill(fill) ? 1 : 0));
  skim::test::aligned_workspace ws(sel.workspace_bytes(p), fill);
  const status st = rc.with_kv([&](const auto& kv) { return sel.select(p, rc.q_view(), kv, list.mut(), ws.bytes); });
  REQUIRE_MESSAGE(st.ok(), st.message());
  const status valid = list.view().validate(p);
  CHECK_MESSAGE(valid.ok(), valid.message());
  std::int64_t mismatches = 0;
  for (std::size_t r = 0; r < model.size(); ++r) {
    if (list.row(r) != model[r] && mismatches++ == 0) {
      std::string got, want;
      for (auto x : list.row(r)) got += std::to_string(x) + " ";
      for (auto x : model[r]) want += std::to_string(x) + " ";
      INFO("row ", r, " got ", got, " want ", want);
      CHECK(false);
    }
    for (std::size_t j = static_cast<std::size_t>(list.count[r]); j < static_cast<std::size_t>(list.width); ++j) {
      CHECK(list.positions[r * static_cast<std::size_t>(list.width) + j] == index::token_list::pad);
    }
    CHECK(list.count[r] <= sel.max_count(p));
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("select::top_tokens: kept set equals a sort of the scores, random decode shapes", T,
                   skim::test::types<float, float, float>, skim::test::types<bfloat16, bfloat16, float>,
                   skim::test::types<half, half, float>, skim::test::types<float, bfloat16, float>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  for (int trial = 0; trial < 40; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = decode_spec(rng);
    const top_tokens sel = random_selector(rng);
    INFO("seed ", seed, " ", spec.describe(), " t ", sel.t, " sink ", sel.sink, " window ", sel.window);
    const random_case<TQ, TKV> rc(spec, rng);
    check_against_model(rc, sel, trial % 2 == 0 ? std::byte{0xff} : std::byte{0x00});
  }
}

TEST_CASE("select::top_tokens: exact ties go to the lower position; NaN scores rank last") {
  for (int trial = 0; trial < 60; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    case_spec spec = decode_spec(rng);
    spec.head_dim = uniform(rng, 1, 3);
    spec.paged = false;  // K is edited after the case is built; the contiguous view reads it
    const top_tokens sel{.t = uniform(rng, 0, 12), .sink = uniform(rng, 0, 2), .window = uniform(rng, 0, 3)};
    INFO("seed ", seed, " ", spec.describe(), " t ", sel.t, " sink ", sel.sink, " window ", sel.window);
    random_case<float, float> rc(spec, rng);
    // Small integers: every product and sum is exact, so equal scores are frequent and exact.
    for (float& x : rc.q) x = static_cast<float>(uniform(rng, -2, 2));
    if (!rc.q.empty() && chance(rng, 0.5)) rc.q[0] = std::numeric_limits<float>::quiet_NaN();  // one head of the first query: all NaN
    for (float& x : rc.k) x = chance(rng, 0.03) ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(uniform(rng, -2, 2));
    check_against_model(rc, sel, std::byte{0xff});
  }
}

TEST_CASE("select::top_tokens: t >= visible keys is dense; sink and window overlap or exceed the row") {
  std::mt19937 rng(0x70c5u);
  case_spec spec;
  spec.head_dim = 5;
  spec.heads_q = 4;
  spec.heads_kv = 1;
  spec.block_q = 1;
  spec.seqs = {{1, 9}, {1, 0}, {1, 1}, {1, 30}};
  const random_case<float, half> rc(spec, rng);
  const problem p = rc.prob();
  const auto run = [&](const top_tokens& sel) {
    owned_list list(p.index_rows(), sel.max_count(p));
    skim::test::aligned_workspace ws(sel.workspace_bytes(p));
    REQUIRE(sel.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes).ok());
    std::vector<std::vector<std::int32_t>> rows;
    for (std::size_t r = 0; r < list.count.size(); ++r) rows.push_back(list.row(r));
    return rows;
  };
  const auto iota = [](std::int32_t n) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
  };
  const auto dense = run(top_tokens{.t = 30});
  CHECK(dense == std::vector<std::vector<std::int32_t>>{iota(9), {}, iota(1), iota(30)});
  const auto reserved_only = run(top_tokens{.t = 0, .sink = 2, .window = 3});
  CHECK(reserved_only == std::vector<std::vector<std::int32_t>>{{0, 1, 6, 7, 8}, {}, {0}, {0, 1, 27, 28, 29}});
  const auto overlap = run(top_tokens{.t = 0, .sink = 6, .window = 5});
  CHECK(overlap[0] == iota(9));
  CHECK(top_tokens{.t = 2, .sink = 6, .window = 5}.max_count(9) == 9);
  CHECK(top_tokens{.t = 2, .sink = 1, .window = 1}.max_count(9) == 4);
  CHECK(top_tokens{.t = std::numeric_limits<std::int32_t>::max(), .sink = 5, .window = 5}.max_count(p) == 30);
}

TEST_CASE("select::top_tokens: select_row matches select, deterministic, no allocation") {
  for (int trial = 0; trial < 20; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = decode_spec(rng);
    const top_tokens sel = random_selector(rng);
    INFO("seed ", seed, " ", spec.describe());
    const random_case<bfloat16, half> rc(spec, rng);
    const problem p = rc.prob();
    owned_list a(p.index_rows(), sel.max_count(p));
    owned_list b(p.index_rows(), sel.max_count(p));
    skim::test::aligned_workspace ws_a(sel.workspace_bytes(p), std::byte{0x00});
    skim::test::aligned_workspace ws_b(sel.workspace_bytes(p), std::byte{0xa5});
    rc.with_kv([&](const auto& kv) {
      skim::test::allocation_counter counter;
      const status sa = sel.select(p, rc.q_view(), kv, a.mut(), ws_a.bytes);
      const status sb = sel.select(p, rc.q_view(), kv, b.mut(), ws_b.bytes);
      CHECK(counter.stop() == 0);
      REQUIRE(sa.ok());
      REQUIRE(sb.ok());
      CHECK(a.positions == b.positions);
      CHECK(a.count == b.count);
      REQUIRE(for_each_row(p, [&](const row_info& r) {
                std::vector<std::int32_t> out(static_cast<std::size_t>(sel.max_count(p)), -9);
                std::int32_t n = -1;
                const status s = sel.select_row(p, r, rc.q_view(), kv, out, n, ws_b.bytes);
                CHECK_MESSAGE(s.ok(), s.message());
                out.resize(static_cast<std::size_t>(std::max(n, 0)));
                CHECK(out == a.row(static_cast<std::size_t>(r.row)));
              }).ok());
    });
  }
}

namespace {
void check_error(const status& s, status_code code, const std::string& message) {
  CHECK(s.code() == code);
  CHECK(std::string(s.message()) == message);
}
}  // namespace

TEST_CASE("select::top_tokens: bad parameters and input give exact statuses") {
  std::mt19937 rng(0xbad7u);
  case_spec spec;
  spec.head_dim = 8;
  spec.heads_q = 2;
  spec.heads_kv = 1;
  spec.block_q = 1;
  spec.seqs = {{1, 20}, {1, 7}};
  const random_case<float, float> rc(spec, rng);
  const problem p = rc.prob();
  const top_tokens good{.t = 4, .sink = 1, .window = 2};
  REQUIRE(good.max_count(p) == 7);
  owned_list list(p.index_rows(), 7);
  skim::test::aligned_workspace ws(good.workspace_bytes(p));
  REQUIRE(good.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes).ok());

  check_error(top_tokens{.t = -1}.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes),
              status_code::invalid_argument, "top_tokens t -1 < 0");
  check_error(top_tokens{.sink = -2}.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes),
              status_code::invalid_argument, "top_tokens sink -2 < 0");
  check_error(top_tokens{.window = -3}.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes),
              status_code::invalid_argument, "top_tokens window -3 < 0");
  owned_list narrow(p.index_rows(), 6);
  check_error(good.select(p, rc.q_view(), rc.contiguous(), narrow.mut(), ws.bytes), status_code::shape_mismatch,
              "token_list width 6 < max_count 7");
  owned_list few(1, 7);
  check_error(good.select(p, rc.q_view(), rc.contiguous(), few.mut(), ws.bytes), status_code::shape_mismatch,
              "token_list count has 1 entries, problem has 2 rows");
  owned_list cut = list;
  cut.positions.pop_back();
  check_error(good.select(p, rc.q_view(), rc.contiguous(), cut.mut(), ws.bytes), status_code::shape_mismatch,
              "token_list positions has 13 entries, needs rows 2 x width 7");
  const std::size_t needed = good.workspace_bytes(p);
  CHECK(good.select(p, rc.q_view(), rc.contiguous(), list.mut(), ws.bytes.first(needed - 1)).code() ==
        status_code::workspace_too_small);
  auto q_bad = rc.q_view();
  q_bad.heads = 3;
  check_error(good.select(p, q_bad, rc.contiguous(), list.mut(), ws.bytes), status_code::shape_mismatch,
              "Q is [2, 3, 8], expected [2, 2, 8]");
  auto kv_bad = rc.contiguous();
  kv_bad.k.tokens = 26;
  check_error(good.select(p, rc.q_view(), kv_bad, list.mut(), ws.bytes), status_code::shape_mismatch,
              "K is [26, 1, 8], expected [27, 1, 8]");

  // select_row: a row too small for out reports what it needs and writes nothing.
  const row_info r1 = make_row_info(p, 1, 1, 0, 0);
  std::vector<std::int32_t> out(3, -7);
  std::int32_t n = -1;
  check_error(good.select_row(p, r1, rc.q_view(), rc.contiguous(), out, n, ws.bytes), status_code::shape_mismatch,
              "row 1 selects 7 tokens, out has room for 3");
  CHECK(n == 7);
  CHECK(out == std::vector<std::int32_t>{-7, -7, -7});
  row_info lying = r1;
  lying.kv_len = 20;  // another sequence's length: would read past the sequence
  check_error(good.select_row(p, lying, rc.q_view(), rc.contiguous(), out, n, ws.bytes), status_code::invalid_argument,
              "row 1: geometry (queries [0, 1), 20 keys, 1 visible of 1 kv blocks) differs from make_row_info's ([0, 1), 7, 1 of 1)");
  CHECK(n == 0);
  row_info far = r1;
  far.seq = 2;
  check_error(good.select_row(p, far, rc.q_view(), rc.contiguous(), out, n, ws.bytes), status_code::invalid_argument,
              "row 1: sequence 2 out of [0, 2)");
}
