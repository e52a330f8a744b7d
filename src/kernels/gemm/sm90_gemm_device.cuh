// Device code every grouped GEMM of the forward shares (the decode, mma.sync, wgmma and fp8
// kernels): the 4-bit weight decode, the per-CTA setup (an M-tile's weight stream, the routing
// tile and its columns), and the epilogues (fc1: scale, SwiGLU, top-k weight, the recipe's
// requantization of h; fc2: alpha, bf16, y rows scattered to t*K+k). Included by the per-recipe
// instantiation files only.
//
// GEMM shape ("swap AB"): weights are the MMA's M side (16-row fragments decoded from 4 bits to
// bf16 in registers), the tokens routed to one expert are the N side (8 per n-fragment), K is
// H (fc1) or I (fc2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/common/forward_args.h"
#include "kernels/common/quantize_math.h"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gemm/decode/decode_config.h"
#include "kernels/weights/e2m1_layout.h"
#include "kernels/weights/resident_scales.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {

constexpr float kTwo63 = 9223372036854775808.0f;  // 2^63

template <Recipe R>
struct RecipeKernelTraits {
  static constexpr bool kFourBit = R != Recipe::kBf16;
  // NVFP4 weights (nvfp4, nvfp4_bf16): E4M3 scales per 16 and the per-expert fc1 / fc2 alphas;
  // else UE8M0 per 32 (MXFP4) and no alphas.
  static constexpr bool kNvScale = R == Recipe::kNvfp4 || R == Recipe::kNvfp4Bf16;
  static constexpr bool kAlphas = kNvScale;
  static constexpr int kFragBytes = kFourBit ? 512 : 2048;
  static constexpr int kScaleBytes = kNvScale ? 64 : (kFourBit ? 32 : 0);
  static constexpr float kAccScale = kFourBit ? kTwo63 : 1.0f;
};

// The expert's fc1 or fc2 alpha where the recipe has them (NVFP4 weights), else 1.
template <Recipe R, bool kFc1>
__device__ __forceinline__ float gemm_alpha(const ForwardArgs& a, int expert) {
  if constexpr (RecipeKernelTraits<R>::kAlphas) return (kFc1 ? a.fc1_alpha : a.fc2_alpha)[expert];
  return 1.0f;
}

// A GEMM accumulator as the epilogue uses it: the 4-bit decode's 2^63 taken out, then the NVFP4
// recipes' alpha (fc1 and fc2) or mxfp4_mxfp8's bf16 rounding of g and u (fc1), as the CPU does.
template <Recipe R, bool kFc1>
__device__ __forceinline__ float epilogue_value(float acc, float alpha) {
  const float v = acc * RecipeKernelTraits<R>::kAccScale;
  if constexpr (RecipeKernelTraits<R>::kAlphas) return fmt::mul_rn(alpha, v);
  if constexpr (kFc1 && R == Recipe::kMxfp4Mxfp8) return fmt::round_to_bf16(v);
  return v;
}

// The activation of fc1's gate and up values g, u of h column `hcol` of expert e (contract §3
// and §3.1): with the extended epilogue the expert's biases are added first (after the alpha,
// before the clamp) and the activation takes the slope and offset; otherwise the plain SwiGLU.
template <ExpertEpilogue kEpi>
__device__ __forceinline__ float fc1_activation(const ForwardArgs& a, int e, int hcol, float g,
                                                float u) {
  if constexpr (kEpi == ExpertEpilogue::kExtended) {
    if (a.fc1_bias != nullptr) {
      const float* b = a.fc1_bias + size_t(e) * 2 * a.I;
      g = fmt::add_rn(g, b[hcol]);
      u = fmt::add_rn(u, b[a.I + hcol]);
    }
    return fmt::swiglu_ab(g, u, a.swiglu_limit, a.swiglu_alpha, a.swiglu_beta);
  } else {
    return fmt::swiglu(g, u, a.swiglu_limit);
  }
}

// fc2's fp32 value v of output row `hrow` of pair `pair` before its bf16 rounding: with the
// extended epilogue plus the expert's bias (times the pair's top-k weight where the weight was
// applied in fc1); otherwise v. Rows past H and columns without a pair (padding) add nothing.
template <ExpertEpilogue kEpi>
__device__ __forceinline__ float fc2_value(const ForwardArgs& a, int e, int hrow, int pair,
                                           float v) {
  if constexpr (kEpi == ExpertEpilogue::kExtended) {
    if (a.fc2_bias != nullptr && hrow < a.H && pair >= 0) {
      const float b = a.fc2_bias[size_t(e) * a.H + hrow];
      v = fmt::add_rn(v, a.weight_in_fc1 ? fmt::mul_rn(a.topk_weights[pair], b) : b);
    }
  }
  return v;
}

