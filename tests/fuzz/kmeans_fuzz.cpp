// Fuzz target: route::kmeans (build, append) and route::kmeans_router on fuzzed problems (sometimes
// broken), cluster counts (0, negative, more than keys), options (iterations, seeds), K values (NaN,
// infinities, huge), contiguous or paged K/V with hostile page tables, state spans a little short
// or long, and workspaces a little short.
//
// For each input:
//  - build fails with a message and a reason (some input out of its contract), or its state holds
//    the invariants of route/kmeans.hpp: every count >= 0, each block's membership adds up to its
//    keys, each cluster's counts to its membership column, each kv head's counts to the sequence's
//    keys; and a second build over another workspace gives the same bits;
//  - appending a key a state already holds is refused; appending a sequence's keys in order to an
//    empty state keeps the invariants;
//  - the router scores every row of a good state: finite or −inf (NaN only from non-finite K or Q),
//    −inf past the visible blocks, and the same bits from score_row.
// ASan and UBSan watch every read and every arithmetic step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "fuzz_tensors.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/route/kmeans.hpp"
#include "skim/route/kmeans_router.hpp"

namespace {

using namespace skim;
using namespace skim::fuzz;
namespace km = skim::route::kmeans;

// An aligned buffer of n bytes filled with `fill`.
struct scratch {
  std::vector<std::byte> storage;
  std::span<std::byte> bytes;
  scratch(std::size_t n, std::byte fill) : storage(n + workspace_alignment, fill) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    bytes = {storage.data() + (workspace_alignment - base % workspace_alignment) % workspace_alignment, n};
  }
};

struct owned {
  std::vector<float> centroids;
  std::vector<std::int32_t> counts, membership;
  std::int32_t clusters = 0;
  [[nodiscard]] km::state view() { return {clusters, centroids, counts, membership}; }
};

// The invariants of a state over the first `keys[b]` keys of each sequence b.
void check_invariants(const problem& p, const owned& s, const std::vector<std::int32_t>& keys) {
  const km::layout l = km::make_layout(p, s.clusters);
  const std::int32_t C = s.clusters;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t n = keys[static_cast<std::size_t>(b)];
    const std::int32_t blocks = (n + p.block_kv - 1) / p.block_kv;
    for (std::int32_t h = 0; h < p.heads_kv; ++h) {
      std::int64_t held = 0;
      for (std::int32_t c = 0; c < C; ++c) {
        const std::int32_t count = s.counts[static_cast<std::size_t>(l.count_offset(b) + h * C + c)];
        SKIM_FUZZ_CHECK(count >= 0, "negative count %d", count);
        std::int64_t column = 0;
        for (std::int32_t j = 0; j < blocks; ++j) {
          column += s.membership[static_cast<std::size_t>(l.membership_offset(b) + (j * p.heads_kv + h) * C + c)];
        }
        SKIM_FUZZ_CHECK(column == count, "cluster %d of (%d, %d): counts %d, membership %lld", c, b, h, count,
                        static_cast<long long>(column));
        held += count;
      }
      SKIM_FUZZ_CHECK(held == n, "(%d, %d) holds %lld keys of %d", b, h, static_cast<long long>(held), n);
      for (std::int32_t j = 0; j < blocks; ++j) {
        std::int64_t in_block = 0;
        for (std::int32_t c = 0; c < C; ++c) {
          const std::int32_t m = s.membership[static_cast<std::size_t>(l.membership_offset(b) + (j * p.heads_kv + h) * C + c)];
          SKIM_FUZZ_CHECK(m >= 0, "negative membership %d", m);
          in_block += m;
        }
        const std::int32_t want = std::min(n, (j + 1) * p.block_kv) - j * p.block_kv;
        SKIM_FUZZ_CHECK(in_block == want, "block %d of (%d, %d) holds %lld keys of %d", j, b, h,
                        static_cast<long long>(in_block), want);
      }
    }
  }
}

