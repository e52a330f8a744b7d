// Prefill grouped GEMM on Hopper wgmma (tile_n
// 128; decode tiles keep the mma.sync kernel of sm90_moe_device.cuh). Same "swap AB" shape and
// resident weight layout: A = 128 weight rows of one M-tile decoded in registers (wgmma's
// register-A fragment of warp w in a warpgroup is mma.sync m16n8k16's A fragment of that warp's 16
// rows, so the resident per-lane layout and the 4-bit decode feed it unchanged), B = up to 128
// routed token rows in shared memory (K-major, 128-byte swizzle, one 128-byte row per token and
// K-chunk), loaded with cp.async. One CTA = one warpgroup; per k16 step two m64nNk16 wgmmas
// (fragments 2w: gate / first 64 rows, 2w+1: up / last 64 rows), so acc[f][nf][i] is laid out as in
// the mma.sync kernel and the epilogue is shared. N is picked per tile at run time (32, 64, 96 or
// 128 by its rows). One commit group per k16 step; up to 3 steps stay in flight while the warps
// decode the next.
#pragma once

#include <cuda.h>  // CUtensorMap (types only)

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <type_traits>
#include <utility>

#include "kernels/moe/sm90_moe_decode.cuh"  // mbarrier helpers
#include "kernels/moe/sm90_moe_device.cuh"