// bf16x2 {s, s} with s = scale * 2^63 for every resident scale byte b (resident_scales.h): the
// table of the decode kernels.
template <Recipe R>
__device__ __forceinline__ uint32_t scale_multiplier(int b) {
  return resident_scale_bf16x2<RecipeKernelTraits<R>::kNvScale>(uint32_t(b) * 0x10001u);
}

// Two multipliers without a table (the m64 kernel): bytes kByte and kByte + 1 of `bytes` to
// bits 0..7 and 16..23 (one byte permute, integer ALU), then one multiply-add on the FMA pipe that
// applies the slope and bias to both: the multiplier of byte kByte in the low half, of kByte + 1
// in the high half (the GEMM picks a half with mul_bf16x2_by_half).
template <Recipe R, int kByte>
__device__ __forceinline__ uint32_t scale_multiplier_pair_of(uint32_t bytes) {
  static_assert(kByte >= 0 && kByte <= 2, "two of the word's bytes");
  constexpr uint32_t kSel = 0x4040u | uint32_t(kByte) | uint32_t(kByte + 1) << 8;
  const uint32_t pair = __byte_perm(bytes, 0u, kSel);  // {b, 0, b', 0}
  return resident_scale_bf16x2<RecipeKernelTraits<R>::kNvScale>(pair);
}

// ---------------------------------------------------------------------------------------------
// Per-CTA setup shared by the three grouped GEMMs (mma.sync below, sm90_decode.cuh,
// sm90_wgmma.cuh).

// M-tile `mtile` of an expert's resident fc1/fc2 matrix (forward_args.h): its weights and scales
// are two contiguous streams of `chunks` K-chunks of kTileFrags fragments each.
struct MTileStream {
  const uint8_t* w;  // chunk c at w + c * kTileFrags * kFragBytes
  const uint8_t* s;  // chunk c at s + c * kTileFrags * kScaleBytes; null for bf16 weights
  int chunks;
};

template <Recipe R, bool kFc1>
__device__ __forceinline__ MTileStream mtile_stream(const ForwardArgs& a, int expert, int mtile) {
  using RT = RecipeKernelTraits<R>;
  MTileStream m;
  m.chunks = (kFc1 ? a.H : a.I) / kKChunk;
  const size_t w_expert = kFc1 ? a.rs.fc1_bytes : a.rs.fc2_bytes;
  m.w = (kFc1 ? a.w1 : a.w2) + size_t(expert) * w_expert +
        size_t(mtile) * m.chunks * (kTileFrags * RT::kFragBytes);
  m.s = nullptr;
  if constexpr (RT::kFourBit) {
    const size_t s_expert = kFc1 ? a.rs.fc1_scale_bytes : a.rs.fc2_scale_bytes;
    m.s = (kFc1 ? a.s1 : a.s2) + size_t(expert) * s_expert +
          size_t(mtile) * m.chunks * (kTileFrags * RT::kScaleBytes);
  }
  return m;
}

// The routing tile and M-tile of a CTA of a (tile, M-tile) grid. The grid is sized for the host's
// bound on the tiles (max_tiles), the device knows how many there are. Item blockIdx.y *
// gridDim.x + blockIdx.x runs tile item % n, M-tile item / n for the n live tiles: the same
// tile-fastest order as (blockIdx.x, blockIdx.y) had, but every CTA without a tile comes after
// the live ones instead of between them (at 128 tokens a quarter to a half of the grid), so
// those start and exit in the grid's tail. With a split tile list (ForwardArgs::tile_part) the
// grid covers its part only: the first num_tiles[1] tiles (1) or the rest (2). False: no tile
// for this CTA.
// The first tile and the number of tiles of this launch's part of the list (all of it where
// tile_part is 0).
__device__ __forceinline__ void tile_part_range(const ForwardArgs& a, unsigned& lo, unsigned& n) {
  lo = 0;
  n = unsigned(a.num_tiles[0]);
  if (a.tile_part != 0) {
    const unsigned narrow = unsigned(a.num_tiles[1]);
    if (a.tile_part == 1) {
      n = narrow;
    } else {
      lo = narrow;
      n -= narrow;
    }
  }
}

