// Faster element math for the quantize kernels, equal bit for bit to the formats.h reference
// (the unit tests check every float, or every case that can differ; the GPU tests check the
// kernels against the CPU quantizers). __host__ __device__ so the CPU can prove it.
//   - e2m1_mag_code_biased: one float add rounds to the E2M1 grid (the add's ulp is the E2M1
//     step) instead of the generic small-float path; signs come straight from the bf16 bits.
//   - blocks with a NaN or Inf element take the formats.h block function itself.
//   - div_by_scale: RN(a / s) as a * r refined by two FMAs (Markstein), r = RN(1 / s) once per
//     block, instead of a full IEEE division per element.
//   - e4m3_pair: the Hopper conversion instruction on the GPU (same rounding, saturation and
//     NaN as fmt::float_to_e4m3), the reference on the CPU.
#pragma once

#include <cstdint>

#include "moe_ep/formats.h"

#if defined(__CUDACC__)
#define MOE_EP_UNROLL _Pragma("unroll")
#else
#define MOE_EP_UNROLL
#endif

namespace moe_ep::kernels::qmath {

MOE_EP_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

MOE_EP_HD uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// |x|, min and a NaN-propagating max that the GPU folds into single instructions (abs as an
// operand modifier); the same values on the CPU.
MOE_EP_HD float fabs_hd(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return fmt::abs_f(x);
#endif
}

MOE_EP_HD float fmin_hd(float a, float b) {  // b not NaN; a NaN never reaches it
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  return a < b ? a : b;
#endif
}

MOE_EP_HD float fmax_nan_hd(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  if (fmt::is_nan(a) || fmt::is_nan(b)) return fmt::bits_float(0x7fc00000u);
  return a > b ? a : b;
#endif
}

// The bytes of {b, a} picked by the selector nibbles (PTX prmt / __byte_perm).
MOE_EP_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t v = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// RN(a / s) for finite a >= 0, s > 0 an E4M3 value and r = RN(1 / s),
// wherever a / s and the residual below (about 2^-24 a) are normal floats. q = RN(a r) is within an
// ulp of a / s, the FMA residual a - q s is exact, and one more FMA rounds correctly (Markstein).
// Exponents only shift the computation, so the unit tests check every (a, s) mantissa pair. A
// quotient that underflows or has a < 2^-100 may differ in its last bits, but is then far below
// 2^-10 (in a block s >= 2^-9), so its E2M1 / E4M3 code is still zero. In a block, r <= 512 and a
// <= amax * nc <= 10 s unless s saturated at 448: no overflow.
MOE_EP_HD float div_by_scale(float a, float s, float r) {
  const float q = fmt::mul_rn(a, r);
  const float e = fma_rn(-q, s, a);
  return fma_rn(e, r, q);
}

// Two E4M3 codes (low byte: x0), as fmt::float_to_e4m3.
MOE_EP_HD uint32_t e4m3_pair(float x0, float x1) {
#if defined(__CUDA_ARCH__)
  uint16_t v;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(v) : "f"(x1), "f"(x0));
  return v;
#else
  return uint32_t(fmt::float_to_e4m3(x0)) | (uint32_t(fmt::float_to_e4m3(x1)) << 8);
#endif
}

MOE_EP_HD uint8_t e4m3(float x) { return uint8_t(e4m3_pair(x, 0.0f)); }

// fmt::e4m3_to_float; on the GPU through the FP8 -> FP16 conversion (exact) and FP16 -> FP32.
MOE_EP_HD float e4m3_value(uint8_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(b)));
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(uint16_t(h2 & 0xffffu)));
  return f;
#else
  return fmt::e4m3_to_float(b);
#endif
}

MOE_EP_HD float bf16_lo(uint32_t w) { return fmt::bits_float(w << 16); }
MOE_EP_HD float bf16_hi(uint32_t w) { return fmt::bits_float(w & 0xffff0000u); }

