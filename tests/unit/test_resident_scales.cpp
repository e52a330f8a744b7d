// The resident scale encoding of 4-bit weights (src/kernels/weights/resident_scales.h) over every
// scale byte: the bf16 multiplier the GEMMs form from the resident byte is the checkpoint scale
// times 2^63 exactly, or the block's codes are zeroed / sign-flipped so that the products stay
// the CPU's.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/weights/resident_scales.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

constexpr double kTwo63 = 9223372036854775808.0;

// A multiplier's bits as the kernels use them: a positive normal bf16 in the low 16 bits, so two
// of them side by side in one 32-bit multiply-add never carry into each other.
void expect_positive_normal_bf16(uint32_t bits, int byte) {
  EXPECT_LT(bits, 0x7f80u) << "byte " << byte;
  EXPECT_GE(bits, 0x0080u) << "byte " << byte;
}

TEST(ResidentScales, Nvfp4EveryE4m3Byte) {
  int carried = 0, zeroed = 0, refused = 0;
  for (int b = 0; b < 256; ++b) {
    const uint8_t raw = uint8_t(b);
    if (scale_byte_refused(true, raw)) {  // NaN
      EXPECT_TRUE(std::isnan(fmt::e4m3_to_float(raw))) << "byte " << b;
      ++refused;
      continue;
    }
    const float scale = fmt::e4m3_to_float(raw);
    if (block_codes_zeroed(true, raw)) {
      EXPECT_EQ(scale, 0.0f) << "byte " << b;
      EXPECT_EQ(nv_resident_scale(raw), 0) << "byte " << b;
      ++zeroed;
      continue;
    }
    EXPECT_EQ(block_codes_negated(true, raw), scale < 0.0f) << "byte " << b;
    const uint32_t r = nv_resident_scale(raw);
    EXPECT_GE(r, 8u) << "byte " << b;
    EXPECT_LE(r, 150u) << "byte " << b;
    const uint32_t bits = resident_scale_bf16<true>(r);
    expect_positive_normal_bf16(bits, b);
    EXPECT_EQ(double(fmt::bf16_to_float(uint16_t(bits))), std::fabs(double(scale)) * kTwo63)
        << "byte " << b;
    ++carried;
  }
  EXPECT_EQ(refused, 2);    // 0x7f and 0xff
  EXPECT_EQ(zeroed, 2);     // +0 and -0
  EXPECT_EQ(carried, 252);  // every other non-NaN byte
}

// Two bytes side by side in one multiply-add give each byte's multiplier in its half.
TEST(ResidentScales, PairHalvesAreIndependent) {
  for (int lo = 0; lo < 256; ++lo)
    for (int hi = 0; hi < 256; hi += 17) {
      const uint32_t pair = uint32_t(lo) | uint32_t(hi) << 16;
      const uint32_t nv = resident_scale_bf16x2<true>(pair),
                     mx = resident_scale_bf16x2<false>(pair);
      EXPECT_EQ(nv & 0xffffu, resident_scale_bf16<true>(lo)) << lo << " " << hi;
      EXPECT_EQ(nv >> 16, resident_scale_bf16<true>(hi)) << lo << " " << hi;
      EXPECT_EQ(mx & 0xffffu, resident_scale_bf16<false>(lo)) << lo << " " << hi;
      EXPECT_EQ(mx >> 16, resident_scale_bf16<false>(hi)) << lo << " " << hi;
    }
}

// A flipped sign bit negates an E2M1 code (sign-magnitude), so a negative scale carried by the
// codes gives the same products.
TEST(ResidentScales, FlippedCodeSignNegates) {
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(fmt::e2m1_to_float(uint8_t(c ^ 8)), -fmt::e2m1_to_float(uint8_t(c))) << c;
}

TEST(ResidentScales, Mxfp4EveryUe8m0Byte) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t raw = uint8_t(b);
    // Above 191: NaN (0xff) or a scale above 2^64, which the bf16 multiplier cannot hold.
    EXPECT_EQ(scale_byte_refused(false, raw), b > 191) << "byte " << b;
    if (b > 191) continue;
    EXPECT_FALSE(block_codes_negated(false, raw));
    const uint32_t bits = resident_scale_bf16<false>(raw);
    expect_positive_normal_bf16(bits, b);
    if (b < 65) {
      EXPECT_TRUE(block_codes_zeroed(false, raw)) << "byte " << b;
      continue;
    }
    EXPECT_FALSE(block_codes_zeroed(false, raw)) << "byte " << b;
    EXPECT_EQ(double(fmt::bf16_to_float(uint16_t(bits))), double(fmt::ue8m0_to_float(raw)) * kTwo63)
        << "byte " << b;
  }
}

}  // namespace
}  // namespace moe_ep::kern
