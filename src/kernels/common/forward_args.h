// Host/device description of the expert side of one forward: the kernel-resident weight layout,
// the routing tiles, and the arguments every kernel of the forward reads. Plain C++ (no device
// code), so the backend, the launch plan and the kernels share it. The choice of kernels is not
// here: that is the launch plan's (src/plan).
//
// Kernel-resident weights (docs/kernels.md): per expert, a matrix of M rows (fc1: 2I gate+up
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

#include "moe_ep/config.h"

namespace moe_ep::kern {

constexpr int kKChunk = 64;     // K per pipeline stage
constexpr int kTileFrags = 8;   // fragments per M-tile
constexpr int kTileRows = 128;  // weight rows per CTA
constexpr int kFc1TileH = 64;   // h columns produced by one fc1 CTA (64 gate + 64 up rows)

// One routing tile: `rows` consecutive entries of the expert-sorted pair list.
struct TileInfo {
  int expert;  // local expert
  int start;   // first index into sorted_pairs
  int rows;    // 1..tile_n
};

// Bytes of one 16x64 fragment block and of its scales.
constexpr int frag_bytes(Recipe r) { return r == Recipe::kBf16 ? 16 * 64 * 2 : 16 * 64 / 2; }
// bf16 weights: a fragment holds lane l's four k16 steps (16 bytes each) at bytes 64 l .. 64 l +
// 63, step s in slot s ^ ((l / 2) % 4): the 16-byte reads of one step by eight consecutive lanes
// then hit eight distinct 16-byte bank groups. The map is its own inverse: the slot of step i and
// the step in slot i.
constexpr int bf16_resident_step(int lane, int i) { return i ^ ((lane >> 1) & 3); }
constexpr int frag_scale_bytes(Recipe r) {
  switch (r) {
    case Recipe::kNvfp4:
    case Recipe::kNvfp4Bf16:
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

// Routing tiles of the prefill GEMM kernels, in rows: the m64 wgmma kernel's and the fp8
// kernel's; the launch plan (src/plan) picks among these and the decode kernel's 8, 16 and 32
// (bf16 weights: 8 and 16).
constexpr int kM64TileN = 160, kFp8TileN = 160;
// The narrow m64 kernel (4-bit weights): tiles of up to 64 rows at three CTAs per SM.
constexpr int kM64NarrowTileN = 64, kM64NarrowCtasPerSm = 3;
// The m64 kernel's CTA: warpgroups (64 weight rows each, sharing one B stage) and CTAs per SM.
// 4-bit weights: 2 x 2; bf16 weights, four times the bytes per row: 4 x 1, so that a B stage
// serves 256 weight rows and the L2 traffic per MMA stays that of the 4-bit kernel.
constexpr int m64_warpgroups(Recipe r) { return r == Recipe::kBf16 ? 4 : 2; }
constexpr int m64_ctas_per_sm(Recipe r) { return r == Recipe::kBf16 ? 1 : 2; }
// CTAs of the m64 kernel per routing tile: groups of m64_warpgroups halves of M-tiles.
constexpr int m64_groups(Recipe r, int mtiles) {
  return (2 * mtiles + m64_warpgroups(r) - 1) / m64_warpgroups(r);
}
// Threads of a prepare block; a block of the spread route counts this many pairs.
constexpr int kPrepThreads = 512;

// Upper bound of the number of routing tiles (what the grids are sized for; workspaces hold
// the list for the smallest tile_n, 8).
constexpr int kMinTileN = 8;
inline int max_tiles(int pairs, int local_experts, int tile_n) {
  // Routing makes sum_e ceil(c_e / tile_n) <= (pairs + touched * (tile_n - 1)) / tile_n tiles
  // over the touched experts (sum_e c_e = pairs); one row on each but one expert reaches it.
  // (The looser pairs / tile_n + touched left empty CTAs in every decode grid: DSV3 1 token, 9
  // tiles for 8.)
  const int touched = pairs < local_experts ? pairs : local_experts;
  return int((int64_t(pairs) + int64_t(touched) * (tile_n - 1)) / tile_n);
}

// The host's estimate of the routing tiles of `pairs` pairs (the device counts them): every
// pair on its own expert while there are fewer pairs than experts, else full tiles. It sizes
// the decode rings (the launch plan's CTAs per SM).
inline int expected_tiles(int pairs, int local_experts, int tile_n) {
  return std::max(std::min(pairs, local_experts), (pairs + tile_n - 1) / tile_n);
}

// The fp8 kernel's fine list of MMA widths serves GEMMs of at least this many M-tiles.
constexpr int kFp8FineMinMTiles = 32;

// Error word in host-mapped memory that a forward sets when it sees a bad input it could not
// reject on the host (an expert id out of range). The first error wins.
struct DeviceError {
  int code;   // 0: none; 1: topk id out of range
  int index;  // flat index t*K + k
  int value;  // the offending id
  int limit;  // E
};

// The expert epilogue a GEMM kernel is instantiated for: the plain SwiGLU of contract §3, or the
// extended one of §3.1 (expert biases, the activation's slope and offset: gpt-oss). A template
// argument, so the plain kernels carry none of the extended one's loads and arithmetic.
enum class ExpertEpilogue : uint8_t { kSwiglu, kExtended };

// Recipes whose kernels are also built with the extended epilogue.
constexpr bool has_extended_epilogue(Recipe r) {
  return r == Recipe::kMxfp4Bf16 || r == Recipe::kNvfp4Bf16 || r == Recipe::kBf16;
}

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
  // The extended expert epilogue's (ExpertEpilogue::kExtended; contract §3.1, gpt-oss): expert
  // biases f32 [local_experts, 2I] and [local_experts, H] (each may be null) and the
  // activation's slope and offset. The plain SwiGLU kernels never read them.
  const float *fc1_bias = nullptr, *fc2_bias = nullptr;
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f;
  const uint8_t *w1 = nullptr, *s1 = nullptr, *w2 = nullptr, *s2 = nullptr;  // resident
  ResidentShape rs{};
  // Workspace scratch.
  uint16_t* xq = nullptr;           // bf16 [T, H]: x as the GEMM sees it (q*s, exact in bf16)
  uint16_t* h = nullptr;            // bf16 [T*K, I]: fc1 output in sorted order (q*s)
  int32_t* sorted_pairs = nullptr;  // [T*K]: t*K+k grouped by expert
  TileInfo* tiles = nullptr;        // [max_tiles]
  int32_t* num_tiles = nullptr;     // [2]: the tiles; the narrow ones first (tile_split_rows)
  // [local_experts + 1], zero between forwards: the spread route's per-expert counts and its
  // ticket (route_spread leaves them at zero).
  int32_t* counts = nullptr;
  int32_t* pair_rank = nullptr;  // [T*K]: route_spread's place of each pair within its expert
  // Outputs.
  uint16_t* y_rows = nullptr;  // bf16 [T*K, H]: y[t,k] at row t*K+k
  // EP fused combine (W > 1, docs/protocol.md §8): when set, fc2 stores the row of pair
  // p = v*K+k at y_dst[p] instead of y_rows + p*H: the row t*K+k of the source's combine area
  // (peer memory through an LSA pointer), written by launch_ep_unpack. Pairs of rows that carry
  // no local slot are never routed, so their entries are never read.
  uint16_t* const* y_dst = nullptr;  // [T*K]
  // With y_dst: every storing thread also fences (fence.sc.sys) after its rows, so they are
  // performed system-wide before its CTA retires (the fallback of docs/protocol.md §5 "kernel
  // boundary"; CombineMode::kFusedFence).
  bool y_dst_fence = false;
  uint16_t* out = nullptr;  // bf16 [T, H] finalized, or null (unfinalized)
  float* weights_out = nullptr;
  int32_t* indices_out = nullptr;
  DeviceError* error = nullptr;  // device alias of host-mapped memory
  int tile_n = 16;               // the plan's routing tile
  // EP owner side: xq (and ids / topk_weights) were filled from the received rows
  // (launch_ep_unpack), so prepare only routes.
  bool xq_ready = false;
  // One GPU, bf16 activations (mxfp4_bf16, nvfp4_bf16, bf16) and x contiguous and 16-byte
  // aligned: xq is x itself (the GEMM's rows are x's rows), so prepare copies nothing.
  bool xq_is_x = false;
  // Tiles split by rows (tile_split_rows > 0; 0: no split): route writes every expert's last
  // tile of at most tile_split_rows rows first and their count at num_tiles[1]. The plan's
  // tile16_row_split (tiles of 16, 8 rows): the decode GEMMs run those on the tile-8 kernel
  // (tile_part 1) and the rest on the tile-16 kernel (tile_part 2). The plan's m64_split (tiles of
  // 160, 64 rows): the wide tiles on the m64 kernel (tile_part 2), then the narrow ones on the
  // narrow m64 kernel (tile_part 1). Each CTA grid covers its own part of the list
  // (tile_part_range). pdl_late: the kernel is the second launch of such a pair, and everything it
  // reads was complete before it could launch, so it skips the wait at its start and waits before
  // it exits instead (so it still completes after the first).
  int tile_split_rows = 0;
  int tile_part = 0;  // 0: every tile
  bool pdl_late = false;
  // The fp8 MMA path of mxfp4_mxfp8 (RecipeConfig::fp8_mma, single GPU; docs/kernels.md):
  // weights in the fp8 resident layout, x and h folded to one power of two per row (e4m3 bytes +
  // the row's UE8M0 reference), every tile on sm90_moe_fp8_ws_kernel.
  bool fp8 = false;
  // The kernel's MMA width list: -1 by its GEMM's M-tiles (the fine list from
  // kFp8FineMinMTiles on, as the plan says), 0 the coarse list, 1 the fine one (PlanOptions).
  int fp8_widths = -1;
  uint8_t* xq8 = nullptr;   // e4m3 [T, H]
  uint8_t* xref = nullptr;  // [T]
  uint8_t* h8 = nullptr;    // e4m3 [T*K, I], sorted order
  // The CUtensorMap of h8 in device memory (encode_fp8_h_tensor_map: boxes of 128 bytes x 8
  // rows, 128-byte swizzle, zeros past the rows): fc2's B rows, contiguous per tile, arrive by
  // the tensor memory accelerator.
  const void* h8_tmap = nullptr;
  uint8_t* href = nullptr;  // [T*K]
  // [2]: the fp8 kernel's next-item ticket and its count of CTAs done; zero at construction,
  // and the last CTA of each launch zeroes both again.
  int32_t* fp8_sched = nullptr;
};

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
};

}  // namespace moe_ep::kern
