#include "skim/exec/cpu/token_gather.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/select/top_tokens.hpp"
#include "support/allocation_counter.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

using namespace skim;
using skim::exec::token_attention_args;
using skim::exec::token_gather;
using skim::test::case_spec;
using skim::test::chance;
using skim::test::pick;
using skim::test::random_case;
using skim::test::uniform;

namespace {

// Bit equality of two float vectors (memcmp is not called on an empty vector's null data).
bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

// Keys the query qi (relative to its sequence) sees, from the lengths alone.
std::int32_t sees(const case_spec& s, std::size_t b, std::int32_t qi) {
  const std::int32_t n_q = s.seqs[b].q, n_kv = s.seqs[b].kv;
  return s.mask == mask_kind::none ? n_kv : std::clamp(qi + n_kv - n_q + 1, 0, n_kv);
}

// Keys of the row of query block i: what its last query sees.
std::int32_t row_keys(const case_spec& s, std::size_t b, std::int32_t i) {
  return sees(s, b, std::min((i + 1) * s.block_q, s.seqs[b].q) - 1);
}

std::int32_t index_heads(const case_spec& s) { return s.scope == index_scope::kv_head ? s.heads_kv : s.heads_q; }

// Rows of a token list, in row order (sequence, query block, index head).
using rows_t = std::vector<std::vector<std::int32_t>>;

// Random ascending positions per row: empty, sparse, half or every visible key (dense).
rows_t random_rows(const case_spec& s, std::mt19937& rng) {
  rows_t rows;
  for (std::size_t b = 0; b < s.seqs.size(); ++b) {
    for (std::int32_t i = 0; i * s.block_q < s.seqs[b].q; ++i) {
      const std::int32_t v = row_keys(s, b, i);
      for (std::int32_t h = 0; h < index_heads(s); ++h) {
        const double density = pick(rng, {0.0, 0.02, 0.1, 0.5, 1.0});
        std::bernoulli_distribution keep(density);
        std::vector<std::int32_t> row;
        for (std::int32_t j = 0; j < v; ++j) {
          if (keep(rng)) row.push_back(j);
        }
        rows.push_back(row);
      }
    }
  }
  return rows;
}

struct owned_list {
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;
  explicit owned_list(const rows_t& rows, std::int32_t extra = 1) {
    std::size_t w = 0;
    for (const auto& r : rows) w = std::max(w, r.size());
    width = static_cast<std::int32_t>(w) + extra;
    positions.assign(rows.size() * static_cast<std::size_t>(width), -3);  // padding is never read
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy(rows[r].begin(), rows[r].end(), positions.begin() + static_cast<std::ptrdiff_t>(r * width));
      count.push_back(static_cast<std::int32_t>(rows[r].size()));
    }
  }
  [[nodiscard]] index::token_list view() const { return {positions, count, width}; }
};

