// Launchers of the input quantizers: validate, pick the instance in one switch, launch.
#include <climits>

#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_kernels.cuh"

namespace moe_ep::kernels {

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::kNvfp4:
      return "nvfp4";
    case QuantFormat::kMxfp4:
      return "mxfp4";
    case QuantFormat::kMxfp8:
      return "mxfp8";
  }
  return "?";
}

int quant_block_elems(QuantFormat f) {
  return f == QuantFormat::kNvfp4 ? fmt::kNvfp4Block : fmt::kMxBlock;
}

int64_t quant_data_bytes_per_row(QuantFormat f, int64_t hidden) {
  return f == QuantFormat::kMxfp8 ? hidden : hidden / 2;
}

int64_t quant_scale_bytes_per_row(QuantFormat f, int64_t hidden) {
  return hidden / quant_block_elems(f);
}

namespace {

constexpr int kThreads = 256;

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Measured on the H200 (bench/results/h200-quantize-2026-11-29-run1.json, T = 4096, H = 7168):
// two blocks per thread help NVFP4 (more math per byte, 66.6% -> 68.6% of the copy ceiling)
// and hurt MXFP4 / MXFP8 (74.6% -> 70.5%, 84.7% -> 81.7%); small grids keep one.
int blocks_per_thread_for(QuantFormat f, int64_t total_blocks) {
  return f == QuantFormat::kNvfp4 && total_blocks >= (1 << 18) ? 2 : 1;
}

template <QuantFormat F, bool kUnitNorm>
cudaError_t launch_for(const QuantizeParams& p, const QuantizeLaunch& c, cudaStream_t stream) {
  const qmath::FastDivU32 bpr(uint32_t(p.hidden / quant_block_elems(F)));
  if (c.vector_loads) {
    if (c.blocks_per_thread == 4)
      quantize_bf16_kernel<F, 4, true, kUnitNorm><<<c.grid, c.threads, 0, stream>>>(p, bpr);
    else if (c.blocks_per_thread == 2)
      quantize_bf16_kernel<F, 2, true, kUnitNorm><<<c.grid, c.threads, 0, stream>>>(p, bpr);
    else
      quantize_bf16_kernel<F, 1, true, kUnitNorm><<<c.grid, c.threads, 0, stream>>>(p, bpr);
  } else {
    quantize_bf16_kernel<F, 1, false, kUnitNorm><<<c.grid, c.threads, 0, stream>>>(p, bpr);
  }
  return cudaGetLastError();
}

QuantizeLaunch config_with(QuantFormat f, const QuantizeParams& p, int blocks_per_thread) {
  QuantizeLaunch c;
  const int64_t total = int64_t(p.num_tokens) * (p.hidden / quant_block_elems(f));
  c.vector_loads = aligned16(p.input) && p.input_row_stride % 8 == 0 && aligned16(p.data);
  c.blocks_per_thread = c.vector_loads ? blocks_per_thread : 1;
  c.threads = kThreads;
  const int64_t per_cta = int64_t(kThreads) * c.blocks_per_thread;
  c.grid = int((total + per_cta - 1) / per_cta);
  return c;
}

}  // namespace

QuantizeLaunch quantize_launch_config(QuantFormat f, const QuantizeParams& p) {
  const int64_t total = int64_t(p.num_tokens > 0 ? p.num_tokens : 0) *
                        (p.hidden > 0 ? p.hidden / quant_block_elems(f) : 0);
  return config_with(f, p, blocks_per_thread_for(f, total));
}

namespace {

// Checks what every launch needs (see quantize.h).
bool valid(QuantFormat f, const QuantizeParams& p) {
  const int block = quant_block_elems(f);
  if (p.num_tokens < 0 || p.hidden <= 0 || p.hidden % block != 0 || p.input_row_stride < p.hidden)
    return false;
  if (f == QuantFormat::kNvfp4 && !(p.norm_const > 0.0f && p.norm_const <= 3.40282347e38f))
    return false;
  if (p.num_tokens > 0 && (!p.input || !p.data || !p.scales)) return false;
  return int64_t(p.num_tokens) * (p.hidden / block) <= INT_MAX;
}

}  // namespace

cudaError_t launch_quantize_with(QuantFormat f, const QuantizeParams& p, int blocks_per_thread,
                                 cudaStream_t stream) {
  if (!valid(f, p) || (blocks_per_thread != 1 && blocks_per_thread != 2 && blocks_per_thread != 4))
    return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const QuantizeLaunch c = config_with(f, p, blocks_per_thread);
  switch (f) {
    case QuantFormat::kNvfp4:
      return p.norm_const == 1.0f ? launch_for<QuantFormat::kNvfp4, true>(p, c, stream)
                                  : launch_for<QuantFormat::kNvfp4, false>(p, c, stream);
    case QuantFormat::kMxfp4:
      return launch_for<QuantFormat::kMxfp4, false>(p, c, stream);
    case QuantFormat::kMxfp8:
      return launch_for<QuantFormat::kMxfp8, false>(p, c, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_quantize(QuantFormat f, const QuantizeParams& p, cudaStream_t stream) {
  if (!valid(f, p)) return cudaErrorInvalidValue;
  return launch_quantize_with(f, p, quantize_launch_config(f, p).blocks_per_thread, stream);
}

}  // namespace moe_ep::kernels
