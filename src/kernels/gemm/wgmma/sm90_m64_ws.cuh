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
// A stage for N columns: B (N swizzled rows of 128 bytes, 1024-aligned), then the weights.
constexpr int m64_ws_bbytes(int n) { return (n * 128 + 1023) / 1024 * 1024; }
constexpr int m64_ws_stage_bytes(int n) { return m64_ws_bbytes(n) + kM64WsWBytes; }
constexpr int kM64WsRing = 200 * 1024;
constexpr int m64_ws_stages(int n) {
  return kM64WsRing / m64_ws_stage_bytes(n) < 8 ? kM64WsRing / m64_ws_stage_bytes(n) : 8;
}
constexpr int kM64WsSmemBytes = kM64WsRing + 1024;  // + the 1024-byte alignment
// One half's epilogue staging for tiles of up to n rows (m64_epilogue: fc1 kWg3XS fp32, fc2
// kWg3YS bf16 per column); both halves' sit at the top of the ring.
constexpr int m64_ws_epi_bytes(bool fc1, int n) { return fc1 ? n * kWg3XS * 4 : n * kWg3YS * 2; }
static_assert(2 * m64_ws_epi_bytes(true, kM64TileN) <= kM64WsRing &&
                  m64_ws_stages(kM64TileN) >= kM64WsLag + 2,
              "ring");

// What a CTA's warpgroups share: the barriers and, per item parity, the item's tile and M-tile
// and its column tables (written by the producer before its first arrival on the item's full
// barriers, read by the consumers after their waits there).
struct M64WsShared {
  uint32_t brow[2][kM64TileN];  // each column's B row: its element offset in xq (fc1) or h (fc2)
  int pair_of[2][kM64TileN];
  float tw_of[2][kM64TileN];
  TileInfo tile[2];  // rows 0: no more items
  int mtile[2];
  uint64_t full[8], empty[8], epi[2];
};

// The producer's share of item j (tile, M-tile) at width kN. `free_bytes`: the ring's bytes below
// the previous item's epilogue staging (the whole ring for a CTA's first item).
template <bool kFc1, int kN>
__device__ __forceinline__ void m64_ws_produce(const ForwardArgs& a, M64WsShared& sh,
                                               unsigned char* smem, uint32_t smem_base,
                                               const TileInfo& tile, int mtile, int j,
                                               int free_bytes, ProducerRing& ring) {
  constexpr int kBPasses = (kN + 15) / 16;
  constexpr int kStages = m64_ws_stages(kN), kStageBytes = m64_ws_stage_bytes(kN);
  constexpr int kBBytes = m64_ws_bbytes(kN);
  const int tid = producer_tid();
  const MTileStream ms = mtile_stream<Recipe::kBf16, kFc1>(a, tile.expert, mtile);
  const int chunks = ms.chunks;
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
  ring.drain(sh.empty);          // the previous item's slots (this width's cover other bytes)
  bool staged = j == 0;          // the previous item's epilogue staging is free
  const bool issues = tid < 32;  // warp 0 issues the weights' bulk copies (warp-uniform)
  for (int c = 0; c < chunks; ++c) {
    const int slot = c % kStages;
    ring.reclaim(sh.empty, slot);
    if (!staged && (slot + 1) * kStageBytes > free_bytes) {
      mbar_wait(&sh.epi[b ^ 1], uint32_t((j - 1) >> 1) & 1u);
      staged = true;
    }
    const uint32_t sp = smem_base + uint32_t(slot * kStageBytes);
    if (issues && elect_one()) {
      uint64_t* bar = &sh.full[slot];
      mbar_expect_tx(bar, uint32_t(kM64WsWBytes));
      bulk_load(smem + slot * kStageBytes + kBBytes, ms.w + size_t(c) * kM64WsWBytes, kM64WsWBytes,
                bar);
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
      mbar_arrive(&sh.full[(c - kM64WsLag) % kStages]);
    }
  }
  cp_async_wait<0>();
  fence_proxy_async_smem();
  for (int c = chunks - kM64WsLag; c < chunks; ++c)
    if (c >= 0) mbar_arrive(&sh.full[c % kStages]);
}

