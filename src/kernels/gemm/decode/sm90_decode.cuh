// The decode GEMM (routing tiles of 8, 16 or 32 tokens): swap-AB mma.sync m16n8k16 (the weights
// are the M side, a tile's tokens the N side), each column's k order that of every tile width,
// so tiles 8, 16 and 32 give the same bits; 4-bit weights decoded in registers (e2m1_layout.h),
// bf16 weights (tiles 8 and 16, one fragment per consumer warp) read as they are:
//  - one producer warp feeds a ring of stages with 1-D bulk copies (cp.async.bulk, TMA): per
//    stage one copy of the M-tile's contiguous weights of 4 K-chunks (16 KB; bf16: 2 chunks,
//    32 KB), one of their scales (4-bit) and one per live token row, all completing on the stage's
//    "full" mbarrier; consumers release a stage on its "empty" mbarrier. No per-thread address
//    math, no CTA barrier per chunk. Four chunks per stage instead of one: DSV3 nvfp4 1 / 128
//    tokens 90.6 -> 76 / 2204 -> 1805 us (fewer, larger copies, a quarter of the barrier round
//    trips).
//  - 4-bit weights: the scale bytes of a stage are converted once per warp into a table of bf16x2
//    multipliers (one lookup per byte instead of four lanes repeating it), read back with two
//    16-byte loads per fragment.
//  - kFW fragments (16 weight rows each) per consumer warp: 8 / kFW consumer warps per CTA.
//  - the ring depth is chosen at launch from the expected CTAs per SM: at 1 token fc1 has only
//    ~2 CTAs per SM, and the bytes in flight per SM, not issue, set the rate.
//  - programmatic dependent launch: the CTA sets up (barriers, table) while the previous kernel
//    finishes.
//  - the default consumer is pipelined (PipeConsumer): chunk c + 1's operands are loaded while
//    chunk c computes, and its slot goes back to the producer as soon as they are in registers.
//    With it (and 16 % fewer instructions per KB) the consumers at 128 tokens wait for data
//    (ncu: issue 0.69 -> 0.59 per scheduler at the same time): the weight stream, ~2.9 TB/s,
//    is now the limit there, not the decode (docs/kernels.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "kernels/common/pdl.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gemm/decode/decode_config.h"
#include "kernels/gemm/sm90_gemm_device.cuh"

