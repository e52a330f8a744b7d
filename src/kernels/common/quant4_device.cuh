// Activation block quantization spread over lanes: each thread holds 4 or 8 consecutive elements
// of a row, the 16 / N (NVFP4, 16-wide blocks) or 32 / N (MXFP8, 32-wide blocks) lanes of one
// scale block share its amax by shuffles, and every element gets the arithmetic of
// fmt::quantize_block_nvfp4 / fmt::quantize_block_mxfp8 (so the codes, the scale byte and q * s are
// those functions' bits). A row then spreads over many threads, so a decode token's quantization is
// not a chain of 16 or 32 dependent divisions per thread. Used by the single-GPU prepare and the EP
// source.
#pragma once

#include <cstdint>

#include "kernels/common/quantize_math.h"
#include "moe_ep/config.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {

namespace qmath = kernels::qmath;

// The activation format of a recipe with 4-bit or 8-bit activations.
template <Recipe R>
constexpr bool kQuantizesActivations = R == Recipe::kNvfp4 || R == Recipe::kMxfp4Mxfp8;

// Elements i0 .. i0 + 3 of a bf16 row x as two words (low half first; zeros where !on), by one
// 8-byte load where the caller's rows allow it (x_rows8: base and stride 8-byte aligned).
__device__ __forceinline__ bool x_rows8(const uint16_t* x, int64_t stride) {
  return ((reinterpret_cast<uintptr_t>(x) | uintptr_t(stride) * 2) & 7) == 0;
}
__device__ __forceinline__ void load_x4(const uint16_t* x, int i0, bool on, bool vec,
                                        uint32_t (&w)[2]) {
  w[0] = w[1] = 0u;
  if (!on) return;
  if (vec) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(x + i0));
    w[0] = u.x;
    w[1] = u.y;
  } else {
    w[0] = uint32_t(x[i0]) | uint32_t(x[i0 + 1]) << 16;
    w[1] = uint32_t(x[i0 + 2]) | uint32_t(x[i0 + 3]) << 16;
  }
}

// Elements i0 .. i0 + 7 as four words: one 16-byte load where the rows allow it (x_rows16),
// else two load_x4.
__device__ __forceinline__ bool x_rows16(const uint16_t* x, int64_t stride) {
  return ((reinterpret_cast<uintptr_t>(x) | uintptr_t(stride) * 2) & 15) == 0;
}
__device__ __forceinline__ void load_x8(const uint16_t* x, int i0, bool on, bool vec16, bool vec8,
                                        uint32_t (&w)[4]) {
  if (on && vec16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(x + i0));
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    return;
  }
  uint32_t a[2], b[2];
  load_x4(x, i0, on, vec8, a);
  load_x4(x, i0 + 4, on, vec8, b);
  w[0] = a[0], w[1] = a[1], w[2] = b[0], w[3] = b[1];
}

// The N / 2 words of bf16 pairs (element 2j in the low half of w[j]) as N floats.
template <int N>
__device__ __forceinline__ void bf16_words_to_f32(const uint32_t (&w)[N / 2], float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    v[2 * j] = fmt::bf16_to_float(w[j] & 0xffffu);
    v[2 * j + 1] = fmt::bf16_to_float(w[j] >> 16);
  }
}

// The block's amax over its lanes (NaN ignored, as fmt::quantize_block_*).
template <Recipe R, int N>
__device__ __forceinline__ float lane_block_amax(const float (&v)[N]) {
  constexpr int kLanes = R == Recipe::kNvfp4 ? fmt::kNvfp4Block / N : fmt::kMxBlock / N;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) amax = fmt::max_ignore_nan(amax, fmt::abs_f(v[i]));
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1)
    amax = fmt::max_ignore_nan(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  return amax;
}

// v: this thread's N (4 or 8) elements (lanes of one block are consecutive and all active, also
// those past the row's end, with zeros). Returns the block's scale byte; q = the N codes (E2M1
// codes for NVFP4, E4M3 bytes for MXFP8), d = q * s as floats (exact). The amax is the same
// whatever the lanes' split (a maximum), so N = 4 and 8 give the same bits.
template <Recipe R, int N>
__device__ __forceinline__ uint8_t quantize_n(const float (&v)[N], float norm_const,
                                              uint8_t (&q)[N], float (&d)[N]) {
  static_assert(kQuantizesActivations<R>, "bf16 activations are not quantized");
  static_assert(N == 4 || N == 8, "4 or 8 elements per lane");
  const float amax = lane_block_amax<R, N>(v);
  if constexpr (R == Recipe::kNvfp4) {
    // The quantize kernels' exact element math (kernels/common/quantize_math.h, proven equal
    // to the formats.h reference by the unit tests): the block scale and each element's quotient
    // by two FMAs after a multiply (one IEEE division per block, for RN(1 / s)), the E2M1 code
    // by one float add, and q * s from the code's value. The reference's arithmetic itself for a
    // block with an Inf element or an overflowing amax * nc, and for a NaN element.
    const qmath::Nvfp4Scale k = qmath::nvfp4_scale(amax, norm_const);
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = qmath::nvfp4_quant(v[i], norm_const, k, &d[i]);
    return k.sb;
  } else {
    // The conversion instruction (qmath::e4m3_pair: the rounding, saturation and NaN of
    // fmt::float_to_e4m3) and back (exact).
    const qmath::MxScale k = qmath::mxfp8_scale(amax);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint32_t p = qmath::mxfp8_pair(v[i], v[i + 1], k, &d[i], &d[i + 1]);
      q[i] = uint8_t(p);
      q[i + 1] = uint8_t(p >> 8);
    }
    return k.sb;
  }
}

// The lane's elements as the GEMM sees them, bf16(q * s) of elements 2j (low half) and 2j + 1 in
// o[j]: quantize_n's d rounded to bf16, without the codes. NVFP4 takes each element's value from
// the rounding add (qmath::nvfp4_quant_bf16: no code, no rounding step).
template <Recipe R, int N>
__device__ __forceinline__ void quantize_bf16_n(const float (&v)[N], float norm_const,
                                                uint32_t (&o)[N / 2]) {
  if constexpr (R == Recipe::kNvfp4) {
    const qmath::Nvfp4Scale k = qmath::nvfp4_scale(lane_block_amax<R, N>(v), norm_const);
#pragma unroll
    for (int j = 0; j < N / 2; ++j)
      o[j] = qmath::nvfp4_quant_bf16(v[2 * j], norm_const, k) |
             (qmath::nvfp4_quant_bf16(v[2 * j + 1], norm_const, k) << 16);
  } else {
    uint8_t q[N];
    float d[N];
    quantize_n<R, N>(v, norm_const, q, d);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) o[j] = fmt::bf16x2(d[2 * j], d[2 * j + 1]);
  }
}

}  // namespace moe_ep::kern
