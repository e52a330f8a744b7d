// The mma.sync grouped GEMM of the bf16 recipe's tiles of 16 rows: one CTA = 4 warps = 128 weight
// rows x 16 tokens, K in chunks of 64 through a cp.async pipeline, mma.sync m16n8k16 with fp32
// accumulation; the epilogue of sm90_gemm_device.cuh.
#pragma once

#include "kernels/gemm/sm90_gemm_device.cuh"

namespace moe_ep::kern {

// ---------------------------------------------------------------------------------------------
// The grouped GEMM. kFc1: B rows are xq rows gathered by token; epilogue = scale, SwiGLU,
// top-k weight, the recipe's requantization of h (written in sorted order). Otherwise (fc2):
// B rows are consecutive h rows; epilogue = alpha, bf16, y rows scattered to t*K+k.

template <Recipe R, int kN>
struct GemmConfig {
  using RT = RecipeKernelTraits<R>;
  static constexpr int kNF = kN / 8;         // n-fragments per warp
  static constexpr int kBRow = kKChunk + 8;  // bf16 per smem B row (16 bytes of padding)
  static constexpr int kWBytes = kTileFrags * RT::kFragBytes;
  static constexpr int kSBytes = kTileFrags * RT::kScaleBytes;
  static constexpr int kBBytes = kN * kBRow * 2;
  static constexpr int kStageBytes = kWBytes + kSBytes + kBBytes;
  static constexpr int kStages = RT::kFourBit ? (kN <= 16 ? 8 : 5) : (kN <= 16 ? 5 : 4);
  static constexpr int kEpiBytes = kN * (kFc1TileH + 4) * 4 > kN*(kTileRows + 8) * 2
                                       ? kN*(kFc1TileH + 4) * 4
                                       : kN*(kTileRows + 8) * 2;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
};

template <Recipe R, int kN, bool kFc1, ExpertEpilogue kEpi = ExpertEpilogue::kSwiglu>
__global__ void __launch_bounds__(kThreads) sm90_moe_gemm_kernel(const ForwardArgs a) {
  using C = GemmConfig<R, kN>;
  using RT = typename C::RT;
  constexpr int kNF = C::kNF;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint32_t scale_lut[RT::kFourBit ? 256 : 1];
  __shared__ int64_t brow_off[kN];  // element offset of each B row
  __shared__ int pair_of[kN];       // t*K+k of each column
  __shared__ float tw_of[kN];

  int tile_idx, mtile;
  if (!tile_item(a, tile_idx, mtile)) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2;

  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int chunks = ms.chunks;
  const uint8_t *wbase = ms.w, *sbase = ms.s;

  if constexpr (RT::kFourBit) {
    for (int b = tid; b < 256; b += kThreads) scale_lut[b] = scale_multiplier<R>(b);
  }
  for (int n = tid; n < kN; n += kThreads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    brow_off[n] = c.brow;
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
  }
  __syncthreads();

  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  auto stage_w = [&](int s) { return smem + s * C::kStageBytes; };
  auto stage_s = [&](int s) { return smem + s * C::kStageBytes + C::kWBytes; };
  auto stage_b = [&](int s) {
    return reinterpret_cast<uint16_t*>(smem + s * C::kStageBytes + C::kWBytes + C::kSBytes);
  };

  auto load_stage = [&](int slot, int chunk) {
    const uint8_t* wsrc = wbase + size_t(chunk) * C::kWBytes;
    unsigned char* wdst = stage_w(slot);
#pragma unroll
    for (int i = 0; i < C::kWBytes / 16 / kThreads; ++i) {
      const int p = tid + i * kThreads;
      cp_async16(wdst + p * 16, wsrc + p * 16, true);
    }
    if constexpr (RT::kFourBit) {
      if (tid < C::kSBytes / 16)
        cp_async16(stage_s(slot) + tid * 16, sbase + size_t(chunk) * C::kSBytes + tid * 16, true);
    }
    uint16_t* bdst = stage_b(slot);
#pragma unroll
    for (int i = 0; i < (kN * 8 + kThreads - 1) / kThreads; ++i) {
      const int p = tid + i * kThreads;
      if (p < kN * 8) {
        const int row = p >> 3, c16 = p & 7;
        const bool live = row < tile.rows;
        const uint16_t* src = bsrc + (live ? brow_off[row] : 0) + chunk * kKChunk + c16 * 8;
        cp_async16(bdst + row * C::kBRow + c16 * 8, src, live);
      }
    }
  };

  float acc[2][kNF][4];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int n = 0; n < kNF; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][n][i] = 0.0f;

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < chunks) load_stage(s, s);
    cp_async_commit();
  }

  // ldmatrix row address of this lane within a B stage: matrices (nf, k 0-7), (nf, k 8-15),
  // (nf+1, k 0-7), (nf+1, k 8-15).
  const int lm_row = (lane & 7) + ((lane >> 4) << 3);
  const int lm_col = ((lane >> 3) & 1) * 8;

  for (int chunk = 0; chunk < chunks; ++chunk) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    {
      const int next = chunk + C::kStages - 1;
      if (next < chunks) load_stage(next % C::kStages, next);
      cp_async_commit();
    }
    const int slot = chunk % C::kStages;
    const unsigned char* ws = stage_w(slot);
    const uint16_t* bs = stage_b(slot);

    // This warp's two fragments: 2*warp and 2*warp+1.
    uint4 wq[2];
    uint32_t sc_lo[2][4], sc_hi[2][4];
    if constexpr (RT::kFourBit) {
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const int frag = 2 * warp + f;
        wq[f] = *reinterpret_cast<const uint4*>(ws + frag * RT::kFragBytes + lane * 16);
        const unsigned char* ss = stage_s(slot) + frag * RT::kScaleBytes;
        if constexpr (RT::kNvScale) {
          const uint32_t lo = *reinterpret_cast<const uint32_t*>(ss + g * 4);
          const uint32_t hi = *reinterpret_cast<const uint32_t*>(ss + (g + 8) * 4);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            sc_lo[f][s] = scale_lut[(lo >> (8 * s)) & 0xff];
            sc_hi[f][s] = scale_lut[(hi >> (8 * s)) & 0xff];
          }
        } else {
          const uint32_t lo = *reinterpret_cast<const uint16_t*>(ss + g * 2);
          const uint32_t hi = *reinterpret_cast<const uint16_t*>(ss + (g + 8) * 2);
          const uint32_t l0 = scale_lut[lo & 0xff], l1 = scale_lut[lo >> 8];
          const uint32_t h0 = scale_lut[hi & 0xff], h1 = scale_lut[hi >> 8];
          sc_lo[f][0] = sc_lo[f][1] = l0;
          sc_lo[f][2] = sc_lo[f][3] = l1;
          sc_hi[f][0] = sc_hi[f][1] = h0;
          sc_hi[f][2] = sc_hi[f][3] = h1;
        }
      }
    }