namespace moe_ep::kern {

// ---------------------------------------------------------------------------------------------

// kCps K-chunks per ring slot (1, 2 or 4): a slot holds the weights of kCps consecutive chunks
// (one bulk copy), then their scales (one), then per B row its kCps * 64 values (one per row).
template <Recipe R, int kN, int kFW, int kCps = 1>
struct DecodeConfig {
  using RT = RecipeKernelTraits<R>;
  static_assert(kCps == 1 || kCps == 2 || kCps == 4, "1, 2 or 4 K-chunks per ring slot");
  static constexpr int kCWarps = kTileFrags / kFW;     // consumer warps
  static constexpr int kThreads = 32 * (kCWarps + 1);  // + the producer warp
  static constexpr int kNF = kN / 8;
  static constexpr int kBRow = kCps * kKChunk + 8;  // bf16 per B row (16 bytes of padding)
  static constexpr int kWBytes = kTileFrags * RT::kFragBytes;   // per chunk
  static constexpr int kSBytes = kTileFrags * RT::kScaleBytes;  // per chunk
  static constexpr int kSOff = kCps * kWBytes;                  // the slot's scales
  static constexpr int kBOff = kCps * (kWBytes + kSBytes);      // the slot's B rows
  static constexpr int kBBytes = kN * kBRow * 2;
  static constexpr int kStageBytes = kBOff + kBBytes;
  static_assert(kStageBytes == decode_stage_bytes(R, kN, kCps), "decode_config.h's geometry");
  // Static shared memory (tables, barriers) stays under kDecodeStaticBound.
  static constexpr int kMaxStages = decode_max_stages(R, kN, kCps);
  static constexpr int kMinStages = decode_min_stages(R, kCps);
  static constexpr int kGuStride = 17;  // fp32 per (frag, column) row of the fc1 g/u tile
  static constexpr int kHS = kFc1TileH + 4;
  static constexpr int kFc1EpiBytes = (kTileFrags * kN * kGuStride + kN * kHS) * 4;
  static constexpr int kFc2EpiBytes = kN * (kTileRows + 8) * 2;
  static constexpr int kEpiBytes = kFc1EpiBytes > kFc2EpiBytes ? kFc1EpiBytes : kFc2EpiBytes;
  static_assert(kEpiBytes <= kMinStages * kStageBytes, "the epilogue reuses the ring");
  static constexpr int smem_bytes(int stages) { return stages * kStageBytes; }
  static constexpr int kMaxSmemBytes = kMaxStages * kStageBytes;  // the launch attribute
  static_assert(kStageBytes % 16 == 0 && kWBytes % 16 == 0 && kSBytes % 16 == 0, "bulk sizes");
};

// ---------------------------------------------------------------------------------------------
// The pipelined consumer (kPipe): the operands of chunk c+1 (B fragments, weight words, scale
// multipliers) are loaded into a second register set while chunk c is decoded and multiplied,
// and chunk c+1's slot is released as soon as those loads have returned their data (a register
// dependence ahead of the arrive), not after its MMAs. Same decode, same MMAs in the same order
// on every accumulator, so the same bits as the plain loop.

// One chunk's operands of one consumer lane (kFW fragments). kLean: only the weight words and
// where the chunk's B columns and scale multipliers are (read per k16 step by compute).
template <Recipe R, int kN, int kFW, bool kLean = false>
struct PipeOps {
  using RT = RecipeKernelTraits<R>;
  static constexpr int kSW = RT::kNvScale ? 4 : 2;  // multipliers per row: per k16 step or per 32
  // A fragment's 16 bytes per lane and k16 step: one word per step (4-bit), or the step itself
  // (bf16, no scales).
  static constexpr int kWQ = RT::kFourBit ? 1 : 4;
  static constexpr int kSF = RT::kFourBit && !kLean ? kFW : 1;
  uint32_t b[kLean ? 1 : 4][kLean ? 1 : kN / 8][2];
  uint4 w[kFW][kWQ];
  uint32_t lo[kSF][kSW], hi[kSF][kSW];  // rows g and g + 8 of each frag (4-bit)
  uint32_t sb, tbl;  // kLean: this lane's B address in the chunk's slot, the chunk's table
};

// kN columns of MMAs on a ring laid out for kRingN columns (kN <= kRingN: a tile of kRingN
// with at most kN live rows).
// kLean (tile 32's 32-column consumer on 2-chunk slots): B fragments and scale multipliers are
// read from shared memory at each k16 step instead of a chunk ahead, so two operand sets fit
// 96 registers and 4 CTAs an SM; a slot goes back to the producer after the MMAs of its last
// chunk instead of after that chunk's loads.
template <Recipe R, int kN, int kFW, int kCps, int kRingN = kN, bool kLean = false>
struct PipeConsumer {
  using C = DecodeConfig<R, kRingN, kFW, kCps>;
  using RT = typename C::RT;
  using Ops = PipeOps<R, kN, kFW, kLean>;
  static constexpr int kNF = kN / 8, kSW = Ops::kSW;
  // One scale table per warp instead of two (decode_scale_tables): the next chunk's table writes
  // wait at a __syncwarp for every lane's reads of the previous one.
  static constexpr bool kOneTable = decode_scale_tables(C::kStageBytes) == 1;
  static_assert(kN % 8 == 0 && kN <= kRingN, "MMA columns within the ring's");
  // bf16 fragments are four times the registers of 4-bit words: one fragment per warp.
  static_assert(RT::kFourBit || (kFW == 1 && !kLean), "bf16 weights: one fragment per warp");
  // kLean reads a chunk's table during the next chunk's loads (two tables), and its release
  // relies on a slot's closing chunk never being followed by another closing one.
  static_assert(!kLean || (!kOneTable && kCps >= 2 && kN >= 16), "lean consumer");
  uint32_t ring, ring_end, full0, empty0;  // shared addresses: slot 0, past the last slot, bars
  uint32_t lut;  // shared address of the scale multiplier table (1 KB aligned: | adds the index)
  uint32_t b_off, w_off, s_off, t_off, tbl0, tbl_step, g_off;
  bool s_lane;    // this lane converts scale bytes (all but mxfp4 with one fragment: lanes < 16)
  uint32_t zero;  // 0, not known to the compiler
  uint32_t st;    // the slot of the next chunk to load
  uint32_t bar;   // its barrier offset (8 * slot)
  uint32_t phase;
  uint32_t pending;  // empty barrier of the last chunk loaded

