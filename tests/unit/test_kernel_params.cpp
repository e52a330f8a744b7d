// Host-side arithmetic of the CUDA backend's kernel parameters (src/kernels/moe/moe_params.h):
// the tile width choice, the bound the grids and the workspace tile list are sized by, and the
// kernel-resident weight sizes. Plain C++, so it runs here although the kernels cannot.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/env_switch.h"
#include "kernels/moe/moe_params.h"

namespace moe_ep::kern {
namespace {

// The on/off knobs: exactly "1" or "0" switch, anything else keeps the default.
TEST(KernelParams, EnvSwitchKnobValues) {
  const char* name = "MOE_EP_TEST_ENV_SWITCH";
  unsetenv(name);
  EXPECT_TRUE(env_switch(name, true));
  EXPECT_FALSE(env_switch(name, false));
  setenv(name, "0", 1);
  EXPECT_FALSE(env_switch(name, true));
  setenv(name, "1", 1);
  EXPECT_TRUE(env_switch(name, false));
  for (const char* other : {"", "01", "10", "2", "yes", "0 "}) {
    setenv(name, other, 1);
    EXPECT_TRUE(env_switch(name, true)) << "'" << other << "'";
    EXPECT_FALSE(env_switch(name, false)) << "'" << other << "'";
    EXPECT_EQ(env_mode(name), -1) << "'" << other << "'";
  }
  setenv(name, "0", 1);
  EXPECT_EQ(env_mode(name), 0);
  setenv(name, "1", 1);
  EXPECT_EQ(env_mode(name), 1);
  unsetenv(name);
  EXPECT_EQ(env_mode(name), -1);
}

// The host's estimate of the routing tiles (the decode ring and split-K policy size from it):
// one per pair below the expert count, else full tiles. DSV3 (256 experts, K 8).
TEST(KernelParams, ExpectedTilesAtDecodeSizes) {
  EXPECT_EQ(expected_tiles(8, 256, 8), 8);         // 1 token
  EXPECT_EQ(expected_tiles(1024, 256, 8), 256);    // 128 tokens: every expert
  EXPECT_EQ(expected_tiles(32768, 256, 8), 4096);  // 4096 tokens: full tiles
  EXPECT_EQ(expected_tiles(1024, 128, 16), 128);   // EP = 2's owner at 64 tokens per rank
  EXPECT_EQ(expected_tiles(0, 256, 8), 0);
}

// An EP owner's fc1 ring: 3 CTAs per SM while the CTAs of the pairs it expects fit 4 per SM;
// otherwise (0) the general estimate. DSV3 at EP = 2: 128 local experts, 32 fc1 M-tiles.
TEST(KernelParams, OwnerFc1RingAtFewTokens) {
  ForwardArgs a;
  a.local_experts = 128;
  a.num_sms = 132;
  a.xq_ready = true;
  a.owner_pairs = 1 * 8;  // 1 token per rank: 8 tiles x 32 M-tiles = 256 CTAs
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 1), 3);
  a.owner_pairs = 2 * 8;  // 512 CTAs <= 528
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 1), 3);
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 2), 0);  // split in two: 1024 CTAs
  a.owner_pairs = 8 * 8;                             // 64 tiles: 2048 CTAs
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 1), 0);
  a.owner_pairs = 8;
  a.xq_ready = false;  // not an EP owner
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 1), 0);
  a.xq_ready = true;
  a.owner_pairs = 0;  // no estimate given
  EXPECT_EQ(owner_fc1_ctas_per_sm(a, 8, 32, 1), 0);
}

