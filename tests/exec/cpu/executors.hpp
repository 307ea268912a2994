#pragma once
// The executors of the CPU conformance suite (conformance_test.cpp, simd_test.cpp), and how a test
// runs one and checks it against exec::reference (double precision).
//
// skim_tests instantiates the suite for exec::reference, exec::scalar, exec::simd<default_arch>
// and simd_dispatched (exec::simd_dispatch over the avx512f, avx2 and baseline entries the binary
// was built with). The per-arch rebuilds of the suite (skim_simd_avx2_tests, skim_simd_avx512_tests,
// the NEON build) define SKIM_TEST_ARCH_BUILD and instantiate it for exec::simd<Arch> alone, Arch
// the widest arch their flags enable (simd<avx2> is the AVX2 build's: compiled again under AVX-512
// flags it would test the same source twice and double this build's time).
// SKIM_SIMD_TEST_SCALE (the qemu build: 0.1) thins the random walks.

#include <doctest/doctest.h>

#include <algorithm>
#include <any>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "support/compare.hpp"
#include "support/random_case.hpp"

#if !defined(SKIM_TEST_ARCH_BUILD)
#include "exec/cpu/simd_dispatch_args.hpp"
#include "skim/exec/cpu/dispatch.hpp"
#endif

#ifndef SKIM_SIMD_TEST_SCALE
#define SKIM_SIMD_TEST_SCALE 1.0  // share of the random cases to run (the qemu build runs fewer)
#endif

// exec::simd<Arch> for the widest arch this translation unit is compiled for (sse2 on a baseline
// x86-64 build; avx512f under -mavx512f ...).
#if XSIMD_WITH_AVX512F
#define SKIM_TEST_SIMD_EXECUTORS ::skim::exec::simd<xsimd::avx512f>
#elif XSIMD_WITH_AVX2
#define SKIM_TEST_SIMD_EXECUTORS ::skim::exec::simd<xsimd::avx2>
#elif XSIMD_WITH_NEON64
#define SKIM_TEST_SIMD_EXECUTORS ::skim::exec::simd<xsimd::neon64>
#else
#define SKIM_TEST_SIMD_EXECUTORS ::skim::exec::simd<xsimd::default_arch>
#endif

// The executor lists of the typed tests. SKIM_TEST_EXECUTORS_ANY_ARGS leaves out simd_dispatched,
// whose table holds entries for dispatch_args only: it joins the tests whose cases include those.
#if defined(SKIM_TEST_ARCH_BUILD)
#define SKIM_TEST_EXECUTORS SKIM_TEST_SIMD_EXECUTORS
#define SKIM_TEST_EXECUTORS_ANY_ARGS SKIM_TEST_SIMD_EXECUTORS
#else
#define SKIM_TEST_EXECUTORS \
  ::skim::exec::reference, ::skim::exec::scalar, SKIM_TEST_SIMD_EXECUTORS, ::skim::test::simd_dispatched
#define SKIM_TEST_EXECUTORS_ANY_ARGS ::skim::exec::reference, ::skim::exec::scalar, SKIM_TEST_SIMD_EXECUTORS
#endif