// The exponent bits of 2^e, e = max(exponent of a, 0), for 0 <= a <= 6: adding C = 2^(e + 22)
// (bits ce + (22 << 23)) to a rounds it to the E2M1 grid of its binade in hardware (ulp(C) is
// the E2M1 step, ties to even).
MOE_EP_HD uint32_t e2m1_binade_bits(float a) {
  const uint32_t ce = fmt::float_bits(a) & 0x7f800000u;
  return ce < 0x3f800000u ? 0x3f800000u : ce;
}

// Magnitude code (0..7) of E2M1(|q|) for q not NaN. |q| is clamped to 6 (all larger values
// saturate to code 7 anyway), rounded by the add of C (e2m1_binade_bits), and the steps above C
// plus 2e are the code. Returned with a bias of 254 (see e2m1_pack).
MOE_EP_HD uint32_t e2m1_mag_code_biased(float q) {
  const float a = fmin_hd(fabs_hd(q), fmt::kE2M1Max);
  const uint32_t ce = e2m1_binade_bits(a);
  const uint32_t cb = ce + (22u << 23);
  const uint32_t sum = fmt::float_bits(fmt::add_rn(a, fmt::bits_float(cb)));
  return sum - cb + (ce >> 22);
}

MOE_EP_HD uint32_t e2m1_mag_code(float q) { return e2m1_mag_code_biased(q) - 254u; }

// |E2M1 value| * 2 of the magnitude code c = code4 / 4 (0..7): 0 1 2 3 4 6 8 12, a nibble table in
// one constant. Taking 4c saves the shift where the caller has the code in place already.
MOE_EP_HD uint32_t e2m1_twice(uint32_t code4) { return (0xC8643210u >> code4) & 0xfu; }

// |E2M1(q)| as a float for q >= 0 not NaN, the value of e2m1_mag_code(q): the same rounding add
// of C, then C subtracted back (exact: the sum lies within 2^(e+1) above C on its ulp grid), so no
// code-to-value table or integer conversion.
MOE_EP_HD float e2m1_round_value(float q) {
  const float a = fmin_hd(q, fmt::kE2M1Max);
  const float c = fmt::bits_float(e2m1_binade_bits(a) + (22u << 23));
  return fmt::add_rn(fmt::add_rn(a, c), -c);
}

// The float bits of nvfp4_element's *d (E2M1(xn / s) * s with xn's sign) for finite xn, s > 0 an
// E4M3 value and r = RN(1 / s). The product has at most 2 + 4 significant bits and is 0 or at
// least 2^-10, so it is exact in bf16: its top half is fmt::float_to_bf16(*d).
MOE_EP_HD uint32_t nvfp4_value_bits(float xn, float s, float r) {
  const float m = fmt::mul_rn(e2m1_round_value(div_by_scale(fabs_hd(xn), s, r)), s);
  return fmt::float_bits(m) | (fmt::float_bits(xn) & 0x80000000u);
}

// One NVFP4 element: the E2M1 code (sign in bit 3) of fmt::float_to_e2m1(fmt::div_rn(xn, s)), for
// finite xn, s > 0 an E4M3 value and r = RN(1 / s); *d = the code's value times s, as
// fmt::e2m1_to_float(code) * s (exact). The sign is xn's (s > 0; -0 gives code 8, as there).
MOE_EP_HD uint8_t nvfp4_element(float xn, float s, float r, float* d) {
  const uint32_t code = e2m1_mag_code(div_by_scale(fabs_hd(xn), s, r));
  const uint32_t neg = fmt::float_bits(xn) >> 31;
  const float mag = fmt::mul_rn(float(e2m1_twice(4 * code)) * 0.5f, s);
  *d = neg ? -mag : mag;
  return uint8_t(code | (neg << 3));
}

