// The fp8 MMA path of mxfp4_mxfp8 in the layer (opt-in, RecipeConfig::fp8_mma
// at construction; the prefill path: faster than the bf16 path from 512 tokens on DSV3 and at
// 2048 and 4096 on Qwen3, slower at decode sizes; docs/kernels.md). sm90_moe_fp8_ws_kernel:
// one CTA per SM taking (routing tile of up to 160 tokens, M-tile) items by ticket,
// a producer warpgroup and two consumer warpgroups (the m64 kernel's 64-row halves, fc1 gate / up
// fragments paired through shared memory), wgmma m64nNk32 e4m3 at the narrowest N that holds the
// tile's rows, A = MXFP4 weights in the fp8 resident layout decoded in registers against
// per-(row, block) shift tables, B = the folded e4m3 rows of xq8 (fc1, by token) or h8 (fc2,
// sorted), an fp32 promotion per 128-wide K stage with the rows' chunk references (the next stage
// is decoded while a stage's wgmmas run), and the columns' fold references applied in the
// epilogue.
#pragma once

#include "kernels/common/launch.h"
#include "kernels/gemm/decode/sm90_decode.cuh"
#include "kernels/gemm/fp8/fp8_fragments.h"
#include "kernels/gemm/wgmma/sm90_wgmma.cuh"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

constexpr int kFp8N = kFp8TileN;  // most tokens per routing tile
// A tile runs the K loop of the narrowest MMA width that holds its rows: one of these classes
// (steps of 8 from 48 : each column of padding costs MMA and promotion work) in a
// GEMM of many M-tiles, else the earlier coarse list (ForwardArgs::fp8_widths, forward_args.h).
using Fp8NClasses = std::integer_sequence<int, 8, 16, 32, 48, 64, 72, 80, 88, 96, 104, 112, 120,
                                          128, 136, 144, 152, 160>;
using Fp8CoarseNClasses = std::integer_sequence<int, 8, 16, 32, 64, 96, 128, 160>;
// f(std::integral_constant<int, kN>) at the narrowest width of the item's list that holds `rows`.
template <class F>
__device__ __forceinline__ void fp8_with_width(bool fine, int rows, F& f) {
  if (fine)
    with_n_class(rows, f, Fp8NClasses{});
  else
    with_n_class(rows, f, Fp8CoarseNClasses{});
}
constexpr int kFp8StageK = 128;  // K per stage: 4 k32 steps, one promotion
// kN B rows of 128 bytes per stage (128-byte swizzle, 1024-byte aligned).
constexpr int fp8_bbytes(int n) { return (n * kFp8StageK + 1023) / 1024 * 1024; }