// The consumers' share of item j at width kN: the K loop of this warpgroup's 64-row half, then
// its epilogue. `fpar`: per slot the parity of the full phase to wait for next (updated at the
// item's end).
template <bool kFc1, int kN, ExpertEpilogue kEpi>
__device__ __forceinline__ void m64_ws_consume(const ForwardArgs& a, M64WsShared& sh,
                                               unsigned char* smem, uint32_t smem_base, int j,
                                               uint32_t& fpar) {
  constexpr Recipe R = Recipe::kBf16;
  constexpr int kNF = kN / 8;
  constexpr int kStages = m64_ws_stages(kN), kStageBytes = m64_ws_stage_bytes(kN);
  constexpr int kBBytes = m64_ws_bbytes(kN);
  const int b = j & 1;
  const TileInfo tile = sh.tile[b];
  const int mtile = sh.mtile[b];
  const int chunks = (kFc1 ? a.H : a.I) / kKChunk;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int ctid = tid & 127, half = wg - 1;  // the thread in its warpgroup
  const int warp = ctid >> 5, lane = ctid & 31;
  // fc2's rows are padded to a multiple of 128: a half made only of padding multiplies nothing
  // and stores nothing (warpgroup-uniform).
  const bool live = kFc1 || (2 * mtile + half) * kWg3Rows < a.H;
  // This lane's 16 bytes of step s of its warp's fragment (4 * half + warp) within a stage.
  const uint32_t a_off = uint32_t(kBBytes + (4 * half + warp) * 2048 + lane * 64);
  float acc[kNF * 4];
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f;

  const uint32_t fpar0 = fpar;  // the slots' parities at the item's start
  auto wait_full = [&](int c) {
    const int slot = c % kStages;
    mbar_wait(&sh.full[slot], ((fpar0 >> slot) ^ uint32_t(c / kStages)) & 1u);
  };
  // Step s of chunk c: this lane's 16 bytes of its warp's fragment (after the chunk's full
  // barrier).
  auto load_a = [&](int c, int s, uint32_t(&f)[4]) {
    const uint4 v = lds128(smem_base + uint32_t((c % kStages) * kStageBytes) + a_off +
                           uint32_t(bf16_resident_step(lane, s) << 4));
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  };
  const uint32_t desc0_lo = uint32_t(sw128_desc(smem_base));
  if (live) {
    // One wgmma per k16 step, two in flight (as the m64 kernel): step k's wgmma is issued, step
    // k - 1's retired, and step k + 1's fragment read into the registers step k - 1 used. At a
    // chunk's first step that retires the previous chunk's last, so its slot is released.
    uint32_t af[2][4];
    wait_full(0);
    load_a(0, 0, af[0]);
    for (int c = 0; c < chunks; ++c) {
      const uint64_t desc = sw128_desc_at(desc0_lo, uint32_t((c % kStages) * kStageBytes));
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        wgmma_fence();
        wgmma_m64<kN>(acc, af[s & 1], desc + uint64_t(2 * s));  // +32 bytes per k16 step
        wgmma_commit();
        wgmma_wait<1>();
        keep_alive4(af[(s + 1) & 1]);
        if (s == 0 && c > 0) mbar_arrive(&sh.empty[(c - 1) % kStages]);
        if (s < 3) {
          load_a(c, s + 1, af[(s + 1) & 1]);
        } else if (c + 1 < chunks) {
          wait_full(c + 1);
          load_a(c + 1, 0, af[0]);
        }
      }
    }
    wgmma_wait<0>();
    mbar_arrive(&sh.empty[(chunks - 1) % kStages]);
  } else {
    for (int c = 0; c < chunks; ++c) {
      wait_full(c);
      mbar_arrive(&sh.empty[c % kStages]);
    }
  }
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  fpar = flip_used_slots<kStages>(fpar, chunks);
  named_barrier(1, 256);  // both halves are done with the ring: its top becomes their staging
  if (live) {
    constexpr int kEpiBytes = m64_ws_epi_bytes(kFc1, kN);
    m64_epilogue<R, kFc1, kNF, kEpi>(
        a, tile, mtile, half, acc, smem + (kM64WsRing - 2 * kEpiBytes) + half * kEpiBytes,
        sh.tw_of[b], sh.pair_of[b], ctid,
        [](float v, int) { return epilogue_value<R, kFc1>(v, 1.0f); },
        [half] { named_barrier(2 + half, 128); });
  }
  // The staging and this parity's tables are free (the producer's next copies there go through
  // the async proxy).
  fence_proxy_async_smem();
  mbar_arrive(&sh.epi[b]);
}

