// Number formats of the layer: bf16, E4M3 (FP8), E2M1 (FP4), UE8M0 scale bytes, and the block
// quantizers of docs/contract.md §3.1 (NVFP4, MXFP4, MXFP8). One definition serves the CPU
// reference and the CUDA kernels, so both round the same way bit for bit.
//
// Policy (docs/quantization.md): rounding is to nearest, ties to even; E4M3 and E2M1 saturate
// to their largest finite value (±448, ±6), Inf included; NaN of either sign becomes E4M3 0x7F
// and E2M1 +6, exactly as the CUDA toolkit's host conversions (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE, __nv_cvt_float_to_fp4 with cudaRoundNearest) do. Block scales never come
// out NaN: the block amax ignores NaN elements, and an Inf amax saturates the scale.
#pragma once

#include <cmath>  // host paths of the .cu files use std::nearbyint / std::exp too
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOE_EP_HD __host__ __device__ __forceinline__
#else
#define MOE_EP_HD inline
#endif

namespace moe_ep::fmt {

// ---------------------------------------------------------------------------------------------
// Bit casts and IEEE arithmetic that the compiler may not contract or approximate.

MOE_EP_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MOE_EP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MOE_EP_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MOE_EP_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MOE_EP_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

MOE_EP_HD float abs_f(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }
MOE_EP_HD bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }

// max that ignores NaN operands, quiet or signaling. Not std::fmax on the host: glibc follows
// IEEE 754-2008 maxNum there and returns NaN for a signaling NaN operand, while the GPU's max
// ignores every NaN (a bf16 sNaN such as 0x7f87 would give the block a NaN scale on the CPU).
MOE_EP_HD float max_ignore_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  if (is_nan(b)) return a;
  if (is_nan(a)) return b;
  return a < b ? b : a;
#endif
}

// 2^e as a float for e in [-149, 127].
MOE_EP_HD float exp2i(int e) {
  if (e >= -126) return bits_float(uint32_t(e + 127) << 23);
  return bits_float(1u << (e + 149));
}

MOE_EP_HD float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);  // default rounding mode: to nearest, ties to even
#endif
}

// ---------------------------------------------------------------------------------------------
// bf16 (stored as uint16_t bits)

MOE_EP_HD float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// Round to nearest even; NaN becomes the canonical quiet NaN 0x7fff. The CPU's arithmetic; on the
// GPU float_to_bf16 is the conversion instruction instead, equal to it for every float
// (tests/gpu/test_quantize_gpu.cu checks all 2^32).
MOE_EP_HD uint16_t float_to_bf16_rne(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: canonical quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return uint16_t(u >> 16);
}

MOE_EP_HD uint16_t float_to_bf16(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  return float_to_bf16_rne(f);
#endif
}

// float_to_bf16 of lo (low half) and hi as one word; one conversion instruction on the GPU.
MOE_EP_HD uint32_t bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(float_to_bf16_rne(lo)) | (uint32_t(float_to_bf16_rne(hi)) << 16);
#endif
}

MOE_EP_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// ---------------------------------------------------------------------------------------------
// Small floats with `kMant` mantissa bits and smallest normal exponent `kEmin`: the code of
// |a| rounded to nearest even, before saturation. Subnormals share the formula: with the
// exponent clamped at kEmin, code = n + ((e - kEmin) << kMant) where n counts quanta.
template <int kMant, int kEmin>
MOE_EP_HD uint32_t small_float_code(float a) {
  const uint32_t bits = float_bits(a);
  int e = int((bits >> 23) & 0xff) - 127;  // floor(log2(a)) for normal a
  if (e < kEmin) e = kEmin;
  if (e > 30) e = 30;  // far above every saturation point; keeps exp2i in range
  const float n = round_half_even(mul_rn(a, exp2i(kMant - e)));
  return uint32_t(n) + (uint32_t(e - kEmin) << kMant);
}

// E4M3 (FP8, bias 7, max 448, 0x7F/0xFF are NaN)
constexpr float kE4M3Max = 448.0f;

MOE_EP_HD uint8_t float_to_e4m3(float f) {
  if (is_nan(f)) return 0x7f;  // canonical NaN, whatever the sign
  const uint8_t sign = uint8_t((float_bits(f) >> 24) & 0x80u);
  const float a = abs_f(f);
  if (a >= kE4M3Max) return sign | 0x7e;
  uint32_t code = small_float_code<3, -6>(a);
  if (code > 0x7e) code = 0x7e;
  return sign | uint8_t(code);
}

MOE_EP_HD float e4m3_to_float(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = bits_float(0x7fc00000u);
  } else if (exp == 0) {
    v = float(man) * exp2i(-9);
  } else {
    v = bits_float(((exp + 120u) << 23) | (man << 20));
  }
  return (b & 0x80) ? -v : v;
}