namespace moe_ep::kern {

constexpr int kWgN = 128;  // tokens per prefill tile

// ---------------------------------------------------------------------------------------------
// wgmma PTX (sm_90a). D += A (registers, bf16) * B (shared-memory descriptor, K-major bf16).

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes (cp.async) made visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes, 8-row groups 1024
// bytes apart (stride byte offset), leading byte offset unused (1), base 1024-aligned.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// One m64nNk16 wgmma, bf16 x bf16 -> fp32, A from registers (K-major), B a K-major shared-memory
// descriptor, accumulating (scale-d 1): CuTe's SM90 GMMA atom for N, its fma called with the
// N / 2 accumulators of this thread.
namespace gmma = cute::SM90::GMMA;
template <int N>
struct WgmmaRs;
template <>
struct WgmmaRs<32> {
  using Op = gmma::MMA_64x32x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<64> {
  using Op = gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<80> {
  using Op = gmma::MMA_64x80x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<96> {
  using Op = gmma::MMA_64x96x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<128> {
  using Op = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<144> {
  using Op = gmma::MMA_64x144x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<160> {
  using Op = gmma::MMA_64x160x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<192> {
  using Op = gmma::MMA_64x192x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaRs<256> {
  using Op = gmma::MMA_64x256x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;
};

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc,
                                         std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], desc, d[I]...);
}

template <int N>
__device__ __forceinline__ void wgmma_m64(float* d, const uint32_t (&a)[4], uint64_t desc) {
  wgmma_rs<typename WgmmaRs<N>::Op>(d, a, desc, std::make_index_sequence<N / 2>{});
}

// The two wgmmas of one k16 step (f = 0: rows 0-63, f = 1: rows 64-127) with N = kNW columns.
template <int kNW>
__device__ __forceinline__ void wgmma_step(float (&acc)[2][kWgN / 8][4], const uint32_t (&af)[2][4],
                                           uint64_t desc) {
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    wgmma_m64<kNW>(&acc[f][0][0], af[f], desc);
  }
}

__device__ __forceinline__ void keep_alive(const uint32_t (&r)[2][4]) {
  asm volatile("" ::"r"(r[0][0]), "r"(r[0][1]), "r"(r[0][2]), "r"(r[0][3]), "r"(r[1][0]),
               "r"(r[1][1]), "r"(r[1][2]), "r"(r[1][3]));
}

template <Recipe R>
struct WgmmaConfig {
  using RT = RecipeKernelTraits<R>;
  static constexpr int kBBytes = kWgN * kKChunk * 2;  // 128 rows x 128 B, swizzled
  static constexpr int kWBytes = kTileFrags * RT::kFragBytes;
  static constexpr int kSBytes = kTileFrags * RT::kScaleBytes;
  // Each stage starts 1024-aligned (the swizzle pattern repeats every 1024 bytes).
  static constexpr int kStageBytes = (kBBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  // Two CTAs per SM: 5 x 21 KB (4-bit) or 3 x 32 KB (bf16) each.
  static constexpr int kStages = RT::kFourBit ? 5 : 3;
  static constexpr int kAhead = kStages - 2;  // chunks loaded ahead (one more is in the wgmmas)
  static constexpr int kEpiBytes = kWgN * (kFc1TileH + 4) * 4 > kWgN*(kTileRows + 8) * 2
                                       ? kWgN*(kFc1TileH + 4) * 4
                                       : kWgN*(kTileRows + 8) * 2;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = (kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes) + 1024;
};

// Grid: one CTA per (routing tile, M-tile), M-tile fastest, so the CTAs of one tile run
// together and share its activation rows in L2.
template <Recipe R, bool kFc1>
__global__ void __launch_bounds__(kThreads, 2) sm90_moe_wgmma_kernel(const ForwardArgs a) {
  using C = WgmmaConfig<R>;
  using RT = typename C::RT;
  constexpr int kNF = kWgN / 8;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint32_t scale_lut[RT::kFourBit ? 256 : 1];
  __shared__ const uint16_t* brow_ptr[kWgN];  // first element of each B row (xq or h)
  __shared__ int pair_of[kWgN];               // t*K+k of each column
  __shared__ float tw_of[kWgN];

  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int mtile = int(blockIdx.x % unsigned(mtiles));
  const int tile_idx = int(blockIdx.x / unsigned(mtiles));
  if (tile_idx >= *a.num_tiles) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);

  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int chunks = ms.chunks;
  const uint8_t *wbase = ms.w, *sbase = ms.s;

  if constexpr (RT::kFourBit) {
    for (int b = tid; b < 256; b += kThreads) scale_lut[b] = scale_multiplier<R>(b);
  }
  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  for (int n = tid; n < kWgN; n += kThreads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    brow_ptr[n] = bsrc + c.brow;
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
  }
  __syncthreads();

  // This thread's B pieces: 16-byte column bc of rows br0 + 16 i; the swizzle XORs the column
  // with the row's low 3 bits, which are br0's for every i.
  const int bc = tid & 7, br0 = tid >> 3;
  const int bdst_off = br0 * 128 + ((bc ^ (br0 & 7)) << 4);
  const int live_rows = tile.rows;
  const uint8_t* wsrc_t = wbase + tid * 16;
  const uint8_t* ssrc_t = RT::kFourBit ? sbase + tid * 16 : nullptr;

  // One stage: the kNW rows the wgmmas read (rows past the tile's zero-filled), 8 weight
  // fragments and their scales.
  const int nb = (live_rows + 31) >> 5;  // 32-column blocks the wgmmas cover
  auto load_stage = [&](int slot, int chunk) {
    unsigned char* st = smem + slot * C::kStageBytes;
#pragma unroll
    for (int i = 0; i < kWgN / 16; ++i) {
      const int row = br0 + 16 * i;
      // Only the rows the wgmmas read; those past the tile's are zero-filled.
      if (i < 2 * nb)  // uniform
        cp_async16(st + bdst_off + i * 2048, brow_ptr[row] + chunk * kKChunk + bc * 8,
                   row < live_rows);
    }
    const uint8_t* wsrc = wsrc_t + size_t(chunk) * C::kWBytes;
    unsigned char* wdst = st + C::kBBytes + tid * 16;
#pragma unroll
    for (int i = 0; i < C::kWBytes / 16 / kThreads; ++i)
      cp_async16(wdst + i * kThreads * 16, wsrc + i * kThreads * 16, true);
    if constexpr (RT::kFourBit) {
      if (tid < C::kSBytes / 16)
        cp_async16(st + C::kBBytes + C::kWBytes + tid * 16, ssrc_t + size_t(chunk) * C::kSBytes,
                   true);
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
  for (int s = 0; s < C::kAhead; ++s) {
    if (s < chunks) load_stage(s, s);
    cp_async_commit();
  }
  uint32_t af[4][2][4];  // A fragments of k16 steps 0..3 of a chunk (f, reg)
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) af[s][f][i] = 0;
  const uint32_t smem_base = smem_addr(smem);

  // One copy of the K loop per N, so every wgmma on the accumulators has the same shape (ptxas
  // orders same-shape wgmmas implicitly; a shape change would need a fence in the pipeline).
  auto k_loop = [&](auto nw) {
    constexpr int kNW = decltype(nw)::value;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      cp_async_wait<C::kAhead - 1>();
      fence_proxy_async_smem();
      // After this barrier chunk's data is visible to every warp, and the slot loaded below
      // (chunk - 2's) is free: every warp's waits in chunk - 1 retired all of chunk - 2's steps.
      __syncthreads();
      {
        const int next = chunk + C::kAhead;
        if (next < chunks) load_stage(next % C::kStages, next);
        cp_async_commit();
      }
      const int slot = chunk % C::kStages;
      const unsigned char* ws = smem + slot * C::kStageBytes + C::kBBytes;

      // This warp's two fragments (2*warp: gate / rows 0-63, 2*warp+1: up / rows 64-127): the
      // 4-bit words and scale multipliers of the whole chunk, decoded one k16 step at a time.
      [[maybe_unused]] uint32_t words[2][4], sc_lo[2][4], sc_hi[2][4];
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        if constexpr (RT::kFourBit) {
          const int frag = 2 * warp + f;
          const uint4 wq = *reinterpret_cast<const uint4*>(ws + frag * RT::kFragBytes + lane * 16);
          words[f][0] = wq.x;
          words[f][1] = wq.y;
          words[f][2] = wq.z;
          words[f][3] = wq.w;
          const unsigned char* ss = ws + C::kWBytes + frag * RT::kScaleBytes;
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
            sc_lo[f][0] = sc_lo[f][1] = scale_lut[lo & 0xff];
            sc_lo[f][2] = sc_lo[f][3] = scale_lut[lo >> 8];
            sc_hi[f][0] = sc_hi[f][1] = scale_lut[hi & 0xff];
            sc_hi[f][2] = sc_hi[f][3] = scale_lut[hi >> 8];
          }
        }
      }

      const uint64_t desc = sw128_desc(smem_base + slot * C::kStageBytes);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // af[s] was last read by the wgmmas of this step one chunk ago, retired by the wait below
        // in step s - 1 (up to 3 steps stay in flight while the next ones decode).
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          if constexpr (RT::kFourBit) {
            uint32_t bits[4];
            decode_e2m1x8(words[f][s], bits);
            af[s][f][0] = mul_bf16x2(bits[0], sc_lo[f][s]);
            af[s][f][1] = mul_bf16x2(bits[1], sc_hi[f][s]);
            af[s][f][2] = mul_bf16x2(bits[2], sc_lo[f][s]);
            af[s][f][3] = mul_bf16x2(bits[3], sc_hi[f][s]);
          } else {
            const uint4 v = *reinterpret_cast<const uint4*>(ws + (2 * warp + f) * RT::kFragBytes +
                                                            lane * 64 + s * 16);
            af[s][f][0] = v.x;
            af[s][f][1] = v.y;
            af[s][f][2] = v.z;
            af[s][f][3] = v.w;
          }
        }
        wgmma_fence();
        const uint64_t d = desc + uint64_t(2 * s);  // +32 bytes per k16 step
        wgmma_step<kNW>(acc, af[s], d);
        wgmma_commit();
        wgmma_wait<3>();
        // The step that used af[(s + 1) % 4] is retired now; keeping those registers alive until
        // here stops ptxas from reusing them for a decode while a wgmma may still read them.
        keep_alive(af[(s + 1) & 3]);
      }
    }
  };
  if (nb >= 4)
    k_loop(std::integral_constant<int, 128>{});
  else if (nb == 3)
    k_loop(std::integral_constant<int, 96>{});
  else if (nb == 2)
    k_loop(std::integral_constant<int, 64>{});
  else
    k_loop(std::integral_constant<int, 32>{});
  wgmma_wait<0>();
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int n = 0; n < kNF; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(acc[f][n][i])::"memory");
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline; its smem becomes the epilogue tile