// ---------------------------------------------------------------------------------------------
// The fp8 kernel: three warpgroups per CTA, each work item a (routing tile, M-tile) at the
// narrowest MMA width that holds the tile's rows (Fp8NClasses / Fp8CoarseNClasses: the MMAs, B
// copies and accumulators scale with the rows, the weight decode does not). Warpgroup 0
// produces, per stage: the M-tile's 8 weight fragments and their scales of two K-chunks as two
// bulk copies, and the kN B rows (128-byte swizzle): fc2's as boxes of h8's tensor map, fc1's
// (gathered by token) by per-thread cp.async, which each thread publishes on the stage's "full"
// mbarrier kFp8WsLag stages later, after its own cp.async.wait_group and a proxy fence (so the
// wgmmas, which read through the async proxy, see them); the bulk and tensor copies complete on
// that barrier's transaction count. Warpgroups 1 and 2 consume the two 64-row halves of the
// M-tile against the same B stage: wait full, the 4 wgmmas, the next stage's decode while they
// run, wait, release the slot on its "empty" mbarrier, promote; then the epilogue, staged at the
// top of the ring. setmaxnreg gives the consumers the producer's registers. Measured in
// tools/probes/fp8_gemm_probe first (docs/kernels.md: the skeleton alone 61 % -> 72 % of the
// fp8 ceiling, against one warpgroup per CTA that copied its own stages).
//
// Persistent: a CTA runs item blockIdx.x and then the items of the tickets it takes
// (the grid: one CTA per SM; tests set other counts), so the producer fills
// the next item's first stages while the consumers run the epilogue of the last. Each item
// starts the ring at slot 0 (its width sets the slot size); every slot keeps its own barrier
// parities across items. At an item's start the producer waits until the consumers have
// released every slot of the previous item, and before a slot that reaches into the previous
// item's epilogue staging (the top 2 * fp8_epi_bytes of the ring) until that epilogue is done
// (the "epi" mbarriers, one per item parity, which also free that parity's column tables).
constexpr int kFp8WsThreads = 384;
// setmaxnreg: the CTA's pool is its launch allocation (the SM's 64K registers over 384 threads,
// rounded down to a multiple of 8: 168 each), and the consumers' increase waits until the pool
// holds it, so the producer's and consumers' counts must fit the pool or the consumers never
// start their K loop.
constexpr int kFp8ProducerRegs = 40, kFp8ConsumerRegs = 232;
constexpr int kFp8LaunchRegs = 65536 / kFp8WsThreads / 8 * 8;
static_assert(kFp8ProducerRegs + 2 * kFp8ConsumerRegs <= 3 * kFp8LaunchRegs,
              "setmaxnreg exceeds the CTA's register pool");
constexpr int kFp8WsWBytes = 2 * kTileFrags * 512;  // the M-tile's fragments of 2 K-chunks
constexpr int kFp8WsSBytes = 2 * kTileFrags * 32;   // their scales
constexpr int kFp8WsLag = 2;                        // stages in flight per producer thread
constexpr int fp8_ws_stage_bytes(int n) {
  return (fp8_bbytes(n) + kFp8WsWBytes + kFp8WsSBytes + 1023) / 1024 * 1024;
}
constexpr int kFp8WsRing = 200 * 1024;
constexpr int fp8_ws_stages(int n) {
  return kFp8WsRing / fp8_ws_stage_bytes(n) < 8 ? kFp8WsRing / fp8_ws_stage_bytes(n) : 8;
}
constexpr int kFp8WsSmemBytes = kFp8WsRing + 1024;
// One half's epilogue staging for tiles of up to n rows (m64_epilogue: fc1 kWg3XS fp32, fc2
// kWg3YS bf16 per column); both halves' sit at the top of the ring.
constexpr int fp8_epi_bytes(bool fc1, int n) { return fc1 ? n * kWg3XS * 4 : n * kWg3YS * 2; }
static_assert(2 * fp8_epi_bytes(true, kFp8N) <= kFp8WsRing &&
                  2 * fp8_epi_bytes(false, kFp8N) <= kFp8WsRing &&
                  fp8_ws_stages(kFp8N) >= kFp8WsLag + 2,
              "ring");

// What a CTA's warpgroups share: the gap table, the barriers and, per item parity, the item's
// tile and M-tile and its column tables (written by the producer before its first arrival on
// the item's full barriers, read by the consumers after their waits there).
struct Fp8Shared {
  uint64_t table[kFp8GapTables];
  uint32_t brow[2][kFp8N];  // each column's B row: its byte offset in xq8 (fc1) or h8 (fc2)
  int pair_of[2][kFp8N];
  float tw_of[2][kFp8N];
  float colf[2][kFp8N];
  TileInfo tile[2];  // rows 0: no more items
  int mtile[2];
  int next[2];  // the producer's next item (its thread 0's ticket)
  uint64_t full[8], empty[8], epi[2];
};

// Entry i of the 64-bit shared-memory table at `base` (a shared address). In PTX so that the
// address stays one multiply-add on the row's base: from C++ the compiler folded the base back
// into the index and spent two more instructions per lookup.
__device__ __forceinline__ uint64_t lds_u64(uint32_t base, int i) {
  uint64_t v;
  asm("{\n\t.reg .u32 a;\n\tmad.lo.u32 a, %1, 8, %2;\n\tld.shared.b64 %0, [a];\n\t}"
      : "=l"(v)
      : "r"(uint32_t(i)), "r"(base));
  return v;
}

