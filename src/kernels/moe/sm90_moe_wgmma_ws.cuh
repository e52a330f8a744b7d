// The prefill GEMM with the weights decoded once per CTA into shared memory
// (MOE_EP_WGMMA_V=4, 4-bit weights, routing tiles of up to 256 tokens; docs/gpu_kernels.md §10,
// session 7). One CTA per (routing tile, M-tile of 128 weight rows) of three warpgroups:
//  - warpgroup 0 produces. Per K-chunk its threads copy the tile's B rows (128-byte swizzle) and
//    the M-tile's raw 4-bit fragments and scales into a ring stage with cp.async; kLag chunks
//    later, after its own cp.async.wait_group and a barrier of the producer warpgroup, warp w
//    decodes fragments 2w and 2w + 1 of that chunk (the same decode and scale multiply as every
//    other kernel) and stores them with stmatrix as bf16 rows in the stage's A tile (K-major,
//    128-byte swizzle: the B tile's format), fences for the async proxy and arrives on the
//    stage's "full" mbarrier.
//  - warpgroups 1 and 2 consume the two 64-row halves (fragments 4h .. 4h + 3, the m64 kernel's
//    halves) against the same B stage: wait full, four m64nNk16 wgmmas with both operands in
//    shared memory, and release the stage on its "empty" mbarrier when they have retired. They
//    do nothing else per chunk, so the tensor cores no longer wait for each warp's decode.
//  - the m64 kernel's epilogue per half (fc1 gate / up paired through shared memory).
// Same fragments, decode, scale multiply and one wgmma per k16 step in K order, so the same bits
// as the m64 kernel (RS) for every column.
#pragma once

#include "kernels/moe/moe_launch.h"
#include "kernels/moe/sm90_moe_decode.cuh"
#include "kernels/moe/sm90_moe_wgmma.cuh"

namespace moe_ep::kern {

// One m64nNk16 wgmma, bf16 x bf16 -> fp32, A and B K-major shared-memory descriptors.
template <int N>
using WgmmaSsOp =
    decltype(gmma::ss_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                  cute::Shape<cute::_64, cute::Int<N>, cute::_16>,
                                  gmma::Major::K, gmma::Major::K>());

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t adesc, uint64_t bdesc,
                                         std::index_sequence<I...>) {
  Op::fma(adesc, bdesc, d[I]...);
}

// 4-byte async copy (cp.async.ca: the sizes below 16 bytes).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}

// Stores the four 8x8 bf16 matrices of an mma.sync m16n8k16 A fragment (r[0]: rows 0-7 k 0-7,
// r[1]: rows 8-15 k 0-7, r[2]: rows 0-7 k 8-15, r[3]: rows 8-15 k 8-15); lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

constexpr int kWsThreads = 384;
constexpr int kWsABytes = kTileRows * kKChunk * 2;  // the decoded M-tile chunk: 128 rows x 128 B
constexpr int kWsRing = 216 * 1024;
constexpr int kWsASlots = 3;  // decoded A tiles: the consumers' one and the next ones
constexpr int kWsMaxBSlots = 8;
constexpr int kWsRawSlots = 8;  // > the lag: a lane's raw slot is decoded before it is rewritten
constexpr int kWsSmemBytes = kWsRing + 1024;  // + the 1024-byte alignment of the ring
constexpr int kWsEpiBytes = kWg3MaxN * (kWg3Rows + 4) * 4;  // one half's fc1 staging (the larger)
static_assert(2 * kWsEpiBytes <= kWsRing, "the epilogue staging fits in the ring");

// Shared memory: kWsASlots decoded A tiles (128 rows x 128 B, 128-byte swizzle), then the B ring
// (N rows x 128 B per slot, the same format), then the raw ring (each chunk's 4-bit fragments and
// scales; every lane copies and later decodes only its own bytes of it).
template <Recipe R>
struct WgmmaWsConfig {
  using RT = RecipeKernelTraits<R>;
  static_assert(RT::kFourBit, "the producer decodes 4-bit weights");
  static constexpr int kWBytes = kTileFrags * RT::kFragBytes;   // raw weights of a chunk
  static constexpr int kSBytes = kTileFrags * RT::kScaleBytes;  // their scales
  static constexpr int kRawStage = kWBytes + kSBytes;
  static constexpr int kARing = kWsASlots * kWsABytes;
  static constexpr int kRawOff = kWsRing - (kWsRawSlots * kRawStage + 1023) / 1024 * 1024;
  __host__ __device__ static constexpr int b_bytes(int n) { return (n * 128 + 1023) / 1024 * 1024; }
  __host__ __device__ static constexpr int b_slots(int n) {
    return (kRawOff - kARing) / b_bytes(n) < kWsMaxBSlots ? (kRawOff - kARing) / b_bytes(n)
                                                         : kWsMaxBSlots;
  }
  // Chunks whose copies a producer thread keeps in flight before it decodes and publishes the
  // oldest: as many as the B ring allows (the consumers hold one slot, one more is published).
  __host__ __device__ static constexpr int lag(int n) { return b_slots(n) - 2; }
  static_assert(b_slots(kWg3MaxN) >= 3, "three B slots of the widest tile");
  static_assert(kWsRawSlots > kWsMaxBSlots - 2, "raw slots for the longest lag");
};