  gemm_epilogue<R, kWgN, kFc1>(a, tile, mtile, acc, smem, pair_of, tw_of);
}

// ---------------------------------------------------------------------------------------------
// v3 (MOE_EP_WGMMA_V=3, 4-bit weights; docs/gpu_kernels.md §10): one routing tile per expert at
// prefill (tile_n 256) and one m64nNk16 wgmma per k16 step. A CTA = one warpgroup = 64 weight
// rows (half an M-tile: fragments 4*half + w, one per warp) x N tokens, N = the tile's rows
// rounded up to a class below (<= 256; acc N/2 fp32 registers per thread). Against v2 (two m64
// wgmmas on 128 rows, tiles of 128): no second tiles of a few rows, and half the decode per
// wgmma. Same fragments, same per-column k order (one wgmma per k16 step, K ascending), so the
// same bits. fc1: warps 0/2 hold gate rows, 1/3 the matching up rows (fragment order of
// moe_params.h), so the epilogue pairs them through shared memory.

constexpr int kWg3MaxN = 256;  // tokens per routing tile (launch_forward's tile_n 256)
constexpr int kWg3Rows = 64;   // weight rows per CTA
constexpr int kWg3Frags = 4;   // fragments per CTA, one per warp
constexpr int kWg3HCols = 32;  // h columns per fc1 CTA