  // The loop below is unrolled by kU (a multiple of kCps) and kJ = chunk % kU is known at
  // compile time, so is the chunk's place in its slot, kSub: the chunk with kSub 0 opens the
  // slot (waits for it), the one with kSub kCps - 1 closes it (moves to the next slot and
  // releases it once its own loads have returned; the slot's earlier chunks were read by MMAs
  // that come before the release in program order).
  static constexpr int kU = kCps > 2 ? kCps : 2;
  template <int kJ>
  static constexpr uint32_t kSub = kJ % kCps;
  template <int kJ>
  static constexpr bool kOpens = kSub<kJ> == 0;
  template <int kJ>
  static constexpr bool kCloses = kSub<kJ> == kCps - 1;

  // k16 step s's B fragments of the kNF column blocks (ldmatrix from the chunk's B columns).
  static __device__ __forceinline__ void load_b(uint32_t (&b)[kNF][2], uint32_t base, int s) {
    if constexpr (kNF >= 2) {
#pragma unroll
      for (int nf = 0; nf < kNF; nf += 2) {
        uint32_t r[4];
        ldsm_x4(r, base + (nf * 8 * C::kBRow + s * 16) * 2);
        b[nf][0] = r[0];
        b[nf][1] = r[1];
        b[nf + 1][0] = r[2];
        b[nf + 1][1] = r[3];
      }
    } else {
      ldsm_x2(b[0][0], b[0][1], base + s * 32);
    }
  }

  // Step s's B fragments: the ones compute just read (kLean) or the ones load kept.
  static __device__ __forceinline__ const uint32_t (&step_b(const Ops& o,
                                                            const uint32_t (&bs)[kNF][2],
                                                            int s))[kNF][2] {
    if constexpr (kLean)
      return bs;
    else
      return o.b[s];
  }

  template <int kJ>
  __device__ __forceinline__ void load(Ops& o, int chunk) {
    if constexpr (kOpens<kJ>) mbar_wait(full0 + bar, phase);
    const uint32_t sw = st + kSub<kJ> * C::kWBytes;     // the chunk's weights
    const uint32_t sb = st + kSub<kJ> * (kKChunk * 2);  // + b_off: its B columns
    if constexpr (!RT::kFourBit) {
      // bf16: this lane's 64 bytes of the fragment at sw + w_off, bits 4..5 of which are
      // (lane / 2) % 4 (w_off holds them; every other term is a multiple of 64), so XOR with the
      // step gives its slot (bf16_resident_step).
#pragma unroll
      for (int s = 0; s < 4; ++s) load_b(o.b[s], sb + b_off, s);
#pragma unroll
      for (int s = 0; s < 4; ++s) o.w[0][s] = lds128((sw + w_off) ^ uint32_t(s << 4));
    } else {
      load_four_bit<kJ>(o, chunk, sw, sb);
    }
    if constexpr (kCloses<kJ>) {
      pending = empty0 + bar;
      bar += 8;
      st += C::kStageBytes;
      if (st == ring_end) {
        st = ring;
        bar = 0;
        phase ^= 1;
      }
    }
  }

  // load()'s part for 4-bit weights: the words, the scale multipliers through the table.
  template <int kJ>
  __device__ __forceinline__ void load_four_bit(Ops& o, int chunk, uint32_t sw, uint32_t sb) {
    const uint32_t ss = st + kSub<kJ> * C::kSBytes;  // + s_off: the chunk's scales
    // Scale bytes first: their table round trip is the longest chain of the chunk.
    const uint32_t tbl = kOneTable ? tbl0 : tbl0 + (chunk & 1) * tbl_step;
    // One table: the previous chunk's was read. kLean: this table was last read by the MMAs of
    // chunk - 2 (compute, after that chunk's loads), so every lane's reads of it must come first.
    if constexpr (kOneTable || kLean) __syncwarp();
    // Each lane converts 4 (nvfp4, 2 fragments) or 2 scale bytes; with one mxfp4 fragment (16
    // rows of 2 bytes) only lanes 0..15 have any.
    if constexpr (RT::kNvScale && kFW == 2) {
      const uint32_t v = lds32(ss + s_off);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tbl + t_off),
                   "r"(lds32(lut | ((v << 2) & 0x3fc))), "r"(lds32(lut | ((v >> 6) & 0x3fc))),
                   "r"(lds32(lut | ((v >> 14) & 0x3fc))), "r"(lds32(lut | ((v >> 22) & 0x3fc))));
    } else if (RT::kNvScale || kFW == 2 || s_lane) {
      const uint32_t v = lds16(ss + s_off);
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(tbl + t_off),
                   "r"(lds32(lut | ((v << 2) & 0x3fc))), "r"(lds32(lut | ((v >> 6) & 0x3fc))));
    }
    if constexpr (kLean) {
      o.sb = sb + b_off;
      o.tbl = tbl;
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) load_b(o.b[s], sb + b_off, s);
    }
