// The launch plan as a pure function (src/plan/forward_plan.h): the tile choice and its
// thresholds, the decode rings, the options that force variants, and the host arithmetic the
// grids and the workspace are sized by. Plain C++, so it runs here although the kernels cannot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/forward_args.h"
#include "kernels/gemm/decode/decode_config.h"
#include "moe_ep/plan.h"
#include "plan/forward_plan.h"

namespace moe_ep::kern {
namespace {

using plan::choose_owner_tile_n;
using plan::choose_tile_n;
using plan::make_forward_plan;
using plan::PlanInputs;

// The shapes of the benchmark on one H200 (132 SMs).
PlanInputs dsv3(Recipe r, int tokens) {
  PlanInputs p;
  p.recipe = r;
  p.H = 7168, p.I = 2048, p.K = 8, p.local_experts = 256, p.num_sms = 132;
  p.tokens = tokens;
  p.capacity = 4096;
  return p;
}
PlanInputs qwen3(Recipe r, int tokens) {
  PlanInputs p = dsv3(r, tokens);
  p.H = 2048, p.I = 768, p.local_experts = 128;
  return p;
}
PlanInputs gpt_oss(Recipe r, int tokens) {
  PlanInputs p = dsv3(r, tokens);
  p.H = 2880, p.I = 2880, p.K = 4, p.local_experts = 128;
  return p;
}

// The host's estimate of the routing tiles (the decode rings size from it): one per pair below
// the expert count, else full tiles. DSV3 (256 experts, K 8).
TEST(ForwardPlan, ExpectedTilesAtDecodeSizes) {
  EXPECT_EQ(expected_tiles(8, 256, 8), 8);         // 1 token
  EXPECT_EQ(expected_tiles(1024, 256, 8), 256);    // 128 tokens: every expert
  EXPECT_EQ(expected_tiles(32768, 256, 8), 4096);  // 4096 tokens: full tiles
  EXPECT_EQ(expected_tiles(1024, 128, 16), 128);   // EP = 2's owner at 64 tokens per rank
  EXPECT_EQ(expected_tiles(0, 256, 8), 0);
}

// The tile width is 8 up to 4 mean rows per expert, 16 up to 17 (14 where tile 32's fc2 runs the
// lean consumer), 32 up to 21, else 160 (the m64 kernel).
TEST(ForwardPlan, TileWidthFollowsMeanRowsPerExpert) {
  EXPECT_EQ(plan::kTile8MaxMeanRows, 4.0);
  EXPECT_EQ(plan::kTile16MaxMeanRows, 17.0);
  EXPECT_EQ(plan::kTile16MaxMeanRowsLeanFc2, 14.0);
  EXPECT_EQ(plan::kTile32MaxMeanRows, 21.0);
  // DeepSeek-V3, EP = 1: K 8, 256 experts -> mean rows = T / 32; I = 2048, so fc2 runs lean.
  auto d = [](int T, Recipe r = Recipe::kNvfp4) { return choose_tile_n(T, 8, 256, r, 2048); };
  EXPECT_EQ(d(1), 8);
  EXPECT_EQ(d(128), 8);    // 4 rows
  EXPECT_EQ(d(129), 16);   // just above 4
  EXPECT_EQ(d(448), 16);   // 14 rows
  EXPECT_EQ(d(449), 32);   // just above 14
  EXPECT_EQ(d(512), 32);   // 16 rows
  EXPECT_EQ(d(672), 32);   // 21 rows
  EXPECT_EQ(d(673), 160);  // just above 21
  EXPECT_EQ(d(4096), 160);
  // Qwen3 (I = 768) as DSV3; gpt-oss (I = 2880, K 4, 128 experts: mean rows = T / 32) keeps
  // tile 16 up to 17 rows (its fc2 runs the 4-chunk consumer).
  EXPECT_EQ(choose_tile_n(224, 8, 128, Recipe::kMxfp4Mxfp8, 768), 16);  // 14 rows
  EXPECT_EQ(choose_tile_n(225, 8, 128, Recipe::kMxfp4Mxfp8, 768), 32);  // just above 14
  EXPECT_EQ(choose_tile_n(544, 4, 128, Recipe::kNvfp4, 2880), 16);      // 17 rows
  EXPECT_EQ(choose_tile_n(545, 4, 128, Recipe::kNvfp4, 2880), 32);      // just above 17
  // EP owners: W * T virtual tokens; never tile 32 (at most 10.5 real rows per expert there).
  auto own = [](int T, int W, int K, int E, Recipe r = Recipe::kNvfp4, int I = 2048) {
    return choose_owner_tile_n(T, W, K, E, r, I);
  };
  EXPECT_EQ(own(128, 2, 8, 128), 16);   // W * 16 rows
  EXPECT_EQ(own(160, 2, 8, 128), 16);   // W * 20 rows: 32 on one GPU
  EXPECT_EQ(own(176, 2, 8, 128), 160);  // W * 22 rows
  EXPECT_EQ(own(16, 2, 8, 128), 8);     // W * 2 rows
  EXPECT_EQ(own(640, 1, 8, 256), 32);   // one rank: the single-GPU bound
  // W = 8 (32 local experts): twice the owner's mean, not 8 times.
  EXPECT_EQ(own(8, 8, 8, 32), 8);      // 2 rows -> 4
  EXPECT_EQ(own(32, 8, 8, 32), 16);    // 8 rows -> 16
  EXPECT_EQ(own(40, 8, 8, 32), 16);    // 10 rows -> 20
  EXPECT_EQ(own(128, 8, 8, 32), 160);  // 32 rows
  // bf16 owners: the single-GPU bf16 bounds on the doubled mean.
  EXPECT_EQ(own(8, 2, 8, 128, Recipe::kBf16), 8);           // W * 0.5 rows
  EXPECT_EQ(own(32, 2, 8, 128, Recipe::kBf16), 16);         // W * 2 rows
  EXPECT_EQ(own(40, 2, 8, 128, Recipe::kBf16), 160);        // W * 2.5 rows
  EXPECT_EQ(own(40, 2, 8, 128, Recipe::kBf16, 768), 16);    // short K: up to 12
  EXPECT_EQ(own(104, 2, 8, 128, Recipe::kBf16, 768), 160);  // W * 6.5 rows
  // No local experts (a degenerate split) does not divide by zero.
  EXPECT_EQ(choose_tile_n(0, 8, 0, Recipe::kNvfp4, 2048), 8);
}

// Tile 32's consumer follows the GEMM's K: the lean one on 2-chunk slots up to 2048 inner values
// (32 K-chunks per CTA), the 136-register one on 4-chunk slots above.
TEST(ForwardPlan, Tile32SlotChunksFollowK) {
  EXPECT_EQ(plan::kLeanMaxK, 2048);
  EXPECT_EQ(plan::tile32_chunks_per_slot(768), 2);   // Qwen3 fc2
  EXPECT_EQ(plan::tile32_chunks_per_slot(2048), 2);  // Qwen3 fc1, DSV3 fc2
  EXPECT_EQ(plan::tile32_chunks_per_slot(2049), 4);
  EXPECT_EQ(plan::tile32_chunks_per_slot(7168), 4);  // DSV3 fc1
  const ForwardPlan p = make_forward_plan(dsv3(Recipe::kNvfp4, 512), {});
  ASSERT_EQ(p.tile_n, 32);
  EXPECT_EQ(p.fc1.decode[0].chunks_per_slot, 4);
  EXPECT_EQ(p.fc2.decode[0].chunks_per_slot, 2);
  // The lean consumer's CTAs per SM are capped by what fits at its smallest ring.
  EXPECT_LE(p.fc2.decode[0].ctas_per_sm, decode_max_per_sm(Recipe::kNvfp4, 32, 2));
  EXPECT_LE(p.fc1.decode[0].ctas_per_sm, decode_max_per_sm(Recipe::kNvfp4, 32, 4));
}

// DSV3 at 1 token on one GPU: tile 8 on the decode kernel; fc1 (8 tiles x 32 M-tiles = 256 CTAs,
// 2 per SM) leaves an SM room for one fc2 CTA: a third of the SM, 3 ring slots of 4 chunks.
TEST(ForwardPlan, Dsv3DecodeOneToken) {
  const ForwardPlan p = make_forward_plan(dsv3(Recipe::kNvfp4, 1), {});
  EXPECT_EQ(p.backend, Backend::kCUDA);
  EXPECT_EQ(p.tile_n, 8);
  EXPECT_EQ(p.route, RouteKind::kOneBlock);
  EXPECT_EQ(p.quant_per_thread, 4);
  ASSERT_EQ(p.fc1.kernel, GemmKernel::kDecode);
  ASSERT_EQ(p.fc1.num_decode_launches, 1);
  const DecodeLaunchPlan& f1 = p.fc1.decode[0];
  EXPECT_EQ(p.fc1.mtiles, 32);
  EXPECT_EQ(p.fc1.grid_tiles, 8);
  EXPECT_EQ(f1.ctas_per_sm, 2);
  EXPECT_TRUE(f1.room_for_fc2);
  EXPECT_EQ(f1.smem_bytes, kSmemPerSm / 3);
  EXPECT_EQ(f1.stages, 3);
  EXPECT_EQ(f1.chunks_per_slot, 4);
  EXPECT_EQ(f1.frags_per_warp, 2);  // 2 CTAs per SM: two fragments per warp
  EXPECT_EQ(f1.first_wave, 132 * 2);
  // fc2: 8 tiles x 56 M-tiles = 448 CTAs, 4 per SM, the smallest ring; no room asked.
  const DecodeLaunchPlan& f2 = p.fc2.decode[0];
  EXPECT_EQ(p.fc2.mtiles, 56);
  EXPECT_EQ(f2.ctas_per_sm, 4);
  EXPECT_FALSE(f2.room_for_fc2);
  EXPECT_EQ(f2.stages, 2);
  // Two fc1 CTAs of a third of the SM and one fc2 CTA fit an SM.
  EXPECT_LE(2 * (f1.smem_bytes + kDecodeStaticBound + kSmemReservedPerCta) +
                (f2.smem_bytes + kDecodeStaticBound + kSmemReservedPerCta),
            kSmemPerSm);
}

// Tile 8's one-fragment warps: nvfp4 where the grid holds at most one CTA per SM (Qwen3 at 1
// token: 8 tiles x 12 M-tiles = 96 CTAs); mxfp4 keeps two.
TEST(ForwardPlan, OneFragmentWarpsWhereOneCtaPerSm) {
  const ForwardPlan nv = make_forward_plan(qwen3(Recipe::kNvfp4, 1), {});
  ASSERT_EQ(nv.fc1.kernel, GemmKernel::kDecode);
  EXPECT_EQ(nv.fc1.decode[0].ctas_per_sm, 1);
  EXPECT_EQ(nv.fc1.decode[0].frags_per_warp, 1);
  const ForwardPlan mx = make_forward_plan(qwen3(Recipe::kMxfp4Mxfp8, 1), {});
  EXPECT_EQ(mx.fc1.decode[0].frags_per_warp, 2);
  // nvfp4_bf16 streams and decodes the same NVFP4 weights as nvfp4: the same plan.
  const ForwardPlan nb = make_forward_plan(qwen3(Recipe::kNvfp4Bf16, 1), {});
  EXPECT_EQ(nb.to_string(), nv.to_string());
  PlanOptions o;
  o.tile8_frags_per_warp = 2;
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kNvfp4, 1), o).fc1.decode[0].frags_per_warp, 2);
  o.tile8_frags_per_warp = 1;
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kMxfp4Bf16, 1), o).fc1.decode[0].frags_per_warp, 1);
}