namespace skim::test {

// A per-arch build on a CPU without its arch exits 77 (CTest's skip) before anything runs:
// tests/main.cpp.

// The per-arch rebuilds leave out the walks that would instantiate simd<Arch> for more element
// types and index forms than the simd-specific ones (float block sizes, the stored forms over three
// element types, block_union): those run in skim_tests, on simd<default_arch> and the dispatch; the
// rebuilds' compile time is part of CI's.
#if defined(SKIM_TEST_ARCH_BUILD)
inline constexpr bool full_suite = false;
#else
inline constexpr bool full_suite = true;
#endif

[[nodiscard]] inline int scaled(int cases) { return std::max(1, static_cast<int>(cases * SKIM_SIMD_TEST_SCALE)); }

#if !defined(SKIM_TEST_ARCH_BUILD)
// exec::simd_dispatch as an executor of dispatch_args: the table of the entries this binary was
// built with (simd_dispatch_avx512.cpp, simd_dispatch_avx2.cpp, and the baseline), picked once.
struct simd_dispatched {
  [[nodiscard]] static const exec::simd_dispatch<dispatch_args>& dispatch() {
    static const std::vector<exec::simd_entry<dispatch_args>> table = [] {  // outlives the dispatch
      std::vector<exec::simd_entry<dispatch_args>> t;
#if defined(SKIM_TEST_DISPATCH_AVX512)
      t.push_back(simd_entry_avx512());
#endif
#if defined(SKIM_TEST_DISPATCH_AVX2)
      t.push_back(simd_entry_avx2());
#endif
      t.push_back(exec::make_simd_entry<xsimd::default_arch, dispatch_args>());
      return t;
    }();
    static const exec::simd_dispatch<dispatch_args> d{table};
    return d;
  }
  [[nodiscard]] std::size_t workspace_bytes(const problem& p, std::int32_t threads = 1) const noexcept {
    return dispatch().workspace_bytes(p, threads);
  }
  [[nodiscard]] status can_implement(const problem& p) const noexcept { return validate(p); }
  [[nodiscard]] status run(const dispatch_args& a, std::span<std::byte> ws, std::int32_t threads = 1) const noexcept {
    return dispatch().run(a, ws, threads);
  }
};
#endif

template <class E>
inline constexpr bool is_simd = false;
template <class Arch>
inline constexpr bool is_simd<exec::simd<Arch>> = true;

template <class E>
inline constexpr bool is_reference = std::is_same_v<E, exec::reference>;

// Whether E runs arguments of type Args (simd_dispatched: dispatch_args only).
template <class E, class Args>
inline constexpr bool runs_args = requires(const E& e, const Args& a, std::span<std::byte> w) {
  { e.run(a, w) } -> std::same_as<status>;
};

// Whether E runs on several threads (run(args, workspace, threads), workspace_bytes(p, threads)).
template <class E>
inline constexpr bool threaded = requires(const E& e, const problem& p) {
  { e.workspace_bytes(p, std::int32_t{2}) } -> std::same_as<std::size_t>;
};

// Options a test sets on the executors that have them (exec::simd's decode split).
struct exec_options {
  std::int32_t decode_chunk_keys = exec::simd<xsimd::default_arch>{}.decode_chunk_keys;
  std::int32_t decode_max_queries = exec::simd<xsimd::default_arch>{}.decode_max_queries;
};

template <class E>
[[nodiscard]] E make_executor(const exec_options& o = {}) {
  E e{};
  if constexpr (is_simd<E>) {
    e.decode_chunk_keys = o.decode_chunk_keys;
    e.decode_max_queries = o.decode_max_queries;
  }
  return e;
}

[[nodiscard]] inline std::string executor_name(const exec::reference&) { return "reference"; }
[[nodiscard]] inline std::string executor_name(const exec::scalar&) { return "scalar"; }
template <class Arch>
[[nodiscard]] std::string executor_name(const exec::simd<Arch>&) {
  return std::string("simd<") + Arch::name() + ">";
}
#if !defined(SKIM_TEST_ARCH_BUILD)
[[nodiscard]] inline std::string executor_name(const simd_dispatched& d) {
  return std::string("simd_dispatch (") + d.dispatch().arch() + ")";
}
#endif

// Runs e on `threads` threads (executors without threads: on one) with a fresh workspace of the size
// it asks for, aligned and filled with `fill`.
template <class E, class Args>
[[nodiscard]] status run_on(const E& e, const Args& a, std::int32_t threads = 1, std::byte fill = std::byte{0xff}) {
  if constexpr (threaded<E>) {
    aligned_workspace ws(e.workspace_bytes(a.prob, threads), fill);
    return threads == 1 ? e.run(a, ws.bytes) : e.run(a, ws.bytes, threads);
  } else {
    aligned_workspace ws(e.workspace_bytes(a.prob), fill);
    return e.run(a, ws.bytes);
  }
}

template <class T>
[[nodiscard]] bool same_bytes(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0);
}

// The reference's output of one case in canonical form: token-major O, with lse.
template <element TO>
struct oracle_output {
  std::vector<TO> o;
  std::vector<float> lse;
  std::int32_t tokens = 0, heads = 0, dim = 0;
  [[nodiscard]] strided_view<TO> view() { return strided_view<TO>::token_major(o.data(), tokens, heads, dim); }
};

// Reference outputs shared by the instances of one typed test. doctest runs the instances of a
// TEST_CASE_TEMPLATE one after another, each on the same cases, so the reference runs once per case
// rather than once per executor. The cache holds one walk (a test's name) at a time: asking for
// another walk empties it. A key names everything the output depends on (seed, element types,
// index); an instance run alone, or in another order, only recomputes.
class oracle_cache {
 public:
  template <class T, class Make>
  T& get(const std::string& walk, const std::string& key, Make&& make) {
    if (walk != walk_) {
      entries_.clear();
      walk_ = walk;
    }
    auto it = entries_.find(key);
    if (it == entries_.end()) it = entries_.emplace(key, std::any(make())).first;
    return std::any_cast<T&>(it->second);  // a key reused for other types throws: a test bug, loudly
  }
  static oracle_cache& instance() {
    static oracle_cache c;
    return c;
  }

 private:
  std::string walk_;
  std::map<std::string, std::any> entries_;
};

// Q of a case as a token-major copy, whatever layout the case holds it in.
template <element TQ, element TKV>
[[nodiscard]] std::vector<TQ> token_major_q(const random_case<TQ, TKV>& c) {
  std::vector<TQ> q(c.q.size());
  const std::size_t d = static_cast<std::size_t>(c.spec.head_dim);
  for (std::int32_t t = 0; t < c.tokens_q(); ++t) {
    for (std::int32_t h = 0; h < c.spec.heads_q; ++h) {
      TQ* row = q.data() + (static_cast<std::size_t>(t) * c.spec.heads_q + h) * d;
      std::memcpy(row, c.q_view().row(t, h), d * sizeof(TQ));
    }
  }
  return q;
}