__device__ __forceinline__ bool tile_item(const ForwardArgs& a, int& tile_idx, int& mtile) {
  unsigned lo, n;
  tile_part_range(a, lo, n);
  const unsigned item = blockIdx.y * gridDim.x + blockIdx.x;
  if (item >= n * gridDim.y) return false;  // n = 0 included
  tile_idx = int(lo + item % n);
  mtile = int(item / n);
  return true;
}

// Column n of a routing tile: its pair t*K+k (-1 past the tile's rows), the element offset of
// its B row (fc1: token t's row of xq; fc2: the tile's own row of h, sorted order) and its top-k
// weight (fc1; 0 otherwise).
struct TileColumn {
  int pair;
  int64_t brow;
  float tw;
};

// Column n's pair (live: n < tile.rows) and the element offset of its B row from its pair.
__device__ __forceinline__ int column_pair(const ForwardArgs& a, const TileInfo& tile, int n) {
  return a.sorted_pairs[tile.start + n];
}
template <bool kFc1>
__device__ __forceinline__ int64_t column_brow(const ForwardArgs& a, const TileInfo& tile, int n,
                                               int pair) {
  return kFc1 ? int64_t(pair / a.K) * a.H : int64_t(tile.start + n) * a.I;
}

template <bool kFc1>
__device__ __forceinline__ TileColumn tile_column(const ForwardArgs& a, const TileInfo& tile,
                                                  int n) {
  TileColumn c{-1, 0, 0.0f};
  if (n < tile.rows) {
    c.pair = column_pair(a, tile, n);
    c.brow = column_brow<kFc1>(a, tile, n, c.pair);
    if constexpr (kFc1) c.tw = a.topk_weights[c.pair];
  }
  return c;
}

// Columns 0 .. n - 1 of a routing tile into the m64 kernel's tables, threads tid of nthreads
// sharing them, in two passes (tile_column's values). First what the B copies need: each
// column's first B element (fc1: its token's xq row, through its pair, also kept; fc2: its h
// row, at tile.start + column with no load). Then, after the ring's first copies are issued (the
// same thread per column), what only the epilogue reads: fc1's top-k weights where fc1 applies
// them, fc2's pairs. A column past the tile's rows: B row 0, pair -1, weight 0.
template <bool kFc1>
__device__ __forceinline__ void tile_b_rows(const ForwardArgs& a, const TileInfo& tile, int n,
                                            const uint16_t** brow_ptr, int* pair_of, int tid,
                                            int nthreads) {
  for (int c = tid; c < n; c += nthreads) {
    const bool live = c < tile.rows;
    const int pair = kFc1 && live ? column_pair(a, tile, c) : -1;  // fc2: none needed here
    if constexpr (kFc1) pair_of[c] = pair;
    brow_ptr[c] = (kFc1 ? a.xq : a.h) + (live ? column_brow<kFc1>(a, tile, c, pair) : 0);
  }
}
template <bool kFc1>
__device__ __forceinline__ void tile_epilogue_columns(const ForwardArgs& a, const TileInfo& tile,
                                                      int n, int* pair_of, float* tw_of, int tid,
                                                      int nthreads) {
  if (kFc1 && !a.weight_in_fc1) return;  // the epilogue reads no top-k weight
  for (int c = tid; c < n; c += nthreads) {
    if constexpr (kFc1)
      tw_of[c] = pair_of[c] >= 0 ? a.topk_weights[pair_of[c]] : 0.0f;
    else
      pair_of[c] = c < tile.rows ? column_pair(a, tile, c) : -1;
  }
}

// One scale block of h requantized and stored as the bf16 q * s the fc2 GEMM reads (nvfp4 16
// values with fc1_norm_const nc, mxfp8 32 values; the bf16-activation recipes 8 values rounded
// to bf16): the quantize
// kernels' exact element math (qmath::nvfp4_block_bf16 / mxfp8_block_bf16, bit for bit
// fmt::quantize_block_* and the dequantization, checked on the host), not the reference's
// division per element: this runs in every fc1 CTA's epilogue, and at two m64 CTAs per SM an
// epilogue's time is tensor-pipe time lost (docs/kernels.md).
__device__ __forceinline__ void store_h_block_nvfp4(const float* v, float nc, uint16_t* dst) {
  uint32_t o[8];
  kernels::qmath::nvfp4_block_bf16(v, nc, o);
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(o[0], o[1], o[2], o[3]);
  d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

__device__ __forceinline__ void store_h_block_mxfp8(const float* v, uint16_t* dst) {
  uint32_t o[16];
  kernels::qmath::mxfp8_block_bf16(v, o);
  uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int j = 0; j < 4; ++j) d[j] = make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
}

