// tiny.cpp - built by the drop-in's smoke test; large vectors go through the pool when it
// runs preloaded too.
#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  std::vector<double> v(1 << 22, 1.0);
  std::printf("sum %.0f\n", std::accumulate(v.begin(), v.end(), 0.0));
  return 0;
}
