// The decode GEMM (routing tiles of 8, 16 or 32 tokens): the same swap-AB mma.sync math as
// sm90_moe_gemm_kernel (same fragments, same decode, same k order per column, so the same bits),
// with a cheaper weight stream and consumer loop for the few-token case:
//  - one producer warp feeds a ring of stages with 1-D bulk copies (cp.async.bulk, TMA): per
//    stage one copy of the M-tile's contiguous weights of 4 K-chunks (16 KB), one of their scales
//    and one per live token row, all completing on the stage's "full" mbarrier; consumers
//    release a stage on its "empty" mbarrier. No per-thread address math, no CTA barrier per
//    chunk. Four chunks per stage instead of one: DSV3 nvfp4 1 / 128 tokens 90.6 -> 76 /
//    2204 -> 1805 us (fewer, larger copies, a quarter of the barrier round trips).
//  - the scale bytes of a stage are converted once per warp into a small table of bf16x2
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
//    is now the limit there, not the decode (docs/gpu_kernels.md §6).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "common/env_switch.h"
#include "kernels/moe/sm90_moe_device.cuh"
#include "kernels/pdl.cuh"

namespace moe_ep::kern {

// ---------------------------------------------------------------------------------------------
// PTX helpers: mbarrier, bulk copy (programmatic dependent launch: kernels/pdl.cuh)

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// One box of a 2-D tensor map at column x, row y into shared memory at dst (aligned as its
// swizzle asks), completing on the mbarrier at shared address bar's transaction count.
__device__ __forceinline__ void tma_box_2d(uint32_t dst, const void* tmap, int x, int y,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(tmap), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// True in one lane of the (converged) warp.
__device__ __forceinline__ bool elect_one() {
  uint32_t p = 0;
  asm volatile("{\n .reg .pred e;\n elect.sync _|e, 0xffffffff;\n selp.u32 %0, 1, 0, e;\n}\n"
               : "=r"(p));
  return p != 0;
}
// Adds `bytes` to the barrier's expected transactions of its current phase (no arrival).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive at `addr` + `zero_dep`, where zero_dep is 0 at run time but computed from registers
// loaded out of the slot: the arrive cannot issue before those loads have returned their data,
// so the producer's next bulk copy into the slot cannot overtake a read of it.
__device__ __forceinline__ void mbar_arrive_after(uint32_t addr, uint32_t zero_dep) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr + zero_dep) : "memory");
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
// Spins until the mbarrier at shared address `addr` completes phase `parity`.
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait(smem_addr(bar), parity);
}
// Global -> shared bulk copy (16-byte aligned, multiple of 16 bytes) completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// The same under an L2 cache policy (make_l2_policy).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], "
      "%2, [%3], %4;\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// ---------------------------------------------------------------------------------------------

// The decode kernel's static shared memory (scale tables, barriers, column tables), as ptxas
// reports it for the 4-bit kernels (4-chunk slots): with two scale tables per warp, and the
// bound the ring sizing reserves for it (with the runtime's 1 KB).
constexpr int kDecodeStaticTwoTables = 5376;
constexpr int kDecodeStaticBound = 8 * 1024;

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
  // Static shared memory (tables, barriers) stays under kDecodeStaticBound.
  static constexpr int kMaxStages = (kSmemPerCtaMax - kDecodeStaticBound) / kStageBytes < 24
                                        ? (kSmemPerCtaMax - kDecodeStaticBound) / kStageBytes
                                        : 24;
  static constexpr int kMinStages = kCps > 1 ? 2 : RT::kFourBit ? 4 : 3;
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

// decode_e2m1x8 (sm90_moe_device.cuh) with register 3 from a multiply-high: the bits of the
// weight word's codes that go to bf16 bits 6..8 (and 22..24) move right by 7 or 3, i.e. left by
// 25 or 29 into the high word of m * (2^25 + 2^29), where the two shifted copies of
// m = w & 0x68006800 do not overlap (so no carries); the sign bits move left by 5 as before.
// 5 instructions for register 3 instead of 6, 3 of them off the integer ALU pipe. Checked equal
// to decode_e2m1x8 on all 2^32 words.
__device__ __forceinline__ void decode_e2m1x8_mulhi(uint32_t w, uint32_t (&r)[4]) {
  r[0] = w & kBf16E2m1Mask;
  r[1] = (w << 6) & kBf16E2m1Mask;
  r[2] = (w << 3) & kBf16E2m1Mask;
  r[3] = (__umulhi(w & 0x68006800u, 0x22000000u) & 0x01C001C0u) | ((w & 0x04000400u) << 5);
}

// Scale tables per consumer warp: two (by chunk parity, so a chunk's table is written while the
// previous one may still be read), or one where the second would keep a fourth CTA of two ring
// slots off the SM: 4 x (2 x stage + static + 1 KB reserved) must fit 228 KB, and the static
// shared memory is 5376 bytes with two tables, 3328 with one (ptxas). That is nvfp4 at tile 16
// (26880-byte slots; 3 CTAs fit with two tables, 4 with one): measured 1.5-3 % faster there
// (docs/gpu_kernels.md §6 "Session 11"), while mxfp4 at tile 16 (25856-byte slots) fits 4 CTAs
// either way and was 1-2 % slower with one.
constexpr int decode_scale_tables(int stage_bytes) {
  return 4 * (2 * stage_bytes + kDecodeStaticTwoTables + kSmemReservedPerCta) > kSmemPerSm ? 1 : 2;
}

