// The number formats of formats.h against independent oracles: the CUDA toolkit's own host
// conversions (cuda_bf16.h, cuda_fp8.h, cuda_fp4.h, run on the CPU; no GPU needed) over every
// bf16 bit pattern, exact double-precision re-derivations, and block-level policy tests
// (zero blocks, one huge value, Inf, NaN, rounding boundaries, norm constants, error bounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/quantize_math.h"
#include "moe_ep/formats.h"

#if defined(MOE_EP_HAVE_CUDA_HEADERS)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#define ORACLE_OR_SKIP()
#else
#define ORACLE_OR_SKIP() \
  GTEST_SKIP() << "CUDA toolkit headers not found: the toolkit's host conversions are the oracle"
#endif

namespace moe_ep::fmt {
namespace {

uint32_t bits(float f) { return float_bits(f); }
float from_bits(uint32_t u) { return bits_float(u); }

// Every float that a bf16 pattern holds, and extra float patterns around bf16 rounding points:
// each bf16 pattern with low halves at and next to the tie, plus seeded random patterns.
std::vector<float> all_bf16_floats() {
  std::vector<float> v(65536);
  for (uint32_t b = 0; b < 65536; ++b) v[b] = bf16_to_float(uint16_t(b));
  return v;
}

std::vector<uint32_t> probe_float_patterns() {
  std::vector<uint32_t> v;
  for (uint32_t b = 0; b < 65536; ++b)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      v.push_back((b << 16) | low);
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) v.push_back(rng());
  for (uint32_t u : {0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u,
                     0xffc00000u, 0xffffffffu, 0x00000001u, 0x80000001u, 0x007fffffu})
    v.push_back(u);
  return v;
}

#if defined(MOE_EP_HAVE_CUDA_HEADERS)
uint16_t oracle_bf16(float f) {
  const __nv_bfloat16 b = __float2bfloat16(f);
  return __nv_bfloat16_raw(b).x;
}
float oracle_bf16_to_float(uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}
uint8_t oracle_e4m3(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3); }
uint8_t oracle_e4m3_d(double d) { return __nv_cvt_double_to_fp8(d, __NV_SATFINITE, __NV_E4M3); }
uint8_t oracle_e2m1(float f) { return __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest); }
uint8_t oracle_e2m1_d(double d) { return __nv_cvt_double_to_fp4(d, __NV_E2M1, cudaRoundNearest); }
float half_raw_to_float(__half_raw h) { return __half2float(__half(h)); }
float oracle_e4m3_to_float(uint8_t b) {
  return half_raw_to_float(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3));
}
float oracle_e2m1_to_float(uint8_t n) {
  return half_raw_to_float(__nv_cvt_fp4_to_halfraw(n, __NV_E2M1));
}
#endif

// Equal bits, or both NaN (used only where a format's NaN payload is not defined).
bool same_or_both_nan(float a, float b) {
  return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(FormatsOracle, Bf16ToFloatAllPatterns) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  for (uint32_t b = 0; b < 65536; ++b)
    ASSERT_EQ(bits(bf16_to_float(uint16_t(b))), bits(oracle_bf16_to_float(uint16_t(b)))) << b;
#endif
}

TEST(FormatsOracle, FloatToBf16AllPatternsTiesOverflowNan) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  int64_t n = 0;
  for (uint32_t u : probe_float_patterns()) {
    const float f = from_bits(u);
    ASSERT_EQ(float_to_bf16(f), oracle_bf16(f)) << std::hex << "float bits 0x" << u;
    ++n;
  }
  EXPECT_GT(n, 2000000);
  // Spot checks of the policy the oracle confirms: ties to even, overflow to Inf, NaN quiet.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);  // rounds past the max: +Inf
  EXPECT_EQ(float_to_bf16(from_bits(0xff800001u)), 0x7fff);  // NaN (any sign): canonical
#endif
}

// ---------------------------------------------------------------------------------------------
// E4M3 and E2M1

TEST(FormatsOracle, E4M3EncodeAllBf16AndRandomFloats) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  for (float f : all_bf16_floats())
    ASSERT_EQ(float_to_e4m3(f), oracle_e4m3(f)) << std::hex << "bf16 float 0x" << bits(f);
  for (uint32_t u : probe_float_patterns())
    ASSERT_EQ(float_to_e4m3(from_bits(u)), oracle_e4m3(from_bits(u))) << std::hex << "0x" << u;
#endif
}

TEST(FormatsOracle, E2M1EncodeAllBf16AndRandomFloats) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  for (float f : all_bf16_floats())
    ASSERT_EQ(float_to_e2m1(f), oracle_e2m1(f)) << std::hex << "bf16 float 0x" << bits(f);
  for (uint32_t u : probe_float_patterns())
    ASSERT_EQ(float_to_e2m1(from_bits(u)), oracle_e2m1(from_bits(u))) << std::hex << "0x" << u;
#endif
}

