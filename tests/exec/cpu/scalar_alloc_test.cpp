// exec::scalar::run does not allocate (support/allocation_counter.hpp counts operator new calls).
#include "skim/exec/cpu/scalar.hpp"

#include <doctest/doctest.h>

#include <random>

#include "skim/exec/cpu/reference.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/allocation_counter.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

TEST_CASE("the allocation counter sees allocations (so a zero below means something)") {
  allocation_counter counter;
  int* volatile p = new int(42);
  delete p;
  CHECK(counter.stop() == 1);

  // The reference, the oracle, does allocate.
  std::mt19937 rng(0xa10cu);
  const case_spec spec = random_spec(rng);
  const random_case<float, float> c(spec, rng);
  output<float> o(spec, c.tokens_q());
  attention_args<float, contiguous_kv<float>, index::causal_all, float> a{
      .prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = {}, .o = o.view, .lse = o.lse};
  allocation_counter counter2;
  REQUIRE(exec::reference{}.run(a, {}).ok());
  CHECK(counter2.stop() > 0);
}

TEST_CASE("scalar::run allocates nothing") {
  for (std::uint32_t seed = 0xa110u; seed < 0xa110u + 12; ++seed) {
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 1e6);
    const random_case<half, half> c(spec, rng);
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc);
    output<float> o(spec, c.tokens_q());
    const exec::scalar e;
    aligned_workspace ws(e.workspace_bytes(c.prob()));
    c.with_kv([&](auto kv) {
      const auto run_counted = [&](const auto& index) {
        attention_args<half, decltype(kv), std::remove_cvref_t<decltype(index)>, float> a{
            .prob = c.prob(), .q = c.q_view(), .kv = kv, .index = index, .o = o.view, .lse = o.lse};
        allocation_counter counter;
        const status s = e.run(a, ws.bytes);
        const long n = counter.stop();
        REQUIRE(s.ok());
        CHECK(n == 0);
        // Error paths do not allocate either.
        allocation_counter counter_err;
        const status too_small = e.run(a, ws.bytes.first(ws.bytes.size() / 2));
        CHECK(counter_err.stop() == 0);
        CHECK(!too_small.ok());
      };
      run_counted(index::causal_all{});
      run_counted(index::sink{1});
      run_counted(index::sliding_window{2});
    });
  }
}
