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

#include <type_traits>

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

__device__ __forceinline__ void wgmma_n32(float* d, const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

__device__ __forceinline__ void wgmma_n64(float* d, const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

__device__ __forceinline__ void wgmma_n96(float* d, const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
      "{%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

__device__ __forceinline__ void wgmma_n128(float* d, const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

// The two wgmmas of one k16 step (f = 0: rows 0-63, f = 1: rows 64-127) with N = kNW columns.
template <int kNW>
__device__ __forceinline__ void wgmma_step(float (&acc)[2][kWgN / 8][4], const uint32_t (&af)[2][4],
                                           uint64_t desc) {
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    if constexpr (kNW == 32) wgmma_n32(&acc[f][0][0], af[f], desc);
    if constexpr (kNW == 64) wgmma_n64(&acc[f][0][0], af[f], desc);
    if constexpr (kNW == 96) wgmma_n96(&acc[f][0][0], af[f], desc);
    if constexpr (kNW == 128) wgmma_n128(&acc[f][0][0], af[f], desc);
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

}  // namespace moe_ep::kern
