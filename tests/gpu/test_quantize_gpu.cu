// The quantize kernels against the CPU block quantizers of formats.h, bit for bit, on random and
// edge-case inputs (zeros, Inf, NaN, huge, subnormal, -0) over several T and H; and the
// kernels' element math on the device against the formats.h reference compiled for the device,
// over every float where that is cheap. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_math.h"
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

// ---------------------------------------------------------------------------------------------
// Kernels against the CPU quantizers

// Rows of mixed content: Gaussian at a per-row magnitude, uniform bit patterns, all-zero,
// and rows with Inf, NaN, huge, subnormal and -0 elements planted.
std::vector<uint16_t> make_input(int T, int H, int64_t stride, uint32_t seed) {
  std::vector<uint16_t> x(size_t(std::max<int64_t>(T * stride, 1)), 0xdead);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const uint16_t specials[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x8000,
                               0x0001, 0x8003, 0x7f7f, 0xff7f, 0x0080};
  for (int t = 0; t < T; ++t) {
    uint16_t* row = x.data() + t * stride;
    const int kind = t % 6;
    const float sigma = std::exp2(float(int(rng() % 120) - 60));
    for (int h = 0; h < H; ++h) {
      switch (kind) {
        case 0:
        case 1:
        case 4:
          row[h] = fmt::float_to_bf16(nd(rng) * sigma);
          break;
        case 2:
          row[h] = uint16_t(rng());
          break;  // NaN, Inf, subnormal patterns included
        case 3:
          row[h] = 0;
          break;
        default:
          row[h] = fmt::float_to_bf16(nd(rng));
      }
    }
    if (kind == 4 || kind == 5) {
      for (int i = 0; i < 1 + H / 64; ++i) row[rng() % H] = specials[rng() % 10];
    }
  }
  return x;
}

struct Case {
  QuantFormat format;
  int T, H;
  int64_t stride;
  float norm_const;
};

std::string describe(const Case& c) {
  return std::string(quant_format_name(c.format)) + " T=" + std::to_string(c.T) +
         " H=" + std::to_string(c.H) + " stride=" + std::to_string(c.stride) +
         " nc=" + std::to_string(c.norm_const);
}

void cpu_quantize(const Case& c, const std::vector<uint16_t>& x, std::vector<uint8_t>& data,
                  std::vector<uint8_t>& scales) {
  const int64_t db = quant_data_bytes_per_row(c.format, c.H);
  const int64_t sb = quant_scale_bytes_per_row(c.format, c.H);
  data.assign(size_t(c.T * db), 0);
  scales.assign(size_t(c.T * sb), 0);
  for (int t = 0; t < c.T; ++t) {
    const uint16_t* row = x.data() + t * c.stride;
    switch (c.format) {
      case QuantFormat::kNvfp4:
        fmt::quantize_row_nvfp4(row, c.H, c.norm_const, &data[t * db], &scales[t * sb]);
        break;
      case QuantFormat::kMxfp4:
        fmt::quantize_row_mxfp4(row, c.H, &data[t * db], &scales[t * sb]);
        break;
      case QuantFormat::kMxfp8:
        fmt::quantize_row_mxfp8(row, c.H, &data[t * db], &scales[t * sb]);
        break;
    }
  }
}

