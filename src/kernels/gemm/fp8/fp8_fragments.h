// Building blocks of the fp8 MMA path for mxfp4_mxfp8 (docs/kernels.md; used by the
// weight preprocessing, the fold kernel and sm90_moe_fp8_ws_kernel): MXFP4 weights decoded to
// E4M3 with a power-of-two shift per (row, 32-wide block), straight into the A fragment of
// mma.sync m16n8k32 / wgmma m64nNk32 e4m3.
//
// A fragment of one warp and k32 step: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8;
// its registers a0 / a1 / a2 / a3 are rows g / g+8 / g / g+8 at k = 4t..4t+3 (a0, a1) and
// 16+4t..16+4t+3 (a2, a3), byte i = k offset i. One 32-bit word per lane, row and step holds the
// 8 codes of a0 and a2 (or a1 and a3):
//   a0's magnitudes at bits 0-2, 4-6, 8-10, 12-14, its signs at 3, 11, 19, 27;
//   a2's magnitudes at 16-18, 20-22, 24-26, 28-30, its signs at 7, 15, 23, 31;
// so one byte permute against the row's 8-byte table of shifted magnitudes and one masked OR of
// the signs give each register: 8 instructions per 8 weights.
//
// The shift: the block's UE8M0 scale s_k against a reference r of the row (the largest scale of
// a 128-wide K chunk, minus 6, see fp8_chunk_reference): d = s_k - r in [6 - span, 6]. Every
// E2M1 value times 2^d is exact in E4M3 for d in [-8, 6] (6 * 2^6 = 384 <= 448; 0.5 * 2^-8 =
// 2^-9, E4M3's smallest subnormal), i.e. when the chunk's 4 scales span at most 14 binades;
// below that the table holds the nearest-even E4M3 (what float_to_e4m3 gives). The MMA's sum is
// then multiplied by 2^r (and the activation's reference) in fp32, exactly.
#pragma once

#include <cstdint>

#include "kernels/common/forward_args.h"
#include "kernels/common/quantize_math.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {

constexpr int kFp8ShiftMax = 6;   // largest d: 6 * 2^6 = 384 <= 448
constexpr int kFp8ShiftMin = -8;  // smallest d with every value exact
constexpr int kFp8ChunkBlocks = 4;
// The kernels' shift tables in shared memory: entry 0 all zero, entry 1 + d - kFp8TableMin the
// table of shift d (fp8_e2m1_table) for kFp8TableMin <= d <= kFp8ShiftMax.
constexpr int kFp8TableMin = -12;  // below: every shifted E2M1 value rounds to 0 in E4M3
constexpr int kFp8Tables = kFp8ShiftMax - kFp8TableMin + 2;

MOE_EP_HD int fp8_table_index(int d) { return d < kFp8TableMin ? 0 : 1 + d - kFp8TableMin; }

// The 8 E4M3 bytes of the E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} times 2^d, d <= 6 (low
// word = magnitudes 0..3, high word = 4..7).
MOE_EP_HD uint64_t fp8_e2m1_table(int d) {
  uint64_t t = 0;
  for (int m = 1; m < 8; ++m)
    t |= uint64_t(fmt::float_to_e4m3(fmt::e2m1_to_float(uint8_t(m)) * fmt::exp2i(d))) << (8 * m);
  return t;
}

// Entry i of the kernels' shift tables (kFp8Tables entries, indexed by fp8_table_index).
MOE_EP_HD uint64_t fp8_table_entry(int i) {
  return i == 0 ? 0 : fp8_e2m1_table(i - 1 + kFp8TableMin);
}

// The consumers' table of every gap: entry s - m + 255 (0..255) for a block scale byte s of a
// row whose chunk's largest scale byte is m is the table of shift d = s - (m - kFp8ShiftMax),
// fp8_table_entry(fp8_table_index(d)); a row then finds its block's table at (table + 255 -
// m)[s], one address operation and no clamp.
constexpr int kFp8GapTables = 256;
MOE_EP_HD uint64_t fp8_gap_entry(int i) {
  return fp8_table_entry(fp8_table_index(i - (kFp8GapTables - 1) + kFp8ShiftMax));
}

