// The fp8 path's weight decode (src/kernels/gemm/fp8/fp8_fragments.h), checked on the host with the
// same functions the device would run (the byte permute emulated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/gemm/fp8/fp8_fragments.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

uint8_t byte_of(uint32_t a0, uint32_t a2, int position) {
  const uint32_t r = position < 4 ? a0 : a2;
  return uint8_t(r >> (8 * (position & 3)));
}

// Every code at every fragment position and every shift gives float_to_e4m3 of the E2M1 value
// times 2^d, whatever the other 7 codes of the word are.
TEST(Fp8Fragments, DecodeGivesTheE4m3OfEveryShiftedCode) {
  std::mt19937 rng(11);
  for (int d = -14; d <= kFp8ShiftMax; ++d) {
    const uint64_t table = fp8_e2m1_table(d);
    for (int rep = 0; rep < 64; ++rep)
      for (int p = 0; p < 8; ++p)
        for (int c = 0; c < 16; ++c) {
          uint8_t codes[8];
          for (auto& x : codes) x = uint8_t(rng() & 15);
          codes[p] = uint8_t(c);
          uint32_t a0 = 0, a2 = 0;
          fp8_decode_word(fp8_pack_word(codes), table, a0, a2);
          for (int q = 0; q < 8; ++q) {
            const float v = fmt::e2m1_to_float(codes[q]) * fmt::exp2i(d);
            ASSERT_EQ(byte_of(a0, a2, q), fmt::float_to_e4m3(v))
                << "d " << d << " position " << q << " code " << int(codes[q]);
          }
        }
  }
}

// Exact for d in [-8, 6]; at d = -9 the smallest value (0.5 * 2^-9) is not representable.
TEST(Fp8Fragments, ShiftsInTheExactRangeLoseNothing) {
  for (int d = kFp8ShiftMin; d <= kFp8ShiftMax; ++d) {
    const uint64_t table = fp8_e2m1_table(d);
    for (int m = 0; m < 8; ++m) {
      const float want = fmt::e2m1_to_float(uint8_t(m)) * fmt::exp2i(d);
      EXPECT_EQ(fmt::e4m3_to_float(uint8_t(table >> (8 * m))), want) << "d " << d << " m " << m;
    }
  }
  const uint64_t below = fp8_e2m1_table(kFp8ShiftMin - 1);
  EXPECT_NE(fmt::e4m3_to_float(uint8_t(below >> 8)), 0.5f * fmt::exp2i(kFp8ShiftMin - 1));
  EXPECT_EQ(fmt::float_to_e4m3(6.0f * fmt::exp2i(kFp8ShiftMax)), 0x7c);  // 384, below 448
}

TEST(Fp8Fragments, ChunkReferenceIsTheLargestScaleMinusSix) {
  EXPECT_EQ(fp8_chunk_reference(0x7f7f7f7fu), 127 - 6);
  EXPECT_EQ(fp8_chunk_reference(0x70817a01u), 0x81 - 6);
  EXPECT_EQ(fp8_chunk_reference(0x000000c8u), 200 - 6);
}

// The consumers' gap table: entry s - m + 255 is the table the shift of scale byte s against
// the chunk reference m - 6 selects, for every pair s <= m of bytes.
TEST(Fp8Fragments, GapTableEntryIsTheShiftTable) {
  for (int m = 0; m < 256; ++m)
    for (int s = 0; s <= m; ++s) {
      const int ref = m - kFp8ShiftMax;  // fp8_chunk_reference of a chunk whose largest byte is m
      ASSERT_EQ(fp8_gap_entry(s - m + kFp8GapTables - 1), fp8_table_entry(fp8_table_index(s - ref)))
          << "s " << s << " m " << m;
    }
  EXPECT_EQ(fp8_gap_entry(kFp8GapTables - 1), fp8_e2m1_table(kFp8ShiftMax));  // s = m
  EXPECT_EQ(fp8_gap_entry(0), 0u);  // 255 binades below: every value rounds to zero
}