// Tile 16 splits its rows up to 10 expected rows per expert: the narrow tiles on the tile-8
// kernel first, then the wide ones.
TEST(ForwardPlan, Tile16RowSplitUpToTenRows) {
  EXPECT_EQ(plan::kTile16SplitMaxMeanRows, 10.0);
  const ForwardPlan p = make_forward_plan(dsv3(Recipe::kNvfp4, 256), {});  // 8 rows
  ASSERT_EQ(p.tile_n, 16);
  EXPECT_TRUE(p.tile16_row_split);
  ASSERT_EQ(p.fc1.num_decode_launches, 2);
  EXPECT_EQ(p.fc1.decode[0].tile_n, 8);
  EXPECT_EQ(p.fc1.decode[0].tile_part, 1);
  EXPECT_EQ(p.fc1.decode[0].grid_tiles, 256);  // at most one narrow tile per expert
  EXPECT_EQ(p.fc1.decode[1].tile_n, 16);
  EXPECT_EQ(p.fc1.decode[1].tile_part, 2);
  EXPECT_EQ(p.fc1.decode[1].grid_tiles, 2048 / 9);  // a wide tile holds at least 9 rows
  EXPECT_TRUE(make_forward_plan(dsv3(Recipe::kNvfp4, 320), {}).tile16_row_split);  // 10 rows
  const ForwardPlan q = make_forward_plan(dsv3(Recipe::kNvfp4, 352), {});          // 11 rows
  ASSERT_EQ(q.tile_n, 16);
  EXPECT_FALSE(q.tile16_row_split);
  EXPECT_EQ(q.fc1.num_decode_launches, 1);
  PlanOptions on, off;
  on.tile16_row_split = 1;
  off.tile16_row_split = 0;
  EXPECT_TRUE(make_forward_plan(dsv3(Recipe::kNvfp4, 352), on).tile16_row_split);
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kNvfp4, 256), off).tile16_row_split);
  // bf16 weights never split: tile 16 is one decode launch of one-fragment warps on 2-chunk
  // slots.
  PlanOptions on16 = on;
  on16.tile_n = 16;
  const ForwardPlan b = make_forward_plan(dsv3(Recipe::kBf16, 256), on16);
  EXPECT_FALSE(b.tile16_row_split);
  ASSERT_EQ(b.fc1.kernel, GemmKernel::kDecode);
  EXPECT_EQ(b.fc1.num_decode_launches, 1);
  EXPECT_EQ(b.fc1.decode[0].tile_n, 16);
  EXPECT_EQ(b.fc1.decode[0].frags_per_warp, 1);
  EXPECT_EQ(b.fc1.decode[0].chunks_per_slot, 2);
}

