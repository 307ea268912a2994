// The doctest main of skim_tsan_tests (the concurrency tests under ThreadSanitizer) and the run's
// base seed (support/seed.hpp). Unlike main.cpp it does not replace operator new: ThreadSanitizer's
// runtime defines its own, so support/allocation_counter.hpp counts nothing in this binary, and
// none of its tests uses it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support/seed.hpp"

SKIM_TEST_SEED_LISTENER();