__device__ __forceinline__ void keep_alive4(const uint32_t (&r)[4]) {
  asm volatile("" ::"r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}

template <Recipe R>
struct Wgmma3Config {
  using RT = RecipeKernelTraits<R>;
  static_assert(RT::kFourBit, "v3 is for 4-bit weights (bf16 weights stay on v2)");
  static constexpr int kWBytes = kWg3Frags * RT::kFragBytes;  // this CTA's half of a chunk
  static constexpr int kSBytes = kWg3Frags * RT::kScaleBytes;
  static_assert(kWBytes == 16 * kThreads, "one 16-byte weight copy per thread and chunk");
  // A stage for N columns: B (N 128-byte swizzled rows, 1024-aligned), weights, scales.
  __host__ __device__ static constexpr int stage_bytes(int n) {
    return (n * 128 + kWBytes + kSBytes + 1023) / 1024 * 1024;
  }
  // The ring holds 3 stages of N = 256; smaller N get more stages (up to 5, v2's depth). Two
  // CTAs per SM.
  static constexpr int kRingBytes = 3 * stage_bytes(kWg3MaxN);
  __host__ __device__ static constexpr int stages(int n) {
    return kRingBytes / stage_bytes(n) < 5 ? kRingBytes / stage_bytes(n) : 5;
  }
  static constexpr int kXS = kWg3Rows + 4;  // fc1 exchange row (fp32 per token column)
  static constexpr int kYS = kWg3Rows + 8;  // fc2 y row (bf16 per token column)
  static constexpr int kEpiBytes =
      kWg3MaxN * kXS * 4 > kWg3MaxN* kYS * 2 ? kWg3MaxN* kXS * 4 : kWg3MaxN* kYS * 2;
  static constexpr int kSmemBytes = (kRingBytes > kEpiBytes ? kRingBytes : kEpiBytes) + 1024;
};

// store_h_tile for kWg3HCols h columns starting at h column hcol0 of the tile's columns
// col0 .. col0 + ncols - 1: xs [ncols][kXS] fp32 requantized with the CPU's block quantizers
// (blocks of 16 / 32 along I lie inside the 32 columns) and written as bf16 q*s rows in sorted
// order.
template <Recipe R, int kXS>
__device__ __forceinline__ void store_h_cols(const ForwardArgs& a, const float* xs,
                                             const TileInfo& tile, int hcol0, int col0, int ncols,
                                             int tid) {
  uint16_t* hdst = a.h + size_t(tile.start + col0) * a.I + hcol0;
  if constexpr (R == Recipe::kNvfp4) {
    const float nc = a.fc1_norm_const[tile.expert];
    for (int it = tid; it < ncols * 2; it += kThreads) {
      const int col = it >> 1, blk = it & 1;
      const float* v = xs + col * kXS + blk * 16;
      uint8_t packed[8];
      const uint8_t sb = fmt::quantize_block_nvfp4(v, nc, packed);
      const float s = fmt::e4m3_to_float(sb);
      uint32_t o[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t lo = fmt::float_to_bf16(fmt::e2m1_to_float(packed[i] & 0xf) * s);
        const uint32_t hi = fmt::float_to_bf16(fmt::e2m1_to_float(packed[i] >> 4) * s);
        o[i] = lo | (hi << 16);
      }
      uint4* d = reinterpret_cast<uint4*>(hdst + size_t(col) * a.I + blk * 16);
      d[0] = make_uint4(o[0], o[1], o[2], o[3]);
      d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    for (int col = tid; col < ncols; col += kThreads) {
      const float* v = xs + col * kXS;
      uint8_t q[32];
      const uint8_t sb = fmt::quantize_block_mxfp8(v, q);
      const float s = fmt::ue8m0_to_float(sb);
      uint4* d = reinterpret_cast<uint4*>(hdst + size_t(col) * a.I);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t lo = fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * i]) * s);
          const uint32_t hi = fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * i + 1]) * s);
          o[i] = lo | (hi << 16);
        }
        d[j] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  } else {
    for (int it = tid; it < ncols * 4; it += kThreads) {
      const int col = it >> 2, p = it & 3;
      const float* v = xs + col * kXS + p * 8;
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o[i] = uint32_t(fmt::float_to_bf16(v[2 * i])) |
               (uint32_t(fmt::float_to_bf16(v[2 * i + 1])) << 16);
      *reinterpret_cast<uint4*>(hdst + size_t(col) * a.I + p * 8) =
          make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

// Calls f(integral_constant<int, N>) with N = the N class of a tile of `rows` rows (<= 256).
template <class F>
__device__ __forceinline__ void m64_dispatch_n(int rows, F&& f) {
  if (rows > 192)
    f(std::integral_constant<int, 256>{});
  else if (rows > 160)
    f(std::integral_constant<int, 192>{});
  else if (rows > 144)
    f(std::integral_constant<int, 160>{});
  else if (rows > 128)
    f(std::integral_constant<int, 144>{});
  else if (rows > 96)
    f(std::integral_constant<int, 128>{});
  else if (rows > 80)
    f(std::integral_constant<int, 96>{});
  else if (rows > 64)
    f(std::integral_constant<int, 80>{});
  else if (rows > 32)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 32>{});
}

// The epilogue of the m64 kernels (threads 0..127 = the warpgroup that holds acc; `sync` is a
// barrier over exactly those threads). The pipeline's shared memory is free.
// Columns col0 .. col0 + min(kNW, rows - col0) - 1 of the tile, acc[kNW / 2] of an m64nNk16
// wgmma with N = kNW.
template <Recipe R, bool kFc1, int kNW, class Sync>
__device__ __forceinline__ void m64_epilogue(const ForwardArgs& a, const TileInfo& tile, int mtile,
                                             int half, float (&acc)[kNW / 2], int col0,
                                             unsigned char* smem, const int* pair_of,
                                             const float* tw_of, Sync sync) {
  using C = Wgmma3Config<R>;
  using RT = typename C::RT;
  constexpr int kNF = kNW / 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int rows = tile.rows - col0 < kNW ? tile.rows - col0 : kNW;  // this call's columns
  // acc[nf*4 + i]: row warp*16 + g + (i>>1)*8 of the CTA's 64, column nf*8 + 2*t4 + (i&1).
  const int e = tile.expert;
  if constexpr (kFc1) {
    // Scaled gate/up values to xs [col][kXS]: gate of h column j (0..31) at j, up at 32 + j
    // (warp w holds fragment 4*half + w: gate (w even) or up (w odd) of h columns
    // (w >> 1) * 16 + 0..15), then h in place of the gate values.
    float* xs = reinterpret_cast<float*>(smem);
    const float alpha = R == Recipe::kNvfp4 ? a.fc1_alpha[e] : 1.0f;
    const int slot0 = (warp & 1) * kWg3HCols + (warp >> 1) * 16 + g;
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 8 >= rows) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nf * 8 + 2 * t4 + (i & 1);
        float v = acc[nf * 4 + i] * RT::kAccScale;
        if constexpr (R == Recipe::kNvfp4) {
          v = fmt::mul_rn(alpha, v);
        } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
          v = fmt::round_to_bf16(v);
        }
        xs[col * C::kXS + slot0 + (i >> 1) * 8] = v;
      }
    }
    sync();
    // Each thread reads the gate slot it overwrites, and nobody writes the up slots: no race.
    for (int it = tid; it < rows * kWg3HCols; it += kThreads) {
      const int col = it / kWg3HCols, j = it % kWg3HCols;
      float* x = xs + col * C::kXS;
      float hv = fmt::swiglu(x[j], x[kWg3HCols + j], a.swiglu_limit);
      if (a.weight_in_fc1) hv = fmt::mul_rn(hv, tw_of[col0 + col]);
      x[j] = hv;
    }
    sync();
    store_h_cols<R, C::kXS>(a, xs, tile, mtile * kFc1TileH + half * kWg3HCols, col0, rows, tid);
  } else {
    // y tile [col][kYS] bf16, then 16-byte row stores to y_rows[t*K+k] (or y_dst).
    uint16_t* ys = reinterpret_cast<uint16_t*>(smem);
    const float alpha = R == Recipe::kNvfp4 ? a.fc2_alpha[e] : 1.0f;
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 8 >= rows) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nf * 8 + 2 * t4 + (i & 1);
        const int row = warp * 16 + g + (i >> 1) * 8;
        float v = acc[nf * 4 + i] * RT::kAccScale;
        if constexpr (R == Recipe::kNvfp4) v = fmt::mul_rn(alpha, v);
        ys[col * C::kYS + row] = fmt::float_to_bf16(v);
      }
    }
    sync();
    const int row0 = mtile * kTileRows + half * kWg3Rows;
    for (int it = tid; it < rows * 8; it += kThreads) {
      const int col = it >> 3, p = it & 7;
      if (row0 + p * 8 >= a.H) continue;
      const int pair = pair_of[col0 + col];
      uint16_t* dst = a.y_dst != nullptr ? a.y_dst[pair] : a.y_rows + size_t(pair) * a.H;
      *reinterpret_cast<uint4*>(dst + row0 + p * 8) =
          *reinterpret_cast<const uint4*>(ys + col * C::kYS + p * 8);
    }
    if (a.y_dst_fence) __threadfence_system();
  }
}

