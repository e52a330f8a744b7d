// The bf16 recipe's persistent m64 kernel (PlanOptions::m64_persistent; docs/kernels.md §4.3).
// The m64 kernel's CTA for bf16 weights (four warpgroups on the 256 weight rows of two M-tiles,
// every warp copying and multiplying, 128 registers, one CTA per SM), made persistent: a CTA runs
// (routing tile, group of four half M-tiles) items, the first blockIdx.x, each next one by ticket.
// Its K-chunks form one stream through the ring across items: the loads an item's last two chunks
// issue are the next item's first two stages, and the next item's tables are built over the
// item's first chunks, so nothing of the m64 kernel's CTA prologue (the tables, the ring's first
// stages) lies between two items. The epilogue stages its values in the two ring stages the
// item's last chunks used. Same fragments, same wgmmas in the same k order: the m64 kernel's bits.
#pragma once

#include "kernels/gemm/wgmma/sm90_wgmma.cuh"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

// Its N classes: more classes in its item loop make ptxas serialize the wgmmas (C7512) or spill
// at 128 registers, so the plan runs it where tiles hold about 96 rows or more
// (plan::kBf16M64PersistentMinMeanRows).
using M64PersistentNClasses = std::integer_sequence<int, 96, 128, 160>;

struct M64PersistentConfig {
  using C = Wgmma3Config<Recipe::kBf16, 4, 1>;
  static constexpr int kNT = C::kNT;               // 512
  static constexpr int kHalfWBytes = C::kWBytes;   // one half's weights of a chunk (8 KB)
  static constexpr int kWBytes = 4 * kHalfWBytes;  // 32 KB, at the stage's start
  static constexpr int kStageBytes = kWBytes + kM64TileN * 128;  // then B, 160 rows of 128 B
  static constexpr int kStaticBytes = 2 * kM64TileN * (8 + 4 + 4) + 64;
  static constexpr int kStages = (kSmemPerCtaMax - kStaticBytes - 1024) / kStageBytes;
  static constexpr int kAhead = kStages - 2;  // chunks loaded ahead (one more is in the wgmmas)
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = kRingBytes + 1024;
  // The epilogue: warpgroups 0-1 stage in one freed stage, 2-3 in the other.
  static constexpr int kEpiBytes = C::kEpiBytes;
  static_assert(kStages == 4 && kAhead == 2,
                "two freed stages hold the epilogue, two the next item's");
  static_assert(2 * kEpiBytes <= kStageBytes, "two warpgroups' staging fit a stage");
  static_assert(kWBytes % 1024 == 0 && kStageBytes % 1024 == 0, "B stages 1024-aligned");
};