// One chunk's operands of one consumer lane (kFW fragments). kLean: only the weight words and
// where the chunk's B columns and scale multipliers are (read per k16 step by compute).
template <Recipe R, int kN, int kFW, bool kLean = false>
struct PipeOps {
  using RT = RecipeKernelTraits<R>;
  static constexpr int kSW = RT::kNvScale ? 4 : 2;  // multipliers per row: per k16 step or per 32
  uint32_t b[kLean ? 1 : 4][kLean ? 1 : kN / 8][2];
  uint4 w[kFW];
  uint32_t lo[kLean ? 1 : kFW][kSW], hi[kLean ? 1 : kFW][kSW];  // rows g and g + 8 of each frag
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
  static_assert(RT::kFourBit, "the pipelined consumer decodes 4-bit weights");
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
    const uint32_t ss = st + kSub<kJ> * C::kSBytes;     // + s_off: its scales
    const uint32_t sb = st + kSub<kJ> * (kKChunk * 2);  // + b_off: its B columns
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
    for (int f = 0; f < kFW; ++f) o.w[f] = lds128(sw + w_off + f * RT::kFragBytes);
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

  static __device__ __forceinline__ uint32_t loaded(const Ops& o) {
    uint32_t dep = o.w[0].x ^ o.w[kFW - 1].x;
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
      if constexpr (kCloses<kJp>) mbar_arrive_after(pending, prev.w[0].x & zero);
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
        const uint4& w = o.w[f];
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
        uint32_t bits[4], af[4];
        decode_e2m1x8_mulhi(word, bits);
        af[0] = mul_bf16x2(bits[0], lo);
        af[1] = mul_bf16x2(bits[1], hi);
        af[2] = mul_bf16x2(bits[2], lo);
        af[3] = mul_bf16x2(bits[3], hi);
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) mma_bf16(acc[f][nf], af, bf[nf][0], bf[nf][1]);
      }
    }
  }

  // Chunk c from `x` while chunk c + 1 is loaded into `y` and its slot released. The wait for
  // chunk c + 1 comes after half of chunk c: waiting before it (more overlap of its loads with
  // chunk c's math, less slack when its data comes late) measured 7 % slower for mxfp4 at 8-128
  // tokens (docs/gpu_kernels.md §6).
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

// Split-K: CTA `split` of `splits` that computed part of (tile, M-tile) `group` stores its
// accumulators in the group's slot `split` (ForwardArgs::splitk_partials; consumer thread tid
// owns float4 j at j * kCThreads + tid, so the stores coalesce) and counts itself in. The last to
// arrive resets the counter (so the next kernel and graph replays start from zero), sums the
// slots in split order 0, 1, ... (its own from registers), whatever the arrival order, so the
// result is the same every run, and returns true to run the epilogue; the others return false
// and exit. Every thread of the CTA calls it. Ordering: each storing thread fences before the
// barrier that precedes the counter atomic; the last CTA fences after seeing the count.
template <int kFW, int kNF, int kCThreads>
__device__ __forceinline__ bool splitk_last(const ForwardArgs& a, float (&acc)[kFW][kNF][4],
                                            int splits, int split, int group, int tid,
                                            bool consumer, int* flag) {
  constexpr int kV4 = kFW * kNF;  // float4 per consumer thread
  static_assert(size_t(kCThreads) * kV4 * 16 <= kSplitKSlotBytes, "one slot per CTA");
  float4* slots = reinterpret_cast<float4*>(a.splitk_partials);
  const size_t first = size_t(group) * splits;  // the group's slot 0
  if (consumer) {
    float4* mine = slots + (first + split) * (kCThreads * kV4) + tid;
#pragma unroll
    for (int f = 0; f < kFW; ++f)
#pragma unroll
      for (int nf = 0; nf < kNF; ++nf)
        __stcg(mine + (f * kNF + nf) * kCThreads,
               make_float4(acc[f][nf][0], acc[f][nf][1], acc[f][nf][2], acc[f][nf][3]));
    __threadfence();
  }
  __syncthreads();
  if (tid == 0) {
    const int last = atomicAdd(&a.splitk_counters[group], 1) == splits - 1;
    if (last) {
      atomicExch(&a.splitk_counters[group], 0);
      __threadfence();
    }
    *flag = last;
  }
  __syncthreads();
  if (!*flag) return false;
  __threadfence();
  if (consumer) {
    float4 sum[kV4];
    for (int sp = 0; sp < splits; ++sp) {
      const float4* src = slots + (first + sp) * (kCThreads * kV4) + tid;
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) {
          const int j = f * kNF + nf;
          const float4 v =
              sp == split ? make_float4(acc[f][nf][0], acc[f][nf][1], acc[f][nf][2], acc[f][nf][3])
                          : __ldcg(src + j * kCThreads);
          if (sp == 0) {
            sum[j] = v;
          } else {
            sum[j].x = __fadd_rn(sum[j].x, v.x);
            sum[j].y = __fadd_rn(sum[j].y, v.y);
            sum[j].z = __fadd_rn(sum[j].z, v.z);
            sum[j].w = __fadd_rn(sum[j].w, v.w);
          }
        }
    }
#pragma unroll
    for (int f = 0; f < kFW; ++f)
#pragma unroll
      for (int nf = 0; nf < kNF; ++nf) {
        const float4& v = sum[f * kNF + nf];
        acc[f][nf][0] = v.x, acc[f][nf][1] = v.y, acc[f][nf][2] = v.z, acc[f][nf][3] = v.w;
      }
  }
  return true;
}