#pragma unroll
    for (int f = 0; f < kFW; ++f) o.w[f][0] = lds128(sw + w_off + f * RT::kFragBytes);
    __syncwarp();
#pragma unroll
    for (int f = 0; f < (kLean ? 0 : kFW); ++f) {
      if constexpr (RT::kNvScale) {
        const uint4 l = lds128(tbl + f * 256 + g_off), h = lds128(tbl + f * 256 + g_off + 128);
        o.lo[f][0] = l.x, o.lo[f][1] = l.y, o.lo[f][2] = l.z, o.lo[f][3] = l.w;
        o.hi[f][0] = h.x, o.hi[f][1] = h.y, o.hi[f][2] = h.z, o.hi[f][3] = h.w;
      } else {
        const uint2 l = lds64(tbl + f * 128 + g_off), h = lds64(tbl + f * 128 + g_off + 64);
        o.lo[f][0] = l.x, o.lo[f][1] = l.y;
        o.hi[f][0] = h.x, o.hi[f][1] = h.y;
      }
    }
  }

  static __device__ __forceinline__ uint32_t loaded(const Ops& o) {
    uint32_t dep = o.w[0][0].x ^ o.w[kFW - 1][Ops::kWQ - 1].x;
    if constexpr (!kLean) {
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int nf = 0; nf < kNF; nf += 2) dep ^= o.b[s][nf][0];
    }
    return dep;
  }

  // Releases the slot of the chunk just loaded into `o` if that chunk closes it, once every
  // load from the slot has returned: the chunk's own (`o`) and its predecessor's (`prev`, in
  // the same slot when kCps > 1; its MMAs, asm volatile like the arrive, come first in program
  // order, which already orders them, and the extra dependence costs a few LOP3).
  template <int kJ>
  __device__ __forceinline__ void release(const Ops& o, const Ops& prev) {
    if constexpr (kLean) {
      // The slot of `prev` (chunk kJ - 1) once its MMAs, which come before in program order and
      // took its B fragments as operands, have been issued; `o` opened the next slot (kCps >= 2),
      // so `pending` is still prev's.
      constexpr int kJp = (kJ + kU - 1) % kU;
      if constexpr (kCloses<kJp>) mbar_arrive_after(pending, prev.w[0][0].x & zero);
    } else if constexpr (kCloses<kJ>) {
      uint32_t dep = loaded(o);
      if constexpr (kCps > 1) dep ^= loaded(prev);
      mbar_arrive_after(pending, dep & zero);
    }
  }

  // k16 steps s0 .. s1 - 1 of the chunk in `o`.
  template <int s0, int s1>
  __device__ __forceinline__ void compute(const Ops& o, float (&acc)[kFW][kNF][4]) const {
#pragma unroll
    for (int s = s0; s < s1; ++s) {
      uint32_t bs[kNF][2];  // kLean: this step's B fragments
      if constexpr (kLean) load_b(bs, o.sb, s);
      const uint32_t(&bf)[kNF][2] = step_b(o, bs, s);
#pragma unroll
      for (int f = 0; f < kFW; ++f) {
        uint32_t af[4];
        if constexpr (!RT::kFourBit) {
          const uint4& v = o.w[f][s];
          af[0] = v.x, af[1] = v.y, af[2] = v.z, af[3] = v.w;
        } else {
          const uint4& w = o.w[f][0];
          const uint32_t word = s == 0 ? w.x : s == 1 ? w.y : s == 2 ? w.z : w.w;
          uint32_t lo, hi;
          if constexpr (kLean) {  // the table's rows g and g + 8 of fragment f (load's layout)
            constexpr int kRow = RT::kNvScale ? 16 : 8;
            const uint32_t t = o.tbl + f * 16 * kRow + g_off + (RT::kNvScale ? s : s >> 1) * 4;
            lo = lds32(t);
            hi = lds32(t + 8 * kRow);
          } else {
            lo = o.lo[f][RT::kNvScale ? s : s >> 1];
            hi = o.hi[f][RT::kNvScale ? s : s >> 1];
          }
          uint32_t bits[4];
          decode_e2m1x8(word, bits);
          af[0] = mul_bf16x2(bits[0], lo);
          af[1] = mul_bf16x2(bits[1], hi);
          af[2] = mul_bf16x2(bits[2], lo);
          af[3] = mul_bf16x2(bits[3], hi);
        }
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) mma_bf16(acc[f][nf], af, bf[nf][0], bf[nf][1]);
      }
    }
  }

  // Chunk c from `x` while chunk c + 1 is loaded into `y` and its slot released. The wait for
  // chunk c + 1 comes after half of chunk c: waiting before it (more overlap of its loads with
  // chunk c's math, less slack when its data comes late) measured 7 % slower for mxfp4 at 8-128
  // tokens (docs/kernels.md).
  // kJ = next % kU (chunk indices count from this CTA's first chunk, which opens slot 0).
  template <int kJ>
  __device__ __forceinline__ void step(const Ops& x, Ops& y, int next, float (&acc)[kFW][kNF][4]) {
    compute<0, 2>(x, acc);
    load<kJ>(y, next);
    compute<2, 4>(x, acc);
    release<kJ>(y, x);
  }

  // When kCps does not divide the chunk count, the last slot is partly filled and never
  // released: nothing waits for it (the producer is done, the epilogue syncs the CTA first).
  __device__ __forceinline__ void run(int chunks, float (&acc)[kFW][kNF][4]) {
    Ops a, b;
    load<0>(a, 0);
    if constexpr (!kLean) release<0>(a, a);  // lean: chunk 0 opens its slot, nothing to release
    int c = 0;
    if constexpr (kU == 2) {
      for (; c + 2 < chunks; c += 2) {
        step<1>(a, b, c + 1, acc);
        step<0>(b, a, c + 2, acc);
      }
      if (c + 1 < chunks) {
        step<1>(a, b, c + 1, acc);
        compute<0, 4>(b, acc);
      } else {
        compute<0, 4>(a, acc);
      }
    } else {
      static_assert(kU == 4, "unrolled by 2 or 4");
      for (; c + 4 < chunks; c += 4) {
        step<1>(a, b, c + 1, acc);
        step<2>(b, a, c + 2, acc);
        step<3>(a, b, c + 3, acc);
        step<0>(b, a, c + 4, acc);
      }
      const int r = chunks - 1 - c;  // chunks left after c: 0 .. 3
      if (r == 0) {
        compute<0, 4>(a, acc);
        return;
      }
      step<1>(a, b, c + 1, acc);
      if (r == 1) {
        compute<0, 4>(b, acc);
        return;
      }
      step<2>(b, a, c + 2, acc);
      if (r == 2) {
        compute<0, 4>(a, acc);
        return;
      }
      step<3>(a, b, c + 3, acc);
      compute<0, 4>(b, acc);
    }
  }
};

