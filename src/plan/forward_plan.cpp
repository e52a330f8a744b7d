#include "plan/forward_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/gemm/decode/decode_config.h"

namespace moe_ep {

const char* combine_mode_name(CombineMode m) {
  switch (m) {
    case CombineMode::kFused:
      return "fused";
    case CombineMode::kCopy:
      return "copy";
    case CombineMode::kFusedFence:
      return "fused_fence";
  }
  return "?";
}

const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::kNone:
      return "none";
    case GemmKernel::kDecode:
      return "decode";
    case GemmKernel::kWgmmaM64:
      return "wgmma_m64";
    case GemmKernel::kWgmmaM64Narrow:
      return "wgmma_m64_narrow";
    case GemmKernel::kFp8:
      return "fp8";
  }
  return "?";
}

const char* route_kind_name(RouteKind k) {
  switch (k) {
    case RouteKind::kOneBlock:
      return "one_block";
    case RouteKind::kBatched:
      return "batched";
    case RouteKind::kSpread:
      return "spread";
  }
  return "?";
}

std::vector<std::string> plan_options_reasons(const PlanOptions& o, Recipe recipe) {
  std::vector<std::string> r;
  auto bad = [&](const char* field, int v, const char* allowed) {
    r.push_back(std::string("plan_options.") + field + " = " + std::to_string(v) +
                " is not one of " + allowed);
  };
  if (o.tile_n != 0 && o.tile_n != 8 && o.tile_n != 16 && o.tile_n != 32 &&
      o.tile_n != plan::kM64NarrowTileN && o.tile_n != plan::kM64TileN)
    bad("tile_n", o.tile_n, "0 (policy), 8, 16, 32, 64, 160");
  if (o.tile16_row_split < -1 || o.tile16_row_split > 1)
    bad("tile16_row_split", o.tile16_row_split, "-1 (policy), 0, 1");
  if (o.tile32_chunks_per_slot != 0 && o.tile32_chunks_per_slot != 2 &&
      o.tile32_chunks_per_slot != 4)
    bad("tile32_chunks_per_slot", o.tile32_chunks_per_slot, "0 (policy), 2, 4");
  if (o.tile8_frags_per_warp < 0 || o.tile8_frags_per_warp > 2)
    bad("tile8_frags_per_warp", o.tile8_frags_per_warp, "0 (policy), 1, 2");
  else if (recipe == Recipe::kBf16 && o.tile8_frags_per_warp == 2)
    bad("tile8_frags_per_warp", o.tile8_frags_per_warp,
        "0 (policy), 1 for bf16 weights (one fragment per consumer warp)");
  if (o.m64_split < -1 || o.m64_split > 1) bad("m64_split", o.m64_split, "-1 (policy), 0, 1");
  if (o.route_spread < -1 || o.route_spread > 1)
    bad("route_spread", o.route_spread, "-1 (policy), 0, 1");
  if (o.decode_first_wave < 0) bad("decode_first_wave", o.decode_first_wave, "0 (policy) or > 0");
  if (o.fp8_grid_ctas < 0) bad("fp8_grid_ctas", o.fp8_grid_ctas, "0 (policy) or > 0");
  if (o.fp8_fine_widths < -1 || o.fp8_fine_widths > 1)
    bad("fp8_fine_widths", o.fp8_fine_widths, "-1 (policy), 0, 1");
  return r;
}

namespace {

void append(std::string& s, const char* fmt, auto... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, args...);
  s += buf;
}

std::string gemm_string(const GemmPlan& g) {
  std::string s = gemm_kernel_name(g.kernel);
  if (g.kernel == GemmKernel::kNone) return s;
  append(s, "[tiles=%d mtiles=%d", g.grid_tiles, g.mtiles);
  if (g.kernel == GemmKernel::kDecode) {
    for (int i = 0; i < g.num_decode_launches; ++i) {
      const DecodeLaunchPlan& d = g.decode[i];
      append(s, " %s{n=%d grid=%d cps=%d fw=%d per_sm=%d stages=%d smem=%d%s}",
             d.tile_part == 1   ? "narrow"
             : d.tile_part == 2 ? "wide"
                                : "launch",
             d.tile_n, d.grid_tiles, d.chunks_per_slot, d.frags_per_warp, d.ctas_per_sm, d.stages,
             d.smem_bytes, d.room_for_fc2 ? " room_for_fc2" : "");
    }
  } else {
    append(s, " ctas=%d", g.grid_ctas);
    if (g.m64_narrow_ctas > 0) append(s, " narrow_ctas=%d", g.m64_narrow_ctas);
    if (g.kernel == GemmKernel::kFp8) s += g.fp8_fine_widths ? " widths=fine" : " widths=coarse";
  }
  return s + "]";
}

}  // namespace

