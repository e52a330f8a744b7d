// The bf16 recipe's persistent m64 kernel (docs/kernels.md §4.3): the m64 kernel's K loop and
// epilogue (sm90_wgmma.cuh) on the fp8 kernel's structure (sm90_fp8.cuh). One CTA per SM runs
// work items (routing tile of up to 160 rows, M-tile of 128 weight rows) in a fixed stride
// (blockIdx.x, + gridDim.x, ...; M-tile fastest, so the CTAs running at once share the tiles'
// rows in L2). Warpgroup 0 produces, per K-chunk of 64: the M-tile's 8 weight fragments (16 KB,
// contiguous in the resident layout) as one bulk copy, and the tile's kN B rows (128-byte
// swizzle) by per-thread cp.async: fc1's gathered by token from xq, fc2's the tile's own rows
// of h. Each producer thread publishes its B copies on the stage's "full" mbarrier kM64WsLag
// stages later, after its own cp.async.wait_group and a proxy fence (the wgmmas read B through
// the async proxy); the bulk copy completes on the same barrier's transaction count. Warpgroups
// 1 and 2 consume the two 64-row halves of the M-tile against the same B stage: per chunk the 4
// k16 steps' A fragments read from the stage (each lane's 16 bytes where the resident layout put
// them, bf16_resident_step) and one wgmma m64nNk16 per step at the narrowest N class of the m64
// kernel that holds the tile's rows, two steps in flight; a slot is released on its "empty"
// mbarrier once its wgmmas have retired. The same wgmmas on the
// same accumulators in the same k order as the m64 kernel: the same bits. Then the m64 kernel's
// epilogue, staged at the top of the ring, while the producer fills the next item's first stages
// below it. setmaxnreg gives the consumers the producer's registers.
//
// Against the m64 kernel (four warpgroups, one CTA per tile and 256 weight rows), this moves the
// stage fill off the consumers' issue slots (bulk copy for the weights, the producer's cp.async
// for B) and overlaps each item's table loads, ring fill and epilogue with the neighbouring
// items' K loops.
#pragma once

#include "kernels/common/launch.h"
#include "kernels/gemm/wgmma/producer_ring.cuh"
#include "kernels/gemm/wgmma/sm90_wgmma.cuh"