// Grid: one CTA per (routing tile, half M-tile), half M-tile fastest (the CTAs of one tile run
// together and share its activation rows in L2).
template <Recipe R, bool kFc1>
__global__ void __launch_bounds__(kThreads, 2) sm90_moe_wgmma3_kernel(const ForwardArgs a) {
  using C = Wgmma3Config<R>;
  using RT = typename C::RT;
  constexpr int kNF = kWg3MaxN / 8;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint32_t scale_lut[256];
  __shared__ const uint16_t* brow_ptr[kWg3MaxN];  // first element of each B row (xq or h)
  __shared__ int pair_of[kWg3MaxN];               // t*K+k of each column
  __shared__ float tw_of[kWg3MaxN];

  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int m64 = int(blockIdx.x % unsigned(halves));
  const int tile_idx = int(blockIdx.x / unsigned(halves));
  if (tile_idx >= *a.num_tiles) return;
  const int mtile = m64 >> 1, half = m64 & 1;
  // fc2 rows are padded to a multiple of 128: a half made only of padding has nothing to store.
  if (!kFc1 && mtile * kTileRows + half * kWg3Rows >= a.H) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);

  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int chunks = ms.chunks;
  // This CTA's fragments 4*half .. 4*half+3 of each chunk (kTileFrags per chunk) are contiguous.
  const uint8_t* wsrc_t = ms.w + half * C::kWBytes + tid * 16;
  const uint8_t* ssrc_t = ms.s + half * C::kSBytes + tid * 16;

  for (int b = tid; b < 256; b += kThreads) scale_lut[b] = scale_multiplier<R>(b);
  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  for (int n = tid; n < kWg3MaxN; n += kThreads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    brow_ptr[n] = bsrc + c.brow;
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
  }
  __syncthreads();

  // This thread's B pieces: 16-byte column bc of rows br0 + 16 i; the swizzle XORs the column
  // with the row's low 3 bits, which are br0's for every i.
  const int bc = tid & 7, br0 = tid >> 3;
  const int bdst_off = br0 * 128 + ((bc ^ (br0 & 7)) << 4);
  const int live_rows = tile.rows;
  const uint32_t smem_base = smem_addr(smem);

  float acc[kNF * 4];
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f;

  // One copy of the K loop per N class (every wgmma on the accumulators has one shape).
  auto k_loop = [&](auto nw) {
    constexpr int kNW = decltype(nw)::value;
    constexpr int kStages = C::stages(kNW);
    constexpr int kStageBytes = C::stage_bytes(kNW);
    constexpr int kAhead = kStages - 2;  // chunks loaded ahead (one more is in the wgmmas)
    static_assert(kNW % 16 == 0 && kStages >= 3, "N class");
    // This thread's B sources, held in registers (a shared-memory table costs a load and
    // three hazard slots per copy).
    const uint16_t* bptr[kNW / 16];
#pragma unroll
    for (int i = 0; i < kNW / 16; ++i) bptr[i] = brow_ptr[br0 + 16 * i] + bc * 8;
    // One stage: the kNW rows the wgmma reads (rows past the tile's zero-filled), this CTA's 4
    // weight fragments and their scales.
    auto load_stage = [&](int slot, int chunk) {
      unsigned char* st = smem + slot * kStageBytes;
#pragma unroll
      for (int i = 0; i < kNW / 16; ++i)
        cp_async16(st + bdst_off + i * 2048, bptr[i] + chunk * kKChunk, br0 + 16 * i < live_rows);
      cp_async16(st + kNW * 128 + tid * 16, wsrc_t + size_t(chunk) * (2 * C::kWBytes), true);
      if (tid < C::kSBytes / 16)
        cp_async16(st + kNW * 128 + C::kWBytes + tid * 16,
                   ssrc_t + size_t(chunk) * (2 * C::kSBytes), true);
    };
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < chunks) load_stage(s, s);
      cp_async_commit();
    }
    uint32_t af[4][4];  // A fragments of k16 steps 0..3 of a chunk
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) af[s][i] = 0;

    for (int chunk = 0; chunk < chunks; ++chunk) {
      cp_async_wait<kAhead - 1>();
      fence_proxy_async_smem();
      // After this barrier chunk's data is visible to every warp, and the slot loaded below
      // (chunk - 2's) is free: every warp's waits in chunk - 1 retired all of chunk - 2's steps.
      __syncthreads();
      {
        const int next = chunk + kAhead;
        if (next < chunks) load_stage(next % kStages, next);
        cp_async_commit();
      }
      const int slot = chunk % kStages;
      const unsigned char* ws = smem + slot * kStageBytes + kNW * 128;

      // This warp's fragment: the 4-bit words and scale multipliers of the whole chunk.
      const uint4 wq = *reinterpret_cast<const uint4*>(ws + warp * RT::kFragBytes + lane * 16);
      const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
      uint32_t sc_lo[4], sc_hi[4];
      const unsigned char* ss = ws + C::kWBytes + warp * RT::kScaleBytes;
      if constexpr (RT::kNvScale) {
        const uint32_t lo = *reinterpret_cast<const uint32_t*>(ss + g * 4);
        const uint32_t hi = *reinterpret_cast<const uint32_t*>(ss + (g + 8) * 4);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          sc_lo[s] = scale_lut[(lo >> (8 * s)) & 0xff];
          sc_hi[s] = scale_lut[(hi >> (8 * s)) & 0xff];
        }
      } else {
        const uint32_t lo = *reinterpret_cast<const uint16_t*>(ss + g * 2);
        const uint32_t hi = *reinterpret_cast<const uint16_t*>(ss + (g + 8) * 2);
        sc_lo[0] = sc_lo[1] = scale_lut[lo & 0xff];
        sc_lo[2] = sc_lo[3] = scale_lut[lo >> 8];
        sc_hi[0] = sc_hi[1] = scale_lut[hi & 0xff];
        sc_hi[2] = sc_hi[3] = scale_lut[hi >> 8];
      }

      const uint64_t desc = sw128_desc(smem_base + slot * kStageBytes);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // af[s] was last read by this step's wgmma one chunk ago, retired by the wait below in
        // step s - 1 (up to 3 steps stay in flight while the next ones decode).
        uint32_t bits[4];
        decode_e2m1x8(words[s], bits);
        af[s][0] = mul_bf16x2(bits[0], sc_lo[s]);
        af[s][1] = mul_bf16x2(bits[1], sc_hi[s]);
        af[s][2] = mul_bf16x2(bits[2], sc_lo[s]);
        af[s][3] = mul_bf16x2(bits[3], sc_hi[s]);
        wgmma_fence();
        wgmma_m64<kNW>(acc, af[s], desc + uint64_t(2 * s));  // +32 bytes per k16 step
        wgmma_commit();
        wgmma_wait<3>();
        // The step that used af[(s + 1) % 4] is retired now; keeping those registers alive until
        // here stops ptxas from reusing them for a decode while a wgmma may still read them.
        keep_alive4(af[(s + 1) & 3]);
      }
    }
    // Retire every step inside this N's loop, so no wgmma is in flight where the paths of the
    // different N merge (ptxas may move accumulators there: C7515 serialization otherwise).
    wgmma_wait<0>();
  };
  const int rows = tile.rows;
  m64_dispatch_n(rows, k_loop);
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline; its smem becomes the epilogue tile

  m64_epilogue<R, kFc1, kWg3MaxN>(a, tile, mtile, half, acc, 0, smem, pair_of, tw_of,
                                  [] { __syncthreads(); });
}

