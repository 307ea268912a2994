// skim_cuda_tests: doctest's main. Each *_test.cu in this folder checks one CUDA policy against
// skim's CPU reference on random shapes; support.cuh holds the device buffers and comparisons.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support/seed.hpp"
SKIM_TEST_SEED_LISTENER();  // the run's base seed: SKIM_TEST_SEED replays it