// What the CTA's setup hands to the tile's K loop and epilogue.
struct WsCta {
  const uint16_t* const* brow_ptr;
  const int* pair_of;
  const float* tw_of;
  const uint32_t* lut;
  unsigned char* smem;  // the ring, 1024-aligned
  uint32_t smem_base;
  int mtile;
};

// The CTA's barriers: full[b] (the producer's 128 threads: chunk c's A tile and B rows are in
// place, b = c % B slots), empty_b[b] / empty_a[a] (the consumers' 256 threads: chunk c's B slot
// / A slot may be rewritten).
struct WsBars {
  uint64_t* full;
  uint64_t* empty_b;
  uint64_t* empty_a;
};

template <Recipe R, bool kFc1, int kN>
__device__ __forceinline__ void wgmma_ws_tile(const ForwardArgs& a, const TileInfo& tile,
                                              const WsCta& c, const WsBars& bars) {
  using C = WgmmaWsConfig<R>;
  using RT = typename C::RT;
  constexpr int kNF = kN / 8;
  constexpr int kSB = C::b_slots(kN), kBBytes = C::b_bytes(kN), kLag = C::lag(kN);
  constexpr int kBPasses = (kN + 15) / 16;
  static_assert(kLag >= 1 && kLag < kWsRawSlots, "lag");
  const int tid = threadIdx.x, wg = tid >> 7;
  unsigned char* smem = c.smem;
  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, c.mtile);
  const int chunks = ms.chunks;

  if (wg == 0) {  // producer
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    const int bc = tid & 7, br0 = tid >> 3;
    const int bdst = C::kARing + br0 * 128 + ((bc ^ (br0 & 7)) << 4);
    const int live = tile.rows;
    // This thread's B sources (rows br0 + 16 i), held in registers.
    const uint16_t* bptr[kBPasses];
#pragma unroll
    for (int i = 0; i < kBPasses; ++i) bptr[i] = c.brow_ptr[br0 + 16 * i] + bc * 8;
    // Warp w decodes fragments w and w + 4, and each lane copies the raw bytes it decodes
    // itself (its 16 weight bytes of each fragment and the 4-byte scale words of its rows g and
    // g + 8), so its own cp.async.wait_group is all the synchronization the decode needs.
    // Scale words: nvfp4 row r's 4 bytes at r * 4; mxfp4 row r's 2 bytes at r * 2, in the
    // 4-byte word at (r * 2) & ~3 (half g & 1).
    constexpr int kRowS = RT::kNvScale ? 4 : 2;
    const int s_lo = (g * kRowS) & ~3, s_hi = ((g + 8) * kRowS) & ~3;
    const int s_shift = RT::kNvScale ? 0 : (g & 1) * 16;
    // stmatrix addresses: lane l stores row l % 8 of matrix l / 8 (rows + 8 for matrices 1, 3;
    // k + 8, the next 16-byte unit, for 2, 3) of fragment w's rows of the A tile; fragment w + 4
    // is 64 rows (8192 bytes) on. Unit u of row r sits at unit u ^ (r & 7), r & 7 = l % 8.
    const int mi = lane >> 3, ri = lane & 7;
    const uint32_t arow = uint32_t((warp * 16 + (mi & 1) * 8 + ri) * 128);
    uint32_t aoff[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) aoff[s] = arow + uint32_t(((2 * s + (mi >> 1)) ^ ri) << 4);
    const uint32_t lut = smem_addr(c.lut);
    const uint32_t raw_base = c.smem_base + uint32_t(C::kRawOff);

    // One commit group per chunk: its B rows and this lane's raw bytes.
    auto copy = [&](int chunk) {
      unsigned char* bp = smem + (chunk % kSB) * kBBytes;
#pragma unroll
      for (int i = 0; i < kBPasses; ++i)
        cp_async16(bp + bdst + i * 2048, bptr[i] + chunk * kKChunk, br0 + 16 * i < live);
      unsigned char* rp = smem + C::kRawOff + (chunk % kWsRawSlots) * C::kRawStage;
      const uint8_t* w = ms.w + size_t(chunk) * C::kWBytes;
      const uint8_t* sc = ms.s + size_t(chunk) * C::kSBytes;
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const int frag = warp + 4 * f;
        cp_async16(rp + frag * RT::kFragBytes + lane * 16, w + frag * RT::kFragBytes + lane * 16,
                   true);
        unsigned char* ds = rp + C::kWBytes + frag * RT::kScaleBytes;
        const uint8_t* gs = sc + frag * RT::kScaleBytes;
        cp_async4(ds + s_lo, gs + s_lo);
        cp_async4(ds + s_hi, gs + s_hi);
      }
      cp_async_commit();
    };
    // Chunk p (this thread's copies of it landed: the caller waited): decode its raw bytes into
    // A slot p % kWsASlots once the consumers are done with that slot's last chunk, fence for
    // the async proxy (wgmma reads the A tile and the B rows through it) and publish.
    auto publish = [&](int p) {
      const int aslot = p % kWsASlots;
      if (p >= kWsASlots) mbar_wait(&bars.empty_a[aslot], uint32_t(p / kWsASlots - 1) & 1u);
      const uint32_t ad = c.smem_base + uint32_t(aslot * kWsABytes);
      const uint32_t rp = raw_base + uint32_t((p % kWsRawSlots) * C::kRawStage);
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const int frag = warp + 4 * f;
        const uint4 wq = lds128(rp + frag * RT::kFragBytes + lane * 16);
        const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
        const uint32_t ss = rp + C::kWBytes + frag * RT::kScaleBytes;
        const uint32_t lo = lds32(ss + s_lo) >> s_shift, hi = lds32(ss + s_hi) >> s_shift;
        uint32_t sc_lo[4], sc_hi[4];
        if constexpr (RT::kNvScale) {
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            sc_lo[s] = lds32(lut | ((lo >> (8 * s)) & 0xff) << 2);
            sc_hi[s] = lds32(lut | ((hi >> (8 * s)) & 0xff) << 2);
          }
        } else {
          sc_lo[0] = sc_lo[1] = lds32(lut | (lo & 0xff) << 2);
          sc_lo[2] = sc_lo[3] = lds32(lut | ((lo >> 8) & 0xff) << 2);
          sc_hi[0] = sc_hi[1] = lds32(lut | (hi & 0xff) << 2);
          sc_hi[2] = sc_hi[3] = lds32(lut | ((hi >> 8) & 0xff) << 2);
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t bits[4], af[4];
          decode_e2m1x8(words[s], bits);
          af[0] = mul_bf16x2(bits[0], sc_lo[s]);
          af[1] = mul_bf16x2(bits[1], sc_hi[s]);
          af[2] = mul_bf16x2(bits[2], sc_lo[s]);
          af[3] = mul_bf16x2(bits[3], sc_hi[s]);
          stmatrix_x4(ad + aoff[s] + uint32_t(f * kWg3Rows * 128), af);
        }
      }
      fence_proxy_async_smem();
      mbar_arrive(&bars.full[p % kSB]);
    };
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (chunk >= kSB) mbar_wait(&bars.empty_b[chunk % kSB], uint32_t(chunk / kSB - 1) & 1u);
      copy(chunk);
      if (chunk >= kLag) {
        cp_async_wait<kLag>();
        publish(chunk - kLag);
      }
    }
    cp_async_wait<0>();
    for (int p = chunks - kLag; p < chunks; ++p)
      if (p >= 0) publish(p);
    return;
  }

  const int ctid = tid & 127, half = wg - 1;
  float acc[kNF * 4];
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int bslot = chunk % kSB;
    mbar_wait(&bars.full[bslot], uint32_t(chunk / kSB) & 1u);
    const uint64_t adesc = sw128_desc(c.smem_base +
                                      uint32_t((chunk % kWsASlots) * kWsABytes + half * kWg3Rows * 128));
    const uint64_t bdesc = sw128_desc(c.smem_base + uint32_t(C::kARing + bslot * kBBytes));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)  // +32 bytes per k16 step in both tiles
      wgmma_ss<WgmmaSsOp<kN>>(acc, adesc + uint64_t(2 * s), bdesc + uint64_t(2 * s),
                              std::make_index_sequence<kNF * 4>{});
    wgmma_commit();
    wgmma_wait<1>();  // the previous chunk's wgmmas have retired: its slots are free
    if (chunk > 0) {
      mbar_arrive(&bars.empty_b[(chunk - 1) % kSB]);
      mbar_arrive(&bars.empty_a[(chunk - 1) % kWsASlots]);
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  named_barrier(1, 256);  // both halves are done with the ring: it becomes their staging
  const float alpha = R == Recipe::kNvfp4 ? (kFc1 ? a.fc1_alpha : a.fc2_alpha)[tile.expert] : 1.0f;
  m64_epilogue<R, kFc1, kNF, kWg3Rows + 4, kWg3Rows + 8>(
      a, tile, c.mtile, half, acc, smem + half * kWsEpiBytes, c.tw_of, c.pair_of, ctid,
      [alpha](float v, int) { return epilogue_value<R, kFc1>(v, alpha); },
      [half] { named_barrier(3 + half, 128); });
}