// The bf16 recipe: the decode kernel (one fragment per consumer warp, 2-chunk slots) with tile 8
// up to 1 mean row per expert and tile 16 up to 4 (up to 12 where I <= 1024: Qwen3), the m64
// kernel above (no tile 32).
TEST(ForwardPlan, Bf16TileByMeanRows) {
  EXPECT_EQ(plan::kBf16Tile8MaxMeanRows, 1.0);
  EXPECT_EQ(plan::kBf16Tile16MaxMeanRows, 4.0);
  EXPECT_EQ(plan::kBf16Tile16MaxMeanRowsShortK, 12.0);
  EXPECT_EQ(plan::kBf16ShortKMaxI, 1024);
  // Qwen3 (I 768): K 8, 128 experts -> mean rows = T / 16.
  auto q = [](int T) { return make_forward_plan(qwen3(Recipe::kBf16, T), {}); };
  for (const int T : {1, 8, 16}) {
    const ForwardPlan p = q(T);
    EXPECT_EQ(p.tile_n, 8) << T;
    ASSERT_EQ(p.fc1.kernel, GemmKernel::kDecode) << T;
    EXPECT_EQ(p.fc2.kernel, GemmKernel::kDecode) << T;
    EXPECT_EQ(p.fc1.decode[0].frags_per_warp, 1) << T;
    EXPECT_EQ(p.fc1.decode[0].chunks_per_slot, 2) << T;
  }
  for (const int T : {17, 64, 192}) {
    const ForwardPlan p = q(T);
    EXPECT_EQ(p.tile_n, 16) << T;
    ASSERT_EQ(p.fc1.kernel, GemmKernel::kDecode) << T;
    EXPECT_EQ(p.fc1.num_decode_launches, 1) << T;  // no row split
    EXPECT_FALSE(p.tile16_row_split) << T;
    // Two-slot rings of 37 KB slots: at most three CTAs an SM (each with its runtime-reserved
    // 1 KB and at most 1 KB of static shared memory; ptxas: 256 bytes).
    EXPECT_LE(p.fc1.decode[0].ctas_per_sm, 3) << T;
    EXPECT_EQ(p.fc1.decode[0].ctas_per_sm, kern::decode_max_per_sm(Recipe::kBf16, 16, 2)) << T;
    EXPECT_EQ(kern::decode_max_per_sm(Recipe::kBf16, 16, 2), 3);
    EXPECT_EQ(p.fc1.decode[0].stages, 2) << T;
    EXPECT_LE(3 * (p.fc1.decode[0].smem_bytes + 2 * kern::kSmemReservedPerCta), kern::kSmemPerSm);
  }
  for (const int T : {193, 512, 4096}) {
    const ForwardPlan p = q(T);
    EXPECT_EQ(p.tile_n, 160) << T;
    EXPECT_EQ(p.fc1.kernel, GemmKernel::kWgmmaM64) << T;
    EXPECT_EQ(p.fc2.kernel, GemmKernel::kWgmmaM64) << T;
  }
  // DSV3 (I 2048; mean rows = T / 32): tile 8 up to 1 row, 16 up to 4, then 160.
  auto d = [](int T) { return make_forward_plan(dsv3(Recipe::kBf16, T), {}).tile_n; };
  EXPECT_EQ(d(1), 8);
  EXPECT_EQ(d(32), 8);
  EXPECT_EQ(d(33), 16);
  EXPECT_EQ(d(128), 16);
  EXPECT_EQ(d(129), 160);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 1), {}).fc1.kernel, GemmKernel::kDecode);
  EXPECT_EQ(make_forward_plan(gpt_oss(Recipe::kBf16, 1), {}).fc2.kernel, GemmKernel::kDecode);
  // One fragment per warp is all the bf16 kernel has.
  PlanOptions two;
  two.tile8_frags_per_warp = 2;
  EXPECT_EQ(plan_options_reasons(two, Recipe::kBf16).size(), 1u);
  EXPECT_TRUE(plan_options_reasons(two, Recipe::kNvfp4).empty());
}