// The EP unpack (owner side): 8 received activation elements into their bf16 q * s, bit for bit
// fmt::float_to_bf16(dequant(...)) (q * s is exact in bf16 there, so the bf16 is the product's
// top half). o[j] holds elements 2j (low half) and 2j + 1. They return false where the fast path
// does not apply (a NaN scale, MXFP8 NaN codes or a scale below 2^-100), and the caller then
// takes the reference per element.

// NVFP4: p holds 8 E2M1 nibbles (element j in bits 4j..4j+3), sb their block's E4M3 scale byte.
// |E2M1| * 2 (e2m1_twice) times s / 2 is exact; the element's sign flips the product's (so a
// negative scale and -0 come out as the reference's float product).
MOE_EP_HD bool nvfp4_unpack8(uint32_t p, uint8_t sb, uint32_t (&o)[4]) {
  if ((sb & 0x7fu) == 0x7fu) return false;
  const float hs = 0.5f * e4m3_value(sb);
  MOE_EP_UNROLL
  for (int j = 0; j < 8; ++j) {
    const uint32_t code4 = j == 0 ? (p << 2) & 0x1cu : (p >> (4 * j - 2)) & 0x1cu;  // 4 * mag
    const float m = fmt::mul_rn(float(e2m1_twice(code4)), hs);
    const uint32_t b = (fmt::float_bits(m) ^ ((p << (28 - 4 * j)) & 0x80000000u)) >> 16;
    o[j / 2] = (j & 1) ? o[j / 2] | (b << 16) : b;
  }
  return true;
}

// MXFP8: q holds 8 E4M3 codes (element j in byte j of q[j / 4]), sb their block's UE8M0 byte.
// With s >= 2^-100 every product is a normal float with at most 4 significant bits, or Inf where
// the reference's float product overflows too.
MOE_EP_HD bool mxfp8_unpack8(const uint32_t (&q)[2], uint8_t sb, uint32_t (&o)[4]) {
  const uint32_t nan = ((q[0] & 0x7f7f7f7fu) + 0x01010101u) | ((q[1] & 0x7f7f7f7fu) + 0x01010101u);
  if (sb == 0xffu || sb < 27u || (nan & 0x80808080u) != 0u) return false;  // 0x7f: NaN code
  const float s = fmt::ue8m0_to_float(sb);
  MOE_EP_UNROLL
  for (int j = 0; j < 8; ++j) {
    const float v = fmt::mul_rn(e4m3_value(uint8_t(q[j / 4] >> (8 * (j % 4)))), s);
    const uint32_t b = fmt::float_bits(v) >> 16;
    o[j / 2] = (j & 1) ? o[j / 2] | (b << 16) : b;
  }
  return true;
}