// kPipe: the pipelined consumer (PipeConsumer), else the plain loop below. splits > 1: this CTA
// computes K-chunks [split * chunks / splits, (split + 1) * chunks / splits) of its M-tile
// (split = blockIdx.z) and splitk_last combines the splits. wave: the CTAs of the launch's first
// wave (below).
template <Recipe R, int kN, int kFW, bool kFc1, bool kPipe, int kCps>
__device__ __forceinline__ void decode_gemm(const ForwardArgs& a, const int stages,
                                            const int splits, const int wave) {
  static_assert(kPipe || kCps == 1, "the plain loop takes one chunk per slot");
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
  __shared__ int last_split;  // splitk_last's verdict

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
  const bool first_wave =
      (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x < unsigned(wave);
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
    if (kEarly && a.tile_split && !a.pdl_late) pdl_wait();
    return;
  }
  if (!first_wave) setup();
  const TileInfo tile = a.tiles[tile_idx];
  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, mtile);
  const int split = blockIdx.z;
  const int c0 = split * ms.chunks / splits;
  const int chunks = (split + 1) * ms.chunks / splits - c0;
  const uint8_t* wbase = ms.w + size_t(c0) * C::kWBytes;
  const uint8_t* sbase = RT::kFourBit ? ms.s + size_t(c0) * C::kSBytes : nullptr;
  const int slots = (chunks + kCps - 1) / kCps;
  // Slot i's full barrier expects its weights, scales and B rows (one arrive, by the producer's
  // lane 0); the weights and scales are queued here (the B rows by the producer's lanes < rows).
  auto queue_weights = [&](int i, unsigned char* st, uint64_t* bar) {
    const int c = i * kCps, n = kCps == 1 ? 1 : min(kCps, chunks - c);  // chunks in the slot
    mbar_arrive_expect_tx(bar, uint32_t(n * (C::kWBytes + C::kSBytes + tile.rows * kKChunk * 2)));
    // Weights and scales are read once per forward: L2 evict_first by default (DSV3 nvfp4 1 / 8
    // tokens 73.1 -> 70.9 / 382.8 -> 377.4 us, Qwen3 8 / 128 tokens 73.2 -> 64.7 / 155.1 -> 140.4,
    // against evict_normal on one H200, docs/gpu_kernels.md §6 "Session 31").
    const uint64_t pol = make_l2_policy(a.weight_evict_first);
    bulk_load(st, wbase + size_t(c) * C::kWBytes, n * C::kWBytes, bar, pol);
    if constexpr (RT::kFourBit)
      bulk_load(st + C::kSOff, sbase + size_t(c) * C::kSBytes, n * C::kSBytes, bar, pol);
  };
  int early = 0;  // slots queued before pdl_wait (producer lane 0 only)
  if constexpr (kEarly) {
    if (producer0 && a.fc2_early) {
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
        brow = a.xq + int64_t(pair_of[lane] / a.K) * a.H + c0 * kKChunk;
      else
        brow = a.h + int64_t(tile.start + lane) * a.I + c0 * kKChunk;
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
  } else if constexpr (kPipe) {
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
      pc.w_off = (warp * kFW) * RT::kFragBytes + lane * 16;
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
  } else {
    // Per-lane shared addresses within a slot: this warp's weight words, its scale bytes, the
    // ldmatrix rows (x4: matrices (nf, k 0-7), (nf, k 8-15), (nf+1, k 0-7), (nf+1, k 8-15); x2:
    // the first two), and the warp's scale table.
    const int lm_row = (lane & 7) + (kNF >= 2 ? ((lane >> 4) << 3) : 0);
    const int lm_col = ((lane >> 3) & 1) * 8;
    const uint32_t w_off = (warp * kFW) * RT::kFragBytes + lane * (RT::kFourBit ? 16 : 64);
    const uint32_t b_off = kBOff + (lm_row * C::kBRow + lm_col) * 2;
    const uint32_t s_off = kSOff + warp * kFW * RT::kScaleBytes;
    const uint32_t tbl0 = smem_addr(&scale_tbl[0][warp][0]);
    static_assert(kTables == 2, "the plain loop's 1-chunk slots leave room for both tables");
    const uint32_t tbl_step = uint32_t(sizeof(scale_tbl[0]));
    const uint32_t lut = smem_addr(scale_lut);
    int slot = 0;
    uint32_t phase = 0, st = ring;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      mbar_wait(&full_bar[slot], phase);
      uint32_t b[4][kNF][2];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (kNF >= 2) {
#pragma unroll
          for (int nf = 0; nf < kNF; nf += 2) {
            uint32_t r[4];
            ldsm_x4(r, st + b_off + (nf * 8 * C::kBRow + s * 16) * 2);
            b[s][nf][0] = r[0];
            b[s][nf][1] = r[1];
            b[s][nf + 1][0] = r[2];
            b[s][nf + 1][1] = r[3];
          }
        } else {
          ldsm_x2(b[s][0][0], b[s][0][1], st + b_off + s * 32);
        }
      }
      uint4 wq[kFW][RT::kFourBit ? 1 : 4];
#pragma unroll
      for (int f = 0; f < kFW; ++f) {
        if constexpr (RT::kFourBit) {
          wq[f][0] = lds128(st + w_off + f * RT::kFragBytes);
        } else {
#pragma unroll
          for (int s = 0; s < 4; ++s)
            wq[f][RT::kFourBit ? 0 : s] = lds128(st + w_off + f * RT::kFragBytes + s * 16);
        }
      }
      // Scale multipliers of this warp's fragments: each lane converts its share of the slot's
      // scale bytes into the warp's table ([frag*16 + row] -> 4 bf16x2, one per k16 step).
      uint4 sc_lo[kFW], sc_hi[kFW];
      if constexpr (RT::kFourBit) {
        const uint32_t tbl = tbl0 + (chunk & 1) * tbl_step;
        if constexpr (RT::kNvScale) {
          if constexpr (kFW == 2) {
            const uint32_t v = lds32(st + s_off + lane * 4);
            const uint4 m =
                make_uint4(lds32(lut + (v & 0xff) * 4), lds32(lut + ((v >> 6) & 0x3fc)),
                           lds32(lut + ((v >> 14) & 0x3fc)), lds32(lut + (v >> 22 & 0x3fc)));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tbl + lane * 16),
                         "r"(m.x), "r"(m.y), "r"(m.z), "r"(m.w));
          } else {
            const uint32_t v = lds16(st + s_off + lane * 2);
            asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(tbl + lane * 8),
                         "r"(lds32(lut + (v & 0xff) * 4)), "r"(lds32(lut + (v >> 8) * 4)));
          }
        } else {
          if (kFW == 2 || lane < 16) {
            const uint32_t v = lds16(st + s_off + lane * 2);
            const uint32_t m0 = lds32(lut + (v & 0xff) * 4), m1 = lds32(lut + (v >> 8) * 4);
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(tbl + lane * 16),
                         "r"(m0), "r"(m0), "r"(m1), "r"(m1));
          }
        }
        __syncwarp();