// Grid: at most one CTA per SM (GemmPlan::grid_ctas); items are (routing tile, M-tile), M-tile
// fastest, CTA i taking items i, i + gridDim.x, ...
template <bool kFc1, ExpertEpilogue kEpi>
__global__ void __launch_bounds__(kM64WsThreads, 1) sm90_moe_m64_ws_kernel(const ForwardArgs a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ M64WsShared sh;

  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int items = a.num_tiles[0] * mtiles;
  const int tid = threadIdx.x;
  if (int(blockIdx.x) >= items) return;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);
  if (tid == 0) {
    for (int s = 0; s < 8; ++s) {
      mbar_init(&sh.full[s], 128);   // the producer's threads
      mbar_init(&sh.empty[s], 256);  // the consumers' threads
    }
    mbar_init(&sh.epi[0], 256);
    mbar_init(&sh.epi[1], 256);
    mbar_init_fence();
  }
  __syncthreads();

  if (tid < 128) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kM64WsProducerRegs));
    ProducerRing ring;
    int free_bytes = kM64WsRing;
    for (int j = 0;; ++j) {
      const int b = j & 1;
      const int it = int(blockIdx.x) + j * int(gridDim.x);
      // This parity's tables were last read by item j - 2's epilogue.
      if (j >= 2) mbar_wait(&sh.epi[b], uint32_t((j - 2) >> 1) & 1u);
      if (it >= items) {
        // The consumers' next wait, on slot 0's full barrier, finds rows 0. (Once they have
        // released every slot: a phase of slot 0 must not complete twice ahead of them.)
        ring.drain(sh.empty);
        if (tid == 0) sh.tile[b].rows = 0;
        mbar_arrive(&sh.full[0]);
        return;
      }
      const int tile_idx = it / mtiles, mtile = it % mtiles;
      const TileInfo tile = a.tiles[tile_idx];
      if (tid == 0) {
        sh.tile[b] = tile;
        sh.mtile[b] = mtile;
      }
      for (int n = tid; n < kM64TileN; n += 128) {
        const TileColumn col = tile_column<kFc1>(a, tile, n);
        sh.brow[b][n] = uint32_t(col.brow);
        sh.pair_of[b][n] = col.pair;
        sh.tw_of[b][n] = col.tw;
      }
      named_barrier(4, 128);  // every producer thread reads other threads' B rows
      auto run = [&](auto n) {
        constexpr int kN = decltype(n)::value;
        m64_ws_produce<kFc1, kN>(a, sh, smem, smem_base, tile, mtile, j, free_bytes, ring);
        free_bytes = kM64WsRing - 2 * m64_ws_epi_bytes(kFc1, kN);
      };
      with_n_class(tile.rows, run, M64NClasses{});
    }
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kM64WsConsumerRegs));
  uint32_t fpar = 0;
  for (int j = 0;; ++j) {
    // The item's tile from the producer's table (published with its first stage's arrivals: the
    // wait below does not flip the slot's parity, the K loop's wait for chunk 0 does).
    mbar_wait(&sh.full[0], fpar & 1u);
    const int rows = sh.tile[j & 1].rows;
    if (rows == 0) return;
    auto run = [&](auto n) {
      m64_ws_consume<kFc1, decltype(n)::value, kEpi>(a, sh, smem, smem_base, j, fpar);
    };
    with_n_class(rows, run, M64NClasses{});
  }
}

template <bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_wgmma_m64_ws(const ForwardArgs& a, int ctas, cudaStream_t s) {
  sm90_moe_m64_ws_kernel<kFc1, kEpi><<<unsigned(ctas), kM64WsThreads, kM64WsSmemBytes, s>>>(a);
  return cudaGetLastError();
}

template <ExpertEpilogue kEpi>
cudaError_t set_m64_ws_attributes() {
  return first_error({set_max_smem(sm90_moe_m64_ws_kernel<true, kEpi>, kM64WsSmemBytes),
                      set_max_smem(sm90_moe_m64_ws_kernel<false, kEpi>, kM64WsSmemBytes)});
}

}  // namespace moe_ep::kern