template <bool kFc1, ExpertEpilogue kEpi>
__global__ void __launch_bounds__(M64PersistentConfig::kNT, 1)
    sm90_moe_m64_persistent_kernel(const ForwardArgs a) {
  constexpr Recipe R = Recipe::kBf16;
  using P = M64PersistentConfig;
  using C = P::C;
  using RT = C::RT;
  constexpr int kNF = kM64TileN / 8;
  constexpr int kIF = C::kInFlight;
  constexpr int kSB = P::kStageBytes, kAhead = P::kAhead;
  constexpr uint32_t kRing = uint32_t(P::kRingBytes);
  constexpr int kBStep = P::kNT / 8;  // 64 rows per pass of B copies
  static_assert(kIF == 2 && C::kWCopies == 4, "the bf16 m64 CTA");
  extern __shared__ unsigned char smem_raw[];
  // Per item parity: the tables of tile_b_rows / tile_epilogue_columns, the tile, the item.
  __shared__ const uint16_t* brow_ptr[2][kM64TileN];
  __shared__ int pair_of[2][kM64TileN];
  __shared__ float tw_of[2][kM64TileN];
  __shared__ TileInfo tile_of[2];  // rows 0: no item
  __shared__ int item_of[2];
  __shared__ const uint8_t* wsrc_of[4];  // each warpgroup's weight source of the current item

  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int groups = (halves + 3) / 4;
  const int items = *a.num_tiles * groups;
  // A CTA without a first item takes no ticket.
  if (int(blockIdx.x) >= items) return;
  auto half_live = [&](int m64) { return m64 < halves && (kFc1 || m64 * kWg3Rows < a.H); };
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
  const int warp = wtid >> 5, lane = tid & 31;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);
  const uint16_t* bsrc = kFc1 ? a.xq : a.h;
  const int chunks = (kFc1 ? a.H : a.I) / kKChunk;
  // This thread's B pieces (as in the m64 kernel): 16-byte column bc of rows br0 + kBStep i.
  const int bc = tid & 7, br0 = tid >> 3;
  const uint32_t bdst_off = uint32_t(P::kWBytes + br0 * 128 + ((bc ^ (br0 & 7)) << 4));
  const uint32_t wdst_off = uint32_t(wg * P::kHalfWBytes + wtid * 16);

  // This warpgroup's weight source of item `item` (tile t): its half's fragments, or, for a half
  // without rows (past fc2's H), the group's first half (it copies nothing). Each thread copies
  // the 16 bytes at wtid * 16 of every 2 KB of it.
  struct Half {
    const uint8_t* w;
    bool active;
    int m64;
  };
  auto half_of = [&](const TileInfo& t, int item) {
    const int group = item % groups, m64 = group * 4 + wg;
    Half hf;
    hf.active = half_live(m64);
    const int src = hf.active ? m64 : group * 4;
    hf.w = mtile_stream<R, kFc1>(a, t.expert, src >> 1).w + (src & 1) * P::kHalfWBytes;
    hf.m64 = m64;
    return hf;
  };
  // A stage of chunk c of the item of parity tb, from its tables: every one of the 160 B rows
  // (zero past the tile's rows) and the weights.
  auto load_from_tables = [&](uint32_t off, int c, int tb) {
    const TileInfo t = tile_of[tb];
    const Half hf = half_of(t, item_of[tb]);
    const uint32_t st = smem_base + off;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int row = br0 + kBStep * i;
      if (i == 2 && row >= kM64TileN) break;
      const bool live = row < t.rows;
      const uint16_t* src = live ? brow_ptr[tb][row] + size_t(c) * kKChunk + bc * 8 : bsrc;
      cp_async16_sz(st + bdst_off + uint32_t(i * kBStep * 128), src, live ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < C::kWCopies; ++i)
      cp_async16_sz(st + wdst_off + uint32_t(i * 16 * 128),
                    hf.w + size_t(c) * (2 * P::kHalfWBytes) + wtid * 16 + i * 16 * 128,
                    hf.active ? 16u : 0u);
  };
  // Item `item`'s tile and tables into parity tb (all at once: the first item).
  auto tables_now = [&](int item, int tb) {
    const TileInfo t = a.tiles[item / groups];
    if (tid == 0) {
      tile_of[tb] = t;
      item_of[tb] = item;
    }
    for (int c = tid; c < kM64TileN; c += P::kNT) {
      const TileColumn col = tile_column<kFc1>(a, t, c);
      brow_ptr[tb][c] = bsrc + col.brow;
      pair_of[tb][c] = col.pair;
      tw_of[tb][c] = col.tw;
    }
  };
  // The exit: the CTA's count, and the last CTA's reset of both counters (each CTA took its
  // last, failing, ticket before its count).
  auto leave = [&] {
    if (tid != 0) return;
    __threadfence();
    if (atomicAdd(a.sched + 1, 1) == min(int(gridDim.x), items) - 1) {
      atomicExch(a.sched, 0);
      atomicExch(a.sched + 1, 0);
    }
  };

  tables_now(int(blockIdx.x), 0);
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    load_from_tables(uint32_t(s * kSB), s, 0);
    cp_async_commit();
  }
  auto advance = [](uint32_t off) {
    off += uint32_t(kSB);
    return off == kRing ? 0u : off;
  };
  uint32_t rd = 0;  // the current chunk's stage
  float acc[kNF * 4];
  int ticket = 0;  // thread 0's, for the next item

  for (int j = 0;; ++j) {
    const int b = j & 1, nb = b ^ 1;
    const TileInfo tile = tile_of[b];
    if (tile.rows == 0) break;
    const Half hf = half_of(tile, item_of[b]);
    // Read back from shared memory in the K loop (published by chunk 0's barrier; the previous
    // item's last loads read the tables instead): two registers fewer there.
    if (wtid == 0) wsrc_of[wg] = hf.w;
    const bool active = hf.active;
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) acc[i] = 0.0f;

    // Chunk c's share of the next item's setup, after the chunk's barrier. Its global reads are
    // cp.async words into the tables, so no register holds them across chunks: a word issued in
    // chunk c completes with chunk c + 1's stage, at chunk c + 3's wait, and every thread sees
    // it after that chunk's barrier. Thread 0's ticket (chunk 0) is read in chunk 1.
    auto setup_next = [&](int c) {
      if (c == 0) {
        if (tid == 0) ticket = atomicAdd(a.sched, 1);
      } else if (c == 1) {
        if (tid == 0) {
          const int next = int(gridDim.x) + ticket;
          item_of[nb] = next;
          if (next < items) {
            const TileInfo* t = a.tiles + next / groups;
            cp_async4(&tile_of[nb].expert, &t->expert);
            cp_async4(&tile_of[nb].start, &t->start);
            cp_async4(&tile_of[nb].rows, &t->rows);
          } else {
            tile_of[nb].rows = 0;
          }
        }
      } else if (c == 4) {  // the tile (chunk 1's words) is in
        const TileInfo t = tile_of[nb];
        if (tid < kM64TileN) {
          if (tid < t.rows)
            cp_async4(&pair_of[nb][tid], a.sorted_pairs + t.start + tid);
          else
            pair_of[nb][tid] = -1;
          if constexpr (!kFc1)
            brow_ptr[nb][tid] = bsrc + (tid < t.rows ? column_brow<false>(a, t, tid, 0) : 0);
        }
      } else if (c == 7) {  // the pairs (chunk 4's words) are in
        if constexpr (kFc1) {
          const TileInfo t = tile_of[nb];
          if (tid < kM64TileN) {
            const bool live = tid < t.rows;
            const int pair = pair_of[nb][tid];
            brow_ptr[nb][tid] = bsrc + (live ? column_brow<true>(a, t, tid, pair) : 0);
            if (a.weight_in_fc1) {
              if (live)
                cp_async4(&tw_of[nb][tid], a.topk_weights + pair);
              else
                tw_of[nb][tid] = 0.0f;
            }
          }
        }
      }
    };

    // One copy of the K loop per N class (every wgmma on the accumulators has one shape).
    auto k_loop = [&](auto nw) {
      constexpr int kNW = decltype(nw)::value;
      constexpr int kBCopies = (kNW + kBStep - 1) / kBStep;
      // This thread's B sources of this item as element offsets from bsrc.
      uint32_t bptr[kBCopies];
#pragma unroll
      for (int i = 0; i < kBCopies; ++i)
        bptr[i] = br0 + kBStep * i < kNW
                      ? uint32_t(brow_ptr[b][br0 + kBStep * i] - bsrc) + uint32_t(bc * 8)
                      : 0u;
      const int live_rows = tile.rows;
      auto load_stage = [&](uint32_t off, int c) {
        const uint32_t st = smem_base + off;
        const uint16_t* bsrc_c = bsrc + size_t(c) * kKChunk;
#pragma unroll
        for (int i = 0; i < kBCopies; ++i) {
          const uint32_t dst = st + bdst_off + uint32_t(i * (kBStep * 128));
          const uint32_t size = br0 + kBStep * i < live_rows ? 16u : 0u;
          if (kNW % kBStep == 0 || i + 1 < kBCopies)
            cp_async16_sz(dst, bsrc_c + bptr[i], size);
          else
            cp_async16_if(dst, bsrc_c + bptr[i], size, br0 + kBStep * i < kNW);
        }
        const uint8_t* w = wsrc_of[wg] + size_t(c) * (2 * P::kHalfWBytes) + wtid * 16;
#pragma unroll
        for (int i = 0; i < C::kWCopies; ++i)
          cp_async16_sz(st + wdst_off + uint32_t(i * 16 * 128), w + i * 16 * 128,
                        active ? 16u : 0u);
      };
      uint32_t af[kIF][4];
#pragma unroll
      for (int s = 0; s < kIF; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) af[s][i] = 0;
      const uint32_t desc0_lo = uint32_t(sw128_desc(smem_base + P::kWBytes));
#pragma unroll 1
      for (int c = 0; c < chunks; ++c) {
        // Chunk c's data is visible to every warp after the barrier, and stage `wr` (chunk
        // c - 2's) is free: every warp's waits in chunk c - 1 retired all of its steps.
        cp_async_wait<kAhead - 1>();
        fence_proxy_async_smem();
        __syncthreads();
        uint32_t wr = rd + uint32_t(kAhead * kSB);  // the stage this chunk loads
        if (wr >= kRing) wr -= kRing;
        const int nc = c + kAhead;
        if (nc < chunks)
          load_stage(wr, nc);
        else if (tile_of[nb].rows > 0)
          load_from_tables(wr, nc - chunks, nb);
        cp_async_commit();
        setup_next(c);
        if (active) {  // warpgroup-uniform
          const unsigned char* ws = smem + rd + wg * P::kHalfWBytes;
          const uint64_t desc = sw128_desc_at(desc0_lo, rd);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t* f = af[s % kIF];
            const uint4 v = *reinterpret_cast<const uint4*>(ws + warp * RT::kFragBytes + lane * 64 +
                                                            (bf16_resident_step(lane, s) << 4));
            f[0] = v.x;
            f[1] = v.y;
            f[2] = v.z;
            f[3] = v.w;
            wgmma_fence();
            wgmma_m64<kNW>(acc, af[s % kIF], desc + uint64_t(2 * s));
            wgmma_commit();
            wgmma_wait<kIF - 1>();
            keep_alive4(af[(s + 1) % kIF]);
          }
        }
        rd = advance(rd);
      }
      wgmma_wait<0>();
    };
    with_n_class(tile.rows, k_loop, M64PersistentNClasses{});
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[i])::"memory");
    // Every warp is done with the stages of the item's last two chunks (rd + 2 and rd + 3
    // stages): they hold the epilogue, warpgroups 0-1 the first, 2-3 the second.
    __syncthreads();
    // The item's tile and half read again from shared memory (held in registers through the K
    // loop they would push its wgmmas past the 128 registers).
    const volatile TileInfo& vt = tile_of[b];
    const TileInfo etile{vt.expert, vt.start, vt.rows};
    const int m64 = *reinterpret_cast<volatile int*>(&item_of[b]) % groups * 4 + wg;
    if (half_live(m64)) {
      uint32_t epi = rd + uint32_t((2 + (wg >> 1)) * kSB);
      if (epi >= kRing) epi -= kRing;
      const float alpha = gemm_alpha<R, kFc1>(a, etile.expert);
      auto value = [alpha](float v, int) { return epilogue_value<R, kFc1>(v, alpha); };
      m64_epilogue<R, kFc1, kNF, kEpi>(a, etile, m64 >> 1, m64 & 1, acc,
                                       smem + epi + (wg & 1) * P::kEpiBytes, tw_of[b], pair_of[b],
                                       wtid, value, [wg] { named_barrier(1 + wg, 128); });
    }
  }
  cp_async_wait<0>();
  leave();
}

// One CTA per SM at most (GemmPlan::grid_ctas).
template <bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_wgmma_m64_persistent(const ForwardArgs& a, const GemmPlan& g, cudaStream_t s) {
  sm90_moe_m64_persistent_kernel<kFc1, kEpi>
      <<<unsigned(g.grid_ctas), M64PersistentConfig::kNT, M64PersistentConfig::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

template <ExpertEpilogue kEpi>
cudaError_t set_m64_persistent_attributes() {
  return first_error(
      {set_max_smem(sm90_moe_m64_persistent_kernel<true, kEpi>, M64PersistentConfig::kSmemBytes),
       set_max_smem(sm90_moe_m64_persistent_kernel<false, kEpi>, M64PersistentConfig::kSmemBytes)});
}

}  // namespace moe_ep::kern