// ---------------------------------------------------------------------------------------------
// v4 (MOE_EP_WGMMA_V=4, pair: =5; v3 above stays the default): v3's math with the copies moved
// to a producer warp (warp specialization). A CTA = warps 0-3 (consumers: v3's wgmma warpgroup,
// same fragments, decode, k order and epilogue, so the same bits) + warp 4 (the producer). Per
// chunk a consumer warp only waits on the slot's "full" mbarrier, reads its weight words and 8
// precomputed scale multipliers, decodes, issues the 4 wgmmas and releases the slot on its
// "empty" mbarrier once they have retired: no copies, no address math, no CTA barrier. The
// producer loads each live B row with one TMA box of 64 bf16 x 1 row (tensor map over xq / h,
// 128-byte swizzle: the swizzle follows the shared-memory address, so row n of a 1024-aligned
// stage lands as wgmma wants it; probe h200-2026-11-29-s4-m64ws-tma_probe.cu), the weights with
// one bulk copy, and turns each fragment row's scale bytes into its bf16x2 multipliers.
// kPair: a cluster of 2 CTAs (the two halves of one M-tile, which read the same B rows): each
// loads every other row and multicasts it to both, halving the B reads from L2 (the m64 kernels
// read the tile's B rows once per 64 weight rows: ~33 GB for fc1 at 4096 tokens); a slot is
// free once the consumers of both CTAs released it. B rows past the tile's are not loaded
// (their columns are computed from stale data and dropped). 160 threads and 2 CTAs per SM leave
// 168 registers per thread (10 warps: 3 on one SM sub-partition), so N is at most 160 per pass
// (m64_dispatch_passes). A producer warpgroup with setmaxnreg does not help: ptxas allocates
// the consumer region within the entry count (128).

constexpr int kWg4Threads = kThreads + 32;  // consumer warpgroup + producer warp

template <Recipe R>
struct Wgmma4Config {
  using RT = RecipeKernelTraits<R>;
  static_assert(RT::kFourBit, "the m64 kernels are for 4-bit weights");
  static constexpr int kWBytes = kWg3Frags * RT::kFragBytes;  // this CTA's half of a chunk
  static constexpr int kSBytes = kWg3Frags * RT::kScaleBytes;
  // Multipliers: per fragment and row (16), 4 bf16x2 (k16 steps 0..3) = 16 bytes.
  static constexpr int kMBytes = kWg3Frags * kFragRows * 16;
  static constexpr int kScaleRows = kWg3Frags * kFragRows;  // 64: two per producer lane
  static_assert(kScaleRows == 2 * 32, "producer lane shares");
  // A stage for N columns: B (N 128-byte swizzled rows, 1024-aligned), weights, multipliers.
  __host__ __device__ static constexpr int stage_bytes(int n) {
    return (n * 128 + kWBytes + kMBytes + 1023) / 1024 * 1024;
  }
  static constexpr int kRingBytes = 3 * stage_bytes(kWg3MaxN);
  static constexpr int kMaxStages = 5;
  __host__ __device__ static constexpr int stages(int n) {
    return kRingBytes / stage_bytes(n) < kMaxStages ? kRingBytes / stage_bytes(n) : kMaxStages;
  }
  static constexpr int kEpiBytes = Wgmma3Config<R>::kEpiBytes;
  static constexpr int kSmemBytes = (kRingBytes > kEpiBytes ? kRingBytes : kEpiBytes) + 1024;
  // "full": the producer lanes' arrivals after their multiplier stores, plus lane 0's
  // arrive.expect_tx (B rows + weights).
  static constexpr int kFullCount = 32 + 1;
};

// A tile of more than 160 rows runs as two passes over K (columns 0-127, then the rest): one
// m64n256 accumulator (128 registers) does not fit beside the rest in the 168 registers that
// 10 warps per SM leave (3 warps on one SM sub-partition), and ptxas would serialize every
// wgmma (C7512). Each pass's columns get the same per-column k order, so the same bits.
template <class F>
__device__ __forceinline__ void m64_dispatch_passes(int rows, F&& f) {
  auto pass = [&](int n, int col0, bool last) {
    if (n > 144)
      f(std::integral_constant<int, 160>{}, col0, last);
    else if (n > 128)
      f(std::integral_constant<int, 144>{}, col0, last);
    else if (n > 96)
      f(std::integral_constant<int, 128>{}, col0, last);
    else if (n > 80)
      f(std::integral_constant<int, 96>{}, col0, last);
    else if (n > 64)
      f(std::integral_constant<int, 80>{}, col0, last);
    else if (n > 32)
      f(std::integral_constant<int, 64>{}, col0, last);
    else
      f(std::integral_constant<int, 32>{}, col0, last);
  };
  if (rows > 160) {
    f(std::integral_constant<int, 128>{}, 0, false);
    pass(rows - 128, 128, true);
  } else {
    pass(rows, 0, true);
  }
}

