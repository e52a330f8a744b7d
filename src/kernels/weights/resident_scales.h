// The resident scale bytes of 4-bit weights (docs/kernels.md §2, §3): what the weight
// preprocessing writes beside the codes, and the bf16 multiplier the GEMMs form from each byte.
// __host__ __device__ so that the unit tests check every byte on the CPU.
//
// The GEMMs multiply a decoded E2M1 code (its value times 2^-126, sm90_gemm_device.cuh) by the
// block's scale times 2^63 as a bf16, and the resident byte is chosen so that this multiplier is
// one integer multiply-add of the byte, bit for bit:
//   - NVFP4 (E4M3 scale per 16): a scale of magnitude 2^E (1 + m/8), E in [-9, 8] (E4M3's
//     subnormals are normals here), is stored as (E + 10) << 3 | m, 8..150, and its bf16
//     multiplier is byte * 16 + 23040 (exponent field E + 190). A negative scale is stored by its
//     magnitude with the block's code signs flipped; a zero scale as byte 0 with the block's codes
//     zeroed, so the multiplier of byte 0 (2^53) multiplies zeros only.
//   - MXFP4 (UE8M0 per 32): the byte as it is, multiplier (byte + 63) << 7 = 2^(byte - 64) for
//     bytes 65..191; below 65 (scales under 2^-62) the block's codes are zeroed, as the bf16
//     multiplier could not hold the scale.
// Refused at construction (scale_byte_refused): E4M3 NaN, UE8M0 NaN and scales above 2^64.
// In both the product with a zeroed code is +0, as the CPU's zero block products sum to +0.
#pragma once

#include <cstdint>

#include "moe_ep/formats.h"

namespace moe_ep::kern {

constexpr uint32_t kNvScaleBias = 23040;  // bf16 exponent 180 << 7
constexpr uint32_t kMxScaleBias = 8064;   // bf16 exponent 63 << 7

// Scale bytes construction refuses: E4M3 NaN (0x7f, 0xff); UE8M0 above 191 (NaN 0xff and scales
// above 2^64, which the bf16 multiplier cannot hold).
MOE_EP_HD bool scale_byte_refused(bool nv, uint8_t raw) {
  return nv ? (raw & 0x7fu) == 0x7fu : raw > 191;
}

// The resident byte of a non-NaN E4M3 scale byte (its sign handled by the codes).
MOE_EP_HD uint8_t nv_resident_scale(uint8_t e4m3) {
  const uint32_t e = (e4m3 >> 3) & 15u, m = e4m3 & 7u;
  if (e != 0) return uint8_t(((e + 3u) << 3) | m);         // E = e - 7
  if (m == 0) return 0;                                    // zero: the codes are zeroed
  if (m == 1) return 1u << 3;                              // 2^-9
  if (m < 4) return uint8_t((2u << 3) | ((m - 2u) << 2));  // 2^-8 (1 + (m - 2) / 2)
  return uint8_t((3u << 3) | ((m - 4u) << 1));             // 2^-7 (1 + (m - 4) / 4)
}

// The bf16x2 multipliers (scale * 2^63) of two resident scale bytes at bits 0..7 and 16..23 of
// `pair`, in one multiply-add: each half stays below 2^16, so neither carries into the other.
template <bool kNv>
MOE_EP_HD uint32_t resident_scale_bf16x2(uint32_t pair) {
  return pair * (kNv ? 16u : 128u) + (kNv ? kNvScaleBias : kMxScaleBias) * 0x10001u;
}

// The bf16 bits of one resident scale byte's multiplier.
template <bool kNv>
MOE_EP_HD uint32_t resident_scale_bf16(uint32_t b) {
  return resident_scale_bf16x2<kNv>(b) & 0xffffu;
}

// What the preprocessing does to the codes of a block with raw scale byte `raw`: zero them
// (NVFP4 zero scale, MXFP4 below 2^-62) or flip their signs (NVFP4 negative scale).
MOE_EP_HD bool block_codes_zeroed(bool nv, uint8_t raw) {
  return nv ? (raw & 0x7fu) == 0 : raw < 65;
}
MOE_EP_HD bool block_codes_negated(bool nv, uint8_t raw) { return nv && (raw & 0x80u) != 0; }

}  // namespace moe_ep::kern
