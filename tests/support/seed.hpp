#pragma once
// One base seed per test run; every randomised test derives its generators from it.
//
// The base seed is SKIM_TEST_SEED when set (decimal, or hex with 0x), otherwise drawn once from
// std::random_device. The test binary's main prints it before the first test case:
//
//   skim tests: seed 123456 (replay: SKIM_TEST_SEED=123456)
//
// and, after a test case that failed, the line that replays that case alone.
//
// A test case's seeds depend only on (base seed, the test case's name, a stream number): stream n
// of a test case gives the same seed whether the case runs alone (-tc=...) or in the full run, and
// two runs with the same base seed see the same data. next_seed() numbers the streams of a test
// case 0, 1, 2, ... in the order it asks for them, from 0 again at each entry of the test case
// (doctest enters a test case once per SUBCASE path), so each pass draws the same sequence.
//
// Tests with a fixed seed of their own (std::mt19937 rng(0x5eed)) do not use this: they see the
// same data in every run already.

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>

namespace skim::test {

namespace seed_detail {

// splitmix64's finaliser: a bijection of 64 bits in which every input bit reaches every output bit.
[[nodiscard]] constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a of a NUL-terminated string: stable across runs, builds and platforms.
[[nodiscard]] constexpr std::uint64_t hash_name(const char* s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (; s != nullptr && *s != '\0'; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return h;
}

// SKIM_TEST_SEED, or one draw of std::random_device. An unparsable SKIM_TEST_SEED ends the run
// (exit code 2) rather than silently testing other data than the one asked for.
[[nodiscard]] inline std::uint64_t read_base_seed() {
  if (const char* env = std::getenv("SKIM_TEST_SEED"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 0);
    if (errno != 0 || end == env || *end != '\0' || *env == '-') {
      std::fprintf(stderr, "skim tests: SKIM_TEST_SEED=%s is not an unsigned integer\n", env);
      std::exit(2);
    }
    return v;
  }
  std::random_device rd;
  return rd();
}

struct state {
  std::uint64_t name_hash = hash_name("");
  std::atomic<std::uint64_t> next_stream{0};
};
inline state& current() {
  static state s;
  return s;
}

}  // namespace seed_detail

// The run's base seed (read or drawn on first use, then fixed for the run).
[[nodiscard]] inline std::uint64_t base_seed() {
  static const std::uint64_t seed = seed_detail::read_base_seed();
  return seed;
}

// The seed of stream `stream` of the running test case.
[[nodiscard]] inline std::uint32_t stream_seed(std::uint64_t stream) {
  const std::uint64_t h = seed_detail::mix(seed_detail::mix(base_seed() ^ seed_detail::current().name_hash) ^ stream);
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

// The seed of the running test case's next stream (0, 1, 2, ... in the order of the calls).
[[nodiscard]] inline std::uint32_t next_seed() {
  return stream_seed(seed_detail::current().next_stream.fetch_add(1, std::memory_order_relaxed));
}

// Tracks the running test case for the seeds above; prints the base seed at the start of the run
// and, after a failed test case, how to replay it. Registered once per test binary by its main:
// SKIM_TEST_SEED_LISTENER().
struct seed_listener : doctest::IReporter {
  const doctest::ContextOptions& options;
  const doctest::TestCaseData* test = nullptr;

  explicit seed_listener(const doctest::ContextOptions& o) : options(o) {}

  static void enter(const doctest::TestCaseData& t) {
    seed_detail::state& s = seed_detail::current();
    s.name_hash = seed_detail::hash_name(t.m_name);
    s.next_stream.store(0, std::memory_order_relaxed);
  }

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {
    const std::uint64_t seed = base_seed();
    *options.cout << "skim tests: seed " << seed << " (replay: SKIM_TEST_SEED=" << seed << ")\n";
  }
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& t) override {
    test = &t;
    enter(t);
  }
  void test_case_reenter(const doctest::TestCaseData& t) override { enter(t); }
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (test == nullptr || (stats.numAssertsFailedCurrentTest == 0 && stats.testCaseSuccess)) return;
    std::string filter;  // doctest splits -tc at commas unless escaped; single-quoted for a shell
    for (const char* c = test->m_name; *c != '\0'; ++c) {
      if (*c == '\'') {
        filter += "'\\''";
        continue;
      }
      if (*c == ',' || *c == '\\') filter += '\\';
      filter += *c;
    }
    *options.cout << "skim tests: failed with seed " << base_seed() << "; replay this case alone: SKIM_TEST_SEED="
                  << base_seed() << " " << options.binary_name.c_str() << " '-tc=" << filter << "'\n";
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace skim::test

#define SKIM_TEST_SEED_LISTENER() DOCTEST_REGISTER_LISTENER("skim_seed", 1, ::skim::test::seed_listener)