// The oracle: for each (query token, query head), a double-precision softmax over exactly the listed
// positions its row holds that it sees, K/V read from the case's contiguous arrays. Output
// token-major [tokens_q, heads_q, head_dim] rounded to TO, lse natural log (-inf for no key).
template <class TO, class TQ, class TKV>
void dense_over_list(const random_case<TQ, TKV>& rc, const rows_t& rows, std::vector<TO>& o, std::vector<float>& lse) {
  const case_spec& s = rc.spec;
  const std::int32_t d = s.head_dim;
  const std::int32_t group = s.heads_q / s.heads_kv;
  const double scale = s.softmax_scale != 0.0f ? s.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));
  o.assign(static_cast<std::size_t>(rc.tokens_q()) * s.heads_q * d, TO{});
  lse.assign(static_cast<std::size_t>(rc.tokens_q()) * s.heads_q, 0.0f);
  const auto q = rc.q_view();
  std::size_t row_base = 0;  // first row of the sequence
  for (std::size_t b = 0; b < s.seqs.size(); ++b) {
    const std::int32_t n_q = s.seqs[b].q;
    const std::int32_t q_blocks = (n_q + s.block_q - 1) / s.block_q;
    for (std::int32_t qi = 0; qi < n_q; ++qi) {
      const std::int32_t token = rc.cu_q[b] + qi;
      for (std::int32_t h = 0; h < s.heads_q; ++h) {
        const std::int32_t ih = s.scope == index_scope::kv_head ? h / group : h;
        const std::int32_t kv_head = h / group;
        const auto& row = rows[row_base + static_cast<std::size_t>(qi / s.block_q * index_heads(s) + ih)];
        std::vector<double> score;
        std::vector<std::int32_t> keys;
        for (std::int32_t j : row) {
          if (j >= sees(s, b, qi)) continue;
          const TKV* k = rc.k.data() + (static_cast<std::size_t>(rc.cu_kv[b] + j) * s.heads_kv + kv_head) * d;
          double dot = 0.0;
          for (std::int32_t e = 0; e < d; ++e) dot += static_cast<double>(to_float(q.row(token, h)[e])) * to_float(k[e]);
          score.push_back(dot * scale);
          keys.push_back(j);
        }
        const std::size_t lrow = static_cast<std::size_t>(token) * s.heads_q + h;
        TO* out = o.data() + lrow * d;
        if (keys.empty()) {
          for (std::int32_t e = 0; e < d; ++e) out[e] = from_float<TO>(0.0f);
          lse[lrow] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const double m = *std::max_element(score.begin(), score.end());
        double sum = 0.0;
        std::vector<double> acc(static_cast<std::size_t>(d), 0.0);
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(score[n] - m);
          sum += w;
          const TKV* v = rc.v.data() + (static_cast<std::size_t>(rc.cu_kv[b] + keys[n]) * s.heads_kv + kv_head) * d;
          for (std::int32_t e = 0; e < d; ++e) acc[static_cast<std::size_t>(e)] += w * to_float(v[e]);
        }
        for (std::int32_t e = 0; e < d; ++e) out[e] = from_float<TO>(static_cast<float>(acc[static_cast<std::size_t>(e)] / sum));
        lse[lrow] = static_cast<float>(m + std::log(sum));
      }
    }
    row_base += static_cast<std::size_t>(q_blocks * index_heads(s));
  }
}

template <class TQ, class KV, class TO>
status run_gather(const token_gather& e, const token_attention_args<TQ, KV, TO>& a, std::byte fill = std::byte{0xff}) {
  skim::test::aligned_workspace ws(e.workspace_bytes(a.prob), fill);
  return e.run(a, ws.bytes);
}

// The tolerance against the double oracle. A sparse list of a few keys keeps fp32's rounding of each
// score (about 1e-6 in the exponent at scores near 15) instead of averaging it over many keys, and when
// those keys' values cancel the output sits at compare()'s floor: 2400 random cases reached 9.3e-6,
// against output_tolerance's 1e-5 for fp32. Three times that leaves room; a wrong key or weight errs
// by more than 1e-3.
template <class TO>
constexpr double list_tolerance = skim::test::output_tolerance<TO> + 2e-5;

}  // namespace