__device__ __forceinline__ void store_h_bf16x8(const float* v, uint16_t* dst) {
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = fmt::bf16x2(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
}

// The recipe's blocks of kCols h columns starting at column hcol0 of the tile's h rows: hs
// [col][kHS] fp32 (blocks of 16 / 32 along I lie inside the kCols columns), threads tid of
// nthreads share the work.
template <Recipe R, int kCols, int kHS>
__device__ __forceinline__ void store_h_rows(const ForwardArgs& a, const float* hs,
                                             const TileInfo& tile, int hcol0, int tid,
                                             int nthreads) {
  constexpr int kBlk = R == Recipe::kNvfp4 ? 16 : (R == Recipe::kMxfp4Mxfp8 ? 32 : 8);
  constexpr int kPerCol = kCols / kBlk;
  uint16_t* hdst = a.h + size_t(tile.start) * a.I + hcol0;
  const float nc = R == Recipe::kNvfp4 ? a.fc1_norm_const[tile.expert] : 0.0f;
  for (int it = tid; it < tile.rows * kPerCol; it += nthreads) {
    const int col = it / kPerCol, blk = it % kPerCol;
    const float* v = hs + col * kHS + blk * kBlk;
    uint16_t* dst = hdst + size_t(col) * a.I + blk * kBlk;
    if constexpr (R == Recipe::kNvfp4)
      store_h_block_nvfp4(v, nc, dst);
    else if constexpr (R == Recipe::kMxfp4Mxfp8)
      store_h_block_mxfp8(v, dst);
    else
      store_h_bf16x8(v, dst);
  }
}

// The fc1 epilogue's last step for an M-tile's kFc1TileH h columns: h tile hs [col][64 (+4)]
// fp32 (column = token slot) requantized and written as bf16 q*s rows in sorted order.
template <Recipe R>
__device__ __forceinline__ void store_h_tile(const ForwardArgs& a, const float* hs,
                                             const TileInfo& tile, int mtile, int tid,
                                             int nthreads) {
  store_h_rows<R, kFc1TileH, kFc1TileH + 4>(a, hs, tile, mtile * kFc1TileH, tid, nthreads);
}

// The fc2 epilogue's last step: y tile ys [kN][128 (+8)] bf16, 16-byte row stores to
// y_rows[t*K+k] (pair_of[col]), or with a.y_dst (EP fused combine) straight into the source
// rank's combine area over NVLink. Those remote stores are made visible by the end of this
// kernel; the signal kernel after it (ep_combine_kernel, signal_only) fences and publishes them.
template <int kN>
__device__ __forceinline__ void store_y_tile(const ForwardArgs& a, const uint16_t* ys,
                                             const TileInfo& tile, const int* pair_of, int mtile,
                                             int tid, int nthreads) {
  constexpr int kYS = kTileRows + 8;
  const int row0 = mtile * kTileRows;
  for (int it = tid; it < kN * 16; it += nthreads) {
    const int col = it >> 4, p = it & 15;
    if (col >= tile.rows || row0 + p * 8 >= a.H) continue;
    const int pair = pair_of[col];
    uint16_t* dst = a.y_dst != nullptr ? a.y_dst[pair] : a.y_rows + size_t(pair) * a.H;
    *reinterpret_cast<uint4*>(dst + row0 + p * 8) =
        *reinterpret_cast<const uint4*>(ys + col * kYS + p * 8);
  }
  if (a.y_dst_fence) __threadfence_system();
}

// ---------------------------------------------------------------------------------------------
// Host helpers shared by the GEMM launchers.

// fc1 then fc2 of one forward, with the benchmark's stage event between them (ev may be null).
template <class Fc1, class Fc2>
cudaError_t launch_fc1_fc2(Fc1 fc1, Fc2 fc2, cudaStream_t s, cudaEvent_t* ev) {
  if (const cudaError_t err = fc1(); err != cudaSuccess) return err;
  if (ev) cudaEventRecord(ev[0], s);
  return fc2();
}

// The dynamic shared memory a kernel may use.
template <class Kernel>
cudaError_t set_max_smem(Kernel k, int bytes) {
  return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The first error of several calls (all of them made), or cudaSuccess.
inline cudaError_t first_error(std::initializer_list<cudaError_t> errs) {
  for (const cudaError_t e : errs)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace moe_ep::kern