// Prefill: the m64 wgmma kernel, tiles of 160 (4-bit weights: one CTA per tile and M-tile;
// bf16: one per tile and two M-tiles, 4 warpgroups); prepare quantizes 8 elements per thread
// from 256 tokens and routes over many blocks from 1024.
TEST(ForwardPlan, PrefillKernels) {
  const ForwardPlan p = make_forward_plan(dsv3(Recipe::kMxfp4Bf16, 4096), {});
  EXPECT_EQ(p.tile_n, 160);
  EXPECT_EQ(p.fc1.kernel, GemmKernel::kWgmmaM64);
  EXPECT_EQ(p.fc1.grid_tiles, max_tiles(4096 * 8, 256, 160));
  EXPECT_EQ(p.fc1.grid_ctas, p.fc1.grid_tiles * 32);
  EXPECT_EQ(p.fc2.grid_ctas, p.fc2.grid_tiles * 56);
  EXPECT_EQ(p.quant_per_thread, 8);
  EXPECT_EQ(p.route, RouteKind::kSpread);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kMxfp4Bf16, 255), {}).route, RouteKind::kOneBlock);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kMxfp4Bf16, 1023), {}).route, RouteKind::kBatched);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kMxfp4Bf16, 1024), {}).route, RouteKind::kSpread);
  // Prepare's quantizing blocks: one wave of 4 per SM over the row's parts (DSV3: 2 of 4096).
  EXPECT_EQ(p.prepare_token_blocks, 4 * 132 / 2);
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kNvfp4, 4096), {}).prepare_token_blocks, 4 * 132);
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kNvfp4, 100), {}).prepare_token_blocks, 100);
  EXPECT_NE(p.to_string().find("prepare=q8x264/spread"), std::string::npos) << p.to_string();
  const ForwardPlan b = make_forward_plan(dsv3(Recipe::kBf16, 4096), {});
  EXPECT_EQ(b.tile_n, 160);
  EXPECT_EQ(b.fc1.kernel, GemmKernel::kWgmmaM64);
  EXPECT_EQ(b.fc1.grid_ctas, b.fc1.grid_tiles * 16);  // 64 halves of M-tiles, 4 per CTA
  EXPECT_EQ(b.fc2.grid_ctas, b.fc2.grid_tiles * 28);
  PlanOptions t8;
  t8.tile_n = 8;
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 1), t8).tile_n, 8);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kNvfp4, 255), {}).quant_per_thread, 4);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kNvfp4, 256), {}).quant_per_thread, 8);
}