// E2M1 (FP4, bias 1, values 0 .5 1 1.5 2 3 4 6; a nibble)
constexpr float kE2M1Max = 6.0f;

MOE_EP_HD uint8_t float_to_e2m1(float f) {
  if (is_nan(f)) return 0x7;
  const uint8_t sign = uint8_t((float_bits(f) >> 28) & 0x8u);
  const float a = abs_f(f);
  if (a >= kE2M1Max) return sign | 0x7;
  uint32_t code = small_float_code<1, 0>(a);
  if (code > 0x7) code = 0x7;
  return sign | uint8_t(code);
}

MOE_EP_HD float e2m1_to_float(uint8_t nibble) {
  // |value| * 2 for codes 0..7 is 0 1 2 3 4 6 8 12.
  const uint32_t c = nibble & 0x7;
  const uint32_t twice = c < 4 ? c : (c < 6 ? 4u + 2u * (c - 4u) : 8u + 4u * (c - 6u));
  const float v = float(twice) * 0.5f;
  return (nibble & 0x8) ? -v : v;
}

// UE8M0 scale byte: 2^(b - 127); 0xFF is NaN.
MOE_EP_HD float ue8m0_to_float(uint8_t b) {
  if (b == 0xff) return bits_float(0x7fc00000u);
  return exp2i(int(b) - 127);
}

// The smallest power of two 2^e with amax / 2^e <= max_value, e clamped to [-127, 127],
// returned as its UE8M0 byte. `max_value` must be m * 2^k with the mantissa m exact.
// amax = 0 gives the smallest scale (byte 0); Inf gives the largest (byte 254).
MOE_EP_HD uint8_t ue8m0_scale_for(float amax, float max_value) {
  const uint32_t ab = float_bits(amax) & 0x7fffffffu;
  if (ab == 0) return 0;
  if (ab >= 0x7f800000u) return 254;
  const uint32_t mb = float_bits(max_value);
  // Compare amax and max_value as (exponent, mantissa); both normal or amax subnormal.
  int ea = int(ab >> 23) - 127;
  uint32_t ma = ab & 0x7fffffu;
  if ((ab >> 23) == 0) {  // subnormal amax: normalize
    ea = -126;
    while ((ma & 0x800000u) == 0) {
      ma <<= 1;
      --ea;
    }
    ma &= 0x7fffffu;
  }
  const int em = int((mb >> 23) & 0xff) - 127;
  const uint32_t mm = mb & 0x7fffffu;
  int e = ea - em + (ma > mm ? 1 : 0);
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return uint8_t(e + 127);
}

// ---------------------------------------------------------------------------------------------
// Block quantizers (docs/contract.md §3.1). Inputs come as a loader so bf16 and fp32 rows share one
// code.

constexpr int kNvfp4Block = 16;  // elements per E4M3 scale
constexpr int kMxBlock = 32;     // elements per UE8M0 scale

MOE_EP_HD float to_f32(float x) { return x; }
MOE_EP_HD float to_f32(uint16_t bf16_bits) { return bf16_to_float(bf16_bits); }

template <class T>
MOE_EP_HD float block_amax(const T* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = max_ignore_nan(amax, abs_f(to_f32(x[i])));
  return amax;
}

// NVFP4: s = e4m3(amax * nc / 6); q = e2m1(x * nc / s), q = 0 when s = 0. Writes 8 bytes of
// packed E2M1 (even element in the low nibble) and returns the scale byte.
template <class T>
MOE_EP_HD uint8_t quantize_block_nvfp4(const T* x, float norm_const, uint8_t* packed) {
  const float amax = block_amax(x, kNvfp4Block);
  const uint8_t sb = float_to_e4m3(div_rn(mul_rn(amax, norm_const), kE2M1Max));
  const float s = e4m3_to_float(sb);
  for (int i = 0; i < kNvfp4Block; i += 2) {
    uint8_t lo = 0, hi = 0;
    if (s != 0.0f) {
      lo = float_to_e2m1(div_rn(mul_rn(to_f32(x[i]), norm_const), s));
      hi = float_to_e2m1(div_rn(mul_rn(to_f32(x[i + 1]), norm_const), s));
    }
    packed[i / 2] = uint8_t(lo | (hi << 4));
  }
  return sb;
}

// MXFP4: scale = smallest 2^e with amax / 2^e <= 6; q = e2m1(x / 2^e). 16 bytes out.
template <class T>
MOE_EP_HD uint8_t quantize_block_mxfp4(const T* x, uint8_t* packed) {
  const uint8_t sb = ue8m0_scale_for(block_amax(x, kMxBlock), kE2M1Max);
  const float inv = exp2i(127 - int(sb));
  for (int i = 0; i < kMxBlock; i += 2) {
    const uint8_t lo = float_to_e2m1(mul_rn(to_f32(x[i]), inv));
    const uint8_t hi = float_to_e2m1(mul_rn(to_f32(x[i + 1]), inv));
    packed[i / 2] = uint8_t(lo | (hi << 4));
  }
  return sb;
}

