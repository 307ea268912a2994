// Placeholder for skim's needle-in-a-haystack demo (scripts/demo builds and runs it).
#include <cstdio>

int main() {
  std::puts("skim demo");
  return 0;
}
