// Host/device description of the single-GPU MoE forward (EP = 1): the kernel-resident weight
// layout, the routing tiles, and the arguments of one forward. Plain C++ (no device code), so
// the backend (.cpp) and the kernels (.cu) share it.
//
// Kernel-resident weights (docs/gpu_kernels.md): per expert, a matrix of M rows (fc1: 2I gate+up
// rows, fc2: H rows padded to a multiple of 128) and K columns is cut into M-tiles of 128 rows
// (8 fragments of 16 rows) and K-chunks of 64; block (mtile, chunk, frag) holds the 16x64
// fragment in the order the mma.sync A operand wants it per lane, so every lane reads its own
// 16 bytes (4-bit) or 64 bytes (bf16) per chunk. fc1 fragment f of M-tile j is gate (f even) or
// up (f odd) rows j*64 + (f/2)*16 .. +16, so one warp holds matching gate and up rows.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "moe_ep/config.h"

namespace moe_ep::kern {

constexpr int kKChunk = 64;     // K per pipeline stage
constexpr int kFragRows = 16;   // rows of one mma.sync A fragment
constexpr int kTileFrags = 8;   // fragments per M-tile (2 per warp)
constexpr int kTileRows = 128;  // weight rows per CTA
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kFc1TileH = 64;  // h columns produced by one fc1 CTA (64 gate + 64 up rows)

// One routing tile: `rows` consecutive entries of the expert-sorted pair list.
struct TileInfo {
  int expert;  // local expert
  int start;   // first index into sorted_pairs
  int rows;    // 1..tile_n
};

// Bytes of one 16x64 fragment block and of its scales.
inline int frag_bytes(Recipe r) { return r == Recipe::kBf16 ? 16 * 64 * 2 : 16 * 64 / 2; }
inline int frag_scale_bytes(Recipe r) {
  switch (r) {
    case Recipe::kNvfp4:
      return 16 * 4;  // one E4M3 per 16 along K
    case Recipe::kMxfp4Mxfp8:
    case Recipe::kMxfp4Bf16:
      return 16 * 2;  // one UE8M0 per 32 along K
    case Recipe::kBf16:
      return 0;
  }
  return 0;
}

struct ResidentShape {
  int fc1_mtiles, fc1_chunks, fc2_mtiles, fc2_chunks;
  size_t fc1_bytes, fc1_scale_bytes, fc2_bytes, fc2_scale_bytes;  // per expert
};

inline ResidentShape resident_shape(Recipe r, int H, int I) {
  ResidentShape s;
  s.fc1_mtiles = I / kFc1TileH;
  s.fc1_chunks = H / kKChunk;
  s.fc2_mtiles = (H + kTileRows - 1) / kTileRows;
  s.fc2_chunks = I / kKChunk;
  const size_t fb = size_t(frag_bytes(r)), sb = size_t(frag_scale_bytes(r));
  const size_t f1 = size_t(s.fc1_mtiles) * s.fc1_chunks * kTileFrags;
  const size_t f2 = size_t(s.fc2_mtiles) * s.fc2_chunks * kTileFrags;
  s.fc1_bytes = f1 * fb;
  s.fc1_scale_bytes = f1 * sb;
  s.fc2_bytes = f2 * fb;
  s.fc2_scale_bytes = f2 * sb;
  return s;
}

// Tokens per routing tile of the m64 wgmma kernel (4-bit weights; bf16 weights run tiles of
// 128 on the v2 kernel instead).
constexpr int kM64TileN = 160;
// The m64 kernel shapes built: {warpgroups per CTA, CTAs per SM} (m64_shapes). Session 9 on
// the H200x2, DSV3 (docs/gpu_kernels.md §10): two warpgroups sharing each B stage at two CTAs
// per SM took nvfp4 4096 tokens from 7.99 to 6.79-6.84 ms and 1024 tokens from 4.28 to 3.95-3.98
// ms against one warpgroup at three CTAs per SM; four warpgroups at one CTA per SM are level at
// 2048-4096 tokens and 4-9 % slower at 1024 and with Zipf routing.
constexpr std::array<int, 2> kM64Shapes[] = {{1, 3}, {2, 2}, {2, 1}, {3, 1}, {4, 1}};
constexpr std::array<int, 2> kM64Default = {2, 2};

// Calls f(M64ShapeC<G, B>{}) for the built shape {G, B} that `shape` names (kM64Shapes; the
// default for any other) and returns its result: the launch code's dispatch from a run-time
// shape to the kernel templates.
template <int G, int B>
struct M64ShapeC {
  static constexpr int kG = G, kMinB = B;
};
template <class F, size_t... I>
auto with_m64_shape_i(const std::array<int, 2>& shape, F& f, std::index_sequence<I...>) {
  decltype(f(M64ShapeC<kM64Default[0], kM64Default[1]>{})) r{};
  const bool found =
      ((shape == kM64Shapes[I] && (r = f(M64ShapeC<kM64Shapes[I][0], kM64Shapes[I][1]>{}), true)) ||
       ...);
  if (!found) r = f(M64ShapeC<kM64Default[0], kM64Default[1]>{});
  return r;
}
template <class F>
auto with_m64_shape(const std::array<int, 2>& shape, F f) {
  return with_m64_shape_i(shape, f, std::make_index_sequence<std::size(kM64Shapes)>{});
}

// Tokens per routing tile: 8, 16 or 32 while experts see few rows (decode: a weight stream; 8 up
// to a mean of 4 rows, where the few experts with more than 8 rows stream twice but no MMA work
// goes to empty columns; measured, docs/gpu_kernels.md §6), kM64TileN = 160 above a mean of 21
// rows (prefill: the m64 wgmma kernel, which sizes its N to each tile's rows in steps of 16-32,
// so a tile costs no MMA work for the rows it lacks; an expert with more rows gets more tiles,
// which run in parallel). Session 9 on the H200x2, DSV3 (§10): with the m64 kernel's branch-free
// loads tile 160 takes nvfp4 3.23-3.28 ms at a mean of 16-20 rows, tile 16 3.03 ms at 16 rows and
// 3.43-3.45 at 18; mxfp4_mxfp8's tile 16 2.79 / 3.33-3.34 ms at 16 / 18 rows against 3.38-3.40
// for tile 160 before those loads, which cut it by 11 % at 32 rows; mxfp4_bf16's tile 160 was
// faster at 18 rows already before them. Session 8 (three CTAs per SM): against the v2 kernel's
// tiles of 128, 5-12 % faster at 32 rows and level at 64.
// Session 21 (H200x2, docs/gpu_kernels.md §6 "Session 21"): the decode kernel's tile of 32
// between 17 and 21 rows, where an expert's rows mostly fit one tile of 32 but take two of 16,
// and the m64 kernel still pays its fixed cost per K-chunk: at 20 rows nvfp4 DSV3 (640 tokens)
// 2931 against 3096-3100 us on tile 160, gpt-oss 896-897 against 954-957, Qwen3 233-235 against
// 236; at 16 rows tile 16 stayed then (gpt-oss and Qwen3 faster there), at 24 tile 160.
// Session 22 (one H200 and the H200x2, §6 "Session 22"): where tile 32's fc2 runs the lean
// consumer (decode32_cps_for: 4-bit weights, I <= 2048), tile 32 from above 14 rows: DSV3 nvfp4
// 480 / 512 / 544 tokens (15 / 16 / 17 rows) 2628-2637 / 2700-2729 / 2767-2788 against tile 16's
// 2674-2704 / 2826-2908 / 3037-3063 us, Qwen3 nvfp4 240 / 256 / 272 187 / 193 / 196 against
// 213 / 217-219 / 234-236; at 14 rows mxfp4_mxfp8 was faster on tile 16 (DSV3 2324-2408 against
// 2446-2467). Elsewhere (gpt-oss, I = 2880: both GEMMs on the 136-register consumer) tile 32
// was 2-8 % slower at 16 rows and level to 4 % slower at 17, so tile 16 stays up to 17 there.
constexpr double kTile16MaxMeanRows = 17.0, kTile16MaxMeanRowsLeanFc2 = 14.0;
constexpr double kTile32MaxMeanRows = 21.0;

// Tile 32's K-chunks per ring slot for a GEMM of k_total inner values (H for fc1, I for fc2):
// 2, the lean consumer (B fragments and scale multipliers read at each k16 step, 96 registers,
// 4 CTAs per SM), up to kDecode32LeanMaxK; else 4, the 136-register consumer (3 CTAs per SM, a
// deeper ring, fewer instructions per chunk). Measured at 12-20 rows per expert
// (docs/gpu_kernels.md §6 "Session 22"): lean was faster where a CTA streams at most 32 K-chunks
// of 64 (Qwen3's fc1 and fc2, DSV3's fc2), level or slower at 45 (gpt-oss) and slower at 112
// (DSV3's fc1).
constexpr int kDecode32LeanMaxK = 2048;
constexpr int decode32_cps_for(int k_total) { return k_total <= kDecode32LeanMaxK ? 2 : 4; }

// The mean rows per expert up to which choose_tile_n takes tile 16 for a layer of this recipe
// and intermediate size (tile 32 above, up to kTile32MaxMeanRows).
constexpr double tile16_max_mean_rows(Recipe r, int intermediate) {
  return r != Recipe::kBf16 && decode32_cps_for(intermediate) == 2 ? kTile16MaxMeanRowsLeanFc2
                                                                   : kTile16MaxMeanRows;
}

inline int choose_tile_n(int tokens, int top_k, int local_experts,
                         double tile16_max_rows = kTile16MaxMeanRows) {
  const double mean_rows = double(tokens) * top_k / (local_experts > 0 ? local_experts : 1);
  return mean_rows <= 4.0                  ? 8
         : mean_rows <= tile16_max_rows    ? 16
         : mean_rows <= kTile32MaxMeanRows ? 32
                                           : kM64TileN;
}

// A single-GPU layer's tile (the CUDA backend's forward, and bench_layer's record of it).
inline int choose_layer_tile_n(int tokens, int top_k, int local_experts, Recipe r,
                               int intermediate) {
  return choose_tile_n(tokens, top_k, local_experts, tile16_max_mean_rows(r, intermediate));
}

// An EP owner's tile (world ranks, tokens per rank). The owner's mean rows per expert are
// world * tokens * top_k / E = tokens * top_k / local_experts, i.e. choose_tile_n(tokens, ...).
// At W = 2 the choice from twice that (choose_tile_n on world * tokens: every rank's T about
// ours) measured faster for 32, 64, 2048 and 4096 tokens per rank (docs/gpu_kernels.md §10,
// session 4), so owners take twice their mean; for W > 2 too (not W times: at W = 8 that would
// give the m64 kernel's tile of 160 at 8 rows per expert, where tile 16 is ~1.8x faster on one
// GPU; W > 2 is not measured, issue #7). And tile 16 up to tile 32's bound: the owner's mean is
// then at most 10.5 rows, where tile 32 was slower (DSV3 nvfp4, 128 / 160 tokens per rank:
// 1056-1058 / 1155-1157 us against 917-918 / 962-963, §9 "Session 22"), so an owner never takes
// tile 32.
inline int choose_owner_tile_n(int tokens, int world, int top_k, int local_experts) {
  return choose_tile_n(tokens * std::min(world, 2), top_k, local_experts,
                       world > 1 ? kTile32MaxMeanRows : kTile16MaxMeanRows);
}

// The prefill GEMM variant (benchmark knob MOE_EP_WGMMA_V, read once per process): unset (0)
// follows choose_tile_n; 2 runs the 4-bit recipes' tiles of 160 as tiles of 128 on the v2
// kernel (the default before session 8 up to a mean of 120 rows). launch_forward applies it
// (forward_tile_n).
inline int wgmma_version() {
  static const int v = [] {
    const char* e = std::getenv("MOE_EP_WGMMA_V");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return n == 2 ? n : 0;
  }();
  return v;
}

// The m64 kernel's shape per GEMM from the benchmark knob MOE_EP_M64's value: "GxB" for both
// GEMMs or "GxB,GxB" for fc1 and fc2, G warpgroups per CTA sharing each B stage (1-4) at B CTAs
// per SM, one of kM64Shapes. Null, unknown or malformed: kM64Default. Indexed by kFc1 (0: fc2,
// 1: fc1).
using M64Shapes = std::array<std::array<int, 2>, 2>;
inline M64Shapes parse_m64_shapes(const char* e) {
  auto parse = [](const char* p) {
    std::array<int, 2> r = kM64Default;
    if (p[0] != '\0' && p[1] == 'x' && p[2] != '\0' && (p[3] == '\0' || p[3] == ',')) {
      const std::array<int, 2> c{p[0] - '0', p[2] - '0'};
      for (const auto& k : kM64Shapes)
        if (k == c) r = c;
    }
    return r;
  };
  const size_t n = e != nullptr ? std::strlen(e) : 0;
  if (n != 3 && !(n == 7 && e[3] == ',')) return M64Shapes{{kM64Default, kM64Default}};
  const std::array<int, 2> fc1 = parse(e);
  return M64Shapes{{n == 7 ? parse(e + 4) : fc1, fc1}};
}

// A test's tile width for the next forwards (8, 16, 32, 128 or kM64TileN, as MOE_EP_TILE_N; 0
// clears it): forward_tile_n (moe_launch.h) takes it before the knob and the choice.
void set_tile_n_override(int tile_n);
// The fp8 path's MMA widths (sm90_moe_fp8.cuh; ForwardArgs::fp8_widths): kFp8WidthsPolicy (the
// fine list for a GEMM of at least kFp8FineMinMTiles M-tiles, else the coarse one), or one list
// for every GEMM where MOE_EP_FP8_FINE_N=1 / 0 or a test's override says so.
constexpr int kFp8WidthsPolicy = 0, kFp8WidthsCoarse = 1, kFp8WidthsFine = 2;
// Session 27 (H200, medians of 20 graph replays): the fine list took DeepSeek-V3 (fc1 32 M-tiles,
// fc2 56) from 4671-4702 to 4543-4565 us at 4096 tokens and from 3293-3313 to 3128-3156 at 2048,
// and Qwen3 (12 and 6) from 825 / 434 to 874 / 459 us at 4096 / 2048: with few M-tiles per
// routing tile the SMs run many classes' code at once.
constexpr int kFp8FineMinMTiles = 32;
int fp8_widths();
int fp8_tile_n();  // the fp8 path's routing tile: 160 rows, or 128 where MOE_EP_FP8_TILE=128
void set_fp8_widths_override(int widths);  // a kFp8Widths* value, or -1 for none
// The fp8 kernel's grid (sm90_moe_fp8.cuh): CTAs, each running item blockIdx.x and then the
// GEMM's (routing tile, M-tile) items of the tickets it takes. One per SM (persistent, session
// 28), or a test's override (> 0; 0 clears it); at most one per item.
int fp8_grid(int64_t items, int num_sms);
void set_fp8_grid_override(int ctas);
// Tile 16's decode GEMMs split by tile rows (ForwardArgs::tile_split): 1 always, 0 never, -1
// (default) where the expected rows per expert are at most kSplit16MaxMeanRows. From
// MOE_EP_DECODE16_SPLIT=0|1 (benchmark knob, read once per process) or a test's override (1, 0;
// -1 back to the knob).
constexpr double kSplit16MaxMeanRows = 10.0;
int decode16_split_mode();
void set_decode16_split_override(int mode);
// The split for `pairs` routed pairs (expected) over `local_experts` experts at tile 16.
bool decode16_split_for(int64_t pairs, int local_experts);

// Prepare's route spread over blocks (route_spread): 1 always, 0 never, -1 (default) on an EP
// owner expecting at least 256 tokens' pairs (there prepare only routes; on one GPU the
// quantizer sets prepare's time, and one batched block routes). From MOE_EP_ROUTE_SPREAD=0|1
// (benchmark knob, read once per process) or a test's override (1, 0; -1 back to the knob).
void set_route_spread_override(int mode);

// ForwardArgs::fc2_early: true, or MOE_EP_FC2_EARLY=0 (read once per process) for A/B runs.
bool fc2_early_start();

// The shapes the next m64 launches use: a test's override (set_m64_shapes_override), else
// MOE_EP_M64 (read once per process), else kM64Default. last_m64_shape is the shape of the last
// m64 launch of fc1 (true) or fc2 on this process (for tests).
M64Shapes m64_shapes();
void set_m64_shapes_override(const char* knob);  // null clears it
void note_m64_shape(bool fc1, std::array<int, 2> shape);
std::array<int, 2> last_m64_shape(bool fc1);

// Upper bound of the number of routing tiles (what the grids are sized for; workspaces hold
// the list for the smallest tile_n, 8).
constexpr int kMinTileN = 8;
inline int max_tiles(int pairs, int local_experts, int tile_n) {
  // Routing makes sum_e ceil(c_e / tile_n) <= (pairs + touched * (tile_n - 1)) / tile_n tiles
  // over the touched experts (sum_e c_e = pairs); one row on each but one expert reaches it.
  // The looser pairs / tile_n + touched left empty CTAs in every decode grid (DSV3 1 token: 9
  // tiles for 8; docs/gpu_kernels.md §6 "Session 10").
  const int touched = pairs < local_experts ? pairs : local_experts;
  return int((int64_t(pairs) + int64_t(touched) * (tile_n - 1)) / tile_n);
}

// The host's estimate of the routing tiles of `pairs` pairs (the device counts them): every
// pair on its own expert while there are fewer pairs than experts, else full tiles. It sizes
// the decode ring (decode_ctas_per_sm, owner_fc1_ctas_per_sm) and the split-K policy.
inline int expected_tiles(int pairs, int local_experts, int tile_n) {
  return std::max(std::min(pairs, local_experts), (pairs + tile_n - 1) / tile_n);
}

// Decode split-K (sm90_moe_decode.cuh): at few routing tiles the decode GEMM may cut each
// M-tile's K range over `splits` CTAs; each stores its fp32 accumulators in one slot (one M-tile
// x 8 columns) and the last to arrive sums the slots in split order and runs the epilogue. The
// workspace holds kSplitKSlots slots and one arrival counter per two slots (zero between kernels:
// the last CTA of each (tile, M-tile) resets its own), whatever the capacity: a launch whose
// grid would need more slots splits less.
constexpr int kSplitKSlots = 8192;
constexpr size_t kSplitKSlotBytes = size_t(kTileRows) * kMinTileN * 4;
inline size_t splitk_partial_bytes() { return kSplitKSlotBytes * kSplitKSlots; }
inline size_t splitk_counter_bytes() { return size_t(kSplitKSlots / 2) * 4; }

// Split-K mode of the decode fc1 or fc2 GEMM (moe_forward.cu). kSplitKDefault: no split (since
// session 26; decode_splits, sm90_moe_decode.cuh); kSplitKAuto: the earlier policy, for every
// 4-bit recipe's fc1; 1: never; 2..8: that many splits wherever the grid allows. From
// MOE_EP_DECODE_SPLITK (read once per process): unset = default, "auto", "N" (both GEMMs) or
// "N,M" (fc1 N, fc2 M); unless a test set an override (kSplitKFromEnv clears it).
constexpr int kSplitKDefault = 0, kSplitKAuto = -1, kSplitKFromEnv = -2;

// A benchmark knob's value "N" (both GEMMs) or "N,M" (fc1 N, fc2 M) as {fc2, fc1} (index by
// fc1); a count outside lo..hi, or no value (v null), gives `other`.
inline std::array<int, 2> knob_fc1_fc2(const char* v, int lo, int hi, int other) {
  if (v == nullptr) return {other, other};
  auto count = [&](const char* p) {
    const int n = std::atoi(p);
    return n >= lo && n <= hi ? n : other;
  };
  const char* comma = std::strchr(v, ',');
  const int n1 = count(v), n2 = comma ? count(comma + 1) : n1;
  return {n2, n1};
}
// A test's first-wave size for the decode launches (decode_gemm's `wave`; 0 clears it), so that
// small grids take the late setup too (under the sanitizers).
void set_decode_wave_override(int ctas);
int decode_wave_override();
int decode_splitk_mode(bool fc1);
void set_decode_splitk_override(int fc1_mode, int fc2_mode);
// The K-splits of the last decode fc1 / fc2 launch on this process (1 when none split; for
// tests).
void note_decode_splits(bool fc1, int splits);
int last_decode_splits(bool fc1);

// K-chunks per ring slot of the tile-8 decode GEMM set by a test (1, 2 or 4; 0 clears it and
// the default or MOE_EP_DECODE_CPS applies; tile 32 takes 2 or 4, its two consumers), and the
// count the last tile-8 or tile-32 decode launch used.
void set_decode_cps_override(int cps);
int decode_cps_override();
void note_decode_cps(int cps);
int last_decode_cps();

// Fragments per consumer warp of the tile-8 decode GEMM (sm90_moe_decode.cuh, decode_fw): 1 or 2
// forced by a test's override (0 clears it), else by MOE_EP_DECODE_FW=1|2 (read once per
// process), else 0 (the policy); and what the last decode fc1 / fc2 launch ran (2 for tiles 16
// and 32).
void set_decode_fw_override(int fw);
int decode_fw_mode();
void note_decode_fw(bool fc1, int fw);
int last_decode_fw(bool fc1);

// The decode kernel's weight stream under an L2 evict_first policy (ForwardArgs::
// weight_evict_first; docs/gpu_kernels.md §6 "Session 31"): a test's override (1 on, 2 off; 0
// clears it), else MOE_EP_WEIGHT_EVICT_FIRST=0|1 (read once per process), else on.
void set_weight_evict_override(int mode);
bool weight_evict_first();

// A tile-8 fc1 with rings for 2 CTAs per SM on one GPU leaves room for an fc2 CTA beside its two
// (sm90_moe_decode.cuh, decode_ring; docs/gpu_kernels.md §6 "Session 32"): a test's override
// (1 on, 2 off; 0 clears it), else MOE_EP_FC1_ROOM=0|1 (read once per process), else on. The
// last forward's fc1 launches say whether they took it (note_fc1_room, reset by launch_forward).
void set_fc1_room_override(int mode);
bool fc1_room_for_fc2();
void note_fc1_room(bool taken);
bool last_fc1_room();

// Error word in host-mapped memory that a forward sets when it sees a bad input it could not
// reject on the host (an expert id out of range). The first error wins.
struct DeviceError {
  int code;   // 0: none; 1: topk id out of range
  int index;  // flat index t*K + k
  int value;  // the offending id
  int limit;  // E
};

struct ForwardArgs {
  Recipe recipe = Recipe::kBf16;
  int H = 0, I = 0, K = 0, local_experts = 0, num_experts = 0, expert_base = 0;
  int tokens = 0;                       // rows of x (T, an upper bound with num_tokens)
  const int32_t* num_tokens = nullptr;  // device int32, optional
  const uint16_t* x = nullptr;          // bf16 [T, H], row stride x_stride elements
  int64_t x_stride = 0;
  const int32_t* ids = nullptr;  // [T, K]
  const float* topk_weights = nullptr;
  float input_norm_const = 1.0f;
  float swiglu_limit = -1.0f;  // < 0: no clamp
  bool weight_in_fc1 = false;
  const float *fc1_alpha = nullptr, *fc2_alpha = nullptr, *fc1_norm_const = nullptr;
  const uint8_t *w1 = nullptr, *s1 = nullptr, *w2 = nullptr, *s2 = nullptr;  // resident
  ResidentShape rs{};
  // Workspace scratch.
  uint16_t* xq = nullptr;           // bf16 [T, H]: x as the GEMM sees it (q*s, exact in bf16)
  uint16_t* h = nullptr;            // bf16 [T*K, I]: fc1 output in sorted order (q*s)
  int32_t* sorted_pairs = nullptr;  // [T*K]: t*K+k grouped by expert
  TileInfo* tiles = nullptr;        // [max_tiles]
  int32_t* num_tiles = nullptr;     // [2]: the tiles; the narrow ones first (tile_split)
  // [local_experts + 1], zero between forwards: the spread route's per-expert counts and its
  // ticket (route_spread leaves them at zero).
  int32_t* counts = nullptr;
  int32_t* pair_rank = nullptr;        // [T*K]: route_spread's place of each pair within its expert
  float* splitk_partials = nullptr;    // [kSplitKSlots] x kSplitKSlotBytes; null: no split-K
  int32_t* splitk_counters = nullptr;  // [kSplitKSlots / 2], zero between kernels
  // Outputs.
  uint16_t* y_rows = nullptr;  // bf16 [T*K, H]: y[t,k] at row t*K+k
  // EP fused combine (W > 1, docs/protocol.md §8): when set, fc2 stores the row of pair
  // p = v*K+k at y_dst[p] instead of y_rows + p*H: the row t*K+k of the source's combine area
  // (peer memory through an LSA pointer), written by launch_ep_unpack. Pairs of rows that carry
  // no local slot are never routed, so their entries are never read.
  uint16_t* const* y_dst = nullptr;  // [T*K]
  // With y_dst: every storing thread also fences (fence.sc.sys) after its rows, so they are
  // performed system-wide before its CTA retires (the fallback of docs/protocol.md §5 "kernel
  // boundary"; MOE_EP_FUSED_COMBINE=2).
  bool y_dst_fence = false;
  uint16_t* out = nullptr;  // bf16 [T, H] finalized, or null (unfinalized)
  float* weights_out = nullptr;
  int32_t* indices_out = nullptr;
  DeviceError* error = nullptr;  // device alias of host-mapped memory
  int tile_n = 16;
  int num_sms = 132;  // multiprocessors of the device (the backend sets it; sizes the decode ring)
  // EP owner side: xq (and ids / topk_weights) were filled from the received rows
  // (launch_ep_unpack), so prepare only routes.
  bool xq_ready = false;
  // The decode kernel's fc2 queues the weights of its first ring slots before it waits for fc1
  // (launch_forward sets it from fc2_early_start(); docs/gpu_kernels.md §6 "Session 10").
  bool fc2_early = true;
  // The decode kernel's weight and scale bulk copies under an L2 evict_first policy (each byte is
  // read once per forward) instead of the normal one; launch_forward sets it from
  // weight_evict_first().
  bool weight_evict_first = true;
  // Route by one warp when at most 32 pairs (route_warp; launch_forward sets it,
  // MOE_EP_WARP_ROUTE=0 turns it off for A/B runs).
  bool warp_route = true;
  // EP owner side: the routed pairs this rank expects in this call (T*K: W sources' T tokens,
  // a 1/W share of their K slots each, under uniform routing), where `tokens` counts W *
  // capacity rows; sizes fc1's decode ring (owner_fc1_ctas_per_sm). 0: not an EP owner.
  int owner_pairs = 0;
  // Tiles of 16 split by rows (decode16_split): route writes the tiles of at most 8 rows first and
  // their count at num_tiles[1]; the decode GEMMs then run those on the tile-8 kernel
  // (tile_part 1) and the rest on the tile-16 kernel (tile_part 2), each CTA grid over its own
  // part of the list (tile_item). pdl_late: the kernel is the second launch of such a pair, and
  // everything it reads was complete before it could launch, so it skips the wait at its start
  // and waits before it exits instead (so it still completes after the first).
  bool tile_split = false;
  int tile_part = 0;  // 0: every tile
  bool pdl_late = false;
  // The fp8 MMA path of mxfp4_mxfp8 (fp8_mma or MOE_EP_FP8=1 at construction, single GPU;
  // docs/gpu_kernels.md §8): weights in the fp8 resident layout, x and h folded to one power of
  // two per row (e4m3 bytes + the row's UE8M0 reference), every tile on sm90_moe_fp8_ws_kernel.
  bool fp8 = false;
  int fp8_widths = kFp8WidthsPolicy;  // the fp8 kernel's MMA width list (fp8_widths())
  uint8_t* xq8 = nullptr;             // e4m3 [T, H]
  uint8_t* xref = nullptr;            // [T]
  uint8_t* h8 = nullptr;              // e4m3 [T*K, I], sorted order
  // The CUtensorMap of h8 in device memory (encode_fp8_h_tensor_map: boxes of 128 bytes x 8
  // rows, 128-byte swizzle, zeros past the rows): fc2's B rows, contiguous per tile, arrive by
  // the tensor memory accelerator.
  const void* h8_tmap = nullptr;
  uint8_t* href = nullptr;  // [T*K]
  // [2]: the fp8 kernel's next-item ticket and its count of CTAs done; zero at construction,
  // and the last CTA of each launch zeroes both again.
  int32_t* fp8_sched = nullptr;
#if defined(MOE_EP_TIMELINE) && MOE_EP_TIMELINE
  uint64_t* timeline = nullptr;  // [kTlSlots][2] (kernels/moe/timeline.cuh; debug builds only)
#endif
};

// CTAs per SM an EP owner's fc1 decode ring is sized for, or 0 where the general estimate
// applies (decode_ctas_per_sm, sm90_moe_decode.cuh): 3 while the CTAs of the pairs this rank
// expects (owner_pairs; tiles of tile_n, mtiles M-tiles, splits K-splits) fit 4 per SM. The
// estimate from W * capacity rows says 4 there (2-slot rings) and this rank's own share 2, and
// the rank that then gets more tiles runs a second wave (docs/gpu_kernels.md §9). Measured on the
// H200x2 (DSV3 nvfp4, EP = 2, session 8): 1 / 2 tokens per rank 141 / 201 -> 128 / 185 us; at 8
// tokens (2048 expected CTAs) 3 per SM was 2 % slower than 4, so there the estimate stays.
inline int owner_fc1_ctas_per_sm(const ForwardArgs& a, int tile_n, int mtiles, int splits) {
  if (!a.xq_ready || a.owner_pairs <= 0 || a.num_sms <= 0) return 0;
  const int tiles = expected_tiles(a.owner_pairs, a.local_experts, tile_n);
  return tiles * mtiles * splits <= 4 * a.num_sms ? 3 : 0;
}

// EP source side (W > 1): checks the ids (bad ones go to `error`) and quantizes x into
// activation rows [T][act_row_bytes] in the recipe's format (data, then scales) for dispatch.
struct EpSourceArgs {
  Recipe recipe = Recipe::kBf16;
  int H = 0, K = 0, num_experts = 0;
  int tokens = 0;
  const int32_t* num_tokens = nullptr;
  const uint16_t* x = nullptr;
  int64_t x_stride = 0;
  const int32_t* ids = nullptr;
  float input_norm_const = 1.0f;
  uint8_t* act = nullptr;
  int act_row_bytes = 0, act_data_bytes = 0;
  DeviceError* error = nullptr;
#if defined(MOE_EP_TIMELINE) && MOE_EP_TIMELINE
  uint64_t* timeline = nullptr;  // kernels/moe/timeline.cuh (debug builds only)
#endif
};

// Ranks EpUnpackArgs can address (equals kEpMaxRanks of kernels/ep/ep_params.h; the backend
// static_asserts it).
constexpr int kEpUnpackMaxRanks = 64;

// EP owner side: the rows received in this rank's window become virtual tokens
// v = src * capacity + row: xq[v] (dequantized, as prepare writes it), ids[v][k] (the local
// slots; every other slot -1) and weights[v][k]. Rows past a source's count get ids -1.
struct EpUnpackArgs {
  Recipe recipe = Recipe::kBf16;
  const uint8_t* window = nullptr;  // this rank's workspace window (WorkspaceLayout offsets)
  int world = 1, capacity = 0, H = 0, K = 0;
  size_t recv_act_off = 0, recv_meta_off = 0, recv_count_off = 0;
  int act_row_bytes = 0, act_data_bytes = 0, meta_row_bytes = 0;
  int expert_base = 0, local_experts = 0;
  uint16_t* xq = nullptr;    // [W*capacity][H]
  int32_t* ids = nullptr;    // [W*capacity][K]
  float* weights = nullptr;  // [W*capacity][K]
  // Optional (fused combine): y_dst[v*K+k] = peer_combine[src] + (token*K + k)*H, the row of
  // the source's combine area that fc2 writes (ForwardArgs::y_dst); null for slots that are not
  // local. A received row whose token index is outside [0, capacity) gets no local slot (the
  // unfused combine skips such rows too).
  uint16_t** y_dst = nullptr;                      // [W*capacity][K]
  uint16_t* peer_combine[kEpUnpackMaxRanks] = {};  // each rank's combine area (LSA pointers)
  // Optional: the workspace's transport error flag (EpState::error). Once set (a wait of this
  // call failed), every virtual token gets ids -1, so nothing is routed, computed or stored.
  const uint32_t* ep_error = nullptr;
#if defined(MOE_EP_TIMELINE) && MOE_EP_TIMELINE
  uint64_t* timeline = nullptr;  // kernels/moe/timeline.cuh (debug builds only)
#endif
};

}  // namespace moe_ep::kern