template <class KV>
void run(fuzz_input& in, const problem& p, const KV& kv, const tensors& t) {
  const bool problem_ok = validate(p).ok();
  const bool kv_ok = problem_ok && kv.validate(p).ok();
  owned s;
  s.clusters = in.flag(16) ? std::min(in.id(), 40) : in.in(1, 9);  // 0, negative, or more than keys
  const km::options opt{.iterations = in.flag(16) ? in.in(-1, 0) : in.in(1, 4), .seed = in.u64()};
  const bool clusters_ok = s.clusters >= 1, options_ok = opt.validate().ok();
  // Spans near the layout's sizes (garbage inside: build overwrites what it owns).
  const bool sized = problem_ok && clusters_ok;
  const km::layout l = sized ? km::make_layout(p, s.clusters) : km::layout{};
  s.centroids.assign(near_size(in, sized ? l.centroid_floats() : 0), 7.0f);
  s.counts.assign(near_size(in, sized ? l.count_entries() : 0), -5);
  s.membership.assign(near_size(in, sized ? l.membership_entries() : 0), -5);
  const bool spans_ok = sized && s.centroids.size() >= static_cast<std::size_t>(l.centroid_floats()) &&
                        s.counts.size() >= static_cast<std::size_t>(l.count_entries()) &&
                        s.membership.size() >= static_cast<std::size_t>(l.membership_entries());
  const std::size_t need = sized ? km::build_workspace_bytes(p, s.clusters) : 0;
  const bool short_ws = need > 0 && in.flag(16);
  scratch ws(short_ws ? need - 1 : need, std::byte{0xff});

  const status st = km::build(p, kv, opt, s.view(), ws.bytes);
  if (!st.ok()) {
    SKIM_FUZZ_CHECK(st.message()[0] != '\0', "build: empty message");
    SKIM_FUZZ_CHECK(!(kv_ok && clusters_ok && options_ok && spans_ok && !short_ws), "every input valid, yet: %s",
                    st.message());
    return;
  }
  SKIM_FUZZ_CHECK(kv_ok && clusters_ok && options_ok && spans_ok && !short_ws, "build ok with a bad input");
  std::vector<std::int32_t> keys(static_cast<std::size_t>(p.batch()));
  for (std::int32_t b = 0; b < p.batch(); ++b) keys[static_cast<std::size_t>(b)] = p.seq_len_kv(b);
  check_invariants(p, s, keys);
  {
    owned again = s;
    std::fill(again.centroids.begin(), again.centroids.end(), -1.0f);
    scratch other(need, std::byte{0x00});
    SKIM_FUZZ_CHECK(km::build(p, kv, opt, again.view(), other.bytes).ok(), "second build failed");
    SKIM_FUZZ_CHECK(again.counts == s.counts && again.membership == s.membership, "builds differ");
    SKIM_FUZZ_CHECK(std::memcmp(again.centroids.data(), s.centroids.data(),
                                static_cast<std::size_t>(l.centroid_floats()) * sizeof(float)) == 0,
                    "centroids differ between builds");
  }

  // The router over the built state, every row and row by row.
  const route::kmeans_router router{.probe = in.in(1, 10),
                                    .pool = in.flag() ? route::query_pool::last : route::query_pool::mean};
  const auto q = strided_view<const float>::token_major(t.q.data(), p.tokens_q(), p.heads_q, p.head_dim);
  const std::int32_t width = p.max_kv_blocks();
  std::vector<float> scores(static_cast<std::size_t>(p.index_rows() * width), 1.0f);
  scratch rws(router.workspace_bytes(p, s.clusters), std::byte{0xff});
  const status rs = router.score(p, q, s.view(), scores, rws.bytes);
  if (rs.ok()) {
    const status walk = for_each_row(p, [&](const row_info& r) -> status {
      std::vector<float> one(static_cast<std::size_t>(r.kv_blocks) + 1, 3.0f);
      SKIM_TRY(router.score_row(p, r, q, l.sequence(km::const_state(s.view()), r.seq), one, rws.bytes));
      for (std::int32_t j = 0; j < r.kv_blocks; ++j) {
        const float a = one[static_cast<std::size_t>(j)], b = scores[static_cast<std::size_t>(r.row * width + j)];
        SKIM_FUZZ_CHECK(std::memcmp(&a, &b, sizeof a) == 0, "score_row differs at row %lld block %d",
                        static_cast<long long>(r.row), j);
        if (j >= r.visible_blocks) SKIM_FUZZ_CHECK(a == -INFINITY, "a block past the visible ones scores %g", a);
      }
      return status::success();
    });
    SKIM_FUZZ_CHECK(walk.ok(), "score_row: %s", walk.message());
  } else {
    SKIM_FUZZ_CHECK(rs.message()[0] != '\0', "router: empty message");
    SKIM_FUZZ_CHECK(p.softmax_scale < 0.0f, "router refused a good state: %s", rs.message());
  }

  // Decode: a state that already holds a sequence's keys refuses one more append of its last key;
  // from an empty state (counts 0), appending every key in order keeps the invariants.
  if (p.batch() == 0) return;
  const std::int32_t b = in.in(0, p.batch() - 1);
  if (p.seq_len_kv(b) == 0) return;
  const status dup = km::append(p, kv, {.seq = b, .position = p.seq_len_kv(b) - 1, .sequence = l.sequence(s.view(), b)});
  SKIM_FUZZ_CHECK(!dup.ok() && dup.message()[0] != '\0', "append of a key the state holds was accepted");
  owned grown = s;
  const km::state seq = l.sequence(grown.view(), b);
  std::fill(seq.counts.begin(), seq.counts.end(), 0);
  for (std::int32_t pos = 0; pos < p.seq_len_kv(b); ++pos) {
    const status a = km::append(p, kv, {.seq = b, .position = pos, .sequence = seq});
    SKIM_FUZZ_CHECK(a.ok(), "append %d: %s", pos, a.message());
  }
  check_invariants(p, grown, keys);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in(data, size);
  std::vector<std::int32_t> cu_q, cu_kv;
  const problem p = read_problem(in, cu_q, cu_kv);
  tensors t(in, p);
  if (in.flag(8)) {  // hostile key values
    for (float& x : t.k) x = in.flag(4) ? in.score() : x;
    for (float& x : t.k_pages) x = in.flag(4) ? in.score() : x;
  }
  t.with_kv(p, [&](const auto& kv) { run(in, p, kv, t); });
  return 0;
}