TEST_CASE_TEMPLATE("exec::token_gather: equals a double softmax over the listed tokens, random shapes", T,
                   skim::test::types<float, float, float>, skim::test::types<bfloat16, bfloat16, bfloat16>,
                   skim::test::types<half, half, float>, skim::test::types<float, bfloat16, float>,
                   skim::test::types<bfloat16, half, half>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  using TO = typename T::o;
  std::int64_t rows_checked = 0, empty_rows = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = skim::test::random_spec(rng, 2e6);
    const token_gather exec{.tile_tokens = pick(rng, {1, 5, 16, 64, 128})};
    INFO("seed ", seed, " ", spec.describe(), " tile ", exec.tile_tokens);
    const random_case<TQ, TKV> rc(spec, rng);
    const problem p = rc.prob();
    const rows_t rows = random_rows(spec, rng);
    REQUIRE(rows.size() == static_cast<std::size_t>(p.index_rows()));
    const owned_list list(rows, uniform(rng, 0, 2));
    std::vector<TO> ref_o;
    std::vector<float> ref_lse;
    dense_over_list(rc, rows, ref_o, ref_lse);
    skim::test::output<TO> out(spec, rc.tokens_q());
    const status st = rc.with_kv([&](const auto& kv) {
      return run_gather(exec, token_attention_args<TQ, std::decay_t<decltype(kv)>, TO>{
                                  .prob = p, .q = rc.q_view(), .kv = kv, .tokens = list.view(), .o = out.view, .lse = out.lse});
    });
    REQUIRE_MESSAGE(st.ok(), st.message());
    const auto ref_view = strided_view<TO>::token_major(ref_o.data(), rc.tokens_q(), spec.heads_q, spec.head_dim);
    const skim::test::comparison c =
        skim::test::compare(p, out.view, ref_view, out.lse, ref_lse, list_tolerance<TO>);
    skim::test::check(c);
    rows_checked += c.rows;
    empty_rows += c.empty_rows;
  }
  CHECK(rows_checked > 0);
  CHECK(empty_rows > 0);  // empty lists and rows that see nothing were exercised
}

TEST_CASE_TEMPLATE("exec::token_gather: the tokens of some blocks give the block executors' output", T,
                   skim::test::types<float, float, float>, skim::test::types<half, bfloat16, float>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  using TO = typename T::o;
  for (int trial = 0; trial < 30; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = skim::test::random_spec(rng, 2e6);
    INFO("seed ", seed, " ", spec.describe());
    const random_case<TQ, TKV> rc(spec, rng);
    const problem p = rc.prob();
    // Random blocks per row, and the same keys as tokens: every key of a chosen block the row sees.
    std::vector<std::vector<std::int32_t>> blocks;
    rows_t tokens;
    const double density = pick(rng, {0.0, 0.2, 0.6, 1.0});
    std::bernoulli_distribution keep(density);
    for (std::size_t b = 0; b < spec.seqs.size(); ++b) {
      for (std::int32_t i = 0; i * spec.block_q < spec.seqs[b].q; ++i) {
        const std::int32_t v = row_keys(spec, b, i);
        for (std::int32_t h = 0; h < index_heads(spec); ++h) {
          std::vector<std::int32_t> ids, pos;
          for (std::int32_t id = 0; id * spec.block_kv < v; ++id) {
            if (!keep(rng)) continue;
            ids.push_back(id);
            for (std::int32_t j = id * spec.block_kv; j < std::min(v, (id + 1) * spec.block_kv); ++j) pos.push_back(j);
          }
          blocks.push_back(ids);
          tokens.push_back(pos);
        }
      }
    }
    std::size_t width = 0;
    for (const auto& r : blocks) width = std::max(width, r.size());
    std::vector<std::int32_t> ids(blocks.size() * width, -1), count;
    for (std::size_t r = 0; r < blocks.size(); ++r) {
      std::copy(blocks[r].begin(), blocks[r].end(), ids.begin() + static_cast<std::ptrdiff_t>(r * width));
      count.push_back(static_cast<std::int32_t>(blocks[r].size()));
    }
    const index::block_table table{ids, count, static_cast<std::int32_t>(width)};
    REQUIRE(table.validate(p).ok());
    const owned_list list(tokens);

    skim::test::output<TO> by_tokens(spec, rc.tokens_q()), by_blocks(spec, rc.tokens_q()), by_ref(spec, rc.tokens_q());
    rc.with_kv([&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      REQUIRE(run_gather(token_gather{}, token_attention_args<TQ, KV, TO>{.prob = p, .q = rc.q_view(), .kv = kv,
                                                                         .tokens = list.view(), .o = by_tokens.view,
                                                                         .lse = by_tokens.lse})
                  .ok());
      const attention_args<TQ, KV, index::block_table, TO> blocks_args{
          .prob = p, .q = rc.q_view(), .kv = kv, .index = table, .o = by_blocks.view, .lse = by_blocks.lse};
      REQUIRE(skim::test::run_executor(exec::scalar{}, blocks_args).ok());
      auto ref_args = blocks_args;
      ref_args.o = by_ref.view;
      ref_args.lse = by_ref.lse;
      REQUIRE(skim::test::run_executor(exec::reference{}, ref_args).ok());
    });
    skim::test::check(skim::test::compare(p, by_tokens.view, by_blocks.view, by_tokens.lse, by_blocks.lse,
                                          2 * skim::test::output_tolerance<TO>));
    skim::test::check(skim::test::compare(p, by_tokens.view, by_ref.view, by_tokens.lse, by_ref.lse,
                                          skim::test::output_tolerance<TO>));
  }
}

