// `moe-ep bench`: benchmark records (docs/benchmarks.md) for the backend this process runs on, and
// on the CPU an OpenBLAS sgemm of the same dequantized problem measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace moe_ep::cli {

struct BenchOptions {
  ModelShape shape;
  std::vector<Recipe> recipes;
  std::vector<int> tokens;
  int ranks;
  int iters;
  uint64_t seed;
  std::string routing;
  std::string json;
};

int cmd_bench(const BenchOptions& o);

}  // namespace moe_ep::cli
