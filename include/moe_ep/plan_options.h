// Explicit launch-plan choices (LayerConfig::plan_options; include/moe_ep/plan.h describes the
// plan they steer). Plain data with no dependencies, so config.h can hold it.
#pragma once

#include <cstdint>

namespace moe_ep {

// How fc2's rows reach the source ranks at W > 1 (docs/protocol.md).
enum class CombineMode : uint8_t {
  kFused,       // fc2 stores each row straight into its source's combine area; a signal follows
  kCopy,        // fc2 writes a local buffer that the combine kernel copies to the sources
  kFusedFence,  // kFused, and every storing thread fences system-wide after its rows
};
const char* combine_mode_name(CombineMode m);

// Explicit choices for tests, benchmarks and experiments (LayerConfig::plan_options). Each
// field's default leaves the choice to the plan's policy, which is what an engine gets.
struct PlanOptions {
  // Tokens per routing tile. 0: the policy. 4-bit recipes: 8, 16, 32 (the decode kernel), 64
  // (the narrow m64 wgmma kernel) or 160 (the m64 wgmma kernel); the bf16 recipe runs 8 and 16
  // (the decode kernel) or 160 (the m64 kernel), and maps 32 and 64 to 160. Ignored by the fp8
  // path (RecipeConfig::fp8_mma).
  int tile_n = 0;
  // Tile 16 of a 4-bit recipe: run an expert's last tile of at most 8 rows on the tile-8
  // kernel. -1: the policy (at most 10 expected rows per expert), 0: never, 1: always.
  int tile16_row_split = -1;
  // Tile 32: K-chunks per ring slot, 2 (the lean consumer) or 4. 0: the policy.
  int tile32_chunks_per_slot = 0;
  // Tile 8: weight fragments per consumer warp, 1 or 2 (bf16 weights: 1 only). 0: the policy.
  int tile8_frags_per_warp = 0;
  // Tiles of 160 of a 4-bit recipe: run each expert's last tile of at most 64 rows on the
  // narrow m64 kernel. -1: the policy, 0: never, 1: always.
  int m64_split = -1;
  // Route over many blocks (EP owners): -1 the policy, 0 never, 1 always.
  int route_spread = -1;
  // > 0: the decode kernels' first wave holds this many CTAs (the rest set up late), so small
  // grids exercise the late path. 0: the SMs' worth.
  int decode_first_wave = 0;
  // > 0: the fp8 kernel runs this many persistent CTAs. 0: one per SM.
  int fp8_grid_ctas = 0;
  // The fp8 kernel's MMA widths: -1 the policy (the fine list for GEMMs of many M-tiles, the
  // coarse one otherwise), 0 the coarse list, 1 the fine one.
  int fp8_fine_widths = -1;
  // W > 1 only.
  CombineMode combine = CombineMode::kFused;
};

}  // namespace moe_ep
