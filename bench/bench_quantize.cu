// Benchmark of the input quantizers (bf16 [T, H] -> NVFP4 / MXFP4 / MXFP8), the method of docs/benchmarks.md:
// warm-up, >= 20 timed iterations with CUDA events, median and min-max, inputs rotated among
// several sets so that the result is not an L2-cache artefact. Bytes = input read + data and
// scales written; the ceiling is the measured 4.22 TB/s copy bandwidth of the H200.
//   bench_quantize [--json PATH] [--iters N] [--hidden H]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/quantize/quantize.h"
#include "moe_ep/formats.h"

namespace {

using moe_ep::kernels::QuantFormat;

constexpr double kCopyCeilingGBps = 4220.0;

#define CHECK_CUDA(expr)                                                        \
  do {                                                                          \
    const cudaError_t err_ = (expr);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

struct Result {
  QuantFormat format;
  int tokens, hidden, blocks_per_thread, grid, threads, input_sets;
  bool chosen;  // the launcher's own choice of blocks_per_thread
  double bytes, median_us, min_us, max_us;
};

Result run_case(QuantFormat f, int T, int H, int bpt, bool chosen, int iters) {
  const int64_t in_bytes = int64_t(T) * H * 2;
  const int64_t data_bytes = T * moe_ep::kernels::quant_data_bytes_per_row(f, H);
  const int64_t scale_bytes = T * moe_ep::kernels::quant_scale_bytes_per_row(f, H);
  // Enough input sets that their sum is well past the 50 MB L2 (at least 2).
  const int sets = int(std::clamp<int64_t>((256ll << 20) / std::max<int64_t>(in_bytes, 1), 2, 16));
  std::vector<uint16_t*> inputs(sets);
  std::vector<uint8_t*> datas(sets), scales(sets);
  std::vector<uint16_t> host(size_t(T) * H);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : host) v = moe_ep::fmt::float_to_bf16(nd(rng));
  for (int s = 0; s < sets; ++s) {
    CHECK_CUDA(cudaMalloc(&inputs[s], in_bytes));
    CHECK_CUDA(cudaMalloc(&datas[s], data_bytes));
    CHECK_CUDA(cudaMalloc(&scales[s], scale_bytes));
    CHECK_CUDA(cudaMemcpy(inputs[s], host.data(), in_bytes, cudaMemcpyHostToDevice));
  }
  auto params = [&](int s) {
    moe_ep::kernels::QuantizeParams p;
    p.input = inputs[s];
    p.input_row_stride = H;
    p.num_tokens = T;
    p.hidden = H;
    p.norm_const = 1.0f;
    p.data = datas[s];
    p.scales = scales[s];
    return p;
  };
  for (int i = 0; i < 10; ++i)
    CHECK_CUDA(moe_ep::kernels::launch_quantize_with(f, params(i % sets), bpt, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(ev[2 * i], nullptr));
    CHECK_CUDA(moe_ep::kernels::launch_quantize_with(f, params(i % sets), bpt, nullptr));
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], nullptr));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = ms * 1000.0;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  const moe_ep::kernels::QuantizeLaunch c = moe_ep::kernels::quantize_launch_config(f, params(0));
  for (int s = 0; s < sets; ++s) {
    cudaFree(inputs[s]);
    cudaFree(datas[s]);
    cudaFree(scales[s]);
  }
  Result r{};
  r.format = f;
  r.tokens = T;
  r.hidden = H;
  r.blocks_per_thread = bpt;
  r.threads = c.threads;
  const int64_t blocks = int64_t(T) * (H / moe_ep::kernels::quant_block_elems(f));
  r.grid = int((blocks + int64_t(c.threads) * bpt - 1) / (int64_t(c.threads) * bpt));
  r.input_sets = sets;
  r.chosen = chosen;
  r.bytes = double(in_bytes + data_bytes + scale_bytes);
  r.median_us = us[iters / 2];
  r.min_us = us.front();
  r.max_us = us.back();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iters = 50, hidden = 7168;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(20, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--hidden") && i + 1 < argc) {
      hidden = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N>=20] [--hidden H]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_quantize: no CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const char* commit = std::getenv("MOE_EP_COMMIT");

  std::vector<Result> results;
  for (QuantFormat f : {QuantFormat::kNvfp4, QuantFormat::kMxfp4, QuantFormat::kMxfp8}) {
    for (int T : {1, 128, 4096}) {
      moe_ep::kernels::QuantizeParams probe;
      probe.num_tokens = T;
      probe.hidden = hidden;
      probe.input_row_stride = hidden;
      // Any 16-byte aligned addresses: the choice depends on alignment and shape only.
      probe.input = reinterpret_cast<const uint16_t*>(uintptr_t(256));
      probe.data = reinterpret_cast<uint8_t*>(uintptr_t(256));
      const int chosen = moe_ep::kernels::quantize_launch_config(f, probe).blocks_per_thread;
      for (int bpt : {1, 2, 4})
        results.push_back(run_case(f, T, hidden, bpt, bpt == chosen, iters));
    }
  }

  std::printf("device: %s, H = %d, %d timed iterations, ceiling %.0f GB/s\n", prop.name, hidden,
              iters, kCopyCeilingGBps);
  std::printf("%-6s %6s %4s %6s %10s %10s %10s %9s %8s %s\n", "format", "T", "bpt", "grid", "MB",
              "median_us", "min-max", "GB/s", "of_4.22", "");
  for (const Result& r : results) {
    const double gbps = r.bytes / (r.median_us * 1e3);
    char range[32];
    std::snprintf(range, sizeof range, "%.1f-%.1f", r.min_us, r.max_us);
    std::printf("%-6s %6d %4d %6d %10.3f %10.2f %10s %9.1f %7.1f%% %s\n",
                moe_ep::kernels::quant_format_name(r.format), r.tokens, r.blocks_per_thread, r.grid,
                r.bytes / 1e6, r.median_us, range, gbps, 100 * gbps / kCopyCeilingGBps,
                r.chosen ? "(default)" : "");
  }

  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(out, "[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const double gbps = r.bytes / (r.median_us * 1e3);
      std::fprintf(out,
                   "  {\"bench\": \"quantize\", \"commit\": \"%s\", \"device\": \"%s\", "
                   "\"format\": \"%s\", \"tokens\": %d, \"hidden\": %d, \"bytes\": %.0f, "
                   "\"median_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, \"GBps\": %.1f, "
                   "\"fraction_of_4220GBps\": %.4f, \"iterations\": %d, \"input_sets\": %d, "
                   "\"default_config\": %s, \"config\": {\"threads\": %d, \"grid\": %d, "
                   "\"blocks_per_thread\": %d, \"vector_loads\": true}}%s\n",
                   commit ? commit : "unknown", prop.name,
                   moe_ep::kernels::quant_format_name(r.format), r.tokens, r.hidden, r.bytes,
                   r.median_us, r.min_us, r.max_us, gbps, gbps / kCopyCeilingGBps, iters,
                   r.input_sets, r.chosen ? "true" : "false", r.threads, r.grid,
                   r.blocks_per_thread, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(out, "]\n");
    std::fclose(out);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
