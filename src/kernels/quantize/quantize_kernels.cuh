// Device code of the input quantizers (launched by quantize.cu). One thread quantizes
// kBlocksPerThread whole scale blocks with the block math of quantize_math.h, which equals the
// formats.h reference bit for bit. Consecutive threads take consecutive blocks, so a warp reads
// 1-2 KiB of contiguous input per step, and every load of a thread is issued before any math.
#pragma once

#include <cstdint>

#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_math.h"

namespace moe_ep::kernels {

template <QuantFormat F>
struct QuantTraits {
  static constexpr int kBlock = F == QuantFormat::kNvfp4 ? fmt::kNvfp4Block : fmt::kMxBlock;
  static constexpr int kInWords = kBlock / 2;  // bf16 pairs
  static constexpr int kOutWords = (F == QuantFormat::kMxfp8 ? kBlock : kBlock / 2) / 4;
};

template <QuantFormat F, bool kUnitNorm>
__device__ __forceinline__ uint8_t quantize_words(const uint32_t* w, float norm_const,
                                                  uint32_t* out) {
  if constexpr (F == QuantFormat::kNvfp4) {
    return qmath::nvfp4_block<kUnitNorm>(w, norm_const, out);
  } else if constexpr (F == QuantFormat::kMxfp4) {
    return qmath::mxfp4_block(w, out);
  } else {
    return qmath::mxfp8_block(w, out);
  }
}

// kVector: input rows and outputs are 16-byte aligned (the launcher checks), so blocks move as
// uint4; otherwise element by element. kUnitNorm: NVFP4 with norm_const == 1.
template <QuantFormat F, int kBlocksPerThread, bool kVector, bool kUnitNorm>
__global__ void __launch_bounds__(256)
    quantize_bf16_kernel(QuantizeParams p, qmath::FastDivU32 blocks_per_row_div) {
  using Tr = QuantTraits<F>;
  int rows = p.num_tokens;
  if (p.device_num_tokens != nullptr) rows = min(rows, int(*p.device_num_tokens));
  const uint32_t blocks_per_row = blocks_per_row_div.d;
  const uint32_t total = uint32_t(rows > 0 ? rows : 0) * blocks_per_row;
  const uint32_t num_threads = gridDim.x * blockDim.x;

  for (uint32_t base = blockIdx.x * blockDim.x + threadIdx.x; base < total;
       base += num_threads * kBlocksPerThread) {
    uint32_t w[kBlocksPerThread][Tr::kInWords];
#pragma unroll
    for (int j = 0; j < kBlocksPerThread; ++j) {
      const uint32_t g = base + j * num_threads;
      if (g >= total) break;
      const uint32_t row = blocks_per_row_div.div(g), col = g - row * blocks_per_row;
      const uint16_t* src = p.input + int64_t(row) * p.input_row_stride + col * Tr::kBlock;
      if constexpr (kVector) {
#pragma unroll
        for (int v = 0; v < Tr::kInWords / 4; ++v) {
          const uint4 q = __ldg(reinterpret_cast<const uint4*>(src) + v);
          w[j][4 * v + 0] = q.x;
          w[j][4 * v + 1] = q.y;
          w[j][4 * v + 2] = q.z;
          w[j][4 * v + 3] = q.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < Tr::kInWords; ++i)
          w[j][i] = uint32_t(src[2 * i]) | (uint32_t(src[2 * i + 1]) << 16);
      }
    }
#pragma unroll
    for (int j = 0; j < kBlocksPerThread; ++j) {
      const uint32_t g = base + j * num_threads;
      if (g >= total) break;
      uint32_t o[Tr::kOutWords];
      const uint8_t s = quantize_words<F, kUnitNorm>(w[j], p.norm_const, o);
      // Outputs are contiguous: block g's bytes start at g * kOutWords * 4.
      uint32_t* dst = reinterpret_cast<uint32_t*>(p.data) + int64_t(g) * Tr::kOutWords;
      if constexpr (kVector) {
        if constexpr (Tr::kOutWords == 2) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(o[0], o[1]);
        } else {
#pragma unroll
          for (int i = 0; i < Tr::kOutWords / 4; ++i)
            reinterpret_cast<uint4*>(dst)[i] =
                make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
        }
      } else {
        uint8_t* d8 = reinterpret_cast<uint8_t*>(dst);
#pragma unroll
        for (int i = 0; i < Tr::kOutWords * 4; ++i) d8[i] = uint8_t(o[i / 4] >> (8 * (i % 4)));
      }
      p.scales[g] = s;
    }
  }
}

}  // namespace moe_ep::kernels