// One row's 128-wide chunk against E4M3 activations: the fp8 products summed and multiplied by
// 2^(r - 127) equal the exact MXFP4 dot product when the chunk's scales span <= 14 binades.
TEST(Fp8Fragments, ChunkDotProductMatchesTheExactOne) {
  std::mt19937 rng(5);
  for (int rep = 0; rep < 200; ++rep) {
    const int span = int(rng() % 15);  // 0..14 binades
    const int base = 100 + int(rng() % 20);
    uint8_t scale[kFp8ChunkBlocks];
    uint32_t packed_scales = 0;
    for (int b = 0; b < kFp8ChunkBlocks; ++b) {
      scale[b] = uint8_t(base + (b == 1 ? span : int(rng() % (span + 1))));
      packed_scales |= uint32_t(scale[b]) << (8 * b);
    }
    const int r = fp8_chunk_reference(packed_scales);
    double exact = 0, via_fp8 = 0;
    for (int b = 0; b < kFp8ChunkBlocks; ++b) {
      const uint64_t table = fp8_e2m1_table(int(scale[b]) - r);
      for (int wd = 0; wd < 4; ++wd) {  // 4 words of 8 codes = one 32-wide block
        uint8_t codes[8];
        for (auto& x : codes) x = uint8_t(rng() & 15);
        uint32_t a0 = 0, a2 = 0;
        fp8_decode_word(fp8_pack_word(codes), table, a0, a2);
        for (int q = 0; q < 8; ++q) {
          const double x = fmt::e4m3_to_float(uint8_t(rng() % 0x7f));  // an E4M3 activation
          exact += double(fmt::e2m1_to_float(codes[q])) * std::ldexp(1.0, int(scale[b]) - 127) * x;
          via_fp8 += double(fmt::e4m3_to_float(byte_of(a0, a2, q))) * x;
        }
      }
    }
    EXPECT_EQ(via_fp8 * std::ldexp(1.0, r - 127), exact) << "span " << span;
  }
}

// A lane's word holds the fragment's k order: a0 = k0 + 4t .. +3, a2 = k0 + 16 + 4t .. +3.
TEST(Fp8Fragments, LaneWordHoldsTheFragmentsKOrder) {
  std::mt19937 rng(3);
  uint8_t row[64];
  for (auto& b : row) b = uint8_t(rng());
  const uint64_t table = fp8_e2m1_table(0);
  for (int k0 = 0; k0 < 128; k0 += 32)
    for (int t = 0; t < 4; ++t) {
      uint32_t a0 = 0, a2 = 0;
      fp8_decode_word(fp8_lane_word(row, k0, t), table, a0, a2);
      for (int i = 0; i < 4; ++i) {
        const float v0 = fmt::e2m1_packed_at(row, k0 + 4 * t + i);
        const float v2 = fmt::e2m1_packed_at(row, k0 + 16 + 4 * t + i);
        EXPECT_EQ(byte_of(a0, a2, i), fmt::float_to_e4m3(v0)) << "k0 " << k0 << " t " << t;
        EXPECT_EQ(byte_of(a0, a2, 4 + i), fmt::float_to_e4m3(v2)) << "k0 " << k0 << " t " << t;
      }
    }
}