#pragma unroll
        for (int f = 0; f < kFW; ++f) {
          sc_lo[f] = lds128(tbl + (f * 16 + g) * 16);
          sc_hi[f] = lds128(tbl + (f * 16 + g + 8) * 16);
        }
      }

#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int f = 0; f < kFW; ++f) {
          uint32_t af[4];
          if constexpr (RT::kFourBit) {
            const uint4& w = wq[f][0];
            const uint32_t word = s == 0 ? w.x : s == 1 ? w.y : s == 2 ? w.z : w.w;
            const uint32_t lo = s == 0   ? sc_lo[f].x
                                : s == 1 ? sc_lo[f].y
                                : s == 2 ? sc_lo[f].z
                                         : sc_lo[f].w;
            const uint32_t hi = s == 0   ? sc_hi[f].x
                                : s == 1 ? sc_hi[f].y
                                : s == 2 ? sc_hi[f].z
                                         : sc_hi[f].w;
            uint32_t bits[4];
            decode_e2m1x8(word, bits);
            af[0] = mul_bf16x2(bits[0], lo);
            af[1] = mul_bf16x2(bits[1], hi);
            af[2] = mul_bf16x2(bits[2], lo);
            af[3] = mul_bf16x2(bits[3], hi);
          } else {
            const uint4& v = wq[f][RT::kFourBit ? 0 : s];
            af[0] = v.x;
            af[1] = v.y;
            af[2] = v.z;
            af[3] = v.w;
          }
#pragma unroll
          for (int nf = 0; nf < kNF; ++nf) mma_bf16(acc[f][nf], af, b[s][nf][0], b[s][nf][1]);
        }
      }
      // Release the slot only now: every value read from it has been consumed by an MMA, so
      // no read of it can still be in flight when the producer's next bulk copy lands.
      mbar_arrive(&empty_bar[slot]);
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
        st = ring;
      } else {
        st += C::kStageBytes;
      }
    }
  }
  if constexpr (kN == 8)  // the split-K slots hold tile 8's accumulators (tile 16 never splits)
    if (splits > 1 &&
        !splitk_last<kFW, kNF, kCW * 32>(a, acc, splits, split, tile_idx * gridDim.y + mtile, tid,
                                         warp < kCW, &last_split))
      return;       // another split of this M-tile runs the epilogue
  __syncthreads();  // every stage was consumed; the pipeline smem becomes the epilogue tile

  const int e = tile.expert;
  if constexpr (kFc1) {
    // g/u values [frag][col][row 0..15] (frag 2j = gate, 2j+1 = up rows of h rows j*16..),
    // then the h tile [kN][64 (+4)] fp32, then the shared requantizing store.
    float* gu = reinterpret_cast<float*>(smem);
    float* hs = gu + kTileFrags * kN * C::kGuStride;
    const float alpha = R == Recipe::kNvfp4 ? a.fc1_alpha[e] : 1.0f;
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
      float hv = fmt::swiglu(gv, uv, a.swiglu_limit);
      if (a.weight_in_fc1) hv = fmt::mul_rn(hv, tw_of[col]);
      hs[col * C::kHS + row] = hv;
    }
    __syncthreads();
    store_h_tile<R>(a, hs, tile, mtile, tid, C::kThreads);
  } else {
    uint16_t* ys = reinterpret_cast<uint16_t*>(smem);
    constexpr int kYS = kTileRows + 8;
    const float alpha = R == Recipe::kNvfp4 ? a.fc2_alpha[e] : 1.0f;
    if (warp < kCW) {
#pragma unroll
      for (int f = 0; f < kFW; ++f)
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = nf * 8 + 2 * t4 + (i & 1);
            const int row = (warp * kFW + f) * 16 + g + (i >> 1) * 8;
            ys[col * kYS + row] =
                fmt::float_to_bf16(epilogue_value<R, false>(acc[f][nf][i], alpha));
          }
    }
    __syncthreads();
    store_y_tile<kN>(a, ys, tile, pair_of, mtile, tid, C::kThreads);
  }
}

