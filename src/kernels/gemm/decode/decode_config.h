// Geometry of the decode kernel's ring (sm90_decode.cuh) as plain constexpr functions of
// run-time values, so that the launch plan (src/plan) sizes rings on the host with the very
// numbers the kernel templates use (DecodeConfig is defined from these).
#pragma once

#include "kernels/common/forward_args.h"

namespace moe_ep::kern {

// Shared memory of a Hopper SM (H100 / H200) as the ring sizing sees it: 228 KB per SM, at most
// 227 KB for one CTA, and 1 KB of every resident CTA's share kept by the runtime.
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemPerCtaMax = 227 * 1024;
constexpr int kSmemReservedPerCta = 1024;

// The decode kernel's static shared memory (scale tables, barriers, column tables), as ptxas
// reports it for the 4-bit kernels (4-chunk slots) with two scale tables per warp and with one,
// a bound for the bf16 kernels (no tables; ptxas: 128-256 bytes), and the bound the ring sizing
// reserves for it (with the runtime's 1 KB).
constexpr int kDecodeStaticTwoTables = 5376, kDecodeStaticOneTable = 3328;
constexpr int kDecodeStaticBf16 = 1024;
constexpr int kDecodeStaticBound = 8 * 1024;
constexpr int kDecodeMaxStages = 24;

// Bytes of one ring slot of a decode kernel with tiles of n rows and cps K-chunks per slot: the
// weights of cps chunks (one bulk copy), their scales (one), then per B row cps * 64 bf16 values
// and 16 bytes of padding.
constexpr int decode_stage_bytes(Recipe r, int n, int cps) {
  return cps * kTileFrags * (frag_bytes(r) + frag_scale_bytes(r)) + n * (cps * kKChunk + 8) * 2;
}
constexpr int decode_min_stages(Recipe r, int cps) {
  return cps > 1 ? 2 : r != Recipe::kBf16 ? 4 : 3;
}
constexpr int decode_max_stages(Recipe r, int n, int cps) {
  const int s = (kSmemPerCtaMax - kDecodeStaticBound) / decode_stage_bytes(r, n, cps);
  return s < kDecodeMaxStages ? s : kDecodeMaxStages;
}
// Scale tables per consumer warp: two (by chunk parity, so a chunk's table is written while the
// previous one may still be read), or one where the second would keep a fourth CTA of two ring
// slots off the SM: 4 x (2 x stage + static + 1 KB reserved) must fit 228 KB, and the static
// shared memory is kDecodeStaticTwoTables with two tables, kDecodeStaticOneTable with one. That is
// nvfp4 at tile 16 (26880-byte slots; 3 CTAs fit with two tables, 4 with one): measured 1.5-3 %
// faster there (docs/kernels.md), while mxfp4 at tile 16 (25856-byte slots) fits 4 CTAs either way
// and was 1-2 % slower with one.
constexpr int decode_scale_tables(int stage_bytes) {
  return 4 * (2 * stage_bytes + kDecodeStaticTwoTables + kSmemReservedPerCta) > kSmemPerSm ? 1 : 2;
}

// The kernel's static shared memory: its scale tables (4-bit weights) or the bf16 bound.
constexpr int decode_static_bytes(Recipe r, int stage_bytes) {
  return r == Recipe::kBf16                      ? kDecodeStaticBf16
         : decode_scale_tables(stage_bytes) == 2 ? kDecodeStaticTwoTables
                                                 : kDecodeStaticOneTable;
}
// The most CTAs an SM holds at the ring's smallest depth (each with its static shared memory and
// the runtime's reserved 1 KB; at most 4).
constexpr int decode_max_per_sm(Recipe r, int n, int cps) {
  const int stage = decode_stage_bytes(r, n, cps);
  const int per =
      decode_min_stages(r, cps) * stage + decode_static_bytes(r, stage) + kSmemReservedPerCta;
  return kSmemPerSm / per < 4 ? kSmemPerSm / per : 4;
}

}  // namespace moe_ep::kern
