// The bit layout of resident 4-bit weight words (src/kernels/weights/e2m1_layout.h): the 32
// positions are a permutation of the word's bits, and decode_e2m1x8 turns every code of every
// register into its E2M1 value times 2^-126 as a bf16, whatever the word's other bits hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "kernels/weights/e2m1_layout.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

// The word holding `codes[j][elem]` (4-bit E2M1 codes) at the layout's positions.
uint32_t place(const uint8_t (&codes)[4][2]) {
  uint32_t w = 0;
  for (int j = 0; j < 4; ++j)
    for (int elem = 0; elem < 2; ++elem)
      for (int bit = 0; bit < 4; ++bit)
        w |= uint32_t((codes[j][elem] >> bit) & 1u) << e2m1_bit_pos(j, elem, bit);
  return w;
}

// The code of register j's element `elem` read back from a word by the layout's positions.
uint8_t code_at(uint32_t w, int j, int elem) {
  uint8_t c = 0;
  for (int bit = 0; bit < 4; ++bit) c |= uint8_t(((w >> e2m1_bit_pos(j, elem, bit)) & 1u) << bit);
  return c;
}

TEST(E2m1Layout, PositionsArePermutationOfTheWord) {
  uint32_t seen = 0;
  for (int j = 0; j < 4; ++j)
    for (int elem = 0; elem < 2; ++elem)
      for (int bit = 0; bit < 4; ++bit) {
        const int p = e2m1_bit_pos(j, elem, bit);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, 32);
        EXPECT_EQ(seen & (1u << p), 0u)
            << "register " << j << " element " << elem << " bit " << bit;
        seen |= 1u << p;
      }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
}

// Every code in every slot, the other slots holding every other code in turn: the decoded bf16
// times 2^126 is the code's E2M1 value (signed zero included).
TEST(E2m1Layout, DecodeGivesEveryCodesValue) {
  const double two126 = std::ldexp(1.0, 126);
  for (int j = 0; j < 4; ++j)
    for (int elem = 0; elem < 2; ++elem)
      for (int code = 0; code < 16; ++code)
        for (int other = 0; other < 16; ++other) {
          uint8_t codes[4][2];
          for (auto& r : codes) r[0] = r[1] = uint8_t(other);
          codes[j][elem] = uint8_t(code);
          uint32_t regs[4];
          decode_e2m1x8(place(codes), regs);
          for (int jj = 0; jj < 4; ++jj)
            for (int ee = 0; ee < 2; ++ee) {
              const uint16_t bf = uint16_t(regs[jj] >> (16 * ee));
              const float v = fmt::bf16_to_float(bf);
              const float want = fmt::e2m1_to_float(codes[jj][ee]);
              EXPECT_EQ(double(v) * two126, double(want))
                  << "register " << jj << " element " << ee << " code " << int(codes[jj][ee]);
              EXPECT_EQ(std::signbit(v), std::signbit(want));
              EXPECT_EQ(bf & ~(kBf16E2m1Mask & 0xFFFFu), 0u) << "bits outside the code's fields";
            }
        }
}

// Random words: each register holds exactly its two codes' fields, so no bit of another code
// leaks into it (the multiply of register 3 included).
TEST(E2m1Layout, DecodeReadsOnlyItsOwnBits) {
  std::mt19937 rng(20261203);
  for (int it = 0; it < (1 << 20); ++it) {
    const uint32_t w = uint32_t(rng());
    uint32_t regs[4];
    decode_e2m1x8(w, regs);
    for (int j = 0; j < 4; ++j) {
      uint32_t want = 0;
      for (int elem = 0; elem < 2; ++elem) {
        const uint32_t c = code_at(w, j, elem);
        want |= ((c & 7u) << 6 | (c >> 3) << 15) << (16 * elem);
      }
      ASSERT_EQ(regs[j], want) << "word " << std::hex << w << " register " << j;
    }
  }
}

}  // namespace
}  // namespace moe_ep::kern