// The plain consumer loop (MOE_EP_DECODE_PIPE=0).
template <Recipe R, int kN, int kFW, bool kFc1>
__global__ void __launch_bounds__(DecodeConfig<R, kN, kFW>::kThreads)
    sm90_moe_decode_kernel(const ForwardArgs a, const int stages, const int splits,
                           const int wave) {
  MOE_EP_TIMELINE_SCOPE(a, kFc1 ? kTlFc1 : kTlFc2);
  decode_gemm<R, kN, kFW, kFc1, false, 1>(a, stages, splits, wave);
}

// The pipelined consumer (default). Up to 96 registers: the two operand sets fit without
// ptxas recomputing per-lane offsets in the loop, and 4 CTAs of 160 threads (2 of 288) still
// fit an SM. Tile 32 holds four times tile 8's B fragments per operand set: kDecode32Regs (3
// CTAs of 160 threads fit the register file, as its ring fits the shared memory; 32-44 bytes
// of spill remain in its 32-column loop).
constexpr int kDecode32Regs = 136;
// (Tile 32 on 2-chunk slots runs the lean consumer at 96 registers and 4 CTAs per SM, for GEMMs
// with a short K: decode32_chunks_per_slot.)
template <Recipe R, int kN, int kFW, bool kFc1, int kCps>
__global__ void __maxnreg__(kN > 16 && kCps == 4 ? kDecode32Regs : 96)
    sm90_moe_decode_pipe_kernel(const ForwardArgs a, const int stages, const int splits,
                                const int wave) {
  MOE_EP_TIMELINE_SCOPE(a, kFc1 ? kTlFc1 : kTlFc2);
  decode_gemm<R, kN, kFW, kFc1, true, kCps>(a, stages, splits, wave);
}

// ---------------------------------------------------------------------------------------------
// Launch: programmatic stream serialization, so each CTA's setup overlaps the previous kernel.

// Benchmark knobs, read once per process: MOE_EP_DECODE_PER_SM=N (1..4; both GEMMs) or N,M
// (fc1 N, fc2 M; 0 = the estimate) sizes the ring for that many CTAs per SM instead of the
// estimate from the routing (e.g. an EP owner's fc1 at a few tokens per rank, whose estimate
// counts W x capacity rows); MOE_EP_DECODE_MAX_STAGES=4..24 caps the ring depth.
inline int decode_env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  const int k = v ? std::atoi(v) : 0;
  return k >= lo && k <= hi ? k : 0;
}
inline int decode_forced_per_sm(bool fc1) {
  static const std::array<int, 2> n = knob_fc1_fc2(std::getenv("MOE_EP_DECODE_PER_SM"), 1, 4, 0);
  return n[fc1];
}
inline int decode_max_stages() {
  static const int n = decode_env_int("MOE_EP_DECODE_MAX_STAGES", 4, 24);
  return n ? n : 24;
}

// CTAs per SM the ring is sized for: the expected grid (the routing tiles are counted on the
// device; min(pairs, experts) is the host's estimate at decode sizes) over the SMs, at most 4
// (beyond that they run in later waves anyway, and a deeper ring per CTA keeps more bytes in
// flight than more shallow CTAs).
template <int kN>
int decode_expected_tiles(const ForwardArgs& a) {
  return expected_tiles(a.tokens * a.K, a.local_experts, kN);
}
template <int kN>
int decode_ctas_per_sm(const ForwardArgs& a, bool fc1, int mtiles, int splits) {
  const int forced = decode_forced_per_sm(fc1);
  if (forced) return forced;
  if (fc1) {
    if (const int owner = owner_fc1_ctas_per_sm(a, kN, mtiles, splits)) return owner;
  }
  const int ctas = decode_expected_tiles<kN>(a) * mtiles * splits;
  return std::min(4, std::max(1, (ctas + a.num_sms - 1) / a.num_sms));
}

// K-splits of one decode GEMM launch (grid_tiles x mtiles M-tile CTAs, chunks K-chunks each).
// By default none: DSV3 nvfp4 at 2 / 3 / 4 tokens read 132.3-133.4 / 170.5-170.6 / 226.4-227.0
// us with the policy below (fc1 4 / 2 / 2 splits) and 117.4-119.2 / 161.9-164.1 / 214.0-214.2
// without (one H200, session 26, docs/gpu_kernels.md §6 "Session 26"; the policy was measured
// faster in session 4, before 4-chunk slots, the pipelined consumer and fc2's early slots), and
// fc2 was slower with every split at 1-4 tokens. The policy, kept for MOE_EP_DECODE_SPLITK=auto
// (fc1 only, any 4-bit recipe): split only where the unsplit grid already runs 4 CTAs per SM
// (more than 3 per SM expected), 2 or 4 splits, up to about 16 CTAs per SM in all (DSV3 fc1: 2
// tokens, 512 CTAs -> 4 splits; 4 tokens, 1024 -> 2; 8 tokens, 2048 -> none). A split changes no
// bit for nvfp4 (its products are exact and its fp32 sums exact on the tests' data) but changes
// the fp32 summation order of the other recipes. Forced counts (MOE_EP_DECODE_SPLITK=N or N,M)
// apply wherever the slots allow. Each split gets at least one K-chunk; the grid's slots must fit
// kSplitKSlots.
template <int kN>
int decode_splits(const ForwardArgs& a, bool fc1, int grid_tiles, int mtiles, int chunks) {
  if (a.splitk_partials == nullptr || a.splitk_counters == nullptr) return 1;
  const int mode = decode_splitk_mode(fc1);
  int s = 1;
  if (mode >= 1) {
    s = mode;
  } else if (fc1 && mode == kSplitKAuto) {
    const int ctas = decode_expected_tiles<kN>(a) * mtiles;
    if (ctas > 3 * a.num_sms)
      while (s < 4 && ctas * s * 2 <= 16 * a.num_sms) s *= 2;
  }
  s = std::min(s, chunks);
  while (s > 1 && size_t(grid_tiles) * mtiles * s > size_t(kSplitKSlots)) --s;
  return std::max(1, s);
}

