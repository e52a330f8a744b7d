// Input quantization on the GPU: a bf16 matrix [T, H] (any row stride) to NVFP4, MXFP4 or
// MXFP8, equal bit for bit to the CPU block quantizers of moe_ep/formats.h (the kernels call
// them). Host-only header: raw pointers, no torch, launches on the caller's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe_ep::kernels {

enum class QuantFormat : uint8_t {
  kNvfp4,  // E2M1 pairs + one E4M3 scale per 16 elements, with a norm constant
  kMxfp4,  // E2M1 pairs + one UE8M0 scale per 32 elements
  kMxfp8,  // E4M3 bytes + one UE8M0 scale per 32 elements
};

const char* quant_format_name(QuantFormat f);
int quant_block_elems(QuantFormat f);                              // 16 or 32
int64_t quant_data_bytes_per_row(QuantFormat f, int64_t hidden);   // H/2 or H
int64_t quant_scale_bytes_per_row(QuantFormat f, int64_t hidden);  // H / block

struct QuantizeParams {
  const uint16_t* input = nullptr;  // bf16 bits [T, H], device memory
  int64_t input_row_stride = 0;     // elements between rows (>= H)
  int num_tokens = 0;               // T (rows); with device_num_tokens: an upper bound
  int hidden = 0;                   // H, a multiple of the format's block
  float norm_const = 1.0f;          // NVFP4 only: x is scaled by it before quantization
  // Optional device-side row count (graph replay with varying T): rows at and past
  // min(*device_num_tokens, num_tokens) are left untouched.
  const int32_t* device_num_tokens = nullptr;
  uint8_t* data = nullptr;    // [T, quant_data_bytes_per_row] contiguous, device memory
  uint8_t* scales = nullptr;  // [T, quant_scale_bytes_per_row] contiguous, device memory
};

// The launch configuration, a pure function of the shape (printed by the benchmark).
struct QuantizeLaunch {
  int threads = 0, grid = 0;
  int blocks_per_thread = 0;  // quantization blocks each thread handles per step
  bool vector_loads = false;  // 16-byte loads (input 16-byte aligned, stride a multiple of 8)
};
QuantizeLaunch quantize_launch_config(QuantFormat f, const QuantizeParams& p);

// Validates (cudaErrorInvalidValue for a null pointer with T > 0, H not a multiple of the
// block, stride < H, T < 0, T * H / block > INT_MAX, an NVFP4 norm constant not finite and
// > 0), then launches on `stream`. T = 0 launches nothing. Returns the launch error.
cudaError_t launch_quantize(QuantFormat f, const QuantizeParams& p, cudaStream_t stream);

// The same with blocks_per_thread (1, 2 or 4) forced instead of chosen (benchmarks compare).
cudaError_t launch_quantize_with(QuantFormat f, const QuantizeParams& p, int blocks_per_thread,
                                 cudaStream_t stream);

}  // namespace moe_ep::kernels