// The fp8 path: every token count on the persistent fp8 kernel, tiles of 160, one CTA per SM,
// the fine width list for GEMMs of at least 32 M-tiles.
TEST(ForwardPlan, Fp8Path) {
  PlanInputs in = dsv3(Recipe::kMxfp4Mxfp8, 4096);
  in.fp8 = true;
  const ForwardPlan p = make_forward_plan(in, {});
  EXPECT_TRUE(p.fp8);
  EXPECT_EQ(p.tile_n, 160);
  EXPECT_EQ(p.fc1.kernel, GemmKernel::kFp8);
  EXPECT_EQ(p.fc1.grid_ctas, 132);
  EXPECT_TRUE(p.fc1.fp8_fine_widths);  // 32 M-tiles
  EXPECT_TRUE(p.fc2.fp8_fine_widths);  // 56
  in = qwen3(Recipe::kMxfp4Mxfp8, 4096);
  in.fp8 = true;
  EXPECT_FALSE(make_forward_plan(in, {}).fc1.fp8_fine_widths);  // 12 M-tiles
  in.tokens = 1;
  PlanOptions o;
  o.fp8_grid_ctas = 3;
  const ForwardPlan one = make_forward_plan(in, o);
  EXPECT_EQ(one.fc1.kernel, GemmKernel::kFp8);
  EXPECT_EQ(one.fc1.grid_ctas, 3);
  o.tile_n = 8;  // ignored by the fp8 path
  EXPECT_EQ(make_forward_plan(in, o).tile_n, 160);
}

