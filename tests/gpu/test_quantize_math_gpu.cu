// The kernels' element math (kernels/common/quantize_math.h, which prepare, the EP source and
// the decode epilogue use) on the device against the formats.h reference compiled for the
// device, over every float where that is cheap. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/quantize_math.h"
#include "moe_ep/formats.h"

namespace moe_ep::kernels {
namespace {

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (count) cudaMalloc(&ptr, count * sizeof(T));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Element math on the device, exhaustively.

struct Mismatch {
  unsigned long long count;
  uint32_t first;
};

__device__ void record(Mismatch* m, uint32_t what) {
  if (atomicAdd(&m->count, 1ull) == 0) m->first = what;
}

// Every float: the hardware E4M3 conversion and the E2M1 magnitude code against formats.h, and
// the bf16 conversion instruction (fmt::float_to_bf16 / bf16x2 on the GPU) against the CPU's
// rounding (fmt::float_to_bf16_rne), both halves of bf16x2 (the high one gets the bits reversed).
__global__ void check_all_floats(Mismatch* e4m3_bad, Mismatch* e2m1_bad, Mismatch* bf16_bad) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u <= 0xffffffffull;
       u += stride) {
    const float f = fmt::bits_float(uint32_t(u));
    if ((qmath::e4m3_pair(f, 0.0f) & 0xffu) != fmt::float_to_e4m3(f)) record(e4m3_bad, uint32_t(u));
    if (!fmt::is_nan(f) && qmath::e2m1_mag_code(f) != (fmt::float_to_e2m1(f) & 7u))
      record(e2m1_bad, uint32_t(u));
    const float g = fmt::bits_float(__brev(uint32_t(u)));
    const uint16_t want = fmt::float_to_bf16_rne(f);
    if (fmt::float_to_bf16(f) != want ||
        fmt::bf16x2(f, g) != (uint32_t(want) | (uint32_t(fmt::float_to_bf16_rne(g)) << 16)))
      record(bf16_bad, uint32_t(u));
  }
}

__global__ void check_e4m3_decode(Mismatch* bad) {
  const int b = threadIdx.x;
  const float mine = qmath::e4m3_value(uint8_t(b)), ref = fmt::e4m3_to_float(uint8_t(b));
  const bool same =
      fmt::float_bits(mine) == fmt::float_bits(ref) || (fmt::is_nan(mine) && fmt::is_nan(ref));
  if (!same) record(bad, uint32_t(b));
}

// Every a in [1, 4) against every E4M3 mantissa: the FMA division equals __fdiv_rn.
__global__ void check_division(Mismatch* bad) {
  const uint32_t lo = fmt::float_bits(1.0f), hi = fmt::float_bits(4.0f);
  const uint32_t stride = gridDim.x * blockDim.x;
  for (int m = 8; m < 16; ++m) {
    const float s = float(m) / 8.0f, r = __fdiv_rn(1.0f, s);
    for (uint32_t u = lo + blockIdx.x * blockDim.x + threadIdx.x; u < hi; u += stride) {
      const float a = fmt::bits_float(u);
      if (fmt::float_bits(qmath::div_by_scale(a, s, r)) != fmt::float_bits(__fdiv_rn(a, s)))
        record(bad, u);
    }
  }
}

TEST(QuantizeGpuMath, ElementMathEveryFloat) {
  REQUIRE_GPU();
  DeviceBuffer<Mismatch> bad(5);
  CUDA_OK(cudaMemset(bad.ptr, 0, 5 * sizeof(Mismatch)));
  check_all_floats<<<132 * 16, 256>>>(bad.ptr, bad.ptr + 1, bad.ptr + 4);
  check_e4m3_decode<<<1, 256>>>(bad.ptr + 2);
  check_division<<<132 * 8, 256>>>(bad.ptr + 3);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  Mismatch h[5];
  CUDA_OK(cudaMemcpy(h, bad.ptr, sizeof(h), cudaMemcpyDeviceToHost));
  const char* names[] = {"E4M3 cvt (all 2^32 floats)", "E2M1 code (all non-NaN floats)",
                         "E4M3 decode (256 codes)", "FMA division ([1,4) x 8 mantissas)",
                         "bf16 cvt (all 2^32 floats)"};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(h[i].count, 0ull) << names[i] << ": first mismatch at bits 0x" << std::hex
                                << h[i].first;
}

}  // namespace
}  // namespace moe_ep::kernels
