// What the GPU tests share: whether a CUDA device is present (every test skips with a reason
// without one) and deterministic random numbers, a pure function of (seed, index) so that large
// weights can be generated in parallel.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace moe_ep::gpu_test {

inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
inline float urand(uint64_t seed, uint64_t i) {
  return float(mix(seed * 0x100000001b3ull + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

inline std::vector<float> random_vec(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) v[i] = scale * urand(seed, i);
  return v;
}

}  // namespace moe_ep::gpu_test

#define SKIP_WITHOUT_GPU() \
  if (!::moe_ep::gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device"
#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