// EP owners (W = 2, DSV3: 128 local experts): the grid covers W x capacity rows; fc1's ring is
// sized for 3 CTAs per SM while this rank's own expected CTAs fit 4 per SM; no fc1 room; the
// route spreads over blocks from 256 tokens per rank.
TEST(ForwardPlan, EpOwner) {
  PlanInputs in = dsv3(Recipe::kNvfp4, 1);
  in.world = 2;
  in.local_experts = 128;
  in.capacity = 128;
  const ForwardPlan p = make_forward_plan(in, {});
  EXPECT_EQ(p.rows, 256);
  EXPECT_EQ(p.tile_n, 8);
  EXPECT_EQ(p.fc1.decode[0].ctas_per_sm, 3);  // 8 tiles x 32 M-tiles <= 4 x 132
  EXPECT_FALSE(p.fc1.decode[0].room_for_fc2);
  EXPECT_EQ(p.route, RouteKind::kBatched);  // 256 rows
  in.tokens = 8;                            // 64 tiles x 32 = 2048 CTAs: the general estimate
  EXPECT_EQ(make_forward_plan(in, {}).fc1.decode[0].ctas_per_sm, 4);
  in.tokens = 256;
  in.capacity = 256;
  EXPECT_EQ(make_forward_plan(in, {}).route, RouteKind::kSpread);
  PlanOptions o;
  o.route_spread = 0;
  EXPECT_EQ(make_forward_plan(in, o).route, RouteKind::kBatched);
  o.combine = CombineMode::kCopy;
  EXPECT_EQ(make_forward_plan(in, o).combine, CombineMode::kCopy);
  EXPECT_NE(make_forward_plan(in, o).to_string().find("combine=copy"), std::string::npos);
}

// Options force a tile; the bf16 recipe maps the tiles it has no kernel for.
TEST(ForwardPlan, OptionsForceTheTile) {
  PlanOptions o;
  for (const int n : {8, 16, 32, 64, 160}) {
    o.tile_n = n;
    EXPECT_EQ(make_forward_plan(dsv3(Recipe::kNvfp4, 64), o).tile_n, n);
  }
  // Tile 64: the narrow m64 kernel on both GEMMs, its grid that of the m64 kernel's groups.
  o.tile_n = 64;
  const ForwardPlan narrow = make_forward_plan(dsv3(Recipe::kMxfp4Bf16, 1024), o);
  EXPECT_EQ(narrow.fc1.kernel, GemmKernel::kWgmmaM64Narrow);
  EXPECT_EQ(narrow.fc2.kernel, GemmKernel::kWgmmaM64Narrow);
  EXPECT_EQ(narrow.fc1.grid_ctas,
            narrow.fc1.grid_tiles * kern::m64_groups(Recipe::kMxfp4Bf16, narrow.fc1.mtiles));
  EXPECT_NE(narrow.to_string().find("fc1=wgmma_m64_narrow["), std::string::npos);
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 64), o).tile_n, 160);
  o.tile_n = 8;
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 64), o).tile_n, 8);
  o.tile_n = 32;
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 64), o).tile_n, 160);
  o.tile_n = 160;
  EXPECT_EQ(make_forward_plan(dsv3(Recipe::kBf16, 64), o).tile_n, 160);
  o.tile_n = 32;
  o.tile32_chunks_per_slot = 4;
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kNvfp4, 64), o).fc2.decode[0].chunks_per_slot, 4);
  o.decode_first_wave = 5;
  EXPECT_EQ(make_forward_plan(qwen3(Recipe::kNvfp4, 64), o).fc1.decode[0].first_wave, 5);
}