// One CTA computes one M-tile of one routing tile over the whole K range with the pipelined
// consumer (PipeConsumer). wave: the CTAs of the launch's first wave (below).
template <Recipe R, int kN, int kFW, bool kFc1, int kCps, ExpertEpilogue kEpi>
__device__ __forceinline__ void decode_gemm(const ForwardArgs& a, const int stages,
                                            const int wave) {
  using C = DecodeConfig<R, kN, kFW, kCps>;
  using RT = typename C::RT;
  constexpr int kNF = C::kNF, kCW = C::kCWarps;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(1024) uint32_t scale_lut[RT::kFourBit ? 256 : 1];
  // Per warp; double-buffered by chunk parity where the shared memory allows (decode_scale_tables).
  constexpr int kTables = decode_scale_tables(C::kStageBytes);
  __shared__ uint4 scale_tbl[kTables][kCW][RT::kFourBit ? kFW * 16 : 1];
  __shared__ __align__(8) uint64_t full_bar[C::kMaxStages];
  __shared__ __align__(8) uint64_t empty_bar[C::kMaxStages];
  __shared__ int pair_of[kN];  // t*K+k of each column
  __shared__ float tw_of[kN];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // fc2's weights do not depend on fc1, and its tile list was written by the kernel before fc1
  // (prepare or route), which had completed before any fc1 CTA passed pdl_wait and so before
  // fc2 could launch: fc2 reads the tile list and queues the weights and scales of its first
  // ring slots before its pdl_wait, streaming them during fc1's tail. fc1 waits first (its tile
  // list comes from the kernel right before it).
  constexpr bool kEarly = !kFc1;
  const bool producer0 = tid == kCW * 32;  // the producer warp's lane 0
  // The scale table and the ring barriers. A CTA of the first wave sets them up before its PDL
  // wait, which that overlaps; a later CTA starts once the kernel before has completed (fc1: a
  // first-wave CTA leaves only after its wait), so it first looks for its tile: the many CTAs
  // of an EP owner's grid without one (sized for W * capacity rows) then exit at once.
  auto setup = [&] {
    if constexpr (RT::kFourBit) {
      for (int b = tid; b < 256; b += C::kThreads) scale_lut[b] = scale_multiplier<R>(b);
    }
    if (kEarly ? producer0 : tid == 0) {
      for (int s = 0; s < stages; ++s) {
        mbar_init(&full_bar[s], 1);
        mbar_init(&empty_bar[s], kCW * 32);
      }
      mbar_init_fence();
    }
  };
  const bool first_wave = blockIdx.y * gridDim.x + blockIdx.x < unsigned(wave);
  if (first_wave) setup();
  // The second launch of a split pair (ForwardArgs::pdl_late) waits for the first at its end,
  // on every way out.
  struct LateWait {
    bool on;
    __device__ ~LateWait() {
      if (on) pdl_wait();
    }
  } late{a.pdl_late};
  if constexpr (!kEarly) {
    // Everything below reads what earlier kernels of the forward wrote (tile list, xq).
    if (!a.pdl_late) pdl_wait();
    pdl_launch_dependents();
  }
  int tile_idx, mtile;
  if (!tile_item(a, tile_idx, mtile)) {
    // A split pair's second launch skips its first wait, so this grid may let it launch only in
    // order: a CTA without a tile still waits for the grid before it (fc2's early start).
    if (kEarly && a.tile_split_rows > 0 && !a.pdl_late) pdl_wait();
    return;
  }
  if (!first_wave) setup();
  const TileInfo tile = a.tiles[tile_idx];
  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int chunks = ms.chunks;
  const uint8_t* wbase = ms.w;
  const uint8_t* sbase = RT::kFourBit ? ms.s : nullptr;
  const int slots = (chunks + kCps - 1) / kCps;
  // Slot i's full barrier expects its weights, scales and B rows (one arrive, by the producer's
  // lane 0); the weights and scales are queued here (the B rows by the producer's lanes < rows).
  auto queue_weights = [&](int i, unsigned char* st, uint64_t* bar) {
    const int c = i * kCps, n = kCps == 1 ? 1 : min(kCps, chunks - c);  // chunks in the slot
    mbar_arrive_expect_tx(bar, uint32_t(n * (C::kWBytes + C::kSBytes + tile.rows * kKChunk * 2)));
    // Weights and scales are read once per forward: L2 evict_first (DSV3 nvfp4 1 / 8 tokens
    // 73.1 -> 70.9 / 382.8 -> 377.4 us, Qwen3 8 / 128 tokens 73.2 -> 64.7 / 155.1 -> 140.4 us,
    // against evict_normal on one H200).
    const uint64_t pol = make_l2_evict_first_policy();
    bulk_load(st, wbase + size_t(c) * C::kWBytes, n * C::kWBytes, bar, pol);
    if constexpr (RT::kFourBit)
      bulk_load(st + C::kSOff, sbase + size_t(c) * C::kSBytes, n * C::kSBytes, bar, pol);
  };
  int early = 0;  // slots queued before pdl_wait (producer lane 0 only)
  if constexpr (kEarly) {
    if (producer0) {
      early = min(stages, slots);
      for (int i = 0; i < early; ++i) queue_weights(i, smem + i * C::kStageBytes, &full_bar[i]);
    }
    // Everything below reads what fc1 wrote (h).
    if (!a.pdl_late) pdl_wait();
    pdl_launch_dependents();
  }

  for (int n = tid; n < kN; n += C::kThreads) {
    const TileColumn c = tile_column<kFc1>(a, tile, n);
    pair_of[n] = c.pair;
    tw_of[n] = c.tw;
  }
  // Ring slot s: weights at s * kStageBytes, then scales, then the B rows.
  const uint32_t ring = smem_addr(smem);
  constexpr uint32_t kSOff = C::kSOff, kBOff = C::kBOff;
  // B rows past tile.rows are never copied: zero them once in every slot (their columns are
  // computed and dropped; zeros keep them finite).
  {
    constexpr int kRowVecs = C::kBRow / 8;
    const int dead = kN - tile.rows;
    for (int i = tid; i < stages * dead * kRowVecs; i += C::kThreads) {
      const int s = i / (dead * kRowVecs), r = i % (dead * kRowVecs);
      uint16_t* row = reinterpret_cast<uint16_t*>(smem + s * C::kStageBytes + kBOff) +
                      (tile.rows + r / kRowVecs) * C::kBRow;
      reinterpret_cast<uint4*>(row)[r % kRowVecs] = make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  float acc[kFW][kNF][4];
#pragma unroll
  for (int f = 0; f < kFW; ++f)
#pragma unroll
    for (int n = 0; n < kNF; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][n][i] = 0.0f;
  const int g = lane >> 2, t4 = lane & 3;

  if (warp == kCW) {
    // Producer warp: lane 0 queues weights + scales, lane n < rows queues B row n.
    const int rows = tile.rows;
    const uint16_t* brow = nullptr;
    if (lane < rows) {
      if constexpr (kFc1)
        brow = a.xq + int64_t(pair_of[lane] / a.K) * a.H;
      else
        brow = a.h + int64_t(tile.start + lane) * a.I;
    }
    int slot = 0;
    uint32_t phase = 0;
    for (int i = 0; i < slots; ++i) {
      const int c = i * kCps, n = kCps == 1 ? 1 : min(kCps, chunks - c);  // chunks in the slot
      if (i >= stages) mbar_wait(&empty_bar[slot], phase ^ 1);
      unsigned char* st = smem + slot * C::kStageBytes;
      if (lane == 0 && i >= early) queue_weights(i, st, &full_bar[slot]);
      if (lane < rows)
        bulk_load(st + kBOff + lane * C::kBRow * 2, brow + c * kKChunk, n * kKChunk * 2,
                  &full_bar[slot]);
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
  } else {
    // A consumer of kNFr * 8 MMA columns (kNFr <= kNF) accumulating into acc_r.
    auto consume = [&](auto nf_c, auto& acc_r) {
      constexpr int kNFr = decltype(nf_c)::value;
      PipeConsumer<R, 8 * kNFr, kFW, kCps, kN, kN == 32 && kCps == 2 && kNFr == kNF> pc;
      const int lm_row = (lane & 7) + (kNFr >= 2 ? ((lane >> 4) << 3) : 0);
      const int lm_col = ((lane >> 3) & 1) * 8;
      pc.ring = ring;
      pc.ring_end = ring + stages * C::kStageBytes;
      pc.full0 = smem_addr(&full_bar[0]);
      pc.empty0 = smem_addr(&empty_bar[0]);
      pc.b_off = kBOff + (lm_row * C::kBRow + lm_col) * 2;
      pc.w_off = RT::kFourBit
                     ? (warp * kFW) * RT::kFragBytes + lane * 16
                     : warp * RT::kFragBytes + lane * 64 + (bf16_resident_step(lane, 0) << 4);
      // This lane's share of the warp's scale bytes and where its multipliers go in the table
      // ([frag * 16 + row], 4 (nv) or 2 (mx) multipliers per row): nvfp4 with two fragments 4
      // bytes = one row (frag lane / 16); nvfp4 with one, 2 bytes = half a row; mxfp4 2 bytes =
      // one row.
      constexpr bool kWide = RT::kNvScale && kFW == 2;
      pc.s_off = kSOff + warp * kFW * RT::kScaleBytes + lane * (kWide ? 4 : 2);
      pc.t_off = lane * (kWide ? 16 : 8);
      pc.s_lane = RT::kNvScale || kFW == 2 || lane < 16;
      pc.tbl0 = smem_addr(&scale_tbl[0][warp][0]);
      pc.tbl_step = uint32_t(sizeof(scale_tbl[0]));  // unused with one table
      pc.lut = smem_addr(scale_lut);
      if (pc.lut & 1023) __trap();  // the lookups OR the index into the address
      pc.g_off = g * (RT::kNvScale ? 16 : 8);
      pc.zero = uint32_t(stages) >> 8;
      pc.st = ring;
      pc.bar = 0;
      pc.phase = 0;
      pc.pending = 0;
      pc.run(chunks, acc_r);
    };
    // A tile with few live rows runs a narrower consumer: 8 columns where at most 8 rows are
    // live (tile 16: about half of the tiles at a mean of 8 rows per expert), 16 where at most
    // 16 are (tile 32): fewer MMAs and B loads per chunk. The live columns get the same MMAs in
    // the same order (ldmatrix x2 loads the x4's first two matrices), so the same bits; the
    // columns past them (zero B rows, never stored) stay 0.
    auto consume_narrow = [&](auto nf_c) {
      constexpr int kNFr = decltype(nf_c)::value;
      float acc_r[kFW][kNFr][4];
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int n = 0; n < kNFr; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_r[f][n][i] = 0.0f;
      consume(nf_c, acc_r);
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int n = 0; n < kNFr; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[f][n][i] = acc_r[f][n][i];
    };
    if constexpr (kN >= 16) {
      if (tile.rows <= 8) {
        consume_narrow(std::integral_constant<int, 1>{});
      } else if constexpr (kN == 32) {
        if (tile.rows <= 16)
          consume_narrow(std::integral_constant<int, 2>{});
        else
          consume(std::integral_constant<int, kNF>{}, acc);
      } else {
        consume(std::integral_constant<int, kNF>{}, acc);
      }
    } else {
      consume(std::integral_constant<int, kNF>{}, acc);
    }
  }
  __syncthreads();  // every stage was consumed; the pipeline smem becomes the epilogue tile

  const int e = tile.expert;
  if constexpr (kFc1) {
    // g/u values [frag][col][row 0..15] (frag 2j = gate, 2j+1 = up rows of h rows j*16..),
    // then the h tile [kN][64 (+4)] fp32, then the shared requantizing store.
    float* gu = reinterpret_cast<float*>(smem);
    float* hs = gu + kTileFrags * kN * C::kGuStride;
    const float alpha = gemm_alpha<R, true>(a, e);
    if (warp < kCW) {
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = nf * 8 + 2 * t4 + (i & 1);
            const int row = g + (i >> 1) * 8;
            gu[((warp * kFW + f) * kN + col) * C::kGuStride + row] =
                epilogue_value<R, true>(acc[f][nf][i], alpha);
          }
    }
    __syncthreads();
    for (int it = tid; it < kN * kFc1TileH; it += C::kThreads) {
      const int col = it / kFc1TileH, row = it % kFc1TileH, j = row >> 4, r = row & 15;
      const float gv = gu[((2 * j) * kN + col) * C::kGuStride + r];
      const float uv = gu[((2 * j + 1) * kN + col) * C::kGuStride + r];
      float hv = fc1_activation<kEpi>(a, e, mtile * kFc1TileH + row, gv, uv);
      if (a.weight_in_fc1) hv = fmt::mul_rn(hv, tw_of[col]);
      hs[col * C::kHS + row] = hv;
    }
    __syncthreads();
    store_h_tile<R>(a, hs, tile, mtile, tid, C::kThreads);
  } else {
    uint16_t* ys = reinterpret_cast<uint16_t*>(smem);
    constexpr int kYS = kTileRows + 8;
    const float alpha = gemm_alpha<R, false>(a, e);
    if (warp < kCW) {
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = nf * 8 + 2 * t4 + (i & 1);
            const int row = (warp * kFW + f) * 16 + g + (i >> 1) * 8;
            float v = epilogue_value<R, false>(acc[f][nf][i], alpha);
            if constexpr (kEpi == ExpertEpilogue::kExtended)
              v = fc2_value<kEpi>(a, e, mtile * kTileRows + row, pair_of[col], v);
            ys[col * kYS + row] = fmt::float_to_bf16(v);
          }
    }
    __syncthreads();
    store_y_tile<kN>(a, ys, tile, pair_of, mtile, tid, C::kThreads);
  }
}

// Up to 96 registers: the two operand sets fit without
// ptxas recomputing per-lane offsets in the loop, and 4 CTAs of 160 threads (2 of 288) still
// fit an SM. Tile 32 holds four times tile 8's B fragments per operand set: kDecode32Regs (3
// CTAs of 160 threads fit the register file, as its ring fits the shared memory; 32-44 bytes
// of spill remain in its 32-column loop).
constexpr int kDecode32Regs = 136;
// (Tile 32 on 2-chunk slots runs the lean consumer at 96 registers and 4 CTAs per SM, for GEMMs
// with a short K: the plan's tile32_chunks_per_slot.) bf16 weights: 72, so that three CTAs of
// 288 threads fit the register file as their two-slot rings fit the shared memory.
constexpr int kDecodeBf16Regs = 72;
template <Recipe R, int kN, int kCps>
constexpr int decode_max_registers() {
  return R == Recipe::kBf16 ? kDecodeBf16Regs : kN > 16 && kCps == 4 ? kDecode32Regs : 96;
}
template <Recipe R, int kN, int kFW, bool kFc1, int kCps,
          ExpertEpilogue kEpi = ExpertEpilogue::kSwiglu>
__global__ void __maxnreg__((decode_max_registers<R, kN, kCps>()))
    sm90_moe_decode_kernel(const ForwardArgs a, const int stages, const int wave) {
  decode_gemm<R, kN, kFW, kFc1, kCps, kEpi>(a, stages, wave);
}

}  // namespace moe_ep::kern