TEST(FormatsOracle, DecodeAllE4M3AndE2M1Codes) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    const float mine = e4m3_to_float(uint8_t(b)), theirs = oracle_e4m3_to_float(uint8_t(b));
    ASSERT_TRUE(same_or_both_nan(mine, theirs)) << b << ": " << mine << " vs " << theirs;
    nans += std::isnan(mine);
    if (!std::isnan(mine)) {
      ASSERT_EQ(float_to_e4m3(mine), uint8_t(b)) << "decode/encode round trip of " << b;
    }
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF only
  for (int n = 0; n < 16; ++n) {
    ASSERT_EQ(bits(e2m1_to_float(uint8_t(n))), bits(oracle_e2m1_to_float(uint8_t(n)))) << n;
    ASSERT_EQ(float_to_e2m1(e2m1_to_float(uint8_t(n))), n);
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// UE8M0

TEST(FormatsOracle, Ue8m0DecodeAllBytes) {
  for (int b = 0; b < 255; ++b)
    ASSERT_EQ(double(ue8m0_to_float(uint8_t(b))), std::ldexp(1.0, b - 127)) << b;
  EXPECT_TRUE(std::isnan(ue8m0_to_float(0xff)));
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  for (int b = 0; b < 256; ++b) {
    const __nv_bfloat16_raw r = __nv_cvt_e8m0_to_bf16raw(uint8_t(b));
    ASSERT_TRUE(same_or_both_nan(ue8m0_to_float(uint8_t(b)), bf16_to_float(r.x))) << b;
  }
#endif
}

// Exact oracle: the smallest e in [-127, 127] with amax <= max * 2^e (doubles hold every
// product exactly); 0 for amax = 0 and 127 for Inf.
int oracle_scale_exp(float amax, float max_value) {
  const double a = std::fabs(double(amax));
  if (a == 0) return -127;
  if (std::isinf(a)) return 127;
  int e = -127;
  while (e < 127 && a > std::ldexp(double(max_value), e)) ++e;
  return e;
}

TEST(FormatsOracle, Ue8m0ScaleForAgainstExactOracle) {
  std::vector<float> amaxes = all_bf16_floats();
  for (uint32_t u : probe_float_patterns()) amaxes.push_back(from_bits(u));
  int checked = 0;
  for (float max_value : {6.0f, 448.0f, 1.0f}) {
    for (size_t i = 0; i < amaxes.size(); i += (i < 65536 ? 1 : 37)) {
      const float a = std::fabs(amaxes[i]);
      if (std::isnan(a)) continue;
      const uint8_t b = ue8m0_scale_for(a, max_value);
      ASSERT_EQ(int(b) - 127, oracle_scale_exp(a, max_value))
          << "amax " << a << " max " << max_value;
      ++checked;
    }
  }
  EXPECT_GT(checked, 300000);
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  // With max 1 the scale is amax rounded up to a power of two: the toolkit's float -> UE8M0
  // conversion rounding to +Inf, for every normal positive bf16 value inside the range.
  for (uint32_t b = 0x0080; b < 0x7f00; ++b) {
    const float a = bf16_to_float(uint16_t(b));
    ASSERT_EQ(ue8m0_scale_for(a, 1.0f), __nv_cvt_float_to_e8m0(a, __NV_SATFINITE, cudaRoundPosInf))
        << a;
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// Blocks: helpers

struct Nvfp4Block {
  uint8_t packed[8];
  uint8_t scale;
};
struct Mxfp4Block {
  uint8_t packed[16];
  uint8_t scale;
};
struct Mxfp8Block {
  uint8_t q[32];
  uint8_t scale;
};

Nvfp4Block nvfp4(const float* x, float nc) {
  Nvfp4Block b{};
  b.scale = quantize_block_nvfp4(x, nc, b.packed);
  return b;
}
Mxfp4Block mxfp4(const float* x) {
  Mxfp4Block b{};
  b.scale = quantize_block_mxfp4(x, b.packed);
  return b;
}
Mxfp8Block mxfp8(const float* x) {
  Mxfp8Block b{};
  b.scale = quantize_block_mxfp8(x, b.q);
  return b;
}
uint8_t nib(const uint8_t* packed, int i) {
  return (i & 1) ? uint8_t(packed[i / 2] >> 4) : uint8_t(packed[i / 2] & 0xf);
}

std::vector<float> gaussian(int n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// ---------------------------------------------------------------------------------------------
// NVFP4: independent re-implementations

// The contract's formula in double with the toolkit's double conversions. With bf16 inputs and a
// power-of-two norm constant every float step of formats.h is either exact or lands far from
// a rounding point of the target format, so both must agree exactly.
TEST(Nvfp4Block, DoubleReimplementationBf16InputsPow2NormConst) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> pat(0, 0xffff);
  int blocks = 0;
  for (int k : {-20, -3, 0, 1, 5, 17}) {
    const double nc = std::ldexp(1.0, k);
    for (int rep = 0; rep < 4000; ++rep) {
      uint16_t xb[16];
      // Random finite bf16 patterns within a few binades of each other (the common case), and
      // fully random ones (Inf/NaN/huge excluded here; the policy tests cover them).
      const int spread = rep % 2 ? 6 : 60;
      const int base = 100 + int(rng() % 50);
      for (uint16_t& v : xb) {
        const uint32_t e = uint32_t(base + int(rng() % spread));
        v = uint16_t(((rng() & 1) << 15) | (std::min<uint32_t>(e, 254) << 7) | (pat(rng) & 0x7f));
      }
      uint8_t packed[8];
      const uint8_t sb = quantize_block_nvfp4(xb, float(nc), packed);
      double amax = 0;
      for (uint16_t v : xb) amax = std::max(amax, std::fabs(double(bf16_to_float(v))));
      const uint8_t want_sb = oracle_e4m3_d(amax * nc / 6.0);
      ASSERT_EQ(sb, want_sb) << "amax " << amax << " nc " << nc;
      const double s = double(oracle_e4m3_to_float(want_sb));
      for (int i = 0; i < 16; ++i) {
        const uint8_t want = s == 0 ? 0 : oracle_e2m1_d(double(bf16_to_float(xb[i])) * nc / s);
        ASSERT_EQ(nib(packed, i), want) << "element " << i << " x " << bf16_to_float(xb[i]);
      }
      ++blocks;
    }
  }
  EXPECT_EQ(blocks, 24000);
#endif
}

// The float formula with the toolkit's float conversions, any norm constant, fp32 inputs.
TEST(Nvfp4Block, FloatFormulaWithToolkitConversions) {
  ORACLE_OR_SKIP();
#if defined(MOE_EP_HAVE_CUDA_HEADERS)
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> lnc(-30.0f, 30.0f);
  for (int rep = 0; rep < 20000; ++rep) {
    const float nc = std::exp2(lnc(rng));
    std::vector<float> x = gaussian(16, std::exp2(lnc(rng)), rng());
    const Nvfp4Block b = nvfp4(x.data(), nc);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float t = amax * nc;  // separate statements: no contraction, float rounding each
    const uint8_t want_sb = oracle_e4m3(t / 6.0f);
    ASSERT_EQ(b.scale, want_sb);
    const float s = oracle_e4m3_to_float(want_sb);
    for (int i = 0; i < 16; ++i) {
      const float xn = x[i] * nc;
      ASSERT_EQ(nib(b.packed, i), s == 0 ? 0 : oracle_e2m1(xn / s)) << i;
    }
  }
#endif
}

TEST(Nvfp4Block, Bf16AndFloatLoadersAgree) {
  std::mt19937 rng(9);
  for (int rep = 0; rep < 5000; ++rep) {
    uint16_t xb[32];
    float xf[32];
    for (int i = 0; i < 32; ++i) {
      xb[i] = uint16_t(rng());
      xf[i] = bf16_to_float(xb[i]);
    }
    uint8_t pb[8], pf[8];
    ASSERT_EQ(quantize_block_nvfp4(xb, 1.5f, pb), quantize_block_nvfp4(xf, 1.5f, pf));
    ASSERT_EQ(0, std::memcmp(pb, pf, 8));
    uint8_t mb[32], mf[32];
    ASSERT_EQ(quantize_block_mxfp8(xb, mb), quantize_block_mxfp8(xf, mf));
    ASSERT_EQ(0, std::memcmp(mb, mf, 32));
    ASSERT_EQ(quantize_block_mxfp4(xb, mb), quantize_block_mxfp4(xf, mf));
    ASSERT_EQ(0, std::memcmp(mb, mf, 16));
  }
}

// ---------------------------------------------------------------------------------------------
// Policy: zero blocks, Inf, NaN, one huge value

TEST(BlockPolicy, ZeroBlocks) {
  const std::vector<float> z(32, 0.0f);
  const Nvfp4Block n = nvfp4(z.data(), 1.0f);
  EXPECT_EQ(n.scale, 0);
  for (uint8_t p : n.packed) EXPECT_EQ(p, 0);
  const Mxfp4Block m4 = mxfp4(z.data());
  EXPECT_EQ(m4.scale, 0);  // the smallest scale, 2^-127
  for (uint8_t p : m4.packed) EXPECT_EQ(p, 0);
  const Mxfp8Block m8 = mxfp8(z.data());
  EXPECT_EQ(m8.scale, 0);
  for (uint8_t q : m8.q) EXPECT_EQ(q, 0);
  // Negative zeros keep their sign bit in the element codes; the scale does not care.
  const std::vector<float> nz(32, -0.0f);
  EXPECT_EQ(mxfp8(nz.data()).q[5], 0x80);
  EXPECT_EQ(mxfp4(nz.data()).packed[3], 0x88);
  EXPECT_EQ(nvfp4(nz.data(), 1.0f).packed[3], 0x00);  // s = 0: q = 0 by definition
}

TEST(BlockPolicy, InfElementsSaturate) {
  std::vector<float> x = gaussian(32, 1.0f, 11);
  x[3] = INFINITY;
  x[10] = -INFINITY;
  const Nvfp4Block n = nvfp4(x.data(), 1.0f);
  EXPECT_EQ(n.scale, 0x7e);  // amax Inf -> scale saturates at 448
  EXPECT_EQ(nib(n.packed, 3), 0x7);
  EXPECT_EQ(nib(n.packed, 10), 0xf);
  for (int i = 0; i < 16; ++i)
    if (i != 3 && i != 10) EXPECT_EQ(nib(n.packed, i), float_to_e2m1(x[i] / 448.0f));
  const Mxfp4Block m4 = mxfp4(x.data());
  EXPECT_EQ(m4.scale, 254);  // the largest finite scale, 2^127
  EXPECT_EQ(nib(m4.packed, 3), 0x7);
  EXPECT_EQ(nib(m4.packed, 10), 0xf);
  EXPECT_EQ(nib(m4.packed, 0) & 7, 0);  // finite elements vanish under 2^127
  const Mxfp8Block m8 = mxfp8(x.data());
  EXPECT_EQ(m8.scale, 254);
  EXPECT_EQ(m8.q[3], 0x7e);
  EXPECT_EQ(m8.q[10], 0xfe);
  EXPECT_EQ(m8.q[0] & 0x7f, 0);
}

TEST(BlockPolicy, NanElementsIgnoredByScale) {
  std::vector<float> x = gaussian(32, 3.0f, 12), y = x;
  x[5] = NAN;
  x[20] = -NAN;
  y[5] = 0.0f;
  y[20] = 0.0f;
  const Nvfp4Block nx = nvfp4(x.data(), 1.0f), ny = nvfp4(y.data(), 1.0f);
  EXPECT_EQ(nx.scale, ny.scale);      // NaN does not enter the amax
  EXPECT_EQ(nib(nx.packed, 5), 0x7);  // NaN -> +6
  for (int i = 0; i < 16; ++i)
    if (i != 5) EXPECT_EQ(nib(nx.packed, i), nib(ny.packed, i));
  const Mxfp4Block m4x = mxfp4(x.data()), m4y = mxfp4(y.data());
  EXPECT_EQ(m4x.scale, m4y.scale);
  EXPECT_EQ(nib(m4x.packed, 20), 0x7);
  const Mxfp8Block m8x = mxfp8(x.data()), m8y = mxfp8(y.data());
  EXPECT_EQ(m8x.scale, m8y.scale);
  EXPECT_EQ(m8x.q[5], 0x7f);
  EXPECT_EQ(m8x.q[20], 0x7f);  // E4M3 NaN is canonical, the sign dropped
  for (int i = 0; i < 32; ++i)
    if (i != 5 && i != 20) EXPECT_EQ(m8x.q[i], m8y.q[i]);
  // All-NaN block: amax 0, so the scales are zero; NVFP4 writes 0 (s = 0), MX write NaN codes.
  const std::vector<float> all_nan(32, NAN);
  EXPECT_EQ(nvfp4(all_nan.data(), 1.0f).scale, 0);
  EXPECT_EQ(nvfp4(all_nan.data(), 1.0f).packed[0], 0);
  EXPECT_EQ(mxfp4(all_nan.data()).scale, 0);
  EXPECT_EQ(mxfp4(all_nan.data()).packed[0], 0x77);
  EXPECT_EQ(mxfp8(all_nan.data()).q[0], 0x7f);
}

// Signaling NaNs (bf16 0x7f81..0x7fbf and negatives) are ignored by the scale like quiet ones,
// wherever they sit in the block (the host's std::fmax would not: it returns NaN for them).
TEST(BlockPolicy, SignalingNanIgnoredByScale) {
  std::mt19937 rng(21);
  for (uint16_t snan : {uint16_t(0x7f87), uint16_t(0xff81), uint16_t(0x7fbf), uint16_t(0x7fc0)}) {
    for (int pos = 0; pos < 32; ++pos) {
      uint16_t x[32], y[32];
      for (int i = 0; i < 32; ++i) x[i] = y[i] = float_to_bf16(float(int(rng() % 2001) - 1000));
      x[pos] = snan;
      y[pos] = 0;
      uint8_t px[32], py[32];
      const int npos = pos % 16;
      uint16_t xn[16], yn[16];
      std::memcpy(xn, x + (pos / 16) * 16, 32);
      std::memcpy(yn, y + (pos / 16) * 16, 32);
      ASSERT_EQ(quantize_block_nvfp4(xn, 1.0f, px), quantize_block_nvfp4(yn, 1.0f, py)) << pos;
      ASSERT_EQ(nib(px, npos), 0x7);
      ASSERT_EQ(quantize_block_mxfp4(x, px), quantize_block_mxfp4(y, py)) << pos;
      ASSERT_EQ(quantize_block_mxfp8(x, px), quantize_block_mxfp8(y, py)) << pos;
      ASSERT_EQ(px[pos], 0x7f);
      ASSERT_EQ(block_amax(x, 32), block_amax(y, 32));
    }
  }
}

TEST(BlockPolicy, OneHugeValue) {
  std::vector<float> x = gaussian(32, 1.0f, 13);
  x[7] = 3.0e37f;
  const Nvfp4Block n = nvfp4(x.data(), 1.0f);
  EXPECT_EQ(n.scale, 0x7e);  // 3e37/6 saturates the E4M3 scale
  EXPECT_EQ(nib(n.packed, 7), 0x7);
  const Mxfp4Block m4 = mxfp4(x.data());
  const float s4 = ue8m0_to_float(m4.scale);
  EXPECT_LE(3.0e37f / s4, 6.0f);
  EXPECT_GT(3.0e37f / s4, 3.0f);
  EXPECT_NEAR(dequant_mxfp4(m4.packed, &m4.scale, 7) / 3.0e37f, 1.0f, 0.25f);
  for (int i = 0; i < 32; ++i)
    if (i != 7) EXPECT_EQ(nib(m4.packed, i) & 7, 0) << i;
  const Mxfp8Block m8 = mxfp8(x.data());
  EXPECT_NEAR(dequant_mxfp8(m8.q, &m8.scale, 7) / 3.0e37f, 1.0f, 1.0f / 16);
  // A norm constant that overflows amax * nc to Inf behaves like an Inf element.
  EXPECT_EQ(nvfp4(x.data(), 1.0e10f).scale, 0x7e);
}

// ---------------------------------------------------------------------------------------------
// Rounding boundaries inside blocks

// Midpoints between consecutive E2M1 magnitudes go to the even code; one float ulp either
// side goes to the nearer one. The block holds 6 so the MXFP4 scale is exactly 1.
TEST(BlockBoundaries, Mxfp4ElementMidpoints) {
  const float vals[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 7; ++c) {
    const float mid = (vals[c] + vals[c + 1]) / 2;
    const int even = (c % 2 == 0) ? c : c + 1;
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> x(32, 0.0f);
      x[0] = 6.0f;
      x[1] = sign * mid;
      x[2] = sign * std::nextafter(mid, 0.0f);
      x[3] = sign * std::nextafter(mid, 10.0f);
      const Mxfp4Block b = mxfp4(x.data());
      ASSERT_EQ(b.scale, 127);
      const uint8_t sbit = sign < 0 ? 8 : 0;
      EXPECT_EQ(nib(b.packed, 1), sbit | even) << mid;
      EXPECT_EQ(nib(b.packed, 2), sbit | c) << mid;
      EXPECT_EQ(nib(b.packed, 3), sbit | (c + 1)) << mid;
    }
  }
}

// E4M3 midpoints (all 126 positive gaps, subnormals included) inside an MXFP8 block whose
// amax is 448 (scale 1), plus the saturation points 448..464..Inf.
TEST(BlockBoundaries, Mxfp8ElementMidpoints) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;
    std::vector<float> x(32, 0.0f);
    x[0] = 448.0f;
    x[1] = mid;
    x[2] = std::nextafter(mid, 0.0f);
    x[3] = std::nextafter(mid, 1000.0f);
    x[4] = -mid;
    const Mxfp8Block b = mxfp8(x.data());
    ASSERT_EQ(b.scale, 127);
    EXPECT_EQ(b.q[1], (c % 2 == 0) ? c : c + 1) << mid;
    EXPECT_EQ(b.q[2], c) << mid;
    EXPECT_EQ(b.q[3], c + 1) << mid;
    EXPECT_EQ(b.q[4], 0x80 | b.q[1]) << mid;
  }
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(500.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
}

// The MX scale steps up exactly when amax passes max * 2^e.
TEST(BlockBoundaries, MxScaleSteps) {
  for (int e = -119; e <= 117; e += 4) {
    for (float m : {6.0f, 448.0f}) {
      const float edge = std::ldexp(m, e);
      std::vector<float> x(32, 0.0f);
      x[9] = edge;
      const uint8_t at = m == 6.0f ? mxfp4(x.data()).scale : mxfp8(x.data()).scale;
      x[9] = std::nextafter(edge, INFINITY);
      const uint8_t above = m == 6.0f ? mxfp4(x.data()).scale : mxfp8(x.data()).scale;
      EXPECT_EQ(int(at) - 127, e) << m;
      EXPECT_EQ(int(above) - 127, e + 1) << m;
    }
  }
}

// NVFP4 scale boundaries: amax / 6 at every E4M3 midpoint rounds to the even scale.
TEST(BlockBoundaries, Nvfp4ScaleMidpoints) {
  for (int c = 1; c < 0x7e; ++c) {
    const float mid = (e4m3_to_float(uint8_t(c)) + e4m3_to_float(uint8_t(c + 1))) / 2;
    std::vector<float> x(16, mid);
    x[0] = mid * 8;  // a power-of-two norm constant keeps amax * nc / 6 exact
    const Nvfp4Block b = nvfp4(x.data(), 0.75f);  // 8 * 0.75 / 6 = 1
    EXPECT_EQ(b.scale, (c % 2 == 0) ? c : c + 1) << mid;
  }
}

// ---------------------------------------------------------------------------------------------
// Norm constants and error bounds

// A power-of-two norm constant only moves the E4M3 scale (while it stays normal): same codes.
TEST(Nvfp4Block, Pow2NormConstShiftsOnlyTheScale) {
  for (int rep = 0; rep < 2000; ++rep) {
    const std::vector<float> x = gaussian(16, 1.0f, 100 + rep);
    const Nvfp4Block a = nvfp4(x.data(), 1.0f), b = nvfp4(x.data(), 4.0f);
    if (e4m3_to_float(a.scale) < 0.015625f || e4m3_to_float(a.scale) * 4 > 448) continue;
    ASSERT_EQ(e4m3_to_float(b.scale), 4 * e4m3_to_float(a.scale));
    ASSERT_EQ(0, std::memcmp(a.packed, b.packed, 8));
  }
  // Dequantized values carry the norm constant: deq / nc approximates x.
  const std::vector<float> x = gaussian(16, 1.0f, 5);
  for (float nc : {0.1f, 1.0f, 37.0f, 500.0f}) {  // scales stay normal, unsaturated
    const Nvfp4Block b = nvfp4(x.data(), nc);
    for (int i = 0; i < 16; ++i) {
      const float d = dequant_nvfp4(b.packed, &b.scale, i) / nc;
      EXPECT_LE(std::fabs(d - x[i]), std::max(std::fabs(x[i]) / 4, e4m3_to_float(b.scale) / nc / 4))
          << nc;
    }
  }
}

// Error bounds, per element (s = the decoded block scale):
//   E2M1 (NVFP4, MXFP4): |deq - x| <= max(|x| / 4, s / 4). Half an E2M1 step is 1/4 below |q| 1
//     and at most |q| / 4 above it; NVFP4's scale rounds down by at most 1/16, so an element
//     saturates by at most 6 / (1 - 1/16) - 6 = 0.4 <= |q| / 4.
//   E4M3 (MXFP8): |deq - x| <= max(|x| / 16, s / 1024) (3 mantissa bits; subnormal step 2^-9).
// And on Gaussian data the relative L2 error stays under 12% (E2M1) and 3% (E4M3).
TEST(BlockErrorBounds, RoundTrip) {
  double e_nv = 0, e_m4 = 0, e_m8 = 0, ref = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    const float sigma = std::exp2(float(rep % 40) - 20);
    const std::vector<float> x = gaussian(32, sigma, 1000 + rep);
    const float nc = 1.0f / sigma;  // keeps the NVFP4 scales normal at every magnitude
    const Nvfp4Block n0 = nvfp4(x.data(), nc), n1 = nvfp4(x.data() + 16, nc);
    const Mxfp4Block m4 = mxfp4(x.data());
    const Mxfp8Block m8 = mxfp8(x.data());
    for (int i = 0; i < 32; ++i) {
      const Nvfp4Block& nb = i < 16 ? n0 : n1;
      const float s_nv = e4m3_to_float(nb.scale);
      ASSERT_GE(s_nv, 0.015625f) << "test data should keep NVFP4 scales normal";
      const float d_nv = dequant_nvfp4(nb.packed, &nb.scale, i % 16) / nc;
      const float d_m4 = dequant_mxfp4(m4.packed, &m4.scale, i);
      const float d_m8 = dequant_mxfp8(m8.q, &m8.scale, i);
      const float ax = std::fabs(x[i]);
      ASSERT_LE(std::fabs(d_nv - x[i]), std::max(ax / 4, s_nv / nc / 4)) << i;
      ASSERT_LE(std::fabs(d_m4 - x[i]), std::max(ax / 4, ue8m0_to_float(m4.scale) / 4)) << i;
      ASSERT_LE(std::fabs(d_m8 - x[i]), std::max(ax / 16, ue8m0_to_float(m8.scale) / 1024)) << i;
      const double xs = double(x[i]) / sigma;
      e_nv += std::pow(d_nv / sigma - xs, 2);
      e_m4 += std::pow(d_m4 / sigma - xs, 2);
      e_m8 += std::pow(d_m8 / sigma - xs, 2);
      ref += xs * xs;
    }
  }
  EXPECT_LT(std::sqrt(e_nv / ref), 0.12);
  EXPECT_LT(std::sqrt(e_m4 / ref), 0.12);
  EXPECT_LT(std::sqrt(e_m8 / ref), 0.03);
  EXPECT_GT(std::sqrt(e_m8 / ref), 0.001);  // the quantizers did quantize
  std::printf("relative L2 round-trip error: nvfp4 %.4f mxfp4 %.4f mxfp8 %.4f\n",
              std::sqrt(e_nv / ref), std::sqrt(e_m4 / ref), std::sqrt(e_m8 / ref));
}