namespace moe_ep::kern {

constexpr int kM64WsThreads = 384;
// setmaxnreg: the launch gives each of the 384 threads 168 registers (65536 / 384, rounded down
// to a multiple of 8); the producer's decrease and the consumers' increase must fit that pool.
constexpr int kM64WsProducerRegs = 56, kM64WsConsumerRegs = 224;
constexpr int kM64WsLaunchRegs = 65536 / kM64WsThreads / 8 * 8;
static_assert(kM64WsProducerRegs + 2 * kM64WsConsumerRegs <= 3 * kM64WsLaunchRegs,
              "setmaxnreg exceeds the CTA's register pool");
constexpr int kM64WsWBytes = kTileFrags * 2048;  // an M-tile's bf16 fragments of one K-chunk
constexpr int kM64WsLag = 2;                     // stages in flight per producer thread
// One half's epilogue staging for tiles of up to n rows (m64_epilogue: fc1 kWg3XS fp32, fc2
// kWg3YS bf16 per column); each consumer warpgroup's sits at the top of the ring.
constexpr int m64_ws_epi_bytes(bool fc1, int n) { return fc1 ? n * kWg3XS * 4 : n * kWg3YS * 2; }

// kMt M-tiles per work item (1: each consumer warpgroup one 64-row half; 2: each one M-tile of
// 128 rows, two accumulator sets, so a B stage serves 256 weight rows). Every item's stages have
// one geometry, the widest tile's (B: kM64TileN swizzled rows of 128 bytes, 1024-aligned, then
// the kMt M-tiles' weights), so the ring runs on across items of any width with no drain between
// them (items of a CTA alternate widths: an expert's tiles of 160 and its remainder).
template <int kMt>
struct M64WsConfig {
  static_assert(kMt == 1 || kMt == 2, "one or two M-tiles per item");
  static constexpr int kBBytes = kM64TileN * 128;
  static constexpr int kStageBytes = kBBytes + kMt * kM64WsWBytes;
  static constexpr int kStages = kMt == 1 ? 6 : 4;
  static constexpr int kRing = kStages * kStageBytes;
  static constexpr int kSmemBytes = kRing + 1024;  // + the 1024-byte alignment
  static_assert(kBBytes % 1024 == 0 && kStages >= kM64WsLag + 2 && kStages <= 8 &&
                    2 * m64_ws_epi_bytes(true, kM64TileN) <= kRing,
                "ring");
  static constexpr int next(int k) { return k + 1 == kStages ? 0 : k + 1; }
};

// What a CTA's warpgroups share: the barriers and, per item parity, the item's tile and first
// M-tile and its column tables (written by the producer threads before their arrival on the
// parity's "item" barrier, read by the consumers after their wait there).
struct M64WsShared {
  uint32_t brow[2][kM64TileN];  // each column's B row: its element offset in xq (fc1) or h (fc2)
  int pair_of[2][kM64TileN];
  float tw_of[2][kM64TileN];
  TileInfo tile[2];  // rows 0: no more items
  int mtile[2];
  uint64_t full[8], empty[8], epi[2], item[2];
};

// The producer's share of item j (tile, M-tiles mtile0 ...) at width kN from slot `slot` on (left
// at the slot after its last chunk's). `free_bytes`: the ring's bytes below the previous item's
// epilogue staging (the whole ring for a CTA's first item).
template <bool kFc1, int kN, int kMt>
__device__ __forceinline__ void m64_ws_produce(const ForwardArgs& a, M64WsShared& sh,
                                               unsigned char* smem, uint32_t smem_base,
                                               const TileInfo& tile, int mtile0, int j,
                                               int free_bytes, ProducerRing& ring) {
  using C = M64WsConfig<kMt>;
  constexpr int kBPasses = (kN + 15) / 16;
  constexpr int kStageBytes = C::kStageBytes, kBBytes = C::kBBytes;
  const int tid = producer_tid();
  const MTileStream ms = mtile_stream<Recipe::kBf16, kFc1>(a, tile.expert, mtile0);
  const int chunks = ms.chunks;
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int live_mt = mtiles - mtile0 < kMt ? mtiles - mtile0 : kMt;
  const size_t mt_stride = size_t(chunks) * kM64WsWBytes;  // the next M-tile's stream
  const int b = j & 1;
  const int bc = tid & 7, br0 = tid >> 3;
  const uint32_t bdst = uint32_t(br0 * 128 + ((bc ^ (br0 & 7)) << 4));
  // This thread's B sources as 32-bit element offsets in registers.
  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  uint32_t boff[kBPasses];
#pragma unroll
  for (int i = 0; i < kBPasses; ++i) {
    const int row = br0 + 16 * i;
    boff[i] = row < kN ? sh.brow[b][row] + uint32_t(bc * 8) : 0u;
  }
  bool staged = j == 0;          // the previous item's epilogue staging is free
  const bool issues = tid < 32;  // warp 0 issues the weights' bulk copies (warp-uniform)
  int slot = 0, pub = 0;         // the next chunk's slot, the next to publish (kM64WsLag behind)
  for (int c = 0; c < chunks; ++c) {
    ring.reclaim(sh.empty, slot);
    if (!staged && (slot + 1) * kStageBytes > free_bytes) {
      mbar_wait(&sh.epi[b ^ 1], uint32_t((j - 1) >> 1) & 1u);
      staged = true;
    }
    const uint32_t sp = smem_base + uint32_t(slot * kStageBytes);
    if (issues && elect_one()) {
      uint64_t* bar = &sh.full[slot];
      mbar_expect_tx(bar, uint32_t(live_mt * kM64WsWBytes));
      for (int m = 0; m < live_mt; ++m)
        bulk_load(smem + slot * kStageBytes + kBBytes + m * kM64WsWBytes,
                  ms.w + m * mt_stride + size_t(c) * kM64WsWBytes, kM64WsWBytes, bar);
    }
    // Rows past the tile's (tile_column: brow 0) copy row 0 of xq or h in full: their columns
    // are computed and dropped, and the copies need no per-row size select.
#pragma unroll
    for (int i = 0; i < kBPasses; ++i) {
      const uint16_t* src = bsrc + boff[i];
      boff[i] += uint32_t(kKChunk);  // the next chunk's
      if (kN % 16 == 0 || i + 1 < kBPasses)
        cp_async16_sz(sp + bdst + uint32_t(i * 2048), src, 16u);
      else
        cp_async16_if(sp + bdst + uint32_t(i * 2048), src, 16u, br0 + 16 * i < kN);
    }
    cp_async_commit();
    if (c >= kM64WsLag) {
      cp_async_wait<kM64WsLag>();
      fence_proxy_async_smem();
      mbar_arrive(&sh.full[pub]);
      pub = C::next(pub);
    }
    slot = C::next(slot);
  }
  cp_async_wait<0>();
  fence_proxy_async_smem();
  for (int r = chunks < kM64WsLag ? chunks : kM64WsLag; r > 0; --r) {  // the last chunks
    mbar_arrive(&sh.full[pub]);
    pub = C::next(pub);
  }
}

// The consumers' share of item j at width kN from slot `slot` on (left at the slot after its last
// chunk's): the K loop of this warpgroup's kMt halves (kMt 1: half `wg - 1` of the item's
// M-tile; 2: both halves of M-tile mtile0 + wg - 1), then their epilogues. `fpar`: per slot the
// parity of its next full phase.
template <bool kFc1, int kN, int kMt, ExpertEpilogue kEpi>
__device__ __forceinline__ void m64_ws_consume(const ForwardArgs& a, M64WsShared& sh,
                                               unsigned char* smem, uint32_t smem_base, int j,
                                               uint32_t& fpar) {
  using C = M64WsConfig<kMt>;
  constexpr Recipe R = Recipe::kBf16;
  constexpr int kNF = kN / 8;
  constexpr int kStageBytes = C::kStageBytes, kBBytes = C::kBBytes;
  const int b = j & 1;
  const TileInfo tile = sh.tile[b];
  const int tid = threadIdx.x, wg = tid >> 7;
  const int ctid = tid & 127, h = wg - 1;  // the thread in its warpgroup, the warpgroup
  const int warp = ctid >> 5, lane = ctid & 31;
  const int mtile = sh.mtile[b] + (kMt == 1 ? 0 : h);
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const bool live = mtile < mtiles;  // warpgroup-uniform
  const int chunks = (kFc1 ? a.H : a.I) / kKChunk;
  // Half i of this warpgroup: half_of(i) of M-tile `mtile`, this lane's 16 bytes of step s of its
  // warp's fragment 4 * half + warp at a_off[i] + the step's slot within a stage.
  auto half_of = [&](int i) { return kMt == 1 ? h : i; };
  uint32_t a_off[kMt];
#pragma unroll
  for (int i = 0; i < kMt; ++i)
    a_off[i] = uint32_t(kBBytes + (kMt == 1 ? 0 : h) * kM64WsWBytes +
                        (4 * half_of(i) + warp) * 2048 + lane * 64);
  float acc[kMt][kNF * 4];
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) acc[m][i] = 0.0f;