// Grid: one CTA per (routing tile, M-tile), M-tile fastest.
template <Recipe R, bool kFc1>
__global__ void __launch_bounds__(kWsThreads, 1) sm90_moe_wgmma_ws_kernel(const ForwardArgs a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(1024) uint32_t scale_lut[256];  // 1 KB aligned: | adds the index
  __shared__ const uint16_t* brow_ptr[kWg3MaxN];  // first element of each B row (xq or h)
  __shared__ int pair_of[kWg3MaxN];               // t*K+k of each column
  __shared__ float tw_of[kWg3MaxN];
  __shared__ __align__(8) uint64_t full[kWsMaxBSlots], empty_b[kWsMaxBSlots], empty_a[kWsASlots];

  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int mtile = int(blockIdx.x % unsigned(mtiles));
  const int tile_idx = int(blockIdx.x / unsigned(mtiles));
  if (tile_idx >= *a.num_tiles) return;
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);

  for (int b = tid; b < 256; b += kWsThreads) scale_lut[b] = scale_multiplier<R>(b);
  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  for (int n = tid; n < kWg3MaxN; n += kWsThreads) {
    const TileColumn col = tile_column<kFc1>(a, tile, n);
    brow_ptr[n] = bsrc + col.brow;
    pair_of[n] = col.pair;
    tw_of[n] = col.tw;
  }
  if (tid == 0) {
    for (int s = 0; s < kWsMaxBSlots; ++s) {
      mbar_init(&full[s], 128);     // the producer's threads
      mbar_init(&empty_b[s], 256);  // the consumers' threads
    }
    for (int s = 0; s < kWsASlots; ++s) mbar_init(&empty_a[s], 256);
    mbar_init_fence();
  }
  __syncthreads();

  const WsCta c{brow_ptr, pair_of, tw_of, scale_lut, smem, smem_addr(smem), mtile};
  const WsBars bars{full, empty_b, empty_a};
  const int rows = tile.rows;
  if (rows > 192)
    wgmma_ws_tile<R, kFc1, 256>(a, tile, c, bars);
  else if (rows > 160)
    wgmma_ws_tile<R, kFc1, 192>(a, tile, c, bars);
  else if (rows > 144)
    wgmma_ws_tile<R, kFc1, 160>(a, tile, c, bars);
  else if (rows > 128)
    wgmma_ws_tile<R, kFc1, 144>(a, tile, c, bars);
  else if (rows > 96)
    wgmma_ws_tile<R, kFc1, 128>(a, tile, c, bars);
  else if (rows > 64)
    wgmma_ws_tile<R, kFc1, 96>(a, tile, c, bars);
  else if (rows > 32)
    wgmma_ws_tile<R, kFc1, 64>(a, tile, c, bars);
  else
    wgmma_ws_tile<R, kFc1, 32>(a, tile, c, bars);
}

template <Recipe R, bool kFc1>
cudaError_t launch_wgmma_ws(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kWg3MaxN);
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  if (tiles == 0) return cudaSuccess;
  sm90_moe_wgmma_ws_kernel<R, kFc1><<<unsigned(tiles) * unsigned(mtiles), kWsThreads, kWsSmemBytes, s>>>(a);
  return cudaGetLastError();
}

template <Recipe R>
cudaError_t set_wgmma_ws_attributes() {
  return first_error({set_max_smem(sm90_moe_wgmma_ws_kernel<R, true>, kWsSmemBytes),
                      set_max_smem(sm90_moe_wgmma_ws_kernel<R, false>, kWsSmemBytes)});
}

}  // namespace moe_ep::kern