// MXFP8: scale = smallest 2^e with amax / 2^e <= 448; q = e4m3(x / 2^e). 32 bytes out.
template <class T>
MOE_EP_HD uint8_t quantize_block_mxfp8(const T* x, uint8_t* q) {
  const uint8_t sb = ue8m0_scale_for(block_amax(x, kMxBlock), kE4M3Max);
  const float inv = exp2i(127 - int(sb));
  for (int i = 0; i < kMxBlock; ++i) q[i] = float_to_e4m3(mul_rn(to_f32(x[i]), inv));
  return sb;
}

// Dequantized element values as the GEMMs see them (q * s; the NVFP4 norm constant stays in).
// The product is exact (<= 4 significant bits, smallest 2^-136); mul_rn keeps a
// caller's `acc += dequant(...) * w` from being contracted into one FMA with it.
MOE_EP_HD float e2m1_packed_at(const uint8_t* packed, int i) {
  const uint8_t byte = packed[i >> 1];
  return e2m1_to_float((i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf));
}

MOE_EP_HD float dequant_nvfp4(const uint8_t* packed, const uint8_t* scales, int i) {
  return mul_rn(e2m1_packed_at(packed, i), e4m3_to_float(scales[i / kNvfp4Block]));
}

MOE_EP_HD float dequant_mxfp4(const uint8_t* packed, const uint8_t* scales, int i) {
  return mul_rn(e2m1_packed_at(packed, i), ue8m0_to_float(scales[i / kMxBlock]));
}

MOE_EP_HD float dequant_mxfp8(const uint8_t* q, const uint8_t* scales, int i) {
  return mul_rn(e4m3_to_float(q[i]), ue8m0_to_float(scales[i / kMxBlock]));
}

// Row quantizers over n elements (n a multiple of the block).
template <class T>
MOE_EP_HD void quantize_row_nvfp4(const T* x, int n, float norm_const, uint8_t* packed,
                                  uint8_t* scales) {
  for (int b = 0; b < n / kNvfp4Block; ++b)
    scales[b] = quantize_block_nvfp4(x + b * kNvfp4Block, norm_const, packed + b * 8);
}

template <class T>
MOE_EP_HD void quantize_row_mxfp4(const T* x, int n, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < n / kMxBlock; ++b)
    scales[b] = quantize_block_mxfp4(x + b * kMxBlock, packed + b * 16);
}

template <class T>
MOE_EP_HD void quantize_row_mxfp8(const T* x, int n, uint8_t* q, uint8_t* scales) {
  for (int b = 0; b < n / kMxBlock; ++b)
    scales[b] = quantize_block_mxfp8(x + b * kMxBlock, q + b * kMxBlock);
}

// ---------------------------------------------------------------------------------------------
// The activation of docs/contract.md §3: g = min(g, L); u = clamp(u, -L, L); h = u * (g *
// sigmoid(g)). `limit` < 0 means no clamp. expf differs between the host libm and CUDA by an ulp or
// two; docs/contract.md §7's tolerance covers that.
// The activation with a slope and an offset (contract §3.1, gpt-oss: alpha 1.702, beta 1, L 7):
// g = min(g, L); u = clamp(u, -L, L); h = (u + beta) * (g * sigmoid(alpha * g)). With alpha = 1
// and beta = 0 it is swiglu() bit for bit (neither the product nor the sum is formed then).
MOE_EP_HD float swiglu_ab(float g, float u, float limit, float alpha, float beta) {
  if (limit >= 0.0f) {
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : (u > limit ? limit : u);
  }
  const float ag = alpha == 1.0f ? g : mul_rn(alpha, g);
#if defined(__CUDA_ARCH__)
  const float e = expf(-ag);
#else
  const float e = std::exp(-ag);
#endif
  const float sig = div_rn(1.0f, add_rn(1.0f, e));
  const float uu = beta == 0.0f ? u : add_rn(u, beta);
  return mul_rn(uu, mul_rn(g, sig));
}

MOE_EP_HD float swiglu(float g, float u, float limit) {
  if (limit >= 0.0f) {
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : (u > limit ? limit : u);
  }
#if defined(__CUDA_ARCH__)
  const float e = expf(-g);
#else
  const float e = std::exp(-g);
#endif
  const float sig = div_rn(1.0f, add_rn(1.0f, e));
  return mul_rn(u, mul_rn(g, sig));
}

}  // namespace moe_ep::fmt