// Sign bits of 8 bf16 elements (4 words) at the top of each E2M1 nibble: odd elements' signs
// are the top bits of bytes 3 of the words, even elements' of bytes 1.
MOE_EP_HD uint32_t e2m1_signs(const uint32_t* w) {
  const uint32_t p01 = byte_perm(w[0], w[1], 0x7531), p23 = byte_perm(w[2], w[3], 0x7531);
  const uint32_t odd = byte_perm(p01, p23, 0x7531), even = byte_perm(p01, p23, 0x6420);
  return (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}

// One output word of 8 E2M1 nibbles from 4 words of finite bf16 pairs and the 8 magnitudes q
// (|x| / s in the block's arithmetic). Biased codes are summed and the bias removed once.
MOE_EP_HD uint32_t e2m1_pack(const uint32_t* w, const float* q) {
  uint32_t acc = 0;
  MOE_EP_UNROLL
  for (int k = 0; k < 8; ++k) acc += e2m1_mag_code_biased(q[k]) << (4 * k);
  return (acc - 254u * 0x11111111u) | e2m1_signs(w);
}

// n / d for n < 2^31 by a multiply-high, an add and a shift (d >= 1 fixed per launch).
struct FastDivU32 {
  uint32_t d = 1, magic = 1, shift = 0;
  FastDivU32() = default;
  explicit FastDivU32(uint32_t divisor) : d(divisor) {
    while ((uint64_t(1) << shift) < d) ++shift;  // shift = ceil(log2 d)
    magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  MOE_EP_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

// ---------------------------------------------------------------------------------------------
// Blocks on bf16 pairs: w[i] holds elements 2i (low half) and 2i+1. Outputs are little-endian
// words of the packed bytes, so they equal the fmt::quantize_block_* byte arrays. Blocks with
// a NaN or Inf element (rare) take the formats.h reference itself; the fast paths below see
// finite data only.

template <int kWords>
MOE_EP_HD float amax_bf16_words_nan(const uint32_t* w) {  // NaN if any element is NaN
  float amax = 0.0f;
  MOE_EP_UNROLL
  for (int i = 0; i < kWords; ++i) {
    amax = fmax_nan_hd(amax, fabs_hd(bf16_lo(w[i])));
    amax = fmax_nan_hd(amax, fabs_hd(bf16_hi(w[i])));
  }
  return amax;
}

MOE_EP_HD bool finite_hd(float x) { return fabs_hd(x) <= 3.40282347e38f; }  // false: Inf, NaN

// The block scales of fmt::quantize_block_nvfp4 / _mxfp8 on this file's element math, shared by
// the quantize kernels' blocks below (nvfp4_block, mxfp8_block), the forward's activation
// quantizer (kern::quantize_n: the lanes of a block share its amax) and the fc1 epilogue's
// requantization of h (nvfp4_block_bf16 / mxfp8_block_bf16, one thread per block).
//
// NVFP4, from the block's amax * nc (NaNs ignored, as block_amax): `fast` where it is finite,
// and then each element with a finite x * nc takes nvfp4_element; anything else takes the
// reference's own arithmetic.
struct Nvfp4Scale {
  uint8_t sb;  // E4M3 scale byte
  bool fast;
  float s, r;  // its value and RN(1 / s) (0 when s = 0)
};
MOE_EP_HD Nvfp4Scale nvfp4_scale_n(float amax_n) {
  Nvfp4Scale k;
  k.fast = finite_hd(amax_n);
  // amax_n / 6 through the same exact division (6 = 1.5 * 2^2 has an E4M3 mantissa).
  k.sb = k.fast ? e4m3(div_by_scale(amax_n, fmt::kE2M1Max, 1.0f / fmt::kE2M1Max))
                : fmt::float_to_e4m3(fmt::div_rn(amax_n, fmt::kE2M1Max));
  k.s = e4m3_value(k.sb);
  k.r = k.s == 0.0f ? 0.0f : fmt::div_rn(1.0f, k.s);
  return k;
}
MOE_EP_HD Nvfp4Scale nvfp4_scale(float amax, float nc) {
  return nvfp4_scale_n(fmt::mul_rn(amax, nc));
}

// MXFP8: the UE8M0 scale from the amax; each pair of elements then by e4m3_pair (the conversion
// instruction on the GPU, equal to fmt::float_to_e4m3).
struct MxScale {
  uint8_t sb;
  float inv, s;  // 2^-e and 2^e
};
MOE_EP_HD MxScale mxfp8_scale(float amax) {
  MxScale k;
  k.sb = fmt::ue8m0_scale_for(amax, fmt::kE4M3Max);
  k.inv = fmt::exp2i(127 - int(k.sb));
  k.s = fmt::ue8m0_to_float(k.sb);
  return k;
}
// Elements v0, v1 of that block: their E4M3 codes, v0's in the low byte.
MOE_EP_HD uint32_t mxfp8_codes(float v0, float v1, const MxScale& k) {
  return e4m3_pair(fmt::mul_rn(v0, k.inv), fmt::mul_rn(v1, k.inv));
}

template <int kWords>
MOE_EP_HD void unpack_bf16(const uint32_t* w, uint16_t* x) {
  MOE_EP_UNROLL
  for (int i = 0; i < kWords; ++i) {
    x[2 * i] = uint16_t(w[i] & 0xffffu);
    x[2 * i + 1] = uint16_t(w[i] >> 16);
  }
}

template <int kBytes>
MOE_EP_HD void bytes_to_words(const uint8_t* b, uint32_t* out) {
  MOE_EP_UNROLL
  for (int i = 0; i < kBytes / 4; ++i)
    out[i] = uint32_t(b[4 * i]) | (uint32_t(b[4 * i + 1]) << 8) | (uint32_t(b[4 * i + 2]) << 16) |
             (uint32_t(b[4 * i + 3]) << 24);
}

// NVFP4 block of 16 elements (8 words) -> 2 output words; returns the E4M3 scale byte.
// kUnitNorm: norm_const is exactly 1 (x * 1 == x, so the multiply is skipped). norm_const > 0.
template <bool kUnitNorm>
MOE_EP_HD uint8_t nvfp4_block(const uint32_t* w, float norm_const, uint32_t* out) {
  const float amax = amax_bf16_words_nan<8>(w);
  const float amax_n = kUnitNorm ? amax : fmt::mul_rn(amax, norm_const);
  if (!finite_hd(amax_n)) {  // NaN/Inf element, or amax * nc overflows: the reference
    uint16_t x[16];
    uint8_t b[8];
    unpack_bf16<8>(w, x);
    const uint8_t sb = fmt::quantize_block_nvfp4(x, norm_const, b);
    bytes_to_words<8>(b, out);
    return sb;
  }
  // One IEEE division per block, for RN(1 / s). (A per-CTA shared table of RN(1/s) measured 10
  // points slower on the H200: its barrier holds every thread's loads back until it is filled.)
  const Nvfp4Scale sc = nvfp4_scale_n(amax_n);
  if (sc.s == 0.0f) {
    out[0] = out[1] = 0;
    return sc.sb;
  }
  MOE_EP_UNROLL
  for (int o = 0; o < 2; ++o) {
    float q[8];
    MOE_EP_UNROLL
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = w[4 * o + k / 2];
      const float x = fabs_hd((k & 1) ? bf16_hi(v) : bf16_lo(v));
      q[k] = div_by_scale(kUnitNorm ? x : fmt::mul_rn(x, norm_const), sc.s, sc.r);
    }
    out[o] = e2m1_pack(w + 4 * o, q);
  }
  return sc.sb;
}

// MXFP4 block of 32 elements (16 words) -> 4 output words; returns the UE8M0 scale byte.
MOE_EP_HD uint8_t mxfp4_block(const uint32_t* w, uint32_t* out) {
  const float amax = amax_bf16_words_nan<16>(w);
  if (!finite_hd(amax)) {
    uint16_t x[32];
    uint8_t b[16];
    unpack_bf16<16>(w, x);
    const uint8_t sb = fmt::quantize_block_mxfp4(x, b);
    bytes_to_words<16>(b, out);
    return sb;
  }
  const uint8_t sb = fmt::ue8m0_scale_for(amax, fmt::kE2M1Max);
  const float inv = fmt::exp2i(127 - int(sb));
  MOE_EP_UNROLL
  for (int o = 0; o < 4; ++o) {
    float q[8];
    MOE_EP_UNROLL
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = w[4 * o + k / 2];
      q[k] = fmt::mul_rn((k & 1) ? bf16_hi(v) : bf16_lo(v), inv);  // exact: a power of two
    }
    out[o] = e2m1_pack(w + 4 * o, q);
  }
  return sb;
}

// MXFP8 block of 32 elements (16 words) -> 8 output words; returns the UE8M0 scale byte.
MOE_EP_HD uint8_t mxfp8_block(const uint32_t* w, uint32_t* out) {
  const float amax = amax_bf16_words_nan<16>(w);
  if (!finite_hd(amax)) {  // the reference, so NaN/Inf never meet the hardware conversion
    uint16_t x[32];
    uint8_t b[32];
    unpack_bf16<16>(w, x);
    const uint8_t sb = fmt::quantize_block_mxfp8(x, b);
    bytes_to_words<32>(b, out);
    return sb;
  }
  const MxScale k = mxfp8_scale(amax);
  MOE_EP_UNROLL
  for (int o = 0; o < 8; ++o) {
    const uint32_t v0 = w[2 * o], v1 = w[2 * o + 1];
    out[o] =
        mxfp8_codes(bf16_lo(v0), bf16_hi(v0), k) | (mxfp8_codes(bf16_lo(v1), bf16_hi(v1), k) << 16);
  }
  return k.sb;
}

// One element v of that block: its E2M1 code and *d = q * s (0 and 0 when s = 0).
MOE_EP_HD uint8_t nvfp4_quant(float v, float nc, const Nvfp4Scale& k, float* d) {
  if (k.s == 0.0f) {
    *d = 0.0f;
    return 0;
  }
  const float xn = fmt::mul_rn(v, nc);
  if (k.fast && finite_hd(xn)) return nvfp4_element(xn, k.s, k.r, d);
  const uint8_t q = fmt::float_to_e2m1(fmt::div_rn(xn, k.s));
  *d = fmt::e2m1_to_float(q) * k.s;
  return q;
}
// One element v of that block as the GEMM sees it: fmt::float_to_bf16 of nvfp4_quant's *d, the
// top half of nvfp4_value_bits where the fast path applies (no rounding step, no code).
MOE_EP_HD uint32_t nvfp4_quant_bf16(float v, float nc, const Nvfp4Scale& k) {
  if (k.s == 0.0f) return 0u;
  const float xn = fmt::mul_rn(v, nc);
  if (k.fast && finite_hd(xn)) return nvfp4_value_bits(xn, k.s, k.r) >> 16;
  float d;
  nvfp4_quant(v, nc, k, &d);
  return fmt::float_to_bf16(d);
}

// A whole NVFP4 block of 16 values as the GEMM sees it: o[j] = bf16(q * s) of elements 2j (low
// half) and 2j + 1, bit for bit fmt::quantize_block_nvfp4 followed by the dequantization.
MOE_EP_HD void nvfp4_block_bf16(const float* v, float nc, uint32_t (&o)[8]) {
  const Nvfp4Scale k = nvfp4_scale(fmt::block_amax(v, fmt::kNvfp4Block), nc);
  MOE_EP_UNROLL
  for (int j = 0; j < 8; ++j)
    o[j] = nvfp4_quant_bf16(v[2 * j], nc, k) | (nvfp4_quant_bf16(v[2 * j + 1], nc, k) << 16);
}

// Elements v0, v1: their E4M3 codes (mxfp8_codes) and d = q * s.
MOE_EP_HD uint32_t mxfp8_pair(float v0, float v1, const MxScale& k, float* d0, float* d1) {
  const uint32_t p = mxfp8_codes(v0, v1, k);
  *d0 = e4m3_value(uint8_t(p)) * k.s;
  *d1 = e4m3_value(uint8_t(p >> 8)) * k.s;
  return p;
}
// A whole MXFP8 block of 32 values as the GEMM sees it: o[j] = bf16(q * s) of elements 2j, 2j + 1.
MOE_EP_HD void mxfp8_block_bf16(const float* v, uint32_t (&o)[16]) {
  const MxScale k = mxfp8_scale(fmt::block_amax(v, fmt::kMxBlock));
  MOE_EP_UNROLL
  for (int j = 0; j < 16; ++j) {
    float d0, d1;
    mxfp8_pair(v[2 * j], v[2 * j + 1], k, &d0, &d1);
    o[j] = fmt::bf16x2(d0, d1);
  }
}

}  // namespace moe_ep::kernels::qmath