// The resident pieces read back through the PTX A-fragment rule of mma m16n8k32 / wgmma
// m64nNk32 e4m3 (register j of lane (g, t): row g + 8 * (j & 1), k = 4t + 16 * (j >> 1) + byte)
// give every weight of an fc1 expert (gate / up fragments interleaved) once, at its (row, k).
TEST(Fp8Fragments, ResidentPiecesFollowTheFragmentLayout) {
  constexpr int kI = 128, kHdim = 256, kM = 2 * kI;  // fc1: M = 2I rows, K = H
  std::mt19937 rng(21);
  std::vector<uint8_t> w(size_t(kM) * kHdim / 2);
  for (auto& b : w) b = uint8_t(rng());
  std::vector<int> seen(size_t(kM) * kHdim, 0);
  const uint64_t table = fp8_e2m1_table(0);
  for (int mtile = 0; mtile < kI / kFc1TileH; ++mtile) {
    auto row_of = [&](int frag, int r) {
      return (frag & 1) * kI + mtile * kFc1TileH + (frag >> 1) * 16 + r;
    };
    for (int chunk = 0; chunk < kHdim / kKChunk; ++chunk)
      for (int frag = 0; frag < kTileFrags; ++frag)
        for (int lane = 0; lane < 32; ++lane) {
          uint32_t words[4];
          fp8_resident_piece(w.data(), kM, kHdim, chunk, lane, frag, row_of, words);
          const int g = lane >> 2, t = lane & 3;
          for (int s = 0; s < 2; ++s) {
            uint32_t reg[4];
            fp8_decode_word(words[2 * s], table, reg[0], reg[2]);
            fp8_decode_word(words[2 * s + 1], table, reg[1], reg[3]);
            for (int j = 0; j < 4; ++j)
              for (int b = 0; b < 4; ++b) {
                const int row = row_of(frag, g + 8 * (j & 1));
                const int k = chunk * kKChunk + 32 * s + 4 * t + 16 * (j >> 1) + b;
                const float want = fmt::e2m1_packed_at(&w[size_t(row) * (kHdim / 2)], k);
                ASSERT_EQ(uint8_t(reg[j] >> (8 * b)), fmt::float_to_e4m3(want))
                    << "row " << row << " k " << k;
                ++seen[size_t(row) * kHdim + k];
              }
          }
        }
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "weight " << i;
}

// The activation fold of an MXFP8-quantized row (DSV3 H, Gaussian with 16 channels 30x larger):
// exact wherever the folded value is an E4M3 normal, never off by more than half the subnormal
// step, and the whole row within rel L2 1e-5.
TEST(Fp8Fragments, ActivationFoldLosesOnlyBelowTheSubnormalStep) {
  constexpr int kH = 7168;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(kH), v(kH);
  for (auto& e : x) e = nd(rng);
  for (int i = 0; i < 16; ++i) x[rng() % kH] *= 30.0f;
  float amax = 0;
  for (int b = 0; b < kH / fmt::kMxBlock; ++b) {
    uint8_t q[fmt::kMxBlock];
    const float sc = fmt::ue8m0_to_float(fmt::quantize_block_mxfp8(&x[b * fmt::kMxBlock], q));
    for (int i = 0; i < fmt::kMxBlock; ++i) {
      v[b * fmt::kMxBlock + i] = fmt::e4m3_to_float(q[i]) * sc;
      amax = std::max(amax, std::fabs(v[b * fmt::kMxBlock + i]));
    }
  }
  const uint8_t ref = fp8_row_reference(amax);
  const double unit = std::ldexp(1.0, int(ref) - 127);
  double err2 = 0, ref2 = 0;
  int exact = 0;
  for (int i = 0; i < kH; ++i) {
    const double back = double(fmt::e4m3_to_float(fp8_fold(v[i], ref))) * unit;
    const double folded_mag = std::fabs(v[i]) / unit;
    ASSERT_LE(folded_mag, 448.0);
    if (folded_mag >= std::ldexp(1.0, -6)) EXPECT_EQ(back, double(v[i])) << "element " << i;
    EXPECT_LE(std::fabs(back - v[i]), std::ldexp(unit, -10)) << "element " << i;
    exact += back == double(v[i]);
    err2 += (back - v[i]) * (back - v[i]);
    ref2 += double(v[i]) * v[i];
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 1e-5);
  EXPECT_GT(exact, kH * 99 / 100);
}

}  // namespace
}  // namespace moe_ep::kern
