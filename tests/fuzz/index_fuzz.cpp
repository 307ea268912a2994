// Fuzz target: index validation, conversion, transpose and canonicalisation for every index form
// (block_table with padding, block_csr, dense_block_mask, unions with the implicit rules), and both
// CPU executors run over whatever the index holds.
//
// For each input: a small problem (sometimes broken), one index form with fuzzed contents, then
//  - validate(): an error must carry a message; an ok index must hold, row by row, sorted unique
//    ids in [0, visible_blocks);
//  - ok index: to_csr / to_block_table / to_dense_mask must succeed and hold the same rows, each
//    form converted into each other one must give the same arrays, transpose must keep every id,
//    canonicalize must not change a canonical index;
//  - raw index (stored forms valid under order::any only): canonicalize must yield the sorted
//    unique rows, which then validate;
//  - the scalar and reference executors over tiny random Q/K/V (contiguous, or paged with a fuzzed
//    page table): an ok index and ok K/V must run, give finite outputs and agree; otherwise a
//    status. The same index behind a validate() that lies must still cost a status, never a read
//    out of bounds (ASan watches every read).

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
#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/canonicalize.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "skim/index/transpose.hpp"

namespace {

using namespace skim;
using namespace skim::fuzz;
using rows_t = std::vector<std::vector<std::int32_t>>;

// The same index behind a validate() that always says ok: the executors' per-id checks must hold.
template <class I>
struct trusting {
  I inner;
  [[nodiscard]] auto cursor(const row_info& r) const noexcept { return inner.cursor(r); }
  [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
};

void check_error(const status& s, const char* what) {
  SKIM_FUZZ_CHECK(s.code() != status_code::ok, "%s", what);
  SKIM_FUZZ_CHECK(s.message()[0] != '\0', "%s: empty message", what);
}

// Every row's ids in cursor order. @pre validate(p).ok(); the cursor must stay in its storage.
template <class I>
rows_t rows_of(const problem& p, const I& idx) {
  rows_t out(static_cast<std::size_t>(p.index_rows()));
  (void)for_each_row(p, [&](const row_info& r) {
    std::int64_t n = 0;
    for (auto c = idx.cursor(r); !c.done() && n <= 1 << 16; c.next(), ++n) {
      out[static_cast<std::size_t>(r.row)].push_back(static_cast<std::int32_t>(c.id()));
    }
  });
  return out;
}

// Scalar and reference over `idx`. expect_ok: the index validated and K/V are sound.
template <class I>
void run_executors(const problem& p, const I& idx, tensors& t, bool index_ok) {
  t.with_kv(p, [&](const auto& kv) {
    using KV = std::decay_t<decltype(kv)>;
    const bool kv_ok = validate(p).ok() && kv.validate(p).ok();
    const auto args = [&](std::vector<float>& o, std::vector<float>& lse) {
      return attention_args<float, KV, I, float>{
          .prob = p, .q = strided_view<const float>::token_major(t.q.data(), p.tokens_q(), p.heads_q, p.head_dim),
          .kv = kv, .index = idx,
          .o = strided_view<float>::token_major(o.data(), p.tokens_q(), p.heads_q, p.head_dim), .lse = lse};
    };
    const status s = run(exec::scalar{}, args(t.o_scalar, t.lse_scalar));
    const status r = run(exec::reference{}, args(t.o_ref, t.lse_ref));
    if (!(index_ok && kv_ok)) {
      check_error(s, "scalar accepted a bad index or K/V");
      check_error(r, "reference accepted a bad index or K/V");
      return;
    }
    SKIM_FUZZ_CHECK(s.ok(), "scalar: %s", s.message());
    SKIM_FUZZ_CHECK(r.ok(), "reference: %s", r.message());
    const std::size_t d = static_cast<std::size_t>(p.head_dim);
    for (std::size_t row = 0; row < t.lse_ref.size(); ++row) {
      SKIM_FUZZ_CHECK(std::isinf(t.lse_ref[row]) == std::isinf(t.lse_scalar[row]), "empty rows differ at %zu", row);
      for (std::size_t e = 0; e < d; ++e) {
        const float a = t.o_scalar[row * d + e], b = t.o_ref[row * d + e];
        SKIM_FUZZ_CHECK(std::isfinite(a), "scalar output not finite at row %zu", row);
        SKIM_FUZZ_CHECK(std::fabs(a - b) <= 1e-4f * (1.0f + std::fabs(b)), "scalar %g vs reference %g at row %zu",
                        static_cast<double>(a), static_cast<double>(b), row);
      }
    }
  });
}

// The same executors behind a lying validate(): ok only if every id passed the per-id checks.
template <class I>
void run_trusting(const problem& p, const I& idx, tensors& t) {
  if (!validate(p).ok()) return;  // check_args stops these before the index anyway
  t.with_kv(p, [&](const auto& kv) {
    using KV = std::decay_t<decltype(kv)>;
    using T = trusting<I>;
    const attention_args<float, KV, T, float> a{
        .prob = p, .q = strided_view<const float>::token_major(t.q.data(), p.tokens_q(), p.heads_q, p.head_dim),
        .kv = kv, .index = T{idx},
        .o = strided_view<float>::token_major(t.o_scalar.data(), p.tokens_q(), p.heads_q, p.head_dim),
        .lse = t.lse_scalar};
    const status s = run(exec::scalar{}, a);
    const status r = run(exec::reference{}, a);
    if (!s.ok()) SKIM_FUZZ_CHECK(s.message()[0] != '\0', "scalar: empty message");
    SKIM_FUZZ_CHECK(s.ok() == r.ok(), "scalar (%s) and reference (%s) disagree on a trusted index", s.message(),
                    r.message());
  });
}

// ---- conversions ------------------------------------------------------------------------------

struct converted {
  std::vector<std::int32_t> row_ptr, col_idx, ids, count;
  std::vector<std::uint64_t> words;
  std::int32_t width = 0;
};

template <class I>
converted convert_all(const problem& p, const I& idx, std::int64_t nnz, std::int32_t width) {
  converted c;
  c.row_ptr.resize(static_cast<std::size_t>(p.index_rows()) + 1);
  c.col_idx.resize(static_cast<std::size_t>(nnz));
  c.width = width;
  c.ids.resize(static_cast<std::size_t>(p.index_rows()) * static_cast<std::size_t>(width));
  c.count.resize(static_cast<std::size_t>(p.index_rows()));
  c.words.resize(static_cast<std::size_t>(index::dense_mask_words(p)));
  const status a = index::to_csr(p, idx, c.row_ptr, c.col_idx);
  const status b = index::to_block_table(p, idx, width, c.ids, c.count);
  const status m = index::to_dense_mask(p, idx, c.words);
  SKIM_FUZZ_CHECK(a.ok(), "to_csr: %s", a.message());
  SKIM_FUZZ_CHECK(b.ok(), "to_block_table: %s", b.message());
  SKIM_FUZZ_CHECK(m.ok(), "to_dense_mask: %s", m.message());
  return c;
}

void check_canonical_rows(const problem& p, const rows_t& rows) {
  (void)for_each_row(p, [&](const row_info& r) {
    const auto& ids = rows[static_cast<std::size_t>(r.row)];
    for (std::size_t i = 0; i < ids.size(); ++i) {
      SKIM_FUZZ_CHECK(ids[i] >= 0 && ids[i] < r.visible_blocks, "valid index: id %d outside [0, %d) in row %lld",
                      ids[i], r.visible_blocks, static_cast<long long>(r.row));
      SKIM_FUZZ_CHECK(i == 0 || ids[i - 1] < ids[i], "valid index: row %lld not ascending",
                      static_cast<long long>(r.row));
    }
  });
}

// Everything a valid index must support.
template <class I>
void check_valid(const problem& p, const I& idx) {
  const rows_t rows = rows_of(p, idx);
  check_canonical_rows(p, rows);
  const std::int64_t nnz = index::count_nnz(p, idx);
  const std::int32_t width = index::max_row_count(p, idx);
  const converted c = convert_all(p, idx, nnz, width);
  const index::block_csr csr{c.row_ptr, c.col_idx};
  const index::block_table table{c.ids, c.count, width};
  const auto mask = index::dense_block_mask::for_problem(p, c.words);
  for (const status& s : {csr.validate(p), table.validate(p), mask.validate(p)}) {
    SKIM_FUZZ_CHECK(s.ok(), "converted index does not validate: %s", s.message());
  }
  SKIM_FUZZ_CHECK(rows_of(p, csr) == rows, "to_csr changed the rows");
  SKIM_FUZZ_CHECK(rows_of(p, table) == rows, "to_block_table changed the rows");
  SKIM_FUZZ_CHECK(rows_of(p, mask) == rows, "to_dense_mask changed the rows");
  // Each form into each other one: the same arrays as converting the original.
  for (const converted& again : {convert_all(p, csr, nnz, width), convert_all(p, table, nnz, width),
                                 convert_all(p, mask, nnz, width)}) {
    SKIM_FUZZ_CHECK(again.row_ptr == c.row_ptr && again.col_idx == c.col_idx, "csr round trip differs");
    SKIM_FUZZ_CHECK(again.ids == c.ids && again.count == c.count, "block_table round trip differs");
    SKIM_FUZZ_CHECK(again.words == c.words, "dense mask round trip differs");
  }
  // Transpose keeps every id once; each kv row lists its query blocks in ascending order.
  std::vector<std::int32_t> t_ptr(static_cast<std::size_t>(index::transposed_rows(p)) + 1);
  std::vector<std::int32_t> t_col(static_cast<std::size_t>(nnz));
  const status ts = index::transpose(p, idx, t_ptr, t_col);
  SKIM_FUZZ_CHECK(ts.ok(), "transpose: %s", ts.message());
  SKIM_FUZZ_CHECK(t_ptr.back() == nnz, "transpose holds %d ids of %lld", t_ptr.back(), static_cast<long long>(nnz));
  for (std::size_t t = 0; t + 1 < t_ptr.size(); ++t) {
    for (std::int32_t e = t_ptr[t] + 1; e < t_ptr[t + 1]; ++e) {
      SKIM_FUZZ_CHECK(t_col[static_cast<std::size_t>(e) - 1] < t_col[static_cast<std::size_t>(e)],
                      "transposed row %zu not ascending", t);
    }
  }
  // A too-small transpose output is a status, not a write past it.
  if (nnz > 0) {
    std::vector<std::int32_t> short_col(static_cast<std::size_t>(nnz - 1));
    check_error(index::transpose(p, idx, t_ptr, short_col), "transpose into a short col_idx");
    std::vector<std::int32_t> short_ids(static_cast<std::size_t>(p.index_rows()) * (width - 1));
    std::vector<std::int32_t> counts(static_cast<std::size_t>(p.index_rows()));
    check_error(index::to_block_table(p, idx, width - 1, short_ids, counts), "to_block_table with a short width");
    std::vector<std::int32_t> row_ptr(static_cast<std::size_t>(p.index_rows()) + 1);
    check_error(index::to_csr(p, idx, row_ptr, short_col), "to_csr into a short col_idx");
  }
  // Canonicalising a canonical index changes nothing.
  converted m = c;
  SKIM_FUZZ_CHECK(index::canonicalize(p, index::mutable_block_table{m.ids, m.count, width}).ok(), "canonicalize");
  SKIM_FUZZ_CHECK(m.ids == c.ids && m.count == c.count, "canonicalize changed a canonical table");
  std::int64_t new_nnz = -1;
  SKIM_FUZZ_CHECK(index::canonicalize(p, index::mutable_block_csr{m.row_ptr, m.col_idx}, new_nnz).ok(), "canonicalize");
  SKIM_FUZZ_CHECK(new_nnz == nnz && m.row_ptr == c.row_ptr && m.col_idx == c.col_idx,
                  "canonicalize changed a canonical csr");
}

// A stored form valid under order::any: canonicalize must give sorted unique rows that validate.
template <class Mutable>
void check_raw(const problem& p, Mutable idx, const rows_t& raw, bool csr) {
  status s;
  if constexpr (requires { idx.width; }) {
    s = index::canonicalize(p, idx);
  } else {
    std::int64_t nnz = -1;
    s = index::canonicalize(p, idx, nnz);
    SKIM_FUZZ_CHECK(!s.ok() || nnz == idx.row_ptr.back(), "canonicalize nnz");
  }
  (void)csr;
  SKIM_FUZZ_CHECK(s.ok(), "canonicalize of an order::any-valid index: %s", s.message());
  const status v = idx.validate(p);
  SKIM_FUZZ_CHECK(v.ok(), "canonicalized index does not validate: %s", v.message());
  rows_t want = raw;
  for (auto& r : want) {
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
  }
  SKIM_FUZZ_CHECK(rows_of(p, idx) == want, "canonicalize gave other rows than sort + unique");
}

// ---- index forms from the input ----------------------------------------------------------------

struct table_store {
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;
  table_store(fuzz_input& in, const problem& p, std::int64_t rows) {
    width = in.flag(16) ? -1 : in.in(0, 6);
    count.resize(near_size(in, rows));
    ids.resize(near_size(in, rows * std::max(width, 0)));
    for (std::int32_t& c : count) {
      const std::uint8_t v = in.u8();
      c = v < 224 ? static_cast<std::int32_t>(v % static_cast<std::uint32_t>(std::max(width, 0) + 1))
                  : (v % 2 ? -1 : width + 1);
    }
    // Mostly a sorted draw of the visible ids (so valid tables are common), else raw fuzz.
    const bool raw = in.flag(3);
    for (std::int32_t& e : ids) e = in.id();
    if (!raw && width > 0 && count.size() == static_cast<std::size_t>(rows) && validate(p).ok()) {
      (void)for_each_row(p, [&](const row_info& r) {
        if (static_cast<std::size_t>((r.row + 1) * width) > ids.size()) return;
        auto first = ids.begin() + static_cast<std::ptrdiff_t>(r.row * width);
        for (std::int32_t i = 0; i < width; ++i) first[i] = r.visible_blocks > 0 ? (first[i] & 0xff) % r.visible_blocks : 0;
        const std::int32_t n = count[static_cast<std::size_t>(r.row)];
        if (n >= 0 && n <= width) std::sort(first, first + n);
      });
    }
  }
  [[nodiscard]] index::block_table view() const { return {ids, count, width}; }
};

struct csr_store {
  std::vector<std::int32_t> row_ptr, col_idx;
  csr_store(fuzz_input& in, const problem& p, std::int64_t rows) {
    row_ptr.resize(near_size(in, rows + 1));
    std::int64_t at = in.flag(32) ? in.id() : 0;
    for (std::int32_t& r : row_ptr) {
      r = static_cast<std::int32_t>(std::clamp<std::int64_t>(at, INT32_MIN, INT32_MAX));
      const std::uint8_t step = in.u8();
      at += step < 248 ? step % 4 : (step % 2 ? -1 : in.id());
    }
    // Capped: a row_ptr that points far past col_idx is one of the cases validate must catch.
    col_idx.resize(near_size(in, row_ptr.empty() ? 0 : std::clamp(row_ptr.back(), 0, 4096)));
    for (std::int32_t& e : col_idx) e = in.id();
    if (!in.flag(3) && row_ptr.size() == static_cast<std::size_t>(rows) + 1 && validate(p).ok()) {
      (void)for_each_row(p, [&](const row_info& r) {  // make rows sorted draws of visible ids
        const std::int64_t b = row_ptr[static_cast<std::size_t>(r.row)], e = row_ptr[static_cast<std::size_t>(r.row) + 1];
        if (b < 0 || e < b || e > static_cast<std::int64_t>(col_idx.size())) return;
        for (std::int64_t i = b; i < e; ++i) {
          auto& x = col_idx[static_cast<std::size_t>(i)];
          x = r.visible_blocks > 0 ? (x & 0xff) % r.visible_blocks : 0;
        }
        std::sort(col_idx.begin() + b, col_idx.begin() + e);
      });
    }
  }
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
};

struct mask_store {
  std::vector<std::uint64_t> words;
  std::int32_t cols = 0;
  mask_store(fuzz_input& in, const problem& p, std::int64_t rows) {
    cols = validate(p).ok() ? p.max_kv_blocks() : 0;
    if (in.flag(8)) cols += in.in(-2, 66);
    const std::int64_t wpr = index::mask_words_per_row(cols);
    words.resize(near_size(in, rows * wpr));
    for (std::uint64_t& w : words) w = in.u8() < 0xc0 ? in.u16() : in.u64();
  }
  [[nodiscard]] index::dense_block_mask view() const { return {words, cols}; }
};

// Validates, then checks what the verdict promises, then runs the executors.
template <class I>
void exercise(const problem& p, const I& idx, tensors& t) {
  const bool problem_ok = validate(p).ok();
  const status s = idx.validate(p);
  if (!s.ok()) check_error(s, "validate");
  if (!problem_ok) {
    // Only the implicit rules ignore the problem in validate(); stored forms must check it.
    constexpr bool implicit_only = std::is_same_v<I, index::block_union<index::sink, index::sliding_window>>;
    SKIM_FUZZ_CHECK(!s.ok() || implicit_only, "an index validated against a broken problem");
    run_executors(p, idx, t, false);
    return;
  }
  if (s.ok()) {
    check_valid(p, idx);
  } else {
    (void)rows_of(p, idx);  // cursors of an invalid index stay in their storage
  }
  run_executors(p, idx, t, s.ok());
  run_trusting(p, idx, t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_input in(data, size);
  std::vector<std::int32_t> cu_q, cu_kv;
  const problem p = read_problem(in, cu_q, cu_kv);
  const bool problem_ok = validate(p).ok();
  const std::int64_t rows = problem_ok ? p.index_rows() : in.in(0, 4);
  const std::uint8_t form = in.u8() % 6;
  switch (form) {
    case 0: {
      table_store st(in, p, rows);
      tensors t(in, p);
      exercise(p, st.view(), t);
      if (problem_ok && !st.view().validate(p).ok() && st.view().validate(p, index::order::any).ok()) {
        check_raw(p, index::mutable_block_table{st.ids, st.count, st.width}, rows_of(p, st.view()), false);
      }
      break;
    }
    case 1: {
      csr_store st(in, p, rows);
      tensors t(in, p);
      exercise(p, st.view(), t);
      if (problem_ok && !st.view().validate(p).ok() && st.view().validate(p, index::order::any).ok()) {
        check_raw(p, index::mutable_block_csr{st.row_ptr, st.col_idx}, rows_of(p, st.view()), true);
      }
      break;
    }
    case 2: {
      mask_store st(in, p, rows);
      tensors t(in, p);
      exercise(p, st.view(), t);
      break;
    }
    case 3: {
      const index::sink sink{in.id()};
      const index::sliding_window window{in.id()};
      table_store st(in, p, rows);
      tensors t(in, p);
      exercise(p, index::make_union(sink, window, st.view()), t);
      break;
    }
    case 4: {
      csr_store a(in, p, rows);
      mask_store b(in, p, rows);
      tensors t(in, p);
      exercise(p, index::make_union(a.view(), b.view()), t);
      break;
    }
    default: {
      const auto u = index::make_union(index::sink{in.id()}, index::sliding_window{in.id()});
      tensors t(in, p);
      exercise(p, u, t);
      break;
    }
  }
  return 0;
}