// The tile width is 8 up to 4 mean rows per expert, 16 up to 17 (14 where tile 32's fc2 runs the
// lean consumer), 32 up to 21, else kM64TileN (160).
TEST(KernelParams, TileWidthFollowsMeanRowsPerExpert) {
  // DeepSeek-V3, EP = 1: K 8, 256 experts -> mean rows = T / 32; I = 2048, so fc2 runs lean.
  const double dsv3 = tile16_max_mean_rows(Recipe::kNvfp4, 2048);
  EXPECT_EQ(dsv3, 14.0);
  EXPECT_EQ(choose_tile_n(1, 8, 256, dsv3), 8);
  EXPECT_EQ(choose_tile_n(128, 8, 256, dsv3), 8);    // 4 rows
  EXPECT_EQ(choose_tile_n(129, 8, 256, dsv3), 16);   // just above 4
  EXPECT_EQ(choose_tile_n(448, 8, 256, dsv3), 16);   // 14 rows
  EXPECT_EQ(choose_tile_n(449, 8, 256, dsv3), 32);   // just above 14
  EXPECT_EQ(choose_tile_n(512, 8, 256, dsv3), 32);   // 16 rows
  EXPECT_EQ(choose_tile_n(576, 8, 256, dsv3), 32);   // 18 rows
  EXPECT_EQ(choose_tile_n(640, 8, 256, dsv3), 32);   // 20 rows
  EXPECT_EQ(choose_tile_n(672, 8, 256, dsv3), 32);   // 21 rows
  EXPECT_EQ(choose_tile_n(673, 8, 256, dsv3), 160);  // just above 21
  EXPECT_EQ(choose_tile_n(768, 8, 256, dsv3), 160);  // 24 rows
  EXPECT_EQ(choose_tile_n(2048, 8, 256, dsv3), 160);
  EXPECT_EQ(choose_tile_n(4096, 8, 256, dsv3), 160);
  EXPECT_EQ(kM64TileN, 160);
  // Qwen3 (I = 768) as DSV3; gpt-oss (I = 2880, K 4, 128 experts: mean rows = T / 32) and bf16
  // weights keep tile 16 up to 17 rows.
  EXPECT_EQ(tile16_max_mean_rows(Recipe::kMxfp4Mxfp8, 768), 14.0);
  const double gpt_oss = tile16_max_mean_rows(Recipe::kNvfp4, 2880);
  EXPECT_EQ(gpt_oss, 17.0);
  EXPECT_EQ(tile16_max_mean_rows(Recipe::kBf16, 2048), 17.0);
  EXPECT_EQ(choose_tile_n(512, 4, 128, gpt_oss), 16);  // 16 rows
  EXPECT_EQ(choose_tile_n(544, 4, 128, gpt_oss), 16);  // 17 rows
  EXPECT_EQ(choose_tile_n(545, 4, 128, gpt_oss), 32);  // just above 17
  EXPECT_EQ(choose_tile_n(544, 4, 128), 16);           // the default bound is 17
  // The layer's choice (the backend's and bench_layer's) takes the bound of its recipe and I.
  EXPECT_EQ(choose_layer_tile_n(480, 8, 256, Recipe::kNvfp4, 2048), 32);  // DSV3, 15 rows
  EXPECT_EQ(choose_layer_tile_n(480, 8, 256, Recipe::kBf16, 2048), 16);
  EXPECT_EQ(choose_layer_tile_n(544, 4, 128, Recipe::kNvfp4, 2880), 16);  // gpt-oss, 17 rows
  // EP = 2 owner side: W * T virtual tokens over 128 local experts; never tile 32 (at most
  // 10.5 real rows per expert there).
  EXPECT_EQ(choose_owner_tile_n(128, 2, 8, 128), 16);   // W * 16 rows
  EXPECT_EQ(choose_owner_tile_n(160, 2, 8, 128), 16);   // W * 20 rows: 32 on one GPU
  EXPECT_EQ(choose_owner_tile_n(176, 2, 8, 128), 160);  // W * 22 rows
  EXPECT_EQ(choose_owner_tile_n(960, 2, 8, 128), 160);
  EXPECT_EQ(choose_owner_tile_n(4096, 2, 8, 128), 160);
  EXPECT_EQ(choose_owner_tile_n(16, 2, 8, 128), 8);    // W * 2 rows
  EXPECT_EQ(choose_owner_tile_n(640, 1, 8, 256), 32);  // one rank: the single-GPU choice
  // W = 8 (32 local experts): twice the owner's mean, not 8 times.
  EXPECT_EQ(choose_owner_tile_n(1, 8, 8, 32), 8);      // 0.25 rows
  EXPECT_EQ(choose_owner_tile_n(8, 8, 8, 32), 8);      // 2 rows -> 4
  EXPECT_EQ(choose_owner_tile_n(32, 8, 8, 32), 16);    // 8 rows -> 16
  EXPECT_EQ(choose_owner_tile_n(40, 8, 8, 32), 16);    // 10 rows -> 20: 32 on one GPU
  EXPECT_EQ(choose_owner_tile_n(128, 8, 8, 32), 160);  // 32 rows
  EXPECT_EQ(choose_owner_tile_n(32, 4, 8, 64), 16);    // W = 4: 4 rows -> 8
  // No local experts (a degenerate split) does not divide by zero.
  EXPECT_EQ(choose_tile_n(0, 8, 0), 8);
}

