// The launch plan as a pure function (include/moe_ep/plan.h says what a plan holds). Every kernel
// choice of the CUDA backend's forward is made here, from the inputs below and nothing else: no
// environment, no process state. The policy's thresholds are named constants, each with the
// measurement that set it (docs/kernels.md), and tests/unit/test_forward_plan.cpp pins them.
#pragma once

#include <cstdint>

#include "kernels/common/forward_args.h"
#include "moe_ep/config.h"
#include "moe_ep/plan.h"

namespace moe_ep::plan {

struct PlanInputs {
  Recipe recipe = Recipe::kBf16;
  int H = 0, I = 0, K = 0;
  int local_experts = 0;  // E_local
  int world = 1;          // W
  bool fp8 = false;       // mxfp4_mxfp8 on fp8 tensor cores (RecipeConfig::fp8_mma)
  // Expert biases or an activation slope / offset (contract §3.1): the GEMMs' extended epilogue.
  bool extended_epilogue = false;
  int num_sms = 132;  // multiprocessors of the device
  int tokens = 0;     // T of this rank (an upper bound where the device holds the count)
  int capacity = 0;   // the workspace's capacity (W > 1: the owner's grid covers W of them)
};

// Mean routed rows per expert up to which a forward takes each tile (single GPU).
// Tile 8 while experts see few rows (a weight stream: the few experts with more than 8 rows
// stream twice, but no MMA work goes to empty columns).
constexpr double kTile8MaxMeanRows = 4.0;
// Tile 16 up to 17 rows, or 14 where tile 32's fc2 runs the lean consumer (4-bit weights,
// I <= kLeanMaxK): measured faster than tile 32 below those bounds (DSV3, Qwen3, gpt-oss).
constexpr double kTile16MaxMeanRows = 17.0, kTile16MaxMeanRowsLeanFc2 = 14.0;
// Tile 32 up to 21 rows; above, the m64 wgmma kernel's tiles of up to 160 rows.
constexpr double kTile32MaxMeanRows = 21.0;
constexpr int kM64TileN = kern::kM64TileN;
constexpr int kM64NarrowTileN = kern::kM64NarrowTileN;
// Single GPU, tiles of 160 of a 4-bit recipe: up to this many mean rows per expert, every
// expert's last tile of at most 64 rows runs on the narrow m64 kernel (three CTAs per SM), the
// others on the m64 kernel (m64_split). Measured against the unsplit kernel, nvfp4: DSV3 768 /
// 1024 / 2048 tokens (24 / 32 / 64 rows) 3101 -> 2975, 3179 -> 3133, 4134 -> 4034 us (Zipf
// 1024: 3560 -> 3439), Qwen3 512 / 1024 (32 / 64 rows) 246 -> 219, 308 -> 295, gpt-oss 1024 /
// 2048 (32 / 64 rows) 987 -> 931, 1244 -> 1189; at 128 rows (Qwen3 2048, gpt-oss and DSV3
// 4096), where no tile is narrow, 1-3 % slower. EP owners: not measured, not chosen.
constexpr double kM64SplitMaxMeanRows = 64.0;
constexpr int kFp8TileN =
    kern::kFp8TileN;  // the fp8 path's (its MMA width follows each tile's rows)

// Tile 32's K-chunks per ring slot for a GEMM of k_total inner values (H for fc1, I for fc2):
// 2, the lean consumer (96 registers, 4 CTAs per SM), up to kLeanMaxK; else 4 (136 registers,
// 3 CTAs per SM, a deeper ring). Lean was faster where a CTA streams at most 32 K-chunks.
constexpr int kLeanMaxK = 2048;
constexpr int tile32_chunks_per_slot(int k_total) { return k_total <= kLeanMaxK ? 2 : 4; }

// Tile 16 runs an expert's narrow last tile (at most 8 rows) on the tile-8 kernel up to this
// many expected rows per expert: 3-11 % faster at 8 rows, 3 % slower at 16.
constexpr double kTile16SplitMaxMeanRows = 10.0;

// The bf16 recipe runs the decode kernel (one weight fragment per consumer warp) with tile 8 up
// to kBf16Tile8MaxMeanRows mean rows per expert and tile 16 up to kBf16Tile16MaxMeanRows (or
// kBf16Tile16MaxMeanRowsShortK where I <= kBf16ShortKMaxI), the m64 kernel above (no tile 32, no
// narrow m64 kernel). Measured on one H200 (medians of two runs, µs; docs/kernels.md §4.3):
//  - against the m64 kernel, uniform routing: faster at 1 token on every shape (Qwen3 41.3 ->
//    28.0, gpt-oss 70.2 -> 57.0, DSV3 176.8 -> 169.9) and up to 4 rows (DSV3 128 tokens 4915 ->
//    4897, gpt-oss 128 1401.5 -> 1388.4); above that level or slower on DSV3 and gpt-oss
//    (gpt-oss 256 tokens, 8 rows: 1448.5 -> 1453.1) and 7-10 % faster on Qwen3 up to 12 rows
//    (128 / 192 tokens 309.0 / 316.0 -> 285.2 / 294.9), slower from 16 (256: 319.8 -> 323.3);
//  - with Zipf routing (an expert with many rows streams its weights once per tile of 16, once
//    per 160 on the m64 kernel): DSV3 2 / 4 / 6 rows 2892 / 3930 / 4382 -> 2916 / 4014 / 4563,
//    gpt-oss 846 / 1186 / 1322 against 854 / 1184 / 1301, Qwen3 2 / 4 / 6 rows 208.5 / 253.9 /
//    287.0 -> 187.0 / 232.9 / 259.0. Qwen3's fc2 has 12 K-chunks (I = 768), where the m64
//    kernel's ring fill and epilogue weigh most;
//  - tile 8 against tile 16: faster at a quarter of a row and below (Qwen3 2 tokens 44.3 against
//    48.8, gpt-oss 105.7 against 115.2), level at 1 row, slower from 2 under Zipf (DSV3 2 / 4
//    rows 2939 / 4115 against 2916 / 4014).
constexpr double kBf16Tile8MaxMeanRows = 1.0;
constexpr double kBf16Tile16MaxMeanRows = 4.0, kBf16Tile16MaxMeanRowsShortK = 12.0;
constexpr int kBf16ShortKMaxI = 1024;

// Prepare's quantizing blocks (kPrepThreads threads, four fit an SM) in all, at most: one wave.
constexpr int kPrepBlocksPerSm = 4;

// From this many token rows on, prepare quantizes 8 elements per thread; from this many tokens
// on an EP owner's route spreads over blocks (route_spread, then route_scatter_kernel; an owner
// with fewer tokens but as many rows routes in one block, in batches).
constexpr int kPrepWideTokens = 256;
// One GPU: the route spreads over blocks from this many tokens (Qwen3 nvfp4 / bf16: 4096 tokens
// 803 -> 784 / 788 -> 759 us, 1024 tokens 310 -> 307 / 370 -> 366, 256 tokens 187 -> 189 /
// 320 -> 321; DSV3 level), in one block below.
constexpr int kSpreadMinTokensOneGpu = 1024;
// Route spread over blocks needs K at most one block's pairs.
constexpr int kSpreadMaxTopK = kern::kPrepThreads;

// The tile of a single-GPU forward of `tokens` tokens (before the bf16 mapping of tile 32).
int choose_tile_n(int tokens, int top_k, int local_experts, Recipe recipe, int intermediate);
// An EP owner's tile: from twice its mean rows per expert (every rank's T about ours; measured
// faster at W = 2 for 32 to 4096 tokens per rank), never tile 32 (slower at 128 / 160 tokens per
// rank on DSV3 at W = 2); bf16 weights take their single-GPU bounds (bf16_tile_for_mean) on
// that mean (not measured at W = 2).
int choose_owner_tile_n(int tokens, int world, int top_k, int local_experts, Recipe recipe,
                        int intermediate);

ForwardPlan make_forward_plan(const PlanInputs& in, const PlanOptions& options);

}  // namespace moe_ep::plan