TEST(RowQuantizers, RowsAreBlocksInOrder) {
  const std::vector<float> x = gaussian(128, 2.0f, 77);
  uint8_t pn[64], sn[8], p4[64], s4[4], q8[128], s8[4];
  quantize_row_nvfp4(x.data(), 128, 2.0f, pn, sn);
  quantize_row_mxfp4(x.data(), 128, p4, s4);
  quantize_row_mxfp8(x.data(), 128, q8, s8);
  for (int b = 0; b < 8; ++b) {
    const Nvfp4Block nb = nvfp4(x.data() + 16 * b, 2.0f);
    ASSERT_EQ(sn[b], nb.scale);
    ASSERT_EQ(0, std::memcmp(pn + 8 * b, nb.packed, 8));
  }
  for (int b = 0; b < 4; ++b) {
    const Mxfp4Block m = mxfp4(x.data() + 32 * b);
    ASSERT_EQ(s4[b], m.scale);
    ASSERT_EQ(0, std::memcmp(p4 + 16 * b, m.packed, 16));
    const Mxfp8Block m8 = mxfp8(x.data() + 32 * b);
    ASSERT_EQ(s8[b], m8.scale);
    ASSERT_EQ(0, std::memcmp(q8 + 32 * b, m8.q, 32));
  }
}