// threadIdx.x read where it is used: the persistent loops' per-width values that follow from it
// (fc2's box counts per producer warp, ...) would otherwise be hoisted out of the item loop for
// every width at once and spill the producer's 40 registers.
__device__ __forceinline__ int fp8_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// The producer's barrier state across its items: slots filled and not yet waited empty
// (`pend`), and per slot the parity of the empty phase to wait for next (`epar`).
struct Fp8ProducerRing {
  uint32_t pend = 0, epar = 0;
  // Waits until the consumers have released slot k's last fill, if it is still pending.
  __device__ __forceinline__ void release(uint64_t* empty, int k) {
    const uint32_t bit = 1u << k;
    if (pend & bit) {
      mbar_wait(&empty[k], (epar >> k) & 1u);
      epar ^= bit;
      pend &= ~bit;
    }
  }
  // Before a fill of `slot`: its previous fill released.
  __device__ __forceinline__ void reclaim(uint64_t* empty, int slot) {
    release(empty, slot);
    pend |= 1u << slot;
  }
  // Waits until the consumers have released every slot filled so far.
  __device__ __forceinline__ void drain(uint64_t* empty) {
#pragma unroll 1
    for (int k = 0; k < 8; ++k) release(empty, k);
  }
};

// The producer's share of item j (tile, M-tile) at width kN. `free_bytes`: the ring's bytes
// below the previous item's epilogue staging (the whole ring for a CTA's first item).
template <bool kFc1, int kN>
__device__ __forceinline__ void fp8_ws_produce(const ForwardArgs& a, Fp8Shared& sh,
                                               unsigned char* smem, uint32_t smem_base,
                                               const TileInfo& tile, int mtile, int j,
                                               int free_bytes, Fp8ProducerRing& ring) {
  constexpr Recipe R = Recipe::kMxfp4Mxfp8;
  constexpr int kBPasses = (kN + 15) / 16;
  constexpr int kStages = fp8_ws_stages(kN), kStageBytes = fp8_ws_stage_bytes(kN);
  constexpr int kBBytes = fp8_bbytes(kN);
  const int tid = fp8_tid();
  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int stages_k = ms.chunks / 2;
  const int b = j & 1;
  const int bc = tid & 7, br0 = tid >> 3;
  const uint32_t bdst = uint32_t(br0 * 128 + ((bc ^ (br0 & 7)) << 4));
  // fc1: this thread's B sources as 32-bit byte offsets in registers (the shared-memory table
  // would cost a load and ptxas's hazard slots per copy).
  const uint8_t* bsrc = kFc1 ? a.xq8 : a.h8;
  uint32_t boff[kBPasses];
#pragma unroll
  for (int i = 0; i < kBPasses; ++i) {
    const int row = br0 + 16 * i;
    boff[i] = row < kN ? sh.brow[b][row] + uint32_t(bc * 16) : 0u;
  }
  ring.drain(sh.empty);  // the previous item's slots (this width's cover other bytes)
  bool staged = j == 0;  // the previous item's epilogue staging is free
  // Per stage: the M-tile's weights of 2 K-chunks (8 KB, contiguous) and their scales (512 B)
  // as two bulk copies, and B: fc1's rows (gathered by token) by per-thread cp.async, fc2's
  // (a tile's h8 rows are contiguous) as kN / 8 boxes of h8's tensor map, every fourth box
  // from one lane of each producer warp (rows past the tile's are other tiles' rows or zeros:
  // their columns are computed and dropped). A lane that issues bulk or tensor copies first
  // adds their bytes to the slot's full barrier, before its own arrival there.
  const int pw = tid >> 5;
  constexpr int kBoxes = kFc1 ? 0 : kN / 8;
  const int boxes = kFc1 ? 0 : (kBoxes - pw + 3) / 4;  // fc2: boxes pw, pw + 4, ...
  const bool issues = pw == 0 || boxes > 0;            // warp-uniform
  for (int st = 0; st < stages_k; ++st) {
    const int slot = st % kStages;
    ring.reclaim(sh.empty, slot);
    if (!staged && (slot + 1) * kStageBytes > free_bytes) {
      mbar_wait(&sh.epi[b ^ 1], uint32_t((j - 1) >> 1) & 1u);
      staged = true;
    }
    const uint32_t sp = smem_base + uint32_t(slot * kStageBytes);
    if (issues && elect_one()) {
      uint64_t* bar = &sh.full[slot];
      mbar_expect_tx(bar, uint32_t((pw == 0 ? kFp8WsWBytes + kFp8WsSBytes : 0) + boxes * 1024));
      if (pw == 0) {
        bulk_load(smem + slot * kStageBytes + kBBytes, ms.w + size_t(2 * st) * (kTileFrags * 512),
                  kFp8WsWBytes, bar);
        bulk_load(smem + slot * kStageBytes + kBBytes + kFp8WsWBytes,
                  ms.s + size_t(2 * st) * (kTileFrags * 32), kFp8WsSBytes, bar);
      }
      if constexpr (!kFc1)
        for (int jb = pw; jb < kBoxes; jb += 4)
          tma_box_2d(sp + uint32_t(jb * 1024), a.h8_tmap, st * kFp8StageK, tile.start + 8 * jb,
                     smem_addr(bar));
    }
    if constexpr (kFc1) {
      // One run of copies (ptxas pads a copy that does not follow another with hazard
      // slots); each thread publishes them kFp8WsLag stages later, after its own wait and a
      // proxy fence (the wgmmas read B through the async proxy).
      // Rows past the tile's (tile_column: brow 0) copy x row 0 in full: their columns are
      // computed and dropped, and the copies need no per-row size select.
#pragma unroll
      for (int i = 0; i < kBPasses; ++i) {
        const int row = br0 + 16 * i;
        const uint8_t* src = bsrc + boff[i];
        boff[i] += uint32_t(kFp8StageK);  // the next stage's
        if (kN % 16 == 0 || i + 1 < kBPasses)
          cp_async16_sz(sp + bdst + uint32_t(i * 2048), src, 16u);
        else
          cp_async16_if(sp + bdst + uint32_t(i * 2048), src, 16u, row < kN);
      }
      cp_async_commit();
      if (st >= kFp8WsLag) {
        cp_async_wait<kFp8WsLag>();
        fence_proxy_async_smem();
        mbar_arrive(&sh.full[(st - kFp8WsLag) % kStages]);
      }
    } else {
      mbar_arrive(&sh.full[slot]);  // fc2: every copy of the stage completes on the barrier
    }
  }
  if constexpr (kFc1) {
    cp_async_wait<0>();
    fence_proxy_async_smem();
    for (int st = stages_k - kFp8WsLag; st < stages_k; ++st)
      if (st >= 0) mbar_arrive(&sh.full[st % kStages]);
  }
}

