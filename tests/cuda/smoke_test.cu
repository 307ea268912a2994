#include "cuda/support.cuh"
TEST_CASE("smoke") { std::mt19937 rng(1); auto s = skim::test::random_spec(rng); skim::test::random_case<skim::bfloat16, skim::bfloat16> c(s, rng); (void)c; }
