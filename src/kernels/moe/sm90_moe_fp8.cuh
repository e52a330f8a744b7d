// The fp8 MMA path of mxfp4_mxfp8 in the layer (DRAFT: compiled, not yet run on a GPU;
// docs/gpu_kernels.md §8). Same CTA as the m64 kernel (one warpgroup, 64 weight rows = half an
// M-tile, fc1 gate / up fragments paired through shared memory), 128-token routing tiles,
// wgmma m64n128k32 e4m3 with A = MXFP4 weights in the fp8 resident layout decoded in registers
// against per-(row, block) shift tables, B = the folded e4m3 rows of xq8 (fc1, by token) or h8
// (fc2, sorted), an fp32 promotion per 128-wide K stage with the rows' chunk references, and the
// columns' fold references applied in the epilogue.
#pragma once

#include "kernels/moe/fp8_fragments.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/sm90_moe_wgmma.cuh"

namespace moe_ep::kern {

constexpr int kFp8N = 128;       // tokens per routing tile (launch_forward's tile_n 128)
constexpr int kFp8StageK = 128;  // K per stage: 4 k32 steps, one promotion
constexpr int kFp8Stages = 4;    // ring depth, 2 stages loaded ahead
constexpr int kFp8BBytes = kFp8N * kFp8StageK;
constexpr int kFp8WBytes = 2 * kWg3Frags * 512;  // 2 chunks x this CTA's 4 fragments
constexpr int kFp8SBytes = 2 * kWg3Frags * 32;   // their UE8M0 scales (16 rows x 2 blocks)
constexpr int kFp8StageBytes = (kFp8BBytes + kFp8WBytes + kFp8SBytes + 1023) / 1024 * 1024;
constexpr int kFp8TableMin = -12;  // below: every shifted E2M1 value rounds to 0 in E4M3
constexpr int kFp8Tables = kFp8ShiftMax - kFp8TableMin + 2;  // entry 0: all zero
constexpr int kFp8XS = kWg3Rows + 4;                         // fc1 exchange row (fp32)
constexpr int kFp8YS = kWg3Rows + 8;                         // fc2 y row (bf16)
constexpr int kFp8EpiBytes = kFp8N * kFp8XS * 4;
constexpr int kFp8SmemBytes =
    (kFp8Stages * kFp8StageBytes > kFp8EpiBytes ? kFp8Stages * kFp8StageBytes : kFp8EpiBytes) +
    1024;

using Fp8Wgmma = gmma::MMA_64x128x32_F32E4M3E4M3_RS_TN<>;

template <size_t... I>
__device__ __forceinline__ void wgmma_fp8_m64n128(float* d, const uint32_t (&a)[4], uint64_t desc,
                                                  bool accumulate, std::index_sequence<I...>) {
  Fp8Wgmma::fma(a[0], a[1], a[2], a[3], desc, d[I]...,
                accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}

__device__ __forceinline__ int fp8_table_index(int d) {
  return d < kFp8TableMin ? 0 : 1 + d - kFp8TableMin;
}

// Grid: one CTA per (routing tile, half M-tile), half M-tile fastest.
template <bool kFc1>
__global__ void __launch_bounds__(kThreads, 2) sm90_moe_fp8_kernel(const ForwardArgs a) {
  constexpr Recipe R = Recipe::kMxfp4Mxfp8;
  constexpr int kNF = kFp8N / 8;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t table[kFp8Tables];
  __shared__ const uint8_t* brow_ptr[kFp8N];
  __shared__ int pair_of[kFp8N];
  __shared__ float tw_of[kFp8N];
  __shared__ float colf[kFp8N];  // 2^(fold reference - 127) of each column

  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int m64 = int(blockIdx.x % unsigned(halves));
  const int tile_idx = int(blockIdx.x / unsigned(halves));
  if (tile_idx >= *a.num_tiles) return;
  const int mtile = m64 >> 1, half = m64 & 1;
  if (!kFc1 && mtile * kTileRows + half * kWg3Rows >= a.H) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);

  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int stages_k = ms.chunks / 2;
  const uint8_t* wsrc = ms.w + half * (kWg3Frags * 512) + tid * 16;
  const uint8_t* ssrc = ms.s + half * (kWg3Frags * 32) + (tid & 7) * 16;

  for (int i = tid; i < kFp8Tables; i += kThreads)
    table[i] = i == 0 ? 0 : fp8_e2m1_table(i - 1 + kFp8TableMin);
  const uint8_t* bsrc = kFc1 ? a.xq8 : a.h8;
  for (int n = tid; n < kFp8N; n += kThreads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    brow_ptr[n] = bsrc + c.brow;  // one byte per element: the bf16 element offset is the byte one
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
    int ref = 127;
    if (n < tile.rows) ref = kFc1 ? a.xref[c.pair / a.K] : a.href[tile.start + n];
    colf[n] = fmt::exp2i(ref - 127);
  }
  __syncthreads();

  const int bc = tid & 7, br0 = tid >> 3;
  const int bdst = br0 * 128 + ((bc ^ (br0 & 7)) << 4);
  const uint8_t* bptr[kFp8N / 16];
#pragma unroll
  for (int i = 0; i < kFp8N / 16; ++i) bptr[i] = brow_ptr[br0 + 16 * i] + bc * 16;
  const int live_rows = tile.rows;

  auto load_stage = [&](int st) {
    unsigned char* sp = smem + (st % kFp8Stages) * kFp8StageBytes;
#pragma unroll
    for (int i = 0; i < kFp8N / 16; ++i)
      cp_async16(sp + bdst + i * 2048, bptr[i] + st * kFp8StageK, br0 + 16 * i < live_rows);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      cp_async16(sp + kFp8BBytes + c * (kWg3Frags * 512) + tid * 16,
                 wsrc + size_t(2 * st + c) * (kTileFrags * 512), true);
      if (tid < 8)
        cp_async16(sp + kFp8BBytes + kFp8WBytes + c * (kWg3Frags * 32) + tid * 16,
                   ssrc + size_t(2 * st + c) * (kTileFrags * 32), true);
    }
  };