// The consumers' share of item j at width kN: the K loop of this warpgroup's 64-row half, then
// its epilogue. `fpar`: per slot the parity of the full phase to wait for next (updated at the
// item's end).
template <bool kFc1, int kN>
__device__ __forceinline__ void fp8_ws_consume(const ForwardArgs& a, Fp8Shared& sh,
                                               unsigned char* smem, uint32_t smem_base, int j,
                                               uint32_t& fpar) {
  constexpr int kNF = kN / 8;
  constexpr int kStages = fp8_ws_stages(kN), kStageBytes = fp8_ws_stage_bytes(kN);
  constexpr int kBBytes = fp8_bbytes(kN);
  const int b = j & 1;
  const TileInfo tile = sh.tile[b];
  const int mtile = sh.mtile[b];
  const int stages_k = (kFc1 ? a.H : a.I) / kKChunk / 2;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int ctid = tid & 127, half = wg - 1;  // the thread in its warpgroup
  const int warp = ctid >> 5, lane = ctid & 31, g = lane >> 2;
  const int wfrag = 4 * half + warp;  // this warp's fragment of the M-tile
  float acc[kNF * 4], part[kNF * 4];
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f, part[i] = 0.0f;

  // Stage st's A fragments and the promotion factors of rows g and g + 8 (after its full
  // barrier).
  const uint32_t fpar0 = fpar;  // the slots' parities at the item's start
  auto decode_stage = [&](int st, uint32_t(&af)[4][4], float& f_lo, float& f_hi) {
    const int slot = st % kStages;
    mbar_wait(&sh.full[slot], ((fpar0 >> slot) ^ uint32_t(st / kStages)) & 1u);
    const unsigned char* sp = smem + slot * kStageBytes;
    // Rows g and g + 8 of this warp's fragment: 2 scale bytes per 64-wide chunk each, the
    // stage's 4 blocks.
    const unsigned char* ss = sp + kBBytes + kFp8WsWBytes + wfrag * 32;
    constexpr int kSC = kTileFrags * 32;  // the next chunk's scales
    int b_lo[4], b_hi[4];
    auto bytes = [](const unsigned char* p, int(&bb)[4]) {
      const uint32_t c0 = *reinterpret_cast<const uint16_t*>(p);
      const uint32_t c1 = *reinterpret_cast<const uint16_t*>(p + kSC);
      bb[0] = int(c0 & 0xff), bb[1] = int(c0 >> 8), bb[2] = int(c1 & 0xff), bb[3] = int(c1 >> 8);
    };
    bytes(ss + g * 2, b_lo);
    bytes(ss + (g + 8) * 2, b_hi);
    // The largest scale byte of each row (its reference plus kFp8ShiftMax) and the row's view
    // of the gap table (fp8_gap_entry).
    const int m_lo = max(max(b_lo[0], b_lo[1]), max(b_lo[2], b_lo[3]));
    const int m_hi = max(max(b_hi[0], b_hi[1]), max(b_hi[2], b_hi[3]));
    // (Shared addresses: one multiply-add per row and one shift-add per block.)
    const uint32_t top = smem_addr(sh.table) + 8u * (kFp8GapTables - 1);
    const uint32_t t_lo = top - 8u * uint32_t(m_lo), t_hi = top - 8u * uint32_t(m_hi);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 piece = *reinterpret_cast<const uint4*>(
          sp + kBBytes + (s >> 1) * (kTileFrags * 512) + wfrag * 512 + lane * 16);
      const uint32_t w_lo = (s & 1) ? piece.z : piece.x, w_hi = (s & 1) ? piece.w : piece.y;
      fp8_decode_word(w_lo, lds_u64(t_lo, b_lo[s]), af[s][0], af[s][2]);
      fp8_decode_word(w_hi, lds_u64(t_hi, b_hi[s]), af[s][1], af[s][3]);
    }
    f_lo = fmt::exp2i(m_lo - kFp8ShiftMax - 127);
    f_hi = fmt::exp2i(m_hi - kFp8ShiftMax - 127);
  };
  float f_lo = 0.0f, f_hi = 0.0f;
  // One fence before the stage's 4 wgmmas: their accumulators chain in order without one (PTX
  // ISA, wgmma.fence).
  auto stage = [&](int st, const uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4]) {
    const int slot = st % kStages;
    const uint64_t desc = sw128_desc(smem_base + slot * kStageBytes);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
      wgmma_fp8<kN>(part, cur[s], desc + uint64_t(2 * s), s > 0,
                    std::make_index_sequence<kNF * 4>{});
    wgmma_commit();
    float n_lo = 0.0f, n_hi = 0.0f;
    if (st + 1 < stages_k) decode_stage(st + 1, nxt, n_lo, n_hi);
    wgmma_wait<0>();
    mbar_arrive(&sh.empty[slot]);
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) acc[i] = fmaf(part[i], (i & 2) ? f_hi : f_lo, acc[i]);
    f_lo = n_lo;
    f_hi = n_hi;
  };
  uint32_t af0[4][4], af1[4][4];
  decode_stage(0, af0, f_lo, f_hi);
  for (int st = 0; st < stages_k; st += 2) {
    stage(st, af0, af1);
    if (st + 1 < stages_k) stage(st + 1, af1, af0);
  }
  // The slots this item used an odd number of times flip their parity.