// The reference on the canonical form of case c: contiguous K/V, token-major Q and O, with lse.
template <element TO, element TQ, element TKV, class Index>
[[nodiscard]] oracle_output<TO>& oracle(const random_case<TQ, TKV>& c, const Index& index, const std::string& walk,
                                        const std::string& key) {
  const std::string full = key + " | " + std::string(element_name<TQ>) + "/" + element_name<TKV> + "/" +
                           element_name<TO> + " | " + c.spec.describe();
  return oracle_cache::instance().get<oracle_output<TO>>(walk, full, [&] {
    const problem p = c.prob();
    case_spec canonical = c.spec;
    canonical.o_head_major = false;
    output<TO> out(canonical, c.tokens_q(), true);
    const std::vector<TQ> q = token_major_q(c);
    const attention_args<TQ, contiguous_kv<TKV>, Index, TO> a{
        .prob = p, .q = strided_view<const TQ>::token_major(q.data(), c.tokens_q(), p.heads_q, p.head_dim),
        .kv = c.contiguous(), .index = index, .o = out.view, .lse = out.lse};
    const status s = run_executor(exec::reference{}, a);
    INFO("reference: " << std::string(s.message()));
    REQUIRE(s.ok());
    return oracle_output<TO>{std::move(out.o), std::move(out.lse), c.tokens_q(), p.heads_q, p.head_dim};
  });
}

struct conform_options {
  bool with_lse = true;
  exec_options exec{};
  bool threads = false;  // threaded executors: 2 and 16 threads must give the bits of 1
};

struct conform_result {
  bool ran = false;  // false: E does not run these arguments (simd_dispatched), or nothing to check
  comparison cmp;
  std::vector<unsigned char> o, lse;  // E's output (1 thread), as bytes, when it ran
};

template <class T>
[[nodiscard]] std::vector<unsigned char> bytes_of(const std::vector<T>& x) {
  std::vector<unsigned char> b(x.size() * sizeof(T));
  if (!x.empty()) std::memcpy(b.data(), x.data(), b.size());
  return b;
}

// Runs E on case c with `index` (the case's K/V storage and Q/O layouts; lse unless !with_lse) and
// checks it against the reference's output on the canonical form (oracle). The reference itself
// must give exactly the canonical bits; where the case is already canonical that is the oracle's own
// run, so there is nothing to check.
template <class E, element TO, element TQ, element TKV, class Index>
conform_result conform(const random_case<TQ, TKV>& c, const Index& index, const conform_options& opt,
                       const std::string& walk, const std::string& key) {
  conform_result result;
  const problem p = c.prob();
  c.with_kv([&](auto kv) {
    using args = attention_args<TQ, decltype(kv), Index, TO>;
    if constexpr (runs_args<E, args>) {
      if constexpr (is_reference<E>) {
        if (!c.spec.paged && !c.spec.q_head_major && !c.spec.o_head_major && opt.with_lse) return;
      }
      oracle_output<TO>& ref = oracle<TO>(c, index, walk, key);
      const E e = make_executor<E>(opt.exec);
      INFO("executor " << executor_name(e));
      output<TO> got(c.spec, c.tokens_q(), opt.with_lse);
      args a{.prob = p, .q = c.q_view(), .kv = kv, .index = index, .o = got.view, .lse = got.lse};
      const status s = run_on(e, a, 1);
      INFO("run: " << std::string(s.message()));
      REQUIRE(s.ok());
      result.ran = true;
      result.cmp = compare(p, got.view, ref.view(), std::span<const float>(got.lse),
                           opt.with_lse ? std::span<const float>(ref.lse) : std::span<const float>(),
                           output_tolerance<TO>);
      check(result.cmp);
      result.o = bytes_of(got.o);
      result.lse = bytes_of(got.lse);
      if constexpr (is_reference<E>) {
        CHECK(result.cmp.max_rel_o == 0.0);
        CHECK(result.cmp.max_abs_lse == 0.0);
      }
      if constexpr (threaded<E>) {
        if (!opt.threads) return;
        for (const std::int32_t n : {2, 16}) {
          INFO("threads " << n);
          output<TO> again(c.spec, c.tokens_q(), opt.with_lse);
          a.o = again.view;
          a.lse = again.lse;
          REQUIRE(run_on(e, a, n).ok());
          CHECK(same_bytes(got.o, again.o));
          CHECK(same_bytes(got.lse, again.lse));
        }
      }
    }
  });
  return result;
}

// Calls f.template operator()<T>() for each T (of a std::tuple<T...>).
template <class... T, class F>
void for_each_type(F&& f) {
  (f.template operator()<T>(), ...);
}
template <class Tuple, class F>
void for_each_type_in(F&& f) {
  [&]<class... T>(std::type_identity<std::tuple<T...>>) { for_each_type<T...>(f); }(std::type_identity<Tuple>{});
}

}  // namespace skim::test