// The chunk reference of one row: the largest of its kFp8ChunkBlocks UE8M0 scale bytes (packed
// little-endian in `scales`) minus 6, so that every block's d = s_k - r is at most 6.
MOE_EP_HD int fp8_chunk_reference(uint32_t scales) {
  int m = 0;
  for (int i = 0; i < kFp8ChunkBlocks; ++i) {
    const int s = int((scales >> (8 * i)) & 0xff);
    m = s > m ? s : m;
  }
  return m - kFp8ShiftMax;
}

// a0 (bytes 0..3) and a2 (bytes 0..3) of one row from its word and its block's table.
MOE_EP_HD void fp8_decode_word(uint32_t w, uint64_t table, uint32_t& a0, uint32_t& a2) {
  const uint32_t lo = uint32_t(table), hi = uint32_t(table >> 32);
  a0 = kernels::qmath::byte_perm(lo, hi, w & 0x7777u) | ((w << 4) & 0x80808080u);
  a2 = kernels::qmath::byte_perm(lo, hi, (w >> 16) & 0x7777u) | (w & 0x80808080u);
}

// The word of 8 E2M1 codes (bit 3 = sign): codes[0..3] go to a0's bytes 0..3, codes[4..7] to
// a2's (the preprocessing's side).
MOE_EP_HD uint32_t fp8_pack_word(const uint8_t (&codes)[8]) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t c0 = codes[i], c2 = codes[4 + i];
    w |= (c0 & 7u) << (4 * i);       // a0 magnitude: nibble i
    w |= (c0 >> 3) << (3 + 8 * i);   // a0 sign: bit 3 + 8i (moves to 7 + 8i by << 4)
    w |= (c2 & 7u) << (16 + 4 * i);  // a2 magnitude: nibble 4 + i
    w |= (c2 >> 3) << (7 + 8 * i);   // a2 sign: bit 7 + 8i
  }
  return w;
}

// The word of one lane (t = lane % 4), row and k32 step from the row's packed E2M1 bytes
// (`row` = the row's first byte, two codes per byte, even k in the low nibble; k0 = the step's
// first k): a0 gets k0 + 4t .. 4t+3, a2 gets k0 + 16 + 4t .. +3 (the fragment order above).
MOE_EP_HD uint32_t fp8_lane_word(const uint8_t* row, int k0, int t) {
  uint8_t codes[8];
  for (int i = 0; i < 8; ++i) {
    const int k = k0 + (i < 4 ? 4 * t + i : 16 + 4 * t + (i - 4));
    codes[i] = uint8_t((row[k / 2] >> (4 * (k & 1))) & 0xf);
  }
  return fp8_pack_word(codes);
}

// The resident fp8 layout keeps today's granularity (docs/kernels.md): per expert,
// M-tile of kTileRows rows, K-chunk of kKChunk = 64 and fragment of 16 rows, each lane owns 16
// bytes = 4 words: k32 step 0 rows g and g + 8, then step 1 rows g and g + 8. Decoding word
// 2s gives that step's a0 / a2, word 2s + 1 its a1 / a3. `row_of(frag, r)` is the weight row of
// fragment row r (fc1 interleaves gate and up fragments), rows >= M read as zero codes.
template <class RowOf>
MOE_EP_HD void fp8_resident_piece(const uint8_t* weights, int M, int K, int chunk, int lane,
                                  int frag, RowOf row_of, uint32_t (&words)[4]) {
  const int g = lane >> 2, t = lane & 3;
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < 2; ++h) {
      const int row = row_of(frag, g + 8 * h);
      words[2 * s + h] =
          row < M ? fp8_lane_word(weights + size_t(row) * (K / 2), chunk * kKChunk + 32 * s, t)
                  : 0u;
    }
}

// Activations (x for fc1, h for fc2): one power of two per row, the UE8M0 byte of the row's
// amax against 448 (the largest of the row's MXFP8 block scales, since a block's scale grows
// with its amax), and each value v = q * 2^s_k stored as e4m3(v * 2^(127 - ref)) (round to
// nearest even). The row's largest blocks keep their q exactly; smaller blocks lose only bits
// that fall below E4M3's subnormal step 2^-9 (tools/fp8_fold_error.py: rel L2 ~1e-7..1e-6).
MOE_EP_HD uint8_t fp8_row_reference(float row_amax) {
  return fmt::ue8m0_scale_for(row_amax, fmt::kE4M3Max);
}
MOE_EP_HD uint8_t fp8_fold(float v, uint8_t ref) {
  return fmt::float_to_e4m3(fmt::mul_rn(v, fmt::exp2i(127 - int(ref))));
}

}  // namespace moe_ep::kern