#pragma unroll
  for (int s = 0; s < kStages; ++s)
    if (s < stages_k && (stages_k - 1 - s) / kStages % 2 == 0) fpar ^= 1u << s;
  named_barrier(1, 256);  // both halves are done with the ring: its top becomes their staging
  // The m64 kernel's epilogue with the columns' fold factors (bf16 rounding of g and u in fc1,
  // as epilogue_value does for this recipe's default path).
  constexpr int kEpi = fp8_epi_bytes(kFc1, kN);
  const float* colf = sh.colf[b];
  m64_epilogue<Recipe::kMxfp4Mxfp8, kFc1, kNF>(
      a, tile, mtile, half, acc, smem + (kFp8WsRing - 2 * kEpi) + half * kEpi, sh.tw_of[b],
      sh.pair_of[b], ctid,
      [colf](float v, int col) {
        const float f = v * colf[col];
        return kFc1 ? fmt::round_to_bf16(f) : f;
      },
      [half] { named_barrier(2 + half, 128); });
  // The staging and this parity's tables are free (the producer's next copies there go through
  // the async proxy).
  fence_proxy_async_smem();
  mbar_arrive(&sh.epi[b]);
}

// Grid: a CTA per SM (fp8_grid); items are (routing tile, M-tile), M-tile fastest.
// A CTA starts with item blockIdx.x and takes each next one from a ticket counter
// (ForwardArgs::fp8_sched, gridDim.x + its count): the CTAs that finish first take the next
// items, as the hardware's scheduler did for a grid of one CTA per item. The last CTA to finish
// zeroes the counters for the next launch.
template <bool kFc1>
__global__ void __launch_bounds__(kFp8WsThreads, 1) sm90_moe_fp8_ws_kernel(const ForwardArgs a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ Fp8Shared sh;

  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int items = *a.num_tiles * mtiles;
  const int tid = threadIdx.x;
  // A CTA without a first item takes no ticket (with one CTA per item, the grid's tail).
  if (int(blockIdx.x) >= items) return;
  // Thread 0 of the producer, once it takes no more items: the CTA's exit count, and the last
  // CTA's reset of both counters (every ticket was taken before its CTA's count).
  auto leave = [&] {
    __threadfence();
    if (atomicAdd(a.fp8_sched + 1, 1) == min(int(gridDim.x), items) - 1) {
      atomicExch(a.fp8_sched, 0);
      atomicExch(a.fp8_sched + 1, 0);
    }
  };
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);

  for (int i = tid; i < kFp8GapTables; i += kFp8WsThreads) sh.table[i] = fp8_gap_entry(i);
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

  const bool fine = a.fp8_widths == 1 || (a.fp8_widths == -1 && mtiles >= kFp8FineMinMTiles);
  if (tid < 128) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFp8ProducerRegs));
    Fp8ProducerRing ring;
    int free_bytes = kFp8WsRing;
    int it = int(blockIdx.x), ticket = 0;
    for (int j = 0;; ++j) {
      const int b = j & 1;
      if (j > 0) {  // thread 0's ticket to every producer thread
        if (tid == 0) sh.next[b] = ticket;
        named_barrier(4, 128);
        it = sh.next[b];
      }
      // This parity's tables were last read by item j - 2's epilogue.
      if (j >= 2) mbar_wait(&sh.epi[b], uint32_t((j - 2) >> 1) & 1u);
      if (it >= items) {
        // The consumers' next wait, on slot 0's full barrier, finds rows 0. (Once they have
        // released every slot: a phase of slot 0 must not complete twice ahead of them.)
        ring.drain(sh.empty);
        if (tid == 0) sh.tile[b].rows = 0;
        mbar_arrive(&sh.full[0]);
        if (tid == 0) leave();
        return;
      }
      if (tid == 0) ticket = int(gridDim.x) + atomicAdd(a.fp8_sched, 1);  // used next item
      const int tile_idx = it / mtiles, mtile = it % mtiles;
      const TileInfo tile = a.tiles[tile_idx];
      if (tid == 0) {
        sh.tile[b] = tile;
        sh.mtile[b] = mtile;
      }
      for (int n = tid; n < kFp8N; n += 128) {
        const TileColumn col = tile_column<kFc1>(a, tile, n);
        sh.brow[b][n] = uint32_t(col.brow);  // e4m3 rows: elements are bytes
        sh.pair_of[b][n] = col.pair;
        sh.tw_of[b][n] = col.tw;
        int ref = 127;
        if (n < tile.rows) ref = kFc1 ? a.xref[col.pair / a.K] : a.href[tile.start + n];
        sh.colf[b][n] = fmt::exp2i(ref - 127);
      }
      named_barrier(4, 128);  // every producer thread reads other threads' B rows
      auto run = [&](auto n) {
        constexpr int kN = decltype(n)::value;
        fp8_ws_produce<kFc1, kN>(a, sh, smem, smem_base, tile, mtile, j, free_bytes, ring);
        free_bytes = kFp8WsRing - 2 * fp8_epi_bytes(kFc1, kN);
      };
      fp8_with_width(fine, tile.rows, run);
    }
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFp8ConsumerRegs));
  uint32_t fpar = 0;
  for (int j = 0;; ++j) {
    // The item's tile from the producer's table (published with its first stage's arrivals: the
    // wait below does not flip the slot's parity, decode_stage's wait for stage 0 does).
    mbar_wait(&sh.full[0], fpar & 1u);
    const int rows = sh.tile[j & 1].rows;
    if (rows == 0) return;
    auto run = [&](auto n) {
      fp8_ws_consume<kFc1, decltype(n)::value>(a, sh, smem, smem_base, j, fpar);
    };
    fp8_with_width(fine, rows, run);
  }
}