#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t b[kNF][2];
#pragma unroll
      for (int nf = 0; nf < kNF; nf += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, bs + (nf * 8 + lm_row) * C::kBRow + s * 16 + lm_col);
        b[nf][0] = r[0];
        b[nf][1] = r[1];
        b[nf + 1][0] = r[2];
        b[nf + 1][1] = r[3];
      }
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        uint32_t af[4];
        if constexpr (RT::kFourBit) {
          const uint32_t word = s == 0 ? wq[f].x : s == 1 ? wq[f].y : s == 2 ? wq[f].z : wq[f].w;
          uint32_t bits[4];
          decode_e2m1x8(word, bits);
          af[0] = mul_bf16x2(bits[0], sc_lo[f][s]);
          af[1] = mul_bf16x2(bits[1], sc_hi[f][s]);
          af[2] = mul_bf16x2(bits[2], sc_lo[f][s]);
          af[3] = mul_bf16x2(bits[3], sc_hi[f][s]);
        } else {
          const uint4 v = *reinterpret_cast<const uint4*>(ws + (2 * warp + f) * RT::kFragBytes +
                                                          lane * 64 + s * 16);
          af[0] = v.x;
          af[1] = v.y;
          af[2] = v.z;
          af[3] = v.w;
        }
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) mma_bf16(acc[f][nf], af, b[nf][0], b[nf][1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline; its smem becomes the epilogue tile

  gemm_epilogue<R, kN, kFc1, kEpi>(a, tile, mtile, acc, smem, pair_of, tw_of);
}

}  // namespace moe_ep::kern