// The most CTAs of the decode kernel an SM holds at the ring's smallest depth (each with its
// static shared memory, two scale tables' worth, and the runtime's reserved 1 KB; at most 4).
template <Recipe R, int kN, int kCps>
constexpr int decode_max_per_sm() {
  using C = DecodeConfig<R, kN, 2, kCps>;
  const int n =
      kSmemPerSm / (C::kMinStages * C::kStageBytes + kDecodeStaticTwoTables + kSmemReservedPerCta);
  return n < 4 ? n : 4;
}

// A launch's ring: its depth in slots and the dynamic shared memory it asks for.
struct DecodeRing {
  int stages, smem;
};

// Ring depth: as deep as the shared memory of per_sm CTAs allows, in exactly that memory; except
// room for fc2 (fc1_room_for_fc2): a tile-8 fc1 whose ring is sized for 2 CTAs per SM on one GPU
// asks for a third of the SM's shared memory and uses at most that as its ring (3 slots of 4
// chunks instead of 4), so that a third fc1 CTA still does not fit an SM but an fc2 CTA (2 slots at
// 4 per SM) does, and can become resident and queue its first slots during fc1. Measured on the
// H200 (docs/gpu_kernels.md §6 "Session 32"): DSV3 1 token nvfp4 70.4-70.8 -> 69.5-69.8 us,
// mxfp4_mxfp8 65.2-65.6 -> 64.4-64.6, gpt-oss nvfp4 1 token 37.1 -> 36.5-36.7. EP owners keep
// their rings (owner_fc1_ctas_per_sm; not measured with this).
template <Recipe R, int kN, int kFW, int kCps, bool kFc1>
DecodeRing decode_ring(const ForwardArgs& a, int per_sm) {
  using C = DecodeConfig<R, kN, kFW, kCps>;
  int stages = (kSmemPerSm / per_sm - kDecodeStaticBound) / C::kStageBytes;
  stages = std::max(C::kMinStages, std::min({C::kMaxStages, decode_max_stages(), stages}));
  if constexpr (kFc1 && kN == 8) {
    if (per_sm == 2 && a.owner_pairs == 0 && fc1_room_for_fc2()) {
      constexpr int kThird = kSmemPerSm / 3;
      using C2 = DecodeConfig<R, kN, 2, 4>;  // fc2 at 4 CTAs per SM: its smallest ring
      static_assert(
          2 * (kThird + kDecodeStaticBound + kSmemReservedPerCta) +
                  (C2::kMinStages * C2::kStageBytes + kDecodeStaticBound + kSmemReservedPerCta) <=
              kSmemPerSm,
          "two fc1 CTAs of a third of the SM and one fc2 CTA fit an SM");
      static_assert(kThird <= C::kMaxSmemBytes, "within the kernel's shared-memory attribute");
      stages = std::max(C::kMinStages, std::min(stages, kThird / C::kStageBytes));
      note_fc1_room(true);
      return {stages, std::max(C::smem_bytes(stages), kThird)};
    }
  }
  return {stages, C::smem_bytes(stages)};
}

// MOE_EP_DECODE_PIPE=0 (benchmark knob, read once per process): the plain consumer loop (load,
// decode, MMAs, then release the slot; the session-2 kernel) instead of the pipelined one, on
// tile 8's launches (tiles 16 and 32 run only the pipelined one). Both
// give the same bits. Measured on the H200 (docs/gpu_kernels.md §6): the pipelined consumer is
// faster or level at 1-128 tokens for nvfp4 and mxfp4_mxfp8 (1 token nvfp4 93.9 -> 90.3 us).
// Variants measured and dropped: the wait for the next chunk before the current one's math, the
// old decode of register 3, one fragment per consumer warp (8 warps; DSV3 1 token 93.4 vs 89.8
// us in session 3; since session 30 nvfp4's choice where a grid holds one CTA per SM, decode_fw).
inline bool decode_pipelined() {
  static const bool on = env_switch("MOE_EP_DECODE_PIPE", true);
  return on;
}