TEST_CASE("exec::token_gather: deterministic bits whatever the workspace held; no allocation") {
  for (int trial = 0; trial < 15; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = skim::test::random_spec(rng, 2e6);
    INFO("seed ", seed, " ", spec.describe());
    const random_case<bfloat16, half> rc(spec, rng);
    const problem p = rc.prob();
    const owned_list list(random_rows(spec, rng));
    skim::test::output<float> a(spec, rc.tokens_q()), b(spec, rc.tokens_q());
    const token_gather e{.tile_tokens = 16};
    rc.with_kv([&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      token_attention_args<bfloat16, KV, float> args{.prob = p, .q = rc.q_view(), .kv = kv, .tokens = list.view(),
                                                     .o = a.view, .lse = a.lse};
      skim::test::aligned_workspace ws_a(e.workspace_bytes(p), std::byte{0x00});
      skim::test::aligned_workspace ws_b(e.workspace_bytes(p), std::byte{0xff});
      skim::test::allocation_counter counter;
      const status sa = e.run(args, ws_a.bytes);
      args.o = b.view;
      args.lse = b.lse;
      const status sb = e.run(args, ws_b.bytes);
      CHECK(counter.stop() == 0);
      REQUIRE(sa.ok());
      REQUIRE(sb.ok());
    });
    CHECK(same_bits(a.o, b.o));
    CHECK(same_bits(a.lse, b.lse));
  }
}