template <bool kFc1>
cudaError_t launch_fp8_gemm(const ForwardArgs& a, const GemmPlan& g, cudaStream_t s) {
  if (g.kernel == GemmKernel::kNone) return cudaSuccess;
  sm90_moe_fp8_ws_kernel<kFc1><<<unsigned(g.grid_ctas), kFp8WsThreads, kFp8WsSmemBytes, s>>>(a);
  return cudaGetLastError();
}

// fc1, the fold of h, fc2 (tiles of up to 160 rows; every token count of the recipe runs here).
inline cudaError_t launch_fp8_gemms(const ForwardArgs& args, const ForwardPlan& p, cudaStream_t s,
                                    cudaEvent_t* ev) {
  return launch_fc1_fc2([&] { return launch_fp8_gemm<true>(args, p.fc1, s); },
                        [&] {
                          const ForwardArgs& a = args;
                          const cudaError_t e =
                              launch_fp8_fold(a.h, a.tokens * a.K, a.I, a.h8, a.href, s);
                          return e != cudaSuccess ? e : launch_fp8_gemm<false>(a, p.fc2, s);
                        },
                        s, ev);
}

inline cudaError_t set_fp8_attributes() {
  return first_error({set_max_smem(sm90_moe_fp8_ws_kernel<true>, kFp8WsSmemBytes),
                      set_max_smem(sm90_moe_fp8_ws_kernel<false>, kFp8WsSmemBytes)});
}

}  // namespace moe_ep::kern