  auto wait_full = [&](int k) {
    mbar_wait(&sh.full[k], (fpar >> k) & 1u);
    fpar ^= 1u << k;
  };
  // Step s of the chunk in slot k, every half.
  auto load_a = [&](int k, int s, uint32_t(&f)[kMt][4]) {
#pragma unroll
    for (int m = 0; m < kMt; ++m) {
      const uint4 v = lds128(smem_base + uint32_t(k * kStageBytes) + a_off[m] +
                             uint32_t(bf16_resident_step(lane, s) << 4));
      f[m][0] = v.x;
      f[m][1] = v.y;
      f[m][2] = v.z;
      f[m][3] = v.w;
    }
  };
  const uint32_t desc0_lo = uint32_t(sw128_desc(smem_base));
  int slot = 0;
  if (live) {
    // Per k16 step one wgmma per half (one commit group), two steps in flight (as the m64
    // kernel): step k's group is issued, step k - 1's retired, and step k + 1's fragments read
    // into the registers step k - 1 used. At a chunk's first step that retires the previous
    // chunk's last, so its slot is released.
    uint32_t af[2][kMt][4];
    wait_full(slot);
    load_a(slot, 0, af[0]);
    int prev = slot;
    for (int c = 0; c < chunks; ++c) {
      const uint64_t desc = sw128_desc_at(desc0_lo, uint32_t(slot * kStageBytes));
      const int nxt = C::next(slot);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        wgmma_fence();
#pragma unroll
        for (int m = 0; m < kMt; ++m)
          wgmma_m64<kN>(acc[m], af[s & 1][m], desc + uint64_t(2 * s));  // +32 bytes per step
        wgmma_commit();
        if constexpr (kMt == 1) {
          wgmma_wait<1>();
          keep_alive4(af[(s + 1) & 1][0]);
          if (s == 0 && c > 0) mbar_arrive(&sh.empty[prev]);
        }
        if (s < 3) {
          load_a(slot, s + 1, af[(s + 1) & 1]);
        } else if (c + 1 < chunks) {
          wait_full(nxt);
          load_a(nxt, 0, af[0]);
        }
        if constexpr (kMt == 2) {
          wgmma_wait<0>();
          if (s == 3) mbar_arrive(&sh.empty[slot]);
        }
      }
      prev = slot;
      slot = nxt;
    }
    wgmma_wait<0>();
    if constexpr (kMt == 1) mbar_arrive(&sh.empty[prev]);
  } else {
    for (int c = 0; c < chunks; ++c) {
      wait_full(slot);
      mbar_arrive(&sh.empty[slot]);
      slot = C::next(slot);
    }
  }
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[m][i])::"memory");
  named_barrier(1, 256);  // both warpgroups are done with the ring: its top becomes their staging
  if (live) {
    constexpr int kEpiBytes = m64_ws_epi_bytes(kFc1, kN);
    unsigned char* staging = smem + (C::kRing - 2 * kEpiBytes) + h * kEpiBytes;
    auto sync = [h] { named_barrier(2 + h, 128); };
#pragma unroll
    for (int i = 0; i < kMt; ++i) {
      // fc2's rows are padded to a multiple of 128: a half made only of padding stores nothing.
      if (!kFc1 && (2 * mtile + half_of(i)) * kWg3Rows >= a.H) continue;
      if (i > 0) sync();  // the staging's last reads are done
      m64_epilogue<R, kFc1, kNF, kEpi>(
          a, tile, mtile, half_of(i), acc[i], staging, sh.tw_of[b], sh.pair_of[b], ctid,
          [](float v, int) { return epilogue_value<R, kFc1>(v, 1.0f); }, sync);
    }
  }
  // The staging and this parity's tables are free (the producer's next copies there go through
  // the async proxy).
  fence_proxy_async_smem();
  mbar_arrive(&sh.epi[b]);
}