TEST_CASE("exec::token_gather: bad input gets exact statuses and writes nothing") {
  std::mt19937 rng(0xbad9u);
  case_spec spec;
  spec.head_dim = 8;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.block_q = 1;
  spec.seqs = {{1, 20}, {2, 7}};
  const random_case<float, float> rc(spec, rng);
  const problem p = rc.prob();
  // Rows: seq 0 block 0 (heads 0, 1), seq 1 blocks 0 (sees 6 keys) and 1 (sees 7).
  rows_t rows{{0, 5, 19}, {1}, {0, 5}, {}, {6}, {2, 3}};
  owned_list list(rows);
  skim::test::output<float> out(spec, rc.tokens_q());
  token_attention_args<float, contiguous_kv<float>, float> args{
      .prob = p, .q = rc.q_view(), .kv = rc.contiguous(), .tokens = list.view(), .o = out.view, .lse = out.lse};
  REQUIRE(run_gather(token_gather{}, args).ok());

  const auto expect = [&](const token_gather& e, status_code code, const std::string& message) {
    skim::test::output<float> fresh(spec, rc.tokens_q());
    auto a = args;
    a.o = fresh.view;
    a.lse = fresh.lse;
    const status s = run_gather(e, a);
    CHECK(s.code() == code);
    CHECK(std::string(s.message()) == message);
    CHECK(std::all_of(fresh.o.begin(), fresh.o.end(), [](float x) { return std::isnan(x); }));
  };
  list.positions[static_cast<std::size_t>(2 * list.width + 1)] = 6;  // row 2 sees keys [0, 6)
  args.tokens = list.view();
  expect(token_gather{}, status_code::invalid_index,
         "token position 6 >= visible keys 6 in row 2 (position 1): in the future under causality");
  list.positions[static_cast<std::size_t>(2 * list.width + 1)] = 0;
  expect(token_gather{}, status_code::invalid_index, "duplicate token position 0 in row 2 (positions 0 and 1)");
  list.positions[static_cast<std::size_t>(2 * list.width + 1)] = 5;
  REQUIRE(list.view().validate(p).ok());
  expect(token_gather{.tile_tokens = 0}, status_code::invalid_argument, "token_gather tile_tokens 0 <= 0");
  auto short_lse = args;
  short_lse.lse = std::span<float>(out.lse).first(3);
  CHECK(run_gather(token_gather{}, short_lse).code() == status_code::shape_mismatch);
  auto overlap = args;
  overlap.o = strided_view<float>::token_major(const_cast<float*>(rc.q.data()), rc.tokens_q(), 4, 8);
  CHECK(run_gather(token_gather{}, overlap).code() == status_code::invalid_argument);
  skim::test::aligned_workspace small(token_gather{}.workspace_bytes(p) - 1);
  CHECK(token_gather{}.run(args, small.bytes).code() == status_code::workspace_too_small);
  // A problem the list was not made for (another scope: other row count).
  auto other = args;
  other.prob.scope = index_scope::query_head;
  CHECK(run_gather(token_gather{}, other).code() == status_code::shape_mismatch);
}

TEST_CASE("exec::token_gather: top_tokens keeping every visible token gives dense attention") {
  for (int trial = 0; trial < 20; ++trial) {
    const std::uint32_t seed = skim::test::next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = skim::test::random_spec(rng, 2e6);
    INFO("seed ", seed, " ", spec.describe());
    const random_case<half, half> rc(spec, rng);
    const problem p = rc.prob();
    const select::top_tokens sel{.t = pick(rng, {300, 100000}), .sink = uniform(rng, 0, 3), .window = uniform(rng, 0, 3)};
    std::vector<std::int32_t> positions(static_cast<std::size_t>(p.index_rows()) * static_cast<std::size_t>(sel.max_count(p)));
    std::vector<std::int32_t> count(static_cast<std::size_t>(p.index_rows()));
    skim::test::output<float> sparse(spec, rc.tokens_q()), dense(spec, rc.tokens_q());
    rc.with_kv([&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      skim::test::aligned_workspace ws(sel.workspace_bytes(p));
      REQUIRE(sel.select(p, rc.q_view(), kv, index::mutable_token_list{positions, count, sel.max_count(p)}, ws.bytes).ok());
      const index::token_list list{positions, count, sel.max_count(p)};
      REQUIRE(run_gather(token_gather{}, token_attention_args<half, KV, float>{.prob = p, .q = rc.q_view(), .kv = kv,
                                                                           .tokens = list, .o = sparse.view,
                                                                           .lse = sparse.lse})
                  .ok());
      const attention_args<half, KV, index::causal_all, float> da{
          .prob = p, .q = rc.q_view(), .kv = kv, .index = {}, .o = dense.view, .lse = dense.lse};
      REQUIRE(skim::test::run_executor(exec::reference{}, da).ok());
    });
    // Rows longer than t keep fewer tokens than dense: compare only when every row kept all it sees.
    bool all_kept = true;
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              if (count[static_cast<std::size_t>(r.row)] != index::row_visible_keys(r, p.mask)) all_kept = false;
            }).ok());
    if (sel.t == 100000) CHECK(all_kept);
    if (!all_kept) continue;
    skim::test::check(skim::test::compare(p, sparse.view, dense.view, sparse.lse, dense.lse,
                                          skim::test::output_tolerance<float>));
  }
}