template <Recipe R, bool kFc1, bool kPair>
__global__ void __launch_bounds__(kWg4Threads, 2)
    sm90_moe_wgmma4_kernel(const ForwardArgs a, const __grid_constant__ CUtensorMap bmap) {
  using C = Wgmma4Config<R>;
  using RT = typename C::RT;
  constexpr int kCtas = kPair ? 2 : 1;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint32_t scale_lut[256];
  __shared__ int pair_of[kWg3MaxN];  // t*K+k of each column
  __shared__ float tw_of[kWg3MaxN];
  __shared__ __align__(8) uint64_t full_bar[C::kMaxStages];
  __shared__ __align__(8) uint64_t empty_bar[C::kMaxStages];

  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int m64 = int(blockIdx.x % unsigned(halves));
  const int tile_idx = int(blockIdx.x / unsigned(halves));
  if (tile_idx >= *a.num_tiles) return;  // both CTAs of a pair (same tile)
  const int mtile = m64 >> 1, half = m64 & 1;
  // fc2 rows are padded to a multiple of 128: a half made only of padding has nothing to store
  // (with kPair it still loads its share of the B rows; its epilogue stores nothing).
  if (!kPair && !kFc1 && mtile * kTileRows + half * kWg3Rows >= a.H) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t ring = smem_addr(smem);

  for (int b = tid; b < 256; b += kWg4Threads) scale_lut[b] = scale_multiplier<R>(b);
  for (int n = tid; n < kWg3MaxN; n += kWg4Threads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
  }
  if (tid == 0) {
    for (int s = 0; s < C::kMaxStages; ++s) {
      mbar_init(&full_bar[s], C::kFullCount);
      mbar_init(&empty_bar[s], kWarps * kCtas);
    }
    mbar_init_fence();
  }
  // With kPair the peer's barriers must be initialized before the first multicast reaches them.
  if constexpr (kPair)
    cluster_sync();
  else
    __syncthreads();
  const int rows = tile.rows;
  const int chunks = (kFc1 ? a.H : a.I) / kKChunk;
  const uint32_t full0 = smem_addr(&full_bar[0]), empty0 = smem_addr(&empty_bar[0]);
  const uint32_t rank = kPair ? cluster_ctarank() : 0;
  // Barrier 1: the consumer warpgroup; barrier 2 (kPair: the cluster barrier): a pass's
  // epilogue done (the next pass's producers may refill the ring it used).
  constexpr int kConsumerBar = 1, kPassBar = 2;
  auto pass_barrier = [&](bool wait) {
    if constexpr (kPair)
      cluster_sync();
    else if (wait)
      named_barrier_sync(kPassBar, kWg4Threads);
    else
      named_barrier_arrive(kPassBar, kWg4Threads);
  };

  if (warp == kWarps) {
    // The producer warp: lane l loads B rows rank + kCtas (l + 32 i) of the pass and the
    // multipliers of fragment rows l, l + 32; lane 0 the weights.
    const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
    const uint8_t* wsrc = ms.w + half * C::kWBytes;
    // Fragment row q (4 fragments x 16 rows) of this CTA's half: its scale bytes are contiguous
    // (4 per row for nvfp4, 2 for mxfp4).
    constexpr int kRowScaleBytes = RT::kScaleBytes / kFragRows;
    const uint8_t* ssrc = ms.s + half * C::kSBytes + lane * kRowScaleBytes;
    auto scale_word = [&](int chunk, int j) -> uint32_t {
      if (chunk >= chunks) return 0;
      const uint8_t* q = ssrc + size_t(chunk) * (2 * C::kSBytes) + j * 32 * kRowScaleBytes;
      if constexpr (RT::kNvScale)
        return __ldg(reinterpret_cast<const unsigned int*>(q));
      else
        return __ldg(reinterpret_cast<const unsigned short*>(q));
    };
    auto multipliers = [&](uint32_t sw) {
      if constexpr (RT::kNvScale) {
        return make_uint4(scale_lut[sw & 0xff], scale_lut[(sw >> 8) & 0xff],
                          scale_lut[(sw >> 16) & 0xff], scale_lut[sw >> 24]);
      } else {
        const uint32_t lo = scale_lut[sw & 0xff], hi = scale_lut[sw >> 8];
        return make_uint4(lo, lo, hi, hi);
      }
    };
    uint32_t fills = 0;  // bit s: times slot s was filled, mod 2
    auto producer = [&](auto nw, int col0, bool) {
      constexpr int kNW = decltype(nw)::value;
      constexpr int kStages = C::stages(kNW);
      constexpr int kStageBytes = C::stage_bytes(kNW);
      constexpr int kPerLane = (kNW / kCtas + 31) / 32;
      if (col0 > 0) {
        // The ring held the last pass's multipliers and epilogue tile (generic-proxy stores);
        // TMA writes it through the async proxy.
        fence_proxy_async_smem();
        pass_barrier(true);
      }
      const int live = rows - col0 < kNW ? rows - col0 : kNW;
      // This lane's B rows of the pass: the row (of xq: the token; of h: the sorted pair) of
      // each, -1 past the tile's.
      int brow[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int r = int(rank) + kCtas * (lane + 32 * i);
        brow[i] = -1;
        if (r < live) {
          const int col = col0 + r;
          brow[i] = kFc1 ? a.sorted_pairs[tile.start + col] / a.K : tile.start + col;
        }
      }
      const uint32_t tx = uint32_t(live * 128 + C::kWBytes);
      // Scale words two chunks ahead (the loads' latency hides behind the ring waits).
      uint32_t sw0[2] = {scale_word(0, 0), scale_word(0, 1)};
      uint32_t sw1[2] = {scale_word(1, 0), scale_word(1, 1)};
      int slot = 0;
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const uint32_t swa = sw0[0], swb = sw0[1];
        sw0[0] = sw1[0];
        sw0[1] = sw1[1];
        sw1[0] = scale_word(chunk + 2, 0);
        sw1[1] = scale_word(chunk + 2, 1);
        // Fill k of a slot waits for the consumers' k-th release (of both CTAs with kPair; the
        // wait on a fresh barrier's parity 1 returns at once).
        mbar_wait(empty0 + 8 * slot, ((fills >> slot) & 1) ^ 1);
        fills ^= 1u << slot;
        const uint32_t st = ring + uint32_t(slot * kStageBytes);
        const uint32_t full = full0 + 8 * slot;
        if (lane == 0) {
          mbar_arrive_expect_tx(&full_bar[slot], tx);
          bulk_load(smem + slot * kStageBytes + kNW * 128, wsrc + size_t(chunk) * (2 * C::kWBytes),
                    C::kWBytes, &full_bar[slot]);
        }
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          if (brow[i] >= 0) {
            const uint32_t dst = st + uint32_t((int(rank) + kCtas * (lane + 32 * i)) * 128);
            if constexpr (kPair)
              tma_load_2d_mc(dst, &bmap, chunk * kKChunk, brow[i], full, 0x3);
            else
              tma_load_2d(dst, &bmap, chunk * kKChunk, brow[i], full);
          }
        }
        uint4* mdst = reinterpret_cast<uint4*>(smem + slot * kStageBytes + kNW * 128 + C::kWBytes);
        mdst[lane] = multipliers(swa);
        mdst[lane + 32] = multipliers(swb);
        mbar_arrive(&full_bar[slot]);  // release: the multiplier stores before the arrival
        if (++slot == kStages) slot = 0;
      }
    };
    m64_dispatch_passes(rows, producer);
    // kPair: the peer's consumers arrive on this CTA's barriers until they are done.
    if constexpr (kPair) cluster_sync();
    return;
  }

  // The consumer warpgroup.
  const int g = lane >> 2;
  const uint32_t peer_empty0 = kPair ? mapa_shared(empty0, rank ^ 1) : 0;
  uint32_t uses = 0;  // bit s: times slot s was consumed, mod 2
  auto release = [&](int slot) {
    if (lane == 0) {
      mbar_arrive(&empty_bar[slot]);
      if constexpr (kPair) mbar_arrive_cluster(peer_empty0 + 8 * slot);
    }
  };
  auto consumer = [&](auto nw, int col0, bool last) {
    constexpr int kNW = decltype(nw)::value;
    constexpr int kStages = C::stages(kNW);
    constexpr int kStageBytes = C::stage_bytes(kNW);
    static_assert(kNW % 16 == 0 && kStages >= 3, "N class");
    float acc[kNW / 2];
#pragma unroll
    for (int i = 0; i < kNW / 2; ++i) acc[i] = 0.0f;
    const uint32_t w_off = uint32_t(kNW * 128 + warp * RT::kFragBytes + lane * 16);
    const uint32_t m_off = uint32_t(kNW * 128 + C::kWBytes + warp * kFragRows * 16 + g * 16);
    uint32_t af[4][4];  // A fragments of k16 steps 0..3 of a chunk
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) af[s][i] = 0;
    int slot = 0, prev = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      mbar_wait(full0 + 8 * slot, (uses >> slot) & 1);
      uses ^= 1u << slot;
      const uint32_t st = ring + uint32_t(slot * kStageBytes);
      const uint4 wq = lds128(st + w_off);
      const uint4 mlo = lds128(st + m_off), mhi = lds128(st + m_off + 8 * 16);
      const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
      const uint32_t sc_lo[4] = {mlo.x, mlo.y, mlo.z, mlo.w};
      const uint32_t sc_hi[4] = {mhi.x, mhi.y, mhi.z, mhi.w};
      const uint64_t desc = sw128_desc(st);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t bits[4];
        decode_e2m1x8(words[s], bits);
        af[s][0] = mul_bf16x2(bits[0], sc_lo[s]);
        af[s][1] = mul_bf16x2(bits[1], sc_hi[s]);
        af[s][2] = mul_bf16x2(bits[2], sc_lo[s]);
        af[s][3] = mul_bf16x2(bits[3], sc_hi[s]);
        wgmma_fence();
        wgmma_m64<kNW>(acc, af[s], desc + uint64_t(2 * s));  // +32 bytes per k16 step
        wgmma_commit();
        wgmma_wait<3>();
        // The step that used af[(s + 1) % 4] is retired now; keeping those registers alive until
        // here stops ptxas from reusing them for a decode while a wgmma may still read them.
        keep_alive4(af[(s + 1) & 3]);
        // After step 2's wait every step of the previous chunk has retired: its slot is free.
        if (s == 2 && chunk > 0) release(prev);
      }
      prev = slot;
      if (++slot == kStages) slot = 0;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kNW / 2; ++i) asm volatile("" : "+f"(acc[i])::"memory");
    release(prev);  // the last chunk's slot
    // Every consumer warp is done with the ring: it becomes the epilogue tile (every load into
    // it has landed: all chunks were consumed).
    named_barrier_sync(kConsumerBar, kThreads);
    m64_epilogue<R, kFc1, kNW>(a, tile, mtile, half, acc, col0, smem, pair_of, tw_of,
                               [] { named_barrier_sync(kConsumerBar, kThreads); });
    if (!last) {
      fence_proxy_async_smem();  // the epilogue's stores before the next pass's TMA writes
      pass_barrier(false);
    }
  };
  m64_dispatch_passes(rows, consumer);
  if constexpr (kPair) cluster_sync();
}
}  // namespace moe_ep::kern