// Grid: at most one CTA per SM (GemmPlan::grid_ctas); items are (routing tile, group of kMt
// M-tiles), the group fastest, CTA i taking items i, i + gridDim.x, ...
template <bool kFc1, int kMt, ExpertEpilogue kEpi>
__global__ void __launch_bounds__(kM64WsThreads, 1) sm90_moe_m64_ws_kernel(const ForwardArgs a) {
  using C = M64WsConfig<kMt>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ M64WsShared sh;

  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int groups = (mtiles + kMt - 1) / kMt;
  const int items = a.num_tiles[0] * groups;
  const int tid = threadIdx.x;
  if (int(blockIdx.x) >= items) return;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);
  if (tid == 0) {
    for (int s = 0; s < 8; ++s) {
      mbar_init(&sh.full[s], 128);   // the producer's threads
      mbar_init(&sh.empty[s], 256);  // the consumers' threads
    }
    for (int p = 0; p < 2; ++p) {
      mbar_init(&sh.epi[p], 256);
      mbar_init(&sh.item[p], 128);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (tid < 128) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kM64WsProducerRegs));
    ProducerRing ring;
    int free_bytes = C::kRing;
    for (int j = 0;; ++j) {
      const int b = j & 1;
      const int it = int(blockIdx.x) + j * int(gridDim.x);
      // This parity's tables were last read by item j - 2's epilogue.
      if (j >= 2) mbar_wait(&sh.epi[b], uint32_t((j - 2) >> 1) & 1u);
      if (it >= items) {
        if (tid == 0) sh.tile[b].rows = 0;
        mbar_arrive(&sh.item[b]);
        return;
      }
      const int tile_idx = it / groups, mtile0 = it % groups * kMt;
      const TileInfo tile = a.tiles[tile_idx];
      if (tid == 0) {
        sh.tile[b] = tile;
        sh.mtile[b] = mtile0;
      }
      for (int n = tid; n < kM64TileN; n += 128) {
        const TileColumn col = tile_column<kFc1>(a, tile, n);
        sh.brow[b][n] = uint32_t(col.brow);
        sh.pair_of[b][n] = col.pair;
        sh.tw_of[b][n] = col.tw;
      }
      named_barrier(4, 128);  // every producer thread reads other threads' B rows
      mbar_arrive(&sh.item[b]);
      auto run = [&](auto n) {
        constexpr int kN = decltype(n)::value;
        m64_ws_produce<kFc1, kN, kMt>(a, sh, smem, smem_base, tile, mtile0, j, free_bytes, ring);
        free_bytes = C::kRing - 2 * m64_ws_epi_bytes(kFc1, kN);
      };
      with_n_class(tile.rows, run, M64NClasses{});
    }
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kM64WsConsumerRegs));
  uint32_t fpar = 0;
  for (int j = 0;; ++j) {
    mbar_wait(&sh.item[j & 1], uint32_t(j >> 1) & 1u);
    const int rows = sh.tile[j & 1].rows;
    if (rows == 0) return;
    auto run = [&](auto n) {
      m64_ws_consume<kFc1, decltype(n)::value, kMt, kEpi>(a, sh, smem, smem_base, j, fpar);
    };
    with_n_class(rows, run, M64NClasses{});
  }
}