// The m64 split: tiles of 160 of a 4-bit recipe, the narrow kernel's grid sized for one narrow
// tile per touched expert, the m64 kernel's for the wide tiles (more than 64 rows each). Never
// for bf16 (no narrow kernel) or the fp8 path, and only on tiles of 160.
TEST(ForwardPlan, M64SplitGrids) {
  PlanOptions o;
  o.m64_split = 1;
  const ForwardPlan p = make_forward_plan(dsv3(Recipe::kNvfp4, 1024), o);  // 8192 pairs, E 256
  ASSERT_EQ(p.tile_n, 160);
  ASSERT_TRUE(p.m64_split);
  const int groups = kern::m64_groups(Recipe::kNvfp4, p.fc1.mtiles);
  EXPECT_EQ(p.fc1.kernel, GemmKernel::kWgmmaM64);
  EXPECT_EQ(p.fc1.m64_narrow_ctas, 256 * groups);
  EXPECT_EQ(p.fc1.grid_ctas, (8192 / 65) * groups);
  EXPECT_EQ(p.fc2.m64_narrow_ctas, 256 * kern::m64_groups(Recipe::kNvfp4, p.fc2.mtiles));
  EXPECT_NE(p.to_string().find(" m64_split "), std::string::npos) << p.to_string();
  EXPECT_NE(p.to_string().find("narrow_ctas="), std::string::npos);
  // 8 pairs: no wide tile fits, the narrow launch alone.
  const ForwardPlan one = make_forward_plan(dsv3(Recipe::kNvfp4, 1), [] {
    PlanOptions q;
    q.m64_split = 1;
    q.tile_n = 160;
    return q;
  }());
  EXPECT_EQ(one.fc1.grid_ctas, 0);
  EXPECT_EQ(one.fc1.m64_narrow_ctas, 8 * kern::m64_groups(Recipe::kNvfp4, one.fc1.mtiles));
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kBf16, 1024), o).m64_split);
  o.tile_n = 32;
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kNvfp4, 1024), o).m64_split);
  o.tile_n = 0;
  o.m64_split = 0;
  const ForwardPlan off = make_forward_plan(dsv3(Recipe::kNvfp4, 1024), o);
  EXPECT_FALSE(off.m64_split);
  EXPECT_EQ(off.fc1.m64_narrow_ctas, 0);
  EXPECT_EQ(off.fc1.grid_ctas, off.fc1.grid_tiles * groups);
}

// The policy splits the tiles of 160 of a 4-bit recipe on one GPU up to 64 mean rows per
// expert (kM64SplitMaxMeanRows).
TEST(ForwardPlan, M64SplitPolicy) {
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kNvfp4, 640), {}).m64_split);  // 20 rows: tile 32
  EXPECT_TRUE(make_forward_plan(dsv3(Recipe::kNvfp4, 704), {}).m64_split);   // 22 rows
  EXPECT_TRUE(make_forward_plan(dsv3(Recipe::kMxfp4Mxfp8, 2048), {}).m64_split);  // 64 rows
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kNvfp4, 2080), {}).m64_split);      // 65 rows
  EXPECT_FALSE(make_forward_plan(dsv3(Recipe::kBf16, 1024), {}).m64_split);
  PlanInputs in = dsv3(Recipe::kNvfp4, 1024);
  in.fp8 = false;
  in.world = 2;
  in.capacity = 1024;
  EXPECT_FALSE(make_forward_plan(in, {}).m64_split);  // EP owner: not measured
  PlanInputs f = dsv3(Recipe::kMxfp4Mxfp8, 1024);
  f.fp8 = true;
  EXPECT_FALSE(make_forward_plan(f, {}).m64_split);
}

TEST(ForwardPlan, OptionsAreValidated) {
  EXPECT_TRUE(plan_options_reasons(PlanOptions{}, Recipe::kNvfp4).empty());
  PlanOptions o;
  o.tile_n = 12;
  o.tile32_chunks_per_slot = 3;
  o.tile8_frags_per_warp = 4;
  o.tile16_row_split = 2;
  o.route_spread = -2;
  o.decode_first_wave = -1;
  o.fp8_grid_ctas = -1;
  o.m64_split = 2;
  const auto r = plan_options_reasons(o, Recipe::kNvfp4);
  ASSERT_EQ(r.size(), 8u);
  EXPECT_NE(r[0].find("plan_options.tile_n = 12"), std::string::npos) << r[0];
  o = PlanOptions{};
  o.tile_n = 128;  // no kernel has tiles of 128
  EXPECT_EQ(plan_options_reasons(o, Recipe::kNvfp4).size(), 1u);
  EXPECT_EQ(plan_options_reasons(o, Recipe::kBf16).size(), 1u);
  o.tile_n = 160;
  EXPECT_TRUE(plan_options_reasons(o, Recipe::kBf16).empty());
  o.tile_n = 64;
  EXPECT_TRUE(plan_options_reasons(o, Recipe::kNvfp4).empty());
}

