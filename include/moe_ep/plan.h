// The launch plan of one forward: which kernels run, on which tiles and grids, with which
// rings. One pure function (src/plan/forward_plan.h) computes it from the layer's configuration,
// the token count, the device's SM count and the explicit PlanOptions below; the CUDA backend's
// launch code executes it and decides nothing. MegaLayer::plan() and last_plan() return it, and
// to_string() prints it in one line (`moe-ep run --explain`, the benchmark's JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/plan_options.h"

namespace moe_ep {

// Why these options cannot be honoured (empty when they can); part of unsupported_reasons().
std::vector<std::string> plan_options_reasons(const PlanOptions& o, Recipe recipe);

enum class GemmKernel : uint8_t {
  kNone,      // no launch (no tokens)
  kDecode,    // sm90 decode kernel: weight stream through a bulk-copy ring, tiles of 8-32 rows
  kWgmmaM64,  // sm90 wgmma m64 kernel, tiles of up to 160 rows
  kWgmmaM64Narrow,  // the same kernel on tiles of up to 64 rows, three CTAs per SM (4-bit)
  kFp8,             // sm90 fp8 wgmma kernel, persistent (mxfp4_mxfp8 with fp8_mma)
};
const char* gemm_kernel_name(GemmKernel k);

enum class RouteKind : uint8_t {
  kOneBlock,  // one block routes (one warp where there are at most 32 pairs), one id at a time
  kBatched,   // one block routes, loading 8 ids per thread before using any
  kSpread,    // every quantizing block counts its pairs; the last one lays out the tiles
};
const char* route_kind_name(RouteKind k);

// One launch of the decode kernel.
struct DecodeLaunchPlan {
  int tile_n = 0;             // the kernel's tile: 8, 16 or 32 rows
  int grid_tiles = 0;         // routing tiles the grid covers (x dimension)
  int chunks_per_slot = 0;    // K-chunks of 64 per ring slot
  int frags_per_warp = 0;     // weight fragments per consumer warp (1 or 2)
  int ctas_per_sm = 0;        // CTAs per SM the ring is sized for
  int stages = 0;             // ring slots
  int smem_bytes = 0;         // dynamic shared memory asked for
  int first_wave = 0;         // CTAs that set up before their wait for the previous kernel
  bool room_for_fc2 = false;  // fc1 sized to leave an SM room for one fc2 CTA
  int tile_part = 0;          // 0: every tile; 1 / 2: the narrow / wide tiles of a row split
};

struct GemmPlan {
  GemmKernel kernel = GemmKernel::kNone;
  int grid_tiles = 0;  // routing tiles the grid is sized for (a bound; the device counts them)
  int mtiles = 0;      // M-tiles of 128 weight rows (fc1: 64 gate + 64 up rows)
  int num_decode_launches = 0;  // kDecode: 1, or 2 where tile 16 splits its rows
  DecodeLaunchPlan decode[2];
  int grid_ctas = 0;  // kWgmmaM64 / kWgmmaM64Narrow / kFp8: CTAs launched
  // kWgmmaM64 split by rows (ForwardPlan::m64_split): the narrow kernel's CTAs for the narrow
  // tiles, launched after grid_ctas CTAs of the m64 kernel for the wide ones; 0 without a split.
  int m64_narrow_ctas = 0;
  bool fp8_fine_widths = false;  // kFp8: the fine list of MMA widths (many M-tiles)
};

struct ForwardPlan {
  Backend backend = Backend::kCPU;  // the CPU reference has no launches
  int tokens = 0;                   // T of this rank
  int rows = 0;                // token rows of the expert side: T, or W * capacity on an EP owner
  int64_t expected_pairs = 0;  // routed (token, expert) pairs this rank expects
  double mean_rows_per_expert = 0;
  int tile_n = 0;
  bool fp8 = false;
  // The GEMMs run the extended expert epilogue (biases, activation slope and offset: gpt-oss).
  bool extended_epilogue = false;
  int quant_per_thread = 0;  // activation elements per prepare thread (4 or 8)
  // Prepare's quantizing blocks per part of a row: block b takes tokens b, b + this, ... (one
  // wave of the SMs at most, instead of a block per token).
  int prepare_token_blocks = 0;
  RouteKind route = RouteKind::kOneBlock;
  bool tile16_row_split = false;
  // Tiles of 160 (4-bit weights): every expert's last tile of at most 64 rows runs on the narrow
  // m64 kernel, the others on the m64 kernel.
  bool m64_split = false;
  int fp8_forced_widths = -1;  // PlanOptions::fp8_fine_widths as the fp8 kernel reads it
  GemmPlan fc1, fc2;
  int world = 1;
  CombineMode combine = CombineMode::kFused;  // world > 1

  // One line, e.g. "cuda T=128 rows/expert=4.0 tile=8 prepare=q4/batched fc1=decode[...]".
  std::string to_string() const;
};

}  // namespace moe_ep