// Runs the kernel (poisoned outputs first) and compares every byte with the CPU.
void check_case(const Case& c, int blocks_per_thread = 0) {
  SCOPED_TRACE(describe(c) + " bpt=" + std::to_string(blocks_per_thread));
  const std::vector<uint16_t> x = make_input(c.T, c.H, c.stride, uint32_t(c.T * 31 + c.H));
  std::vector<uint8_t> want_data, want_scales;
  cpu_quantize(c, x, want_data, want_scales);
  const size_t db = want_data.size(), sb = want_scales.size();
  DeviceBuffer<uint16_t> in(x.size());
  DeviceBuffer<uint8_t> data(db + 16), scales(sb + 16);
  CUDA_OK(cudaMemcpy(in.ptr, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(data.ptr, 0xa5, db + 16));
  CUDA_OK(cudaMemset(scales.ptr, 0xa5, sb + 16));
  QuantizeParams p;
  p.input = in.ptr;
  p.input_row_stride = c.stride;
  p.num_tokens = c.T;
  p.hidden = c.H;
  p.norm_const = c.norm_const;
  p.data = data.ptr;
  p.scales = scales.ptr;
  CUDA_OK(blocks_per_thread ? launch_quantize_with(c.format, p, blocks_per_thread, nullptr)
                            : launch_quantize(c.format, p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got_data(db + 16), got_scales(sb + 16);
  CUDA_OK(cudaMemcpy(got_data.data(), data.ptr, db + 16, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_scales.data(), scales.ptr, sb + 16, cudaMemcpyDeviceToHost));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < db; ++i)
    if (got_data[i] != want_data[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "data bytes differ; first at byte " << first << " (row "
                     << first / quant_data_bytes_per_row(c.format, c.H) << ") got "
                     << int(got_data[first]) << " want " << int(want_data[first]);
  bad = 0;
  for (size_t i = 0; i < sb; ++i)
    if (got_scales[i] != want_scales[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "scale bytes differ; first at " << first << " got "
                     << int(got_scales[first]) << " want " << int(want_scales[first]);
  for (int i = 0; i < 16; ++i) {  // nothing written past the end
    EXPECT_EQ(got_data[db + i], 0xa5);
    EXPECT_EQ(got_scales[sb + i], 0xa5);
  }
}

TEST(QuantizeGpu, EqualsCpuBitForBit) {
  REQUIRE_GPU();
  for (QuantFormat f : {QuantFormat::kNvfp4, QuantFormat::kMxfp4, QuantFormat::kMxfp8}) {
    for (int T : {0, 1, 7, 128, 4096}) {
      for (int H : {64, 2048, 7168}) {
        check_case({f, T, H, H, 1.0f});
        if (f == QuantFormat::kNvfp4) check_case({f, T, H, H, 0.37f});
      }
    }
  }
}

TEST(QuantizeGpu, StridesAlignmentAndBlocksPerThread) {
  REQUIRE_GPU();
  for (QuantFormat f : {QuantFormat::kNvfp4, QuantFormat::kMxfp4, QuantFormat::kMxfp8}) {
    check_case({f, 300, 2048, 2048 + 8, 1.0f});  // padded rows, vector path
    check_case({f, 300, 2048, 2048 + 3, 1.0f});  // odd stride: scalar path
    check_case({f, 1000, 7168, 7168, 1.0f}, 1);  // both instances of the vector path
    check_case({f, 1000, 7168, 7168, 1.0f}, 2);
    check_case({f, 1000, 7168, 7168, 1.0f}, 4);
  }
  // Norm constants that overflow amax * nc for large rows, and tiny ones.
  check_case({QuantFormat::kNvfp4, 256, 2048, 2048, 0x1p100f});
  check_case({QuantFormat::kNvfp4, 256, 2048, 2048, 0x1p-100f});
  check_case({QuantFormat::kNvfp4, 256, 2048, 2048, 3.0e37f});
}

TEST(QuantizeGpu, DeviceTokenCountLeavesLaterRowsAlone) {
  REQUIRE_GPU();
  const int T = 64, H = 2048, valid = 37;
  const std::vector<uint16_t> x = make_input(T, H, H, 9);
  DeviceBuffer<uint16_t> in(x.size());
  DeviceBuffer<uint8_t> data(size_t(T) * H / 2), scales(size_t(T) * H / 16);
  DeviceBuffer<int32_t> count(1);
  CUDA_OK(cudaMemcpy(in.ptr, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(count.ptr, &valid, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(data.ptr, 0xa5, data.n));
  CUDA_OK(cudaMemset(scales.ptr, 0xa5, scales.n));
  QuantizeParams p;
  p.input = in.ptr;
  p.input_row_stride = H;
  p.num_tokens = T;
  p.hidden = H;
  p.device_num_tokens = count.ptr;
  p.data = data.ptr;
  p.scales = scales.ptr;
  CUDA_OK(launch_quantize(QuantFormat::kNvfp4, p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(data.n), want_data, want_scales;
  CUDA_OK(cudaMemcpy(got.data(), data.ptr, data.n, cudaMemcpyDeviceToHost));
  cpu_quantize({QuantFormat::kNvfp4, valid, H, H, 1.0f}, x, want_data, want_scales);
  EXPECT_EQ(0, std::memcmp(got.data(), want_data.data(), want_data.size()));
  for (size_t i = want_data.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xa5) << i;
}

TEST(QuantizeGpu, RejectsBadArguments) {
  // Validation runs before any launch: no GPU needed.
  QuantizeParams p;
  uint16_t in[64];
  uint8_t out[64];
  p.input = in;
  p.data = out;
  p.scales = out;
  p.num_tokens = 1;
  p.hidden = 24;  // not a multiple of 16
  p.input_row_stride = 24;
  EXPECT_EQ(launch_quantize(QuantFormat::kNvfp4, p, nullptr), cudaErrorInvalidValue);
  p.hidden = 48;  // a multiple of 16, not of 32
  p.input_row_stride = 48;
  EXPECT_EQ(launch_quantize(QuantFormat::kMxfp8, p, nullptr), cudaErrorInvalidValue);
  p.hidden = 32;
  p.input_row_stride = 16;  // stride < H
  EXPECT_EQ(launch_quantize(QuantFormat::kMxfp4, p, nullptr), cudaErrorInvalidValue);
  p.input_row_stride = 32;
  p.norm_const = 0.0f;
  EXPECT_EQ(launch_quantize(QuantFormat::kNvfp4, p, nullptr), cudaErrorInvalidValue);
  p.norm_const = 1.0f;
  p.scales = nullptr;
  EXPECT_EQ(launch_quantize(QuantFormat::kNvfp4, p, nullptr), cudaErrorInvalidValue);
  p.num_tokens = 0;  // T = 0: nothing to do, nothing launched
  EXPECT_EQ(launch_quantize(QuantFormat::kNvfp4, p, nullptr), cudaSuccess);
  EXPECT_EQ(launch_quantize_with(QuantFormat::kNvfp4, p, 3, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_quantize_with(QuantFormat::kNvfp4, p, 4, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace moe_ep::kernels