// MOE_EP_DECODE_CPS=N or N,M (benchmark knob, read once per process; 1, 2 or 4; fc1 N, fc2 M):
// K-chunks per ring slot of the pipelined tile-8 consumer (the plain loop always takes one);
// unset = the policy below.
inline int decode_forced_cps(bool fc1) {
  static const std::array<int, 2> n = [] {
    std::array<int, 2> k = knob_fc1_fc2(std::getenv("MOE_EP_DECODE_CPS"), 1, 4, 0);
    for (int& c : k) c = c == 3 ? 0 : c;
    return k;
  }();
  return n[fc1];
}
// Tile 32's K-chunks per ring slot for a GEMM of k_total inner values (H for fc1, I for fc2):
// decode32_cps_for's policy (2, the lean consumer, where K is short; else 4), unless a test's
// override (2 or 4) or MOE_EP_DECODE32_LEAN=1 / =0 (benchmark knob, read once per process: 2 / 4)
// says otherwise.
inline int decode32_chunks_per_slot(int k_total) {
  const int o = decode_cps_override();
  if (o == 2 || o == 4) return o;
  static const int mode = env_mode("MOE_EP_DECODE32_LEAN");
  return mode < 0 ? decode32_cps_for(k_total) : mode == 1 ? 2 : 4;
}

// K-chunks per ring slot: 4 (fewer, larger copies and a quarter of the barrier waits per byte;
// measured against 1 and 2 in docs/gpu_kernels.md §6), unless a test's override or the knob
// says otherwise.
inline int decode_chunks_per_slot(bool fc1) {
  if (const int o = decode_cps_override()) return o;
  const int f = decode_forced_cps(fc1);
  return f ? f : 4;
}

// MOE_EP_FC1_PDL=0 / MOE_EP_FC2_PDL=0 (benchmark knobs, read once per process): the decode fc1 /
// fc2 launched plainly instead of programmatically, so none of its CTAs is resident before the
// kernel ahead of it has completed. Same results (every kernel waits for its inputs either way).
inline bool decode_pdl(bool fc1) {
  static const bool on1 = env_switch("MOE_EP_FC1_PDL", true);
  static const bool on2 = env_switch("MOE_EP_FC2_PDL", true);
  return fc1 ? on1 : on2;
}

template <Recipe R, int kN, bool kFc1, int kCps, int kFW = 2>
cudaError_t launch_decode_cps(const ForwardArgs& a, cudaStream_t s, int tiles, int mtiles,
                              int splits, int per_sm) {
  using C = DecodeConfig<R, kN, kFW, kCps>;
  if (tiles == 0) return cudaSuccess;
  const DecodeRing ring = decode_ring<R, kN, kFW, kCps, kFc1>(a, per_sm);
  // The plain loop takes 1-chunk slots only, so slots of 2 or 4 chunks build only the pipelined
  // kernel.
  auto kernel = sm90_moe_decode_pipe_kernel<R, kN, kFW, kFc1, kCps>;
  if constexpr (kCps == 1 && kFW == 2)
    if (!decode_pipelined()) kernel = sm90_moe_decode_kernel<R, kN, 2, kFc1>;
  // The first wave (decode_gemm's `wave`): the CTAs that fit the SMs at the ring's size, or a
  // test's count.
  const int forced_wave = decode_wave_override();
  const int wave = forced_wave ? forced_wave : a.num_sms * per_sm;
  return launch_kernel(decode_pdl(kFc1), kernel, dim3(tiles, mtiles, splits), dim3(C::kThreads),
                       ring.smem, s, a, ring.stages, splits, wave);
}

// Fragments per consumer warp of a tile-8 launch: 2 (4 consumer warps), or 1 (8 warps, each
// summing its fragment's columns over K in the same order: the same bits) for nvfp4 where the
// GEMM's grid is expected to hold at most one CTA per SM (few M-tiles: Qwen3 at 1 token, gpt-oss's
// fc2): there 4 consumer warps per SM, one per scheduler, set the GEMM's time by their chains.
// Measured on one H200 (session 30, medians of 20 graph replays, both GEMMs forced): Qwen3 1
// token nvfp4 25.6 -> 23.1 us, gpt-oss 39.9-40.2 -> 37.7-38.1; at 2 or more CTAs per SM level
// or slower (gpt-oss 4 tokens 78.8 -> 83.0), and mxfp4's one-fragment warps (half the lanes
// convert scale bytes) slower at any size (Qwen3 1 token 22.9-23.0 -> 23.2-23.6, gpt-oss
// 36.6-36.8 -> 39.0-39.1), as session 18 found on DSV3. With the policy (call F): Qwen3 1 token
// 25.8-26.4 -> 22.9-23.6, gpt-oss 41.2-41.5 -> 39.1-39.3. Only on 4-chunk slots, unsplit; a
// test's override or MOE_EP_DECODE_FW=1|2 forces it there.
template <Recipe R>
int decode_fw(bool fc1, int splits, int per_sm, int cps) {
  if (!decode_pipelined() || cps != 4 || splits != 1) return 2;
  const int mode = decode_fw_mode();
  if (mode == 1 || mode == 2) return mode;
  return R == Recipe::kNvfp4 && per_sm == 1 && decode_forced_per_sm(fc1) == 0 ? 1 : 2;
}