// The plan is a pure function of its inputs, prints in one line, and names what it chose.
TEST(ForwardPlan, PureAndPrintable) {
  for (const int T : {0, 1, 7, 128, 480, 640, 4096}) {
    const ForwardPlan a = make_forward_plan(gpt_oss(Recipe::kNvfp4, T), {});
    const ForwardPlan b = make_forward_plan(gpt_oss(Recipe::kNvfp4, T), {});
    EXPECT_EQ(a.to_string(), b.to_string());
    EXPECT_EQ(a.to_string().find('\n'), std::string::npos);
  }
  const std::string s = make_forward_plan(dsv3(Recipe::kNvfp4, 1), {}).to_string();
  EXPECT_NE(s.find("tile=8"), std::string::npos) << s;
  EXPECT_NE(s.find("fc1=decode"), std::string::npos) << s;
  EXPECT_NE(s.find("room_for_fc2"), std::string::npos) << s;
  const ForwardPlan none = make_forward_plan(dsv3(Recipe::kNvfp4, 0), {});
  EXPECT_EQ(none.fc1.kernel, GemmKernel::kNone);
  EXPECT_EQ(ForwardPlan{}.to_string(), "cpu reference T=0");
}

// Routing makes ceil(count_e / tile_n) tiles per touched expert; max_tiles must bound their sum
// for every distribution of `pairs` over the experts (the grids and the tile list rely on it).
TEST(ForwardPlan, MaxTilesBoundsEveryRouting) {
  std::mt19937 rng(7);
  for (const int tn : {8, 16, 128, 256}) {
    for (const int El : {1, 3, 32, 128, 256}) {
      for (const int pairs : {0, 1, 7, 8, 9, 100, 1024, 32768}) {
        auto tiles_of = [&](const std::vector<int>& c) {
          int n = 0;
          for (int v : c) n += (v + tn - 1) / tn;
          return n;
        };
        // Worst cases: every expert one row more than a multiple of tn, and all on one expert.
        std::vector<int> c(El, 0);
        for (int p = 0; p < pairs; ++p) c[p % El] += 1;
        EXPECT_LE(tiles_of(c), max_tiles(pairs, El, tn)) << tn << " " << El << " " << pairs;
        std::fill(c.begin(), c.end(), 0);
        if (El) c[0] = pairs;
        EXPECT_LE(tiles_of(c), max_tiles(pairs, El, tn));
        // The bound is tight: one row on each of the other touched experts.
        const int touched = std::min(pairs, El);
        if (touched > 0) {
          std::fill(c.begin(), c.end(), 0);
          for (int e = 1; e < touched; ++e) c[e] = 1;
          c[0] = pairs - (touched - 1);
          EXPECT_EQ(tiles_of(c), max_tiles(pairs, El, tn)) << tn << " " << El << " " << pairs;
        }
        for (int trial = 0; trial < 20; ++trial) {
          std::fill(c.begin(), c.end(), 0);
          std::uniform_int_distribution<int> pick(0, El - 1);
          for (int p = 0; p < pairs; ++p) c[pick(rng)] += 1;
          EXPECT_LE(tiles_of(c), max_tiles(pairs, El, tn)) << tn << " " << El << " " << pairs;
        }
      }
    }
  }
  // The workspace's tile list is sized for the smallest tile width, which bounds the others.
  for (const int tn : {16, 128})
    EXPECT_LE(max_tiles(32768, 256, tn), max_tiles(32768, 256, kMinTileN));
}

// Resident weights hold exactly the checkpoint's 4-bit / bf16 bytes; fc2's rows are padded to
// whole 128-row M-tiles (gpt-oss H = 2880 -> 2944 rows).
TEST(ForwardPlan, ResidentSizesMatchTheCheckpoint) {
  struct Shape {
    int H, I;
  };
  for (const Shape s : {Shape{7168, 2048}, Shape{2048, 768}, Shape{2880, 2880}}) {
    for (const Recipe r : kAllRecipes) {
      const ResidentShape rs = resident_shape(r, s.H, s.I);
      const size_t per_elem_x2 = r == Recipe::kBf16 ? 4 : 1;  // bytes per 2 elements
      EXPECT_EQ(rs.fc1_bytes, size_t(2) * s.I * s.H * per_elem_x2 / 2) << s.H;
      const size_t fc2_rows = size_t(rs.fc2_mtiles) * kTileRows;
      EXPECT_GE(fc2_rows, size_t(s.H));
      EXPECT_LT(fc2_rows, size_t(s.H) + kTileRows);
      EXPECT_EQ(rs.fc2_bytes, fc2_rows * s.I * per_elem_x2 / 2) << s.H;
      const int block = recipe_traits(r).e4m3_scales ? 16 : 32;
      if (r != Recipe::kBf16) {
        EXPECT_EQ(rs.fc1_scale_bytes, size_t(2) * s.I * (s.H / block));
        EXPECT_EQ(rs.fc2_scale_bytes, fc2_rows * (s.I / block));
      } else {
        EXPECT_EQ(rs.fc1_scale_bytes, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace moe_ep::kern