std::string ForwardPlan::to_string() const {
  if (backend == Backend::kCPU) {
    std::string s;
    append(s, "cpu reference T=%d", tokens);
    return s;
  }
  std::string s;
  append(s, "cuda T=%d rows=%d pairs=%lld rows/expert=%.2f tile=%d%s prepare=q%dx%d/%s%s%s", tokens,
         rows, static_cast<long long>(expected_pairs), mean_rows_per_expert, tile_n,
         fp8 ? " fp8" : "", quant_per_thread, prepare_token_blocks, route_kind_name(route),
         tile16_row_split ? " row_split" : "", m64_split ? " m64_split" : "");
  s += " fc1=" + gemm_string(fc1) + " fc2=" + gemm_string(fc2);
  if (extended_epilogue) s += " epilogue=extended";
  if (world > 1) append(s, " W=%d combine=%s", world, combine_mode_name(combine));
  return s;
}

namespace plan {
namespace {

// The pairs an EP owner expects (its sources' T about its own, a 1/W share of their slots
// each), or 0 on one GPU. An owner's grid covers W x capacity rows; its rings and its row split
// follow these pairs instead, where it expects any.
int64_t owner_pairs(const PlanInputs& in) { return in.world > 1 ? int64_t(in.tokens) * in.K : 0; }

double mean_rows(int64_t pairs, int local_experts) {
  return double(pairs) / (local_experts > 0 ? local_experts : 1);
}

int tile_for_mean(double mean, double tile16_max) {
  return mean <= kTile8MaxMeanRows    ? 8
         : mean <= tile16_max         ? 16
         : mean <= kTile32MaxMeanRows ? 32
                                      : kM64TileN;
}

// The bf16 recipe has no tile-32 decode kernel and no narrow m64 kernel: tiles 32 and 64 run
// as the m64 kernel's 160.
int recipe_tile(Recipe r, int n) {
  if (r != Recipe::kBf16) return n;
  return n == 32 || n == kM64NarrowTileN ? kM64TileN : n;
}

// Ring depth and shared memory of one decode launch sized for per_sm CTAs per SM: as deep as the
// shared memory of per_sm CTAs allows, in exactly that memory. Except room for fc2: a tile-8 fc1
// sized for 2 CTAs per SM on one GPU asks for a third of the SM (3 slots instead of 4), so a
// third fc1 CTA still does not fit but one fc2 CTA at its smallest ring does, and becomes
// resident and queues its first slots during fc1 (DSV3 1 token nvfp4 70.4-70.8 -> 69.5-69.8 us).
void size_ring(DecodeLaunchPlan& d, Recipe r, bool fc1, bool owner_expects_pairs) {
  const int stage = kern::decode_stage_bytes(r, d.tile_n, d.chunks_per_slot);
  const int lo = kern::decode_min_stages(r, d.chunks_per_slot);
  const int hi = kern::decode_max_stages(r, d.tile_n, d.chunks_per_slot);
  int stages = (kern::kSmemPerSm / d.ctas_per_sm - kern::kDecodeStaticBound) / stage;
  stages = std::max(lo, std::min(hi, stages));
  d.smem_bytes = stages * stage;
  if (fc1 && d.tile_n == 8 && d.ctas_per_sm == 2 && !owner_expects_pairs) {
    constexpr int kThird = kern::kSmemPerSm / 3;
    stages = std::max(lo, std::min(stages, kThird / stage));
    d.smem_bytes = std::max(stages * stage, kThird);
    d.room_for_fc2 = true;
  }
  d.stages = stages;
}

struct GemmShape {
  bool fc1;
  int mtiles, k_total;
};

// CTAs per SM a decode ring is sized for: the expected grid over the SMs, at most 4 (beyond that
// they run in later waves anyway, and a deeper ring keeps more bytes in flight than more CTAs).
// An EP owner's fc1 takes 3 while its own expected CTAs fit 4 per SM: the estimate from W x
// capacity rows says 4 (2-slot rings), this rank's own share 2, and the rank that then gets more
// tiles runs a second wave (DSV3 nvfp4 at W = 2, 1 / 2 tokens per rank: 141 / 201 -> 128 / 185 us).
int decode_ctas_per_sm(const PlanInputs& in, const ForwardPlan& p, const GemmShape& g, int n) {
  if (g.fc1 && owner_pairs(in) > 0 && in.num_sms > 0) {
    const int own = kern::expected_tiles(int(owner_pairs(in)), in.local_experts, n);
    if (int64_t(own) * g.mtiles <= 4LL * in.num_sms) return 3;
  }
  const int64_t ctas =
      int64_t(kern::expected_tiles(int(int64_t(p.rows) * in.K), in.local_experts, n)) * g.mtiles;
  return int(std::min<int64_t>(4, std::max<int64_t>(1, (ctas + in.num_sms - 1) / in.num_sms)));
}

// K-chunks per ring slot of tiles 8 and 16: 4 (16 KB of 4-bit weights), or 2 for bf16 weights
// (32 KB), so that two CTAs of two-slot rings fit an SM.
int decode_chunks_per_slot(Recipe r) { return r == Recipe::kBf16 ? 2 : 4; }

DecodeLaunchPlan decode_launch(const PlanInputs& in, const PlanOptions& o, const GemmShape& g,
                               int n, int cps, int grid_tiles, int per_sm) {
  DecodeLaunchPlan d;
  d.tile_n = n;
  d.grid_tiles = grid_tiles;
  d.chunks_per_slot = cps;
  // bf16 fragments are four times the registers of 4-bit words: one per consumer warp.
  d.frags_per_warp = in.recipe == Recipe::kBf16 ? 1 : 2;
  // At most what fits an SM at the ring's smallest depth.
  d.ctas_per_sm = std::min(per_sm, kern::decode_max_per_sm(in.recipe, n, cps));
  d.first_wave = o.decode_first_wave > 0 ? o.decode_first_wave : in.num_sms * d.ctas_per_sm;
  size_ring(d, in.recipe, g.fc1, owner_pairs(in) > 0);
  return d;
}

GemmPlan decode_plan(const PlanInputs& in, const PlanOptions& o, const ForwardPlan& p,
                     const GemmShape& g) {
  GemmPlan gp;
  gp.kernel = GemmKernel::kDecode;
  gp.mtiles = g.mtiles;
  const int n = p.tile_n;
  const int64_t pairs = int64_t(p.rows) * in.K;
  gp.grid_tiles = kern::max_tiles(int(pairs), in.local_experts, n);
  if (gp.grid_tiles == 0) {
    gp.kernel = GemmKernel::kNone;
    return gp;
  }
  const int per_sm = decode_ctas_per_sm(in, p, g, n);
  gp.num_decode_launches = 1;
  if (n == 32) {
    const int cps =
        o.tile32_chunks_per_slot ? o.tile32_chunks_per_slot : tile32_chunks_per_slot(g.k_total);
    gp.decode[0] = decode_launch(in, o, g, n, cps, gp.grid_tiles, per_sm);
  } else if (n == 16 && p.tile16_row_split) {
    // The narrow tiles (an expert's last, at most 8 rows; at most one per touched expert) on the
    // tile-8 kernel first, then the wide ones (at least 9 rows each) on this kernel, which waits
    // for the first launch at its end.
    gp.num_decode_launches = 2;
    const int narrow = std::min<int64_t>(gp.grid_tiles, std::min<int64_t>(pairs, in.local_experts));
    gp.decode[0] = decode_launch(in, o, g, 8, 4, narrow, per_sm);
    gp.decode[0].tile_part = 1;
    gp.decode[1] =
        decode_launch(in, o, g, 16, 4, std::min<int64_t>(gp.grid_tiles, pairs / 9), per_sm);
    gp.decode[1].tile_part = 2;
  } else {
    const int cps = decode_chunks_per_slot(in.recipe);
    gp.decode[0] = decode_launch(in, o, g, n, cps, gp.grid_tiles, per_sm);
    // Tile 8: one fragment per consumer warp (8 consumer warps, the same sums in the same order)
    // for NVFP4 weights (nvfp4, nvfp4_bf16: the same weight stream and decode) where the grid
    // holds at most one CTA per SM (nvfp4 Qwen3 1 token 25.6 -> 23.1 us, gpt-oss 39.9-40.2 ->
    // 37.7-38.1); at more CTAs per SM, and for mxfp4 (half the lanes would convert scale bytes),
    // two were level or faster.
    if (n == 8 && in.recipe != Recipe::kBf16)
      gp.decode[0].frags_per_warp =
          o.tile8_frags_per_warp ? o.tile8_frags_per_warp
                                 : (recipe_traits(in.recipe).e4m3_scales && per_sm == 1 ? 1 : 2);
  }
  return gp;
}

GemmPlan gemm_plan(const PlanInputs& in, const PlanOptions& o, const ForwardPlan& p,
                   const GemmShape& g) {
  const int64_t pairs = int64_t(p.rows) * in.K;
  if (p.fp8) {
    GemmPlan gp;
    gp.kernel = GemmKernel::kFp8;
    gp.mtiles = g.mtiles;
    gp.grid_tiles = kern::max_tiles(int(pairs), in.local_experts, kFp8TileN);
    const int64_t items = int64_t(gp.grid_tiles) * g.mtiles;
    gp.grid_ctas = int(
        std::min<int64_t>(items, o.fp8_grid_ctas > 0 ? o.fp8_grid_ctas : std::max(1, in.num_sms)));
    // The fine list of MMA widths where a GEMM has many M-tiles (DSV3 at 4096 tokens 4671-4702
    // -> 4543-4565 us); with few (Qwen3) the SMs then ran many width classes at once (slower).
    gp.fp8_fine_widths =
        o.fp8_fine_widths >= 0 ? o.fp8_fine_widths == 1 : g.mtiles >= kern::kFp8FineMinMTiles;
    if (gp.grid_tiles == 0) gp.kernel = GemmKernel::kNone;
    return gp;
  }
  if (p.tile_n == 8 || p.tile_n == 16 || p.tile_n == 32) return decode_plan(in, o, p, g);
  GemmPlan gp;
  gp.mtiles = g.mtiles;
  gp.grid_tiles = kern::max_tiles(int(pairs), in.local_experts, p.tile_n);
  gp.kernel = p.tile_n == kM64NarrowTileN ? GemmKernel::kWgmmaM64Narrow : GemmKernel::kWgmmaM64;
  const int groups = kern::m64_groups(in.recipe, g.mtiles);
  gp.grid_ctas = gp.grid_tiles * groups;
  if (p.m64_split && gp.grid_tiles > 0) {
    // At most one narrow tile per touched expert; every wide tile holds more than 64 rows.
    const int64_t narrow =
        std::min<int64_t>(std::min<int64_t>(pairs, in.local_experts), gp.grid_tiles);
    const int64_t wide = std::min<int64_t>(pairs / (kM64NarrowTileN + 1), gp.grid_tiles);
    gp.m64_narrow_ctas = int(narrow * groups);
    gp.grid_ctas = int(wide * groups);
  }
  if (gp.grid_tiles == 0) gp.kernel = GemmKernel::kNone;
  return gp;
}

// bf16 weights (forward_plan.h): tile 8, tile 16 (further where fc2's K is short), else 160.
int bf16_tile_for_mean(double mean, int intermediate) {
  const double tile16_max =
      intermediate <= kBf16ShortKMaxI ? kBf16Tile16MaxMeanRowsShortK : kBf16Tile16MaxMeanRows;
  return mean <= kBf16Tile8MaxMeanRows ? 8 : mean <= tile16_max ? 16 : kM64TileN;
}

}  // namespace

int choose_tile_n(int tokens, int top_k, int local_experts, Recipe recipe, int intermediate) {
  const double mean = mean_rows(int64_t(tokens) * top_k, local_experts);
  if (recipe == Recipe::kBf16) return bf16_tile_for_mean(mean, intermediate);
  const double tile16_max =
      tile32_chunks_per_slot(intermediate) == 2 ? kTile16MaxMeanRowsLeanFc2 : kTile16MaxMeanRows;
  return tile_for_mean(mean, tile16_max);
}

int choose_owner_tile_n(int tokens, int world, int top_k, int local_experts, Recipe recipe,
                        int intermediate) {
  const double mean = mean_rows(int64_t(tokens) * std::min(world, 2) * top_k, local_experts);
  if (recipe == Recipe::kBf16) return bf16_tile_for_mean(mean, intermediate);
  return tile_for_mean(mean, world > 1 ? kTile32MaxMeanRows : kTile16MaxMeanRows);
}

ForwardPlan make_forward_plan(const PlanInputs& in, const PlanOptions& o) {
  ForwardPlan p;
  p.backend = Backend::kCUDA;
  p.tokens = in.tokens;
  p.world = in.world;
  p.combine = o.combine;
  p.fp8 = in.fp8;
  p.extended_epilogue = in.extended_epilogue;
  p.fp8_forced_widths = o.fp8_fine_widths;
  const bool owner = in.world > 1;
  p.rows = owner ? in.world * in.capacity : in.tokens;
  p.expected_pairs = int64_t(in.tokens) * in.K;
  p.mean_rows_per_expert = mean_rows(p.expected_pairs, in.local_experts);
  if (in.tokens == 0 && !owner) return p;
  const kern::ResidentShape rs = kern::resident_shape(in.recipe, in.H, in.I);
  const int chosen =
      owner ? choose_owner_tile_n(in.tokens, in.world, in.K, in.local_experts, in.recipe, in.I)
            : choose_tile_n(in.tokens, in.K, in.local_experts, in.recipe, in.I);
  p.tile_n = in.fp8 ? kFp8TileN : recipe_tile(in.recipe, o.tile_n ? o.tile_n : chosen);
  p.quant_per_thread = p.rows >= kPrepWideTokens ? 8 : 4;
  {
    const int elems = p.quant_per_thread * kern::kPrepThreads;
    const int parts = (in.H + elems - 1) / elems;
    const int wave = std::max(1, kPrepBlocksPerSm * in.num_sms / std::max(1, parts));
    p.prepare_token_blocks = std::max(1, std::min(p.rows, wave));
  }
  const bool spread = o.route_spread >= 0
                          ? o.route_spread == 1
                          : in.tokens >= (owner ? kPrepWideTokens : kSpreadMinTokensOneGpu);
  p.route = spread && in.K <= kSpreadMaxTopK ? RouteKind::kSpread
            : p.rows >= kPrepWideTokens      ? RouteKind::kBatched
                                             : RouteKind::kOneBlock;
  const int64_t split_pairs = owner_pairs(in) ? owner_pairs(in) : int64_t(p.rows) * in.K;
  p.tile16_row_split =
      p.tile_n == 16 && in.recipe != Recipe::kBf16 && !in.fp8 &&
      (o.tile16_row_split >= 0
           ? o.tile16_row_split == 1
           : in.local_experts > 0 &&
                 double(split_pairs) <= kTile16SplitMaxMeanRows * in.local_experts);
  p.m64_split = p.tile_n == kM64TileN && in.recipe != Recipe::kBf16 && !in.fp8 &&
                (o.m64_split >= 0 ? o.m64_split == 1
                                  : !owner && p.mean_rows_per_expert <= kM64SplitMaxMeanRows);
  p.fc1 = gemm_plan(in, o, p, GemmShape{true, rs.fc1_mtiles, in.H});
  p.fc2 = gemm_plan(in, o, p, GemmShape{false, rs.fc2_mtiles, in.I});
  return p;
}

}  // namespace plan
}  // namespace moe_ep