template <bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_wgmma_m64_ws(const ForwardArgs& a, const GemmPlan& g, cudaStream_t s) {
  if (g.mtiles_per_item == 2)
    sm90_moe_m64_ws_kernel<kFc1, 2, kEpi>
        <<<unsigned(g.grid_ctas), kM64WsThreads, M64WsConfig<2>::kSmemBytes, s>>>(a);
  else
    sm90_moe_m64_ws_kernel<kFc1, 1, kEpi>
        <<<unsigned(g.grid_ctas), kM64WsThreads, M64WsConfig<1>::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

template <ExpertEpilogue kEpi>
cudaError_t set_m64_ws_attributes() {
  return first_error(
      {set_max_smem(sm90_moe_m64_ws_kernel<true, 1, kEpi>, M64WsConfig<1>::kSmemBytes),
       set_max_smem(sm90_moe_m64_ws_kernel<false, 1, kEpi>, M64WsConfig<1>::kSmemBytes),
       set_max_smem(sm90_moe_m64_ws_kernel<true, 2, kEpi>, M64WsConfig<2>::kSmemBytes),
       set_max_smem(sm90_moe_m64_ws_kernel<false, 2, kEpi>, M64WsConfig<2>::kSmemBytes)});
}

}  // namespace moe_ep::kern