template <Recipe R, int kN, bool kFc1>
cudaError_t launch_decode(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kN);
  if (tiles == 0) return cudaSuccess;
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  const int chunks = kFc1 ? a.rs.fc1_chunks : a.rs.fc2_chunks;
  const int splits = kN == 8 ? decode_splits<kN>(a, kFc1, tiles, mtiles, chunks) : 1;
  note_decode_splits(kFc1, splits);
  note_decode_fw(kFc1, 2);
  const int per_sm = decode_ctas_per_sm<kN>(a, kFc1, mtiles, splits);
  if constexpr (kN == 32) {
    // No split, only the pipelined consumer (as tile 16; the plain loop on 1-chunk slots
    // measured 18-53 % slower, docs/gpu_kernels.md §6 "Session 21"): on 4-chunk slots, two of
    // 35 KB (nvfp4) leaving room for 3 CTAs, or the lean one on 2-chunk slots at 4 CTAs where
    // the GEMM's K is short (decode32_chunks_per_slot).
    const int cps = decode32_chunks_per_slot(kFc1 ? a.H : a.I);
    note_decode_cps(cps);
    auto launch = [&](auto cps_c) {
      constexpr int kC = decltype(cps_c)::value;
      return launch_decode_cps<R, kN, kFc1, kC>(a, s, tiles, mtiles, 1,
                                                std::min(per_sm, decode_max_per_sm<R, kN, kC>()));
    };
    return cps == 2 ? launch(std::integral_constant<int, 2>{})
                    : launch(std::integral_constant<int, 4>{});
  } else if constexpr (kN == 16) {  // only the 4-chunk slots (decode_tile16)
    if (a.tile_split) {
      // Tiles of at most 8 rows (the list's first num_tiles[1]) on the tile-8 kernel: its smaller
      // ring slots and one consumer loop. Then the rest on this kernel, which never runs its
      // narrow loop then, and waits for the first launch at its end (pdl_late). Grids: at most
      // one narrow tile per touched expert; a wide tile holds at least 9 rows.
      const int pairs = a.tokens * a.K;
      ForwardArgs narrow = a, wide = a;
      narrow.tile_part = 1;
      wide.tile_part = 2;
      wide.pdl_late = true;
      const cudaError_t e = launch_decode_cps<R, 8, kFc1, 4>(
          narrow, s, std::min(tiles, std::min(pairs, a.local_experts)), mtiles, 1, per_sm);
      if (e != cudaSuccess) return e;
      return launch_decode_cps<R, kN, kFc1, 4>(wide, s, std::min(tiles, pairs / 9), mtiles, 1,
                                               per_sm);
    }
    return launch_decode_cps<R, kN, kFc1, 4>(a, s, tiles, mtiles, splits, per_sm);
  } else {
    const int cps = decode_pipelined() ? decode_chunks_per_slot(kFc1) : 1;
    note_decode_cps(cps);
    if (decode_fw<R>(kFc1, splits, per_sm, cps) == 1) {
      note_decode_fw(kFc1, 1);
      return launch_decode_cps<R, kN, kFc1, 4, 1>(a, s, tiles, mtiles, splits, per_sm);
    }
    if (cps == 4) return launch_decode_cps<R, kN, kFc1, 4>(a, s, tiles, mtiles, splits, per_sm);
    if (cps == 2) return launch_decode_cps<R, kN, kFc1, 2>(a, s, tiles, mtiles, splits, per_sm);
    return launch_decode_cps<R, kN, kFc1, 1>(a, s, tiles, mtiles, splits, per_sm);
  }
}

// Tile_n 16 (5-15 rows per expert) runs this kernel too (4-chunk slots, no split): with the
// 4-chunk slots it measured faster than sm90_moe_gemm_kernel (DSV3 nvfp4 256 / 512 tokens
// 2448 -> 2144 / 3447 -> 3055 us; docs/gpu_kernels.md §6). MOE_EP_DECODE16=0 (benchmark knob,
// read once per process) sends tile_n 16 back to sm90_moe_gemm_kernel.
inline bool decode_tile16() {
  static const bool on = env_switch("MOE_EP_DECODE16", true);
  return on;
}

// fc1 then fc2 on tiles of kN (8 or 16) tokens.
template <Recipe R, int kN = 8>
cudaError_t launch_decode_gemms(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_fc1_fc2([&] { return launch_decode<R, kN, true>(a, s); },
                        [&] { return launch_decode<R, kN, false>(a, s); }, s, ev);
}

template <Recipe R, int kN, bool kFc1>
cudaError_t set_decode_attr() {
  return first_error({set_max_smem(sm90_moe_decode_kernel<R, kN, 2, kFc1>,
                                   DecodeConfig<R, kN, 2, 1>::kMaxSmemBytes),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, kN, 1, kFc1, 4>,
                                   DecodeConfig<R, kN, 1, 4>::kMaxSmemBytes),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, kN, 2, kFc1, 1>,
                                   DecodeConfig<R, kN, 2, 1>::kMaxSmemBytes),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, kN, 2, kFc1, 2>,
                                   DecodeConfig<R, kN, 2, 2>::kMaxSmemBytes),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, kN, 2, kFc1, 4>,
                                   DecodeConfig<R, kN, 2, 4>::kMaxSmemBytes)});
}

template <Recipe R>
cudaError_t set_decode_attributes() {
  constexpr int kBytes16 = DecodeConfig<R, 16, 2, 4>::kMaxSmemBytes;
  constexpr int kBytes32 = DecodeConfig<R, 32, 2, 4>::kMaxSmemBytes;
  return first_error({set_decode_attr<R, 8, true>(), set_decode_attr<R, 8, false>(),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 16, 2, true, 4>, kBytes16),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 16, 2, false, 4>, kBytes16),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 32, 2, true, 4>, kBytes32),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 32, 2, false, 4>, kBytes32),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 32, 2, true, 2>,
                                   DecodeConfig<R, 32, 2, 2>::kMaxSmemBytes),
                      set_max_smem(sm90_moe_decode_pipe_kernel<R, 32, 2, false, 2>,
                                   DecodeConfig<R, 32, 2, 2>::kMaxSmemBytes)});
}

}  // namespace moe_ep::kern