// ---------------------------------------------------------------------------------------------
// The GPU kernels' element math (src/kernels/common/quantize_math.h) against formats.h. The
// functions are __host__ __device__; here they run on the CPU, where they must agree with the
// reference on every input that can differ (the GPU tests check the kernels themselves).

namespace qm = moe_ep::kernels::qmath;

TEST(QuantizeMath, E2m1MagnitudeCodeEveryRelevantFloat) {
  // Every float in [2^-3, 16) (all rounding decisions happen there), a stride through all
  // other finite floats and the infinities.
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t u = 0x3e000000; u < 0x41800000; ++u) {
    const float q = from_bits(uint32_t(u));
    bad += qm::e2m1_mag_code(q) != (float_to_e2m1(q) & 7u);
  }
  EXPECT_EQ(bad, 0);
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    const float q = from_bits(uint32_t(u));
    if (std::isnan(q)) continue;
    ASSERT_EQ(qm::e2m1_mag_code(q), float_to_e2m1(q) & 7u) << std::hex << u;
  }
  EXPECT_EQ(qm::e2m1_mag_code(INFINITY), 7u);
  EXPECT_EQ(qm::e2m1_mag_code(-INFINITY), 7u);
  EXPECT_EQ(qm::e2m1_mag_code(3.4e38f), 7u);
}