// Tile 32's consumer follows the GEMM's K: the lean one on 2-chunk slots up to 2048 inner values
// (32 K-chunks per CTA), the 136-register one on 4-chunk slots above.
TEST(KernelParams, Tile32SlotChunksFollowK) {
  EXPECT_EQ(kDecode32LeanMaxK, 2048);
  EXPECT_EQ(decode32_cps_for(768), 2);   // Qwen3 fc2
  EXPECT_EQ(decode32_cps_for(2048), 2);  // Qwen3 fc1, DSV3 fc2
  EXPECT_EQ(decode32_cps_for(2049), 4);
  EXPECT_EQ(decode32_cps_for(2880), 4);  // gpt-oss fc1 and fc2
  EXPECT_EQ(decode32_cps_for(7168), 4);  // DSV3 fc1
}

// Routing makes ceil(count_e / tile_n) tiles per touched expert; max_tiles must bound their sum
// for every distribution of `pairs` over the experts (the grids and the tile list rely on it).
TEST(KernelParams, MaxTilesBoundsEveryRouting) {
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
// The decode split-K scratch: one slot = one M-tile (128 rows) x tile_n 8 fp32 accumulators,
// fixed in size whatever the capacity (32 MiB + the counters). The DSV3 grid bounds: 1 token
// (8 tiles) fits fc1 (32 M-tiles) and fc2 (56) at 8 splits; 8 tokens (64 tiles) fc1 at 4 and
// fc2 at 2, and 3 splits of fc2 there split less.
TEST(KernelParams, SplitKScratchHoldsTheDecodeGrids) {
  EXPECT_EQ(kSplitKSlotBytes, size_t(128 * 8 * 4));
  EXPECT_EQ(splitk_partial_bytes(), size_t(32) << 20);
  EXPECT_EQ(splitk_counter_bytes(), size_t(kSplitKSlots / 2) * 4);
  const ResidentShape rs = resident_shape(Recipe::kNvfp4, 7168, 2048);
  const int t1 = max_tiles(8, 256, 8), t8 = max_tiles(64, 256, 8);
  EXPECT_EQ(t1, 8);
  EXPECT_EQ(t8, 64);
  EXPECT_LE(t1 * rs.fc1_mtiles * 8, kSplitKSlots);
  EXPECT_LE(t1 * rs.fc2_mtiles * 8, kSplitKSlots);
  EXPECT_LE(t8 * rs.fc1_mtiles * 4, kSplitKSlots);
  EXPECT_LE(t8 * rs.fc2_mtiles * 2, kSplitKSlots);
  EXPECT_GT(t8 * rs.fc2_mtiles * 3, kSplitKSlots);
}

// The benchmark knobs' "N" / "N,M" values (MOE_EP_DECODE_SPLITK, MOE_EP_DECODE_PER_SM):
// {fc2, fc1}, counts outside the range and a missing value give the fallback.
TEST(KernelParams, KnobValuesForFc1AndFc2) {
  using A = std::array<int, 2>;
  EXPECT_EQ(knob_fc1_fc2(nullptr, 1, 4, 0), (A{0, 0}));
  EXPECT_EQ(knob_fc1_fc2("3", 1, 4, 0), (A{3, 3}));
  EXPECT_EQ(knob_fc1_fc2("3,2", 1, 4, 0), (A{2, 3}));
  EXPECT_EQ(knob_fc1_fc2("2,0", 1, 4, 0), (A{0, 2}));
  EXPECT_EQ(knob_fc1_fc2("9", 1, 8, -7), (A{-7, -7}));
  EXPECT_EQ(knob_fc1_fc2("", 1, 8, -7), (A{-7, -7}));
  EXPECT_EQ(knob_fc1_fc2("8,1", 1, 8, -7), (A{1, 8}));
}

TEST(KernelParams, ResidentSizesMatchTheCheckpoint) {
  struct Shape {
    int H, I;
  };
  for (const Shape s : {Shape{7168, 2048}, Shape{2048, 768}, Shape{2880, 2880}}) {
    for (const Recipe r : {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kBf16}) {
      const ResidentShape rs = resident_shape(r, s.H, s.I);
      const size_t per_elem_x2 = r == Recipe::kBf16 ? 4 : 1;  // bytes per 2 elements
      EXPECT_EQ(rs.fc1_bytes, size_t(2) * s.I * s.H * per_elem_x2 / 2) << s.H;
      const size_t fc2_rows = size_t(rs.fc2_mtiles) * kTileRows;
      EXPECT_GE(fc2_rows, size_t(s.H));
      EXPECT_LT(fc2_rows, size_t(s.H) + kTileRows);
      EXPECT_EQ(rs.fc2_bytes, fc2_rows * s.I * per_elem_x2 / 2) << s.H;
      const int block = r == Recipe::kNvfp4 ? 16 : 32;
      if (r != Recipe::kBf16) {
        EXPECT_EQ(rs.fc1_scale_bytes, size_t(2) * s.I * (s.H / block));
        EXPECT_EQ(rs.fc2_scale_bytes, fc2_rows * (s.I / block));
      } else {
        EXPECT_EQ(rs.fc1_scale_bytes, 0u);
      }
    }
  }
}

// The launch dispatch reaches the kernel template of every built shape, and the default for
// any other.
TEST(KernelParams, M64ShapeDispatch) {
  auto dispatched = [](const std::array<int, 2>& shape) {
    return with_m64_shape(shape, [](auto c) {
      return std::array<int, 2>{decltype(c)::kG, decltype(c)::kMinB};
    });
  };
  for (const auto& shape : kM64Shapes) EXPECT_EQ(dispatched(shape), shape);
  EXPECT_EQ(dispatched({9, 9}), kM64Default);
  EXPECT_EQ(dispatched({1, 1}), kM64Default);
}

TEST(KernelParams, M64ShapeKnob) {
  using Shape = std::array<int, 2>;
  // Index 1 is fc1, index 0 fc2.
  EXPECT_EQ(parse_m64_shapes(nullptr)[1], kM64Default);
  EXPECT_EQ(parse_m64_shapes(nullptr)[0], kM64Default);
  EXPECT_EQ(parse_m64_shapes("1x3")[1], (Shape{1, 3}));
  EXPECT_EQ(parse_m64_shapes("1x3")[0], (Shape{1, 3}));
  EXPECT_EQ(parse_m64_shapes("4x1,1x3")[1], (Shape{4, 1}));
  EXPECT_EQ(parse_m64_shapes("4x1,1x3")[0], (Shape{1, 3}));
  // Shapes that are not built, or malformed values, fall back to the default.
  EXPECT_EQ(parse_m64_shapes("9x9")[1], kM64Default);
  EXPECT_EQ(parse_m64_shapes("2x2,9x9")[1], (Shape{2, 2}));
  EXPECT_EQ(parse_m64_shapes("2x2,9x9")[0], kM64Default);
  EXPECT_EQ(parse_m64_shapes("4x1,")[1], kM64Default);
  EXPECT_EQ(parse_m64_shapes("")[0], kM64Default);
  EXPECT_EQ(parse_m64_shapes("13")[0], kM64Default);
}

}  // namespace
}  // namespace moe_ep::kern
