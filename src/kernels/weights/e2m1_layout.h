// The bit layout of resident 4-bit weight words and their decode to bf16 (docs/kernels.md §2,
// §3): what the weight preprocessing writes and what every 4-bit GEMM kernel does with it.
// __host__ __device__ so that the unit tests check the decode on the CPU.
//
// E2M1 -> bf16 without a table: an E2M1 code's bits (e1 e0 m) at bf16 bits 8..6 and its sign at
// bit 15 give value * 2^-126 exactly (code 1 = 0.5 lands on the bf16 subnormal 2^-127, the
// others on normals). The 2^126 comes back partly through the scale multiplier (scale * 2^63,
// resident_scales.h) and partly through the fp32 accumulator (* 2^63 in the epilogue): both
// exact powers of two.
//
// One 32-bit word holds the 8 codes of one k16 step of a lane: registers j = 0..3 of the MMA's A
// fragment, a low and a high element each (bits {6, 7, 8, 15} and {22, 23, 24, 31} of the
// register, kBf16E2m1Mask). The preprocessing scatters the codes' bits so that
//   - register 0 is the word masked,
//   - registers 1 and 2 are the word rotated left by 10 and 13, masked,
//   - register 3 takes the 8 bits left: masked out of the word, moved by one integer multiply
//     (three shifted copies, 3, 8 and 14 bits left, which land on distinct bits, so no carries)
//     and masked again.
// Eight instructions per word, one of them on the FMA pipe. e2m1_bit_pos holds each code bit's
// place in the word (tests/unit/test_e2m1_layout.cpp checks it against the decode).
#pragma once

#include <cstdint>

#include "moe_ep/formats.h"

namespace moe_ep::kern {

constexpr uint32_t kBf16E2m1Mask = 0x81C081C0u;
constexpr int kE2m1Rot1 = 10, kE2m1Rot2 = 13;

// Bit of the word that holds bit `bit` (0 m, 1 e0, 2 e1, 3 sign) of register `reg`'s element
// `elem` (0 low, 1 high).
MOE_EP_HD constexpr int e2m1_bit_pos(int reg, int elem, int bit) {
  constexpr int kLow[4][4] = {{6, 7, 8, 15}, {28, 29, 30, 5}, {25, 26, 27, 2}, {3, 4, 0, 1}};
  return (kLow[reg][bit] + 16 * elem) & 31;
}

// Register 3: its bits in the word, and the multiplier whose shifted copies move them to the
// bf16 fields ({m, e0, e1, s} left by {3, 3, 8, 14}).
constexpr uint32_t kE2m1RestMul = (1u << 3) | (1u << 8) | (1u << 14);
constexpr uint32_t kE2m1RestMask = (1u << e2m1_bit_pos(3, 0, 0)) | (1u << e2m1_bit_pos(3, 0, 1)) |
                                   (1u << e2m1_bit_pos(3, 0, 2)) | (1u << e2m1_bit_pos(3, 0, 3)) |
                                   (1u << e2m1_bit_pos(3, 1, 0)) | (1u << e2m1_bit_pos(3, 1, 1)) |
                                   (1u << e2m1_bit_pos(3, 1, 2)) | (1u << e2m1_bit_pos(3, 1, 3));

MOE_EP_HD uint32_t rotate_left(uint32_t w, int n) {
#ifdef __CUDA_ARCH__
  return __funnelshift_l(w, w, n);
#else
  return (w << n) | (w >> (32 - n));
#endif
}

MOE_EP_HD void decode_e2m1x8(uint32_t w, uint32_t (&r)[4]) {
  r[0] = w & kBf16E2m1Mask;
  r[1] = rotate_left(w, kE2m1Rot1) & kBf16E2m1Mask;
  r[2] = rotate_left(w, kE2m1Rot2) & kBf16E2m1Mask;
  r[3] = ((w & kE2m1RestMask) * kE2m1RestMul) & kBf16E2m1Mask;
}

}  // namespace moe_ep::kern