// RN(a / s) by a * RN(1 / s) and two FMAs equals the IEEE division for every mantissa of a
// (two binades, a in [1, 4)) against every E4M3 mantissa of s: exponents only shift both sides
// while a / s and the FMA residual (about 2^-24 a) stay normal.
TEST(QuantizeMath, MarksteinDivisionEveryMantissaPair) {
  int64_t bad = 0, n = 0;
  for (int m = 8; m < 16; ++m) {
    const float s = float(m) / 8.0f, r = 1.0f / s;
    const uint32_t lo = bits(1.0f), hi = bits(4.0f);
#pragma omp parallel for reduction(+ : bad, n) schedule(static)
    for (int64_t u = lo; u < hi; ++u) {
      const float a = from_bits(uint32_t(u));
      bad += bits(qm::div_by_scale(a, s, r)) != bits(a / s);
      ++n;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(n, int64_t(8) * 2 * (1 << 23));
  // Scales at the ends of the E4M3 range, random a.
  std::mt19937 rng(3);
  for (float s : {0x1p-9f, 0x1.8p-8f, 448.0f, 6.0f}) {
    for (int i = 0; i < 200000; ++i) {
      const float a = from_bits(rng() & 0x7fffffffu);
      if (!std::isfinite(a) || a / s > 1e30f) continue;
      const float q = qm::div_by_scale(a, s, 1.0f / s);
      ASSERT_EQ(qm::e2m1_mag_code(q), qm::e2m1_mag_code(a / s)) << a << " / " << s;
      if (a >= 0x1p-100f && a / s >= 0x1p-126f) ASSERT_EQ(bits(q), bits(a / s)) << a << " / " << s;
    }
  }
}

// The per-element NVFP4 path of the forward's activation quantizer (kern::quantize_n): every
// bf16 input times several norm constants, against every positive finite E4M3 scale, gives the
// reference's code and q * s bit for bit.
TEST(QuantizeMath, Nvfp4ElementEveryBf16AndScale) {
  const float ncs[] = {1.0f, 0.7315f, 3.25f, 1.0f / 448.0f};
  int64_t checked = 0, bad = 0;
  for (int sb = 1; sb < 0x7f; ++sb) {
    const float s = e4m3_to_float(uint8_t(sb));
    const float r = 1.0f / s;
    for (float nc : ncs)
      for (uint32_t u = 0; u < 0x10000u; ++u) {
        const float xn = mul_rn(bf16_to_float(uint16_t(u)), nc);
        if (!std::isfinite(xn)) continue;  // the quantizer takes the reference there
        float d = 0.0f;
        const uint8_t code = qm::nvfp4_element(xn, s, r, &d);
        const uint8_t want = float_to_e2m1(div_rn(xn, s));
        const float dwant = e2m1_to_float(want) * s;
        ++checked;
        if (code != want || bits(d) != bits(dwant)) {
          if (++bad <= 5)
            ADD_FAILURE() << "x " << std::hex << u << " nc " << nc << " s " << s << ": code "
                          << int(code) << " want " << int(want);
        }
      }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(checked, int64_t(126) * 4 * 60000);
}

// The EP unpack's element math (kern ep_unpack_kernel): every E2M1 code at every place of the
// word, times every E4M3 scale byte, is fmt::float_to_bf16 of the reference product; only NaN
// scales leave the fast path.
TEST(QuantizeMath, Nvfp4Unpack8EveryCodeAndScale) {
  std::mt19937 rng(11);
  int64_t checked = 0;
  for (int sb = 0; sb < 256; ++sb) {
    const float s = e4m3_to_float(uint8_t(sb));
    const bool nan_scale = (sb & 0x7f) == 0x7f;
    for (int j = 0; j < 8; ++j)
      for (uint32_t c = 0; c < 16; ++c) {
        const uint32_t p = (rng() & ~(0xfu << (4 * j))) | (c << (4 * j));
        uint32_t o[4] = {};
        const bool fast = qm::nvfp4_unpack8(p, uint8_t(sb), o);
        ASSERT_EQ(fast, !nan_scale) << "scale byte " << sb;
        if (!fast) continue;
        for (int e = 0; e < 8; ++e) {
          const uint16_t got = uint16_t(o[e / 2] >> (16 * (e % 2)));
          const uint16_t want = float_to_bf16(e2m1_to_float(uint8_t((p >> (4 * e)) & 0xf)) * s);
          ASSERT_EQ(got, want) << "scale byte " << sb << " word " << std::hex << p << " element "
                               << e;
          ++checked;
        }
      }
  }
  EXPECT_EQ(checked, int64_t(254) * 8 * 16 * 8);
}

// MXFP8: every E4M3 code at every place, times every UE8M0 byte; NaN codes, the NaN scale and
// scales below 2^-100 leave the fast path, nothing else does.
TEST(QuantizeMath, Mxfp8Unpack8EveryCodeAndScale) {
  std::mt19937 rng(12);
  int64_t checked = 0;
  for (int sb = 0; sb < 256; ++sb) {
    const float s = ue8m0_to_float(uint8_t(sb));
    for (int j = 0; j < 8; ++j)
      for (uint32_t c = 0; c < 256; ++c) {
        // No NaN codes elsewhere.
        uint32_t q[2] = {uint32_t(rng()) & 0x7e7e7e7eu, uint32_t(rng()) & 0x7e7e7e7eu};
        q[j / 4] = (q[j / 4] & ~(0xffu << (8 * (j % 4)))) | (c << (8 * (j % 4)));
        uint32_t o[4] = {};
        const bool fast = qm::mxfp8_unpack8(q, uint8_t(sb), o);
        ASSERT_EQ(fast, sb != 0xff && sb >= 27 && (c & 0x7f) != 0x7f)
            << "scale byte " << sb << " code " << c;
        if (!fast) continue;
        for (int e = 0; e < 8; ++e) {
          const uint16_t got = uint16_t(o[e / 2] >> (16 * (e % 2)));
          const uint16_t want =
              float_to_bf16(e4m3_to_float(uint8_t(q[e / 4] >> (8 * (e % 4)))) * s);
          ASSERT_EQ(got, want) << "scale byte " << sb << " code " << c << " element " << e;
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, int64_t(227) * 8 * 254 * 8);
}

TEST(QuantizeMath, FastDivision) {
  std::mt19937 rng(4);
  for (uint32_t d = 1; d < 70000; d += (d < 2048 ? 1 : 97)) {
    const qm::FastDivU32 fd(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 0x7fffffffu, 0x7fffffffu - d}) {
      ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 50; ++i) {
      const uint32_t n = rng() & 0x7fffffffu;
      ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
    }
  }
}

TEST(QuantizeMath, BytePermMatchesPtxSemantics) {
  EXPECT_EQ(qm::byte_perm(0x33221100u, 0x77665544u, 0x7531), 0x77553311u);
  EXPECT_EQ(qm::byte_perm(0x33221100u, 0x77665544u, 0x6420), 0x66442200u);
  EXPECT_EQ(qm::byte_perm(0x33221100u, 0x77665544u, 0x3210), 0x33221100u);
}

// Random blocks of every kind the kernels meet: uniform bit patterns (NaN, Inf, subnormals
// included), Gaussian data over a wide range of magnitudes, zeros, and injected specials.
std::vector<uint16_t> random_block_bits(std::mt19937& rng, int n, int kind) {
  std::vector<uint16_t> x(n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float sigma = std::exp2(float(int(rng() % 200) - 100));
  for (int i = 0; i < n; ++i) {
    switch (kind % 5) {
      case 0:
        x[i] = uint16_t(rng());
        break;
      case 1:
      case 2:
        x[i] = float_to_bf16(nd(rng) * sigma);
        break;
      case 3:
        x[i] = (rng() % 4) ? 0 : float_to_bf16(nd(rng));
        break;
      default:
        x[i] = float_to_bf16(nd(rng) * sigma);
    }
  }
  if (kind % 5 == 4) {
    const uint16_t specials[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x8000, 0x0001, 0x7f7f, 0xff7f};
    x[rng() % n] = specials[rng() % 8];
  }
  return x;
}

void to_words(const std::vector<uint16_t>& x, uint32_t* w) {
  for (size_t i = 0; i < x.size() / 2; ++i)
    w[i] = uint32_t(x[2 * i]) | (uint32_t(x[2 * i + 1]) << 16);
}

TEST(QuantizeMath, BlocksEqualReference) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> lnc(-40.0f, 40.0f);
  for (int rep = 0; rep < 300000; ++rep) {
    {
      const std::vector<uint16_t> x = random_block_bits(rng, 16, rep);
      uint32_t w[8], out[2];
      uint8_t ref[8];
      const float nc = rep % 3 == 0 ? 1.0f : std::exp2(lnc(rng));
      const uint8_t sb_ref = quantize_block_nvfp4(x.data(), nc, ref);
      to_words(x, w);
      const uint8_t sb =
          nc == 1.0f ? qm::nvfp4_block<true>(w, nc, out) : qm::nvfp4_block<false>(w, nc, out);
      ASSERT_EQ(sb, sb_ref) << "nvfp4 rep " << rep << " nc " << nc;
      ASSERT_EQ(0, std::memcmp(out, ref, 8)) << "nvfp4 rep " << rep << " nc " << nc;
    }
    const std::vector<uint16_t> x = random_block_bits(rng, 32, rep);
    uint32_t w[16], out[8];
    uint8_t ref[32];
    to_words(x, w);
    ASSERT_EQ(qm::mxfp4_block(w, out), quantize_block_mxfp4(x.data(), ref)) << rep;
    ASSERT_EQ(0, std::memcmp(out, ref, 16)) << "mxfp4 rep " << rep;
    ASSERT_EQ(qm::mxfp8_block(w, out), quantize_block_mxfp8(x.data(), ref)) << rep;
    ASSERT_EQ(0, std::memcmp(out, ref, 32)) << "mxfp8 rep " << rep;
  }
}

// fp32 blocks as the fc1 epilogue hands them to the h requantization: random bit patterns,
// Gaussians over 2^+-100 (subnormals included), sparse blocks, values near the float maximum,
// and one planted special (+-Inf, NaN, -0, the smallest subnormal) in a fifth of them.
std::vector<float> random_block_f32(std::mt19937& rng, int n, int kind) {
  std::vector<float> x(n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float sigma = std::exp2(float(int(rng() % 200) - 100));
  for (int i = 0; i < n; ++i) {
    switch (kind % 6) {
      case 0:
        x[i] = bits_float(uint32_t(rng()));
        break;
      case 3:
        x[i] = (rng() % 4) ? 0.0f : nd(rng);
        break;
      case 5:
        x[i] = nd(rng) * 1e38f;
        break;
      default:
        x[i] = nd(rng) * sigma;
    }
  }
  if (kind % 5 == 4) {
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                 0x80000000u, 0x00000001u, 0x7f7fffffu, 0xff7fffffu};
    x[rng() % n] = bits_float(specials[rng() % 8]);
  }
  return x;
}

// The fc1 epilogue's requantization of h (qmath::nvfp4_block_bf16 / mxfp8_block_bf16, one
// thread per block) against what it replaced: fmt::quantize_block_nvfp4 / _mxfp8 and the
// dequantized values rounded to bf16, for 200,000 blocks each (NVFP4 with nc = 1 or 2^+-40).
TEST(QuantizeMath, BlockBf16EqualsReferenceAndDequant) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> lnc(-40.0f, 40.0f);
  for (int rep = 0; rep < 200000; ++rep) {
    {
      const std::vector<float> x = random_block_f32(rng, 16, rep);
      const float nc = rep % 3 == 0 ? 1.0f : std::exp2(lnc(rng));
      uint8_t packed[8];
      const float s = e4m3_to_float(quantize_block_nvfp4(x.data(), nc, packed));
      uint32_t o[8];
      qm::nvfp4_block_bf16(x.data(), nc, o);
      for (int e = 0; e < 16; ++e) {
        const uint8_t code = uint8_t((packed[e / 2] >> (4 * (e % 2))) & 0xf);
        const uint16_t want = float_to_bf16(e2m1_to_float(code) * s);
        ASSERT_EQ(uint16_t(o[e / 2] >> (16 * (e % 2))), want)
            << "nvfp4 rep " << rep << " nc " << nc << " element " << e;
      }
    }
    const std::vector<float> x = random_block_f32(rng, 32, rep);
    uint8_t q[32];
    const float s = ue8m0_to_float(quantize_block_mxfp8(x.data(), q));
    uint32_t o[16];
    qm::mxfp8_block_bf16(x.data(), o);
    for (int e = 0; e < 32; ++e)
      ASSERT_EQ(uint16_t(o[e / 2] >> (16 * (e % 2))), float_to_bf16(e4m3_to_float(q[e]) * s))
          << "mxfp8 rep " << rep << " element " << e;
  }
}

// The value path of the NVFP4 element math (prepare's and fc1's requantization take bf16(q * s)
// from it): e2m1_round_value equals the code's value for every float of the binades around the
// E2M1 grid and for specials, and nvfp4_value_bits equals nvfp4_element's d, exact in bf16.
TEST(QuantizeMath, Nvfp4ValueBitsEqualsElement) {
  for (uint32_t b = 0x3c000000u; b < 0x41000000u; ++b) {  // [2^-7, 8): every float
    const float q = bits_float(b);
    ASSERT_EQ(float_bits(qm::e2m1_round_value(q)),
              float_bits(e2m1_to_float(uint8_t(qm::e2m1_mag_code(q)))))
        << "q = " << q;
  }
  for (float q : {0.0f, 1e-30f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 6.5f, 7.0f,
                  1e30f, std::numeric_limits<float>::infinity()})
    ASSERT_EQ(float_bits(qm::e2m1_round_value(q)),
              float_bits(e2m1_to_float(uint8_t(qm::e2m1_mag_code(q)))))
        << "q = " << q;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> le(-30.0f, 30.0f), u(-1.0f, 1.0f);
  for (int sb = 1; sb < 0x7f; ++sb) {  // every positive finite E4M3 scale
    const float s = e4m3_to_float(uint8_t(sb)), r = div_rn(1.0f, s);
    for (int rep = 0; rep < 4000; ++rep) {
      // |x| / s around the grid (up to ~10) and far outside it, both signs, zeros.
      float x = rep % 97 == 0  ? (rep % 2 ? -0.0f : 0.0f)
                : rep % 3 == 0 ? u(rng) * std::exp2(le(rng))
                               : u(rng) * 10.0f * s;
      float d = 0.0f;
      qm::nvfp4_element(x, s, r, &d);
      const uint32_t v = qm::nvfp4_value_bits(x, s, r);
      ASSERT_EQ(v, float_bits(d)) << "x = " << x << " s = " << s;
      ASSERT_EQ(v & 0xffffu, 0u) << "not exact in bf16: x = " << x << " s = " << s;
      ASSERT_EQ(uint16_t(v >> 16), float_to_bf16(d)) << "x = " << x << " s = " << s;
    }
  }
}

}  // namespace
}  // namespace moe_ep::fmt