  float acc[kNF * 4], part[kNF * 4];
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f, part[i] = 0.0f;
  uint32_t af[4][4];

#pragma unroll
  for (int st = 0; st < kFp8Stages - 2; ++st) {
    if (st < stages_k) load_stage(st);
    cp_async_commit();
  }
  for (int st = 0; st < stages_k; ++st) {
    cp_async_wait<kFp8Stages - 3>();
    fence_proxy_async_smem();
    __syncthreads();  // stage st is visible; stage st - 2's slot is free (its wgmmas retired)
    if (st + kFp8Stages - 2 < stages_k) load_stage(st + kFp8Stages - 2);
    cp_async_commit();

    const unsigned char* sp = smem + (st % kFp8Stages) * kFp8StageBytes;
    // Rows g and g + 8 of this warp's fragment: 2 scale bytes per 64-wide chunk each.
    const unsigned char* ss = sp + kFp8BBytes + kFp8WBytes + warp * 32;
    const uint32_t sc_lo = uint32_t(*reinterpret_cast<const uint16_t*>(ss + g * 2)) |
                           (uint32_t(*reinterpret_cast<const uint16_t*>(ss + 128 + g * 2)) << 16);
    const uint32_t sc_hi =
        uint32_t(*reinterpret_cast<const uint16_t*>(ss + (g + 8) * 2)) |
        (uint32_t(*reinterpret_cast<const uint16_t*>(ss + 128 + (g + 8) * 2)) << 16);
    const int ref_lo = fp8_chunk_reference(sc_lo), ref_hi = fp8_chunk_reference(sc_hi);
    const uint64_t desc = sw128_desc(smem_base + (st % kFp8Stages) * kFp8StageBytes);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 piece = *reinterpret_cast<const uint4*>(
          sp + kFp8BBytes + (s >> 1) * (kWg3Frags * 512) + warp * 512 + lane * 16);
      const uint32_t w_lo = (s & 1) ? piece.z : piece.x, w_hi = (s & 1) ? piece.w : piece.y;
      const uint64_t t_lo = table[fp8_table_index(int((sc_lo >> (8 * s)) & 0xff) - ref_lo)];
      const uint64_t t_hi = table[fp8_table_index(int((sc_hi >> (8 * s)) & 0xff) - ref_hi)];
      fp8_decode_word(w_lo, t_lo, af[s][0], af[s][2]);
      fp8_decode_word(w_hi, t_hi, af[s][1], af[s][3]);
      wgmma_fence();
      wgmma_fp8_m64n128(part, af[s], desc + uint64_t(2 * s), s > 0,
                        std::make_index_sequence<kNF * 4>{});
      wgmma_commit();
    }
    wgmma_wait<0>();
    const float f_lo = fmt::exp2i(ref_lo - 127), f_hi = fmt::exp2i(ref_hi - 127);
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) acc[i] = fmaf(part[i], (i & 2) ? f_hi : f_lo, acc[i]);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring; its smem becomes the epilogue tile

  // acc[nf * 4 + i]: row warp * 16 + g + (i >> 1) * 8 of the CTA's 64, column nf * 8 + 2 t4 +
  // (i & 1); the same as the m64 kernel's, so its epilogue follows (with the column factors).
  const int rows = tile.rows;
  if constexpr (kFc1) {
    float* xs = reinterpret_cast<float*>(smem);
    const int slot0 = (warp & 1) * kWg3HCols + (warp >> 1) * 16 + g;
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 8 >= rows) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nf * 8 + 2 * t4 + (i & 1);
        xs[col * kFp8XS + slot0 + (i >> 1) * 8] = fmt::round_to_bf16(acc[nf * 4 + i] * colf[col]);
      }
    }
    __syncthreads();
    for (int it = tid; it < rows * kWg3HCols; it += kThreads) {
      const int col = it / kWg3HCols, j = it % kWg3HCols;
      float* x = xs + col * kFp8XS;
      float hv = fmt::swiglu(x[j], x[kWg3HCols + j], a.swiglu_limit);
      if (a.weight_in_fc1) hv = fmt::mul_rn(hv, tw_of[col]);
      x[j] = hv;
    }
    __syncthreads();
    store_h_rows<R, kWg3HCols, kFp8XS>(a, xs, tile, mtile * kFc1TileH + half * kWg3HCols, tid,
                                       kThreads);
  } else {
    uint16_t* ys = reinterpret_cast<uint16_t*>(smem);
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 8 >= rows) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nf * 8 + 2 * t4 + (i & 1);
        const int row = warp * 16 + g + (i >> 1) * 8;
        ys[col * kFp8YS + row] = fmt::float_to_bf16(acc[nf * 4 + i] * colf[col]);
      }
    }
    __syncthreads();
    const int row0 = mtile * kTileRows + half * kWg3Rows;
    for (int it = tid; it < rows * 8; it += kThreads) {
      const int col = it >> 3, p = it & 7;
      if (row0 + p * 8 >= a.H) continue;
      const int pair = pair_of[col];
      uint16_t* dst = a.y_dst != nullptr ? a.y_dst[pair] : a.y_rows + size_t(pair) * a.H;
      *reinterpret_cast<uint4*>(dst + row0 + p * 8) =
          *reinterpret_cast<const uint4*>(ys + col * kFp8YS + p * 8);
    }
    if (a.y_dst_fence) __threadfence_system();
  }
}

template <bool kFc1>
cudaError_t launch_fp8_gemm(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kFp8N);
  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  if (tiles == 0) return cudaSuccess;
  sm90_moe_fp8_kernel<kFc1><<<unsigned(tiles) * unsigned(halves), kThreads, kFp8SmemBytes, s>>>(a);
  return cudaGetLastError();
}

// fc1, the fold of h, fc2 (tiles of 128; every tile size of the recipe runs here).
inline cudaError_t launch_fp8_gemms(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_fc1_fc2([&] { return launch_fp8_gemm<true>(a, s); },
                        [&] {
                          const cudaError_t e =
                              launch_fp8_fold(a.h, a.tokens * a.K, a.I, a.h8, a.href, s);
                          return e != cudaSuccess ? e : launch_fp8_gemm<false>(a, s);
                        },
                        s, ev);
}

inline cudaError_t set_fp8_attributes() {
  return first_error({set_max_smem(sm90_moe_fp8_kernel<true>, kFp8SmemBytes),
                      set_max_smem(sm90_moe_fp8_kernel<false>, kFp8SmemBytes)});
}

}  // namespace moe_ep::kern
