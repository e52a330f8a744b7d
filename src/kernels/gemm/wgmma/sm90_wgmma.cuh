// Prefill grouped GEMMs on Hopper wgmma: the wgmma PTX and descriptors shared with the fp8 path
// (sm90_fp8.cuh), and the m64 kernel (tiles of up to 160 routed rows, every recipe's default
// above the decode range; docs/kernels.md §4.2). "Swap AB" as everywhere: A = weight rows in
// registers (wgmma's register-A fragment of a warp is mma.sync m16n8k16's A fragment of that
// warp's 16 rows, so the resident per-lane layout and the 4-bit decode feed it unchanged), B =
// the tile's token rows in shared memory (K-major, 128-byte swizzle).
#pragma once

// The extended wgmma shapes (N = 80, 144, ...) in CuTe's selector.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <type_traits>
#include <utility>

#include "kernels/common/pdl.cuh"
#include "kernels/gemm/sm90_gemm_device.cuh"

namespace moe_ep::kern {

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
// sw128_desc(saddr + bytes) from the low word of sw128_desc(saddr): the start address field (bits
// 0..13, address / 16) holds any shared-memory address, so the offset adds to the low word
// without a carry, and the high word is a constant (one add per use instead of the mask, shift
// and merge).
__device__ __forceinline__ uint64_t sw128_desc_at(uint32_t desc_lo, uint32_t bytes) {
  return (sw128_desc(0) & ~uint64_t(0xFFFFFFFFu)) | (desc_lo + (bytes >> 4));
}

// One m64nNk16 wgmma, bf16 x bf16 -> fp32, A from registers (K-major), B a K-major shared-memory
// descriptor, accumulating (scale-d 1): the SM90 GMMA atom CuTe's own selector picks for a
// 64 x N x 16 tile (N one of the kernels' classes, 32..256, including the extended shapes 80 and
// 144), its fma called with the N / 2 accumulators of this thread.
namespace gmma = cute::SM90::GMMA;
template <int N>
using WgmmaRsOp = decltype(gmma::rs_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                                cute::Shape<cute::_64, cute::Int<N>, cute::_16>>());

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc,
                                         std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], desc, d[I]...);
}

template <int N>
__device__ __forceinline__ void wgmma_m64(float* d, const uint32_t (&a)[4], uint64_t desc) {
  wgmma_rs<WgmmaRsOp<N>>(d, a, desc, std::make_index_sequence<N / 2>{});
}

// The fp8 path's MMA (sm90_fp8.cuh, tools/probes/fp8_gemm_probe): m64 x kN x k32, e4m3 x e4m3 ->
// f32, A from registers (kN = 160 is one of the extended shapes); `accumulate` false starts the
// accumulators afresh.
template <int kN>
using Fp8RsOp = decltype(gmma::rs_op_selector<cute::float_e4m3_t, cute::float_e4m3_t, float,
                                              cute::Shape<cute::_64, cute::Int<kN>, cute::_32>>());

template <int kN, size_t... I>
__device__ __forceinline__ void wgmma_fp8(float* d, const uint32_t (&a)[4], uint64_t desc,
                                          bool accumulate, std::index_sequence<I...>) {
  Fp8RsOp<kN>::fma(a[0], a[1], a[2], a[3], desc, d[I]...,
                   accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}

// ---------------------------------------------------------------------------------------------
// The m64 kernel (tile_n kM64TileN = 160; 4-bit weights above 21 rows per expert on average,
// bf16 weights above 4, or 12 where I <= 1024 (forward_plan.h); docs/kernels.md §4.2), and the
// narrow m64 kernel (kMaxN = kM64NarrowTileN = 64, three CTAs per SM, 4-bit weights: the narrow
// tiles of the m64 split, or tile_n 64): one m64nNk16 wgmma per k16 step. A warpgroup = 64 weight
// rows (half an M-tile: fragments 4*half + w, one per warp) x N tokens, N = the tile's rows rounded
// up to a class (M64NClasses, <= 160; acc N/2 fp32 registers per thread). A CTA holds G warpgroups
// on consecutive halves of one routing tile, which share each B stage, at B CTAs per SM
// (Wgmma3Config; forward_args.h: 2 x 2 for 4-bit weights, 4 x 1 for bf16). B crosses L2 once per G
// halves (one warpgroup at three CTAs per SM read 35 GB from L2 for fc1 at 4096 tokens, 62 % of its
// throughput) and 16 warps per SM hide each warp's decode -> wgmma chain; 2 wgmma steps in flight
// fit the 128 registers. 4-bit: 15 % faster than 1x3 at 4096 tokens, 7 % at 1024. bf16 weights
// (four times the bytes per row) take the 4 x 1 CTA, whose B stage serves 256 weight rows: 1.3-1.7x
// faster than one warpgroup of 128 rows at two CTAs per SM from 512 tokens on. Same fragments, same
// per-column k order (one wgmma per k16 step, K ascending), so the same bits for any G. fc1: warps
// 0/2 hold gate rows, 1/3 the matching up rows (fragment order of forward_args.h), so the epilogue
// pairs them through shared memory.

constexpr int kWg3Rows = 64;   // weight rows per CTA
constexpr int kWg3Frags = 4;   // fragments per CTA, one per warp
constexpr int kWg3HCols = 32;  // h columns per fc1 CTA
// The epilogue's staging rows per token column (m64_epilogue; the fp8 kernel's too).
constexpr int kWg3XS = kWg3Rows + 4;  // fc1 exchange row (fp32)
constexpr int kWg3YS = kWg3Rows + 8;  // fc2 y row (bf16)

__device__ __forceinline__ void keep_alive4(const uint32_t (&r)[4]) {
  asm volatile("" ::"r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}

__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// kG warpgroups per CTA, each the m64 consumer of one 64-row half M-tile (consecutive halves of
// one routing tile), all reading the same B stage: B crosses L2 once per kG halves. kMinB CTAs
// per SM size the ring (the shared memory of an SM, 228 KB, split kMinB ways). kMaxN: rows per
// routing tile (kM64TileN, or kM64NarrowTileN: N <= 64 needs 32 accumulators per thread instead
// of 80, so three CTAs of two warpgroups fit an SM's registers).
template <Recipe R, int kG = 1, int kMinB = 3, int kMaxN = kM64TileN>
struct Wgmma3Config {
  using RT = RecipeKernelTraits<R>;
  static constexpr int kNT = 128 * kG;  // threads per CTA
  // wgmma steps in flight: 4 (138-152 registers); 2 where the SM's registers allow at most
  // 128 per thread (4 in flight spill there).
  static constexpr int kInFlight = kG * kMinB >= 4 ? 2 : 4;
  static constexpr int kWBytes = kWg3Frags * RT::kFragBytes;  // one half's share of a chunk
  static constexpr int kSBytes = kWg3Frags * RT::kScaleBytes;
  // 16-byte weight copies per warpgroup thread and chunk: 1 (4-bit), 4 (bf16: one fragment each).
  static constexpr int kWCopies = kWBytes / (16 * 128);
  static_assert(kWCopies * 16 * 128 == kWBytes, "whole 16-byte weight copies per thread");
  // A stage for N columns: B (N 128-byte swizzled rows, 1024-aligned), then the kG halves'
  // weights, then their scales.
  __host__ __device__ static constexpr int stage_bytes(int n) {
    return (n * 128 + kG * (kWBytes + kSBytes) + 1023) / 1024 * 1024;
  }
  // Static shared memory (the tile's column tables) and the 1024-byte
  // alignment of the ring come out of the SM's share.
  static constexpr int kStaticBytes = kMaxN * (8 + 4 + 4);
  static constexpr int kBudget =
      (kMinB == 1 ? kSmemPerCtaMax : kSmemPerSm / kMinB - kSmemReservedPerCta) - kStaticBytes -
      1024;
  static constexpr int kMaxStages = 8;
  static constexpr int kStagesMaxN =
      kBudget / stage_bytes(kMaxN) < kMaxStages ? kBudget / stage_bytes(kMaxN) : kMaxStages;
  static_assert(kStagesMaxN >= 3, "the ring needs three stages of the widest N");
  static constexpr int kRingBytes = kStagesMaxN * stage_bytes(kMaxN);
  // Smaller N get more stages, up to kMaxStages.
  __host__ __device__ static constexpr int stages(int n) {
    return kRingBytes / stage_bytes(n) < kMaxStages ? kRingBytes / stage_bytes(n) : kMaxStages;
  }
  // Each warpgroup's epilogue staging (m64_epilogue), side by side.
  static constexpr int kEpiBytes =
      kMaxN * kWg3XS * 4 > kMaxN* kWg3YS * 2 ? kMaxN* kWg3XS * 4 : kMaxN* kWg3YS * 2;
  static constexpr int kSmemBytes =
      (kRingBytes > kG * kEpiBytes ? kRingBytes : kG * kEpiBytes) + 1024;
  // kMinB CTAs fit an SM (228 KB, 1 KB reserved per CTA) and one CTA the 227 KB per-CTA limit.
  static_assert(kMinB * (kSmemBytes + kStaticBytes + kSmemReservedPerCta) <= kSmemPerSm &&
                    kSmemBytes + kStaticBytes <= kSmemPerCtaMax,
                "the ring and the static tables fit kMinB CTAs per SM");
};

// The epilogue of one 64-row half M-tile (the m64 kernel's, and the fp8 path's with the
// columns' fold factors): acc[nf * 4 + i] is row warp * 16 + g + (i >> 1) * 8 of the half and
// column nf * 8 + 2 t4 + (i & 1); `value(acc, col)` the fp32 the recipe stages (fc1: the gate or
// up value before SwiGLU; fc2: y before its bf16 rounding). `tid` 0..127 is the thread in the
// half's warpgroup, `smem` its staging area (kWg3XS fp32 or kWg3YS bf16 per column), `sync` a
// barrier over that warpgroup.
template <Recipe R, bool kFc1, int kNF, ExpertEpilogue kEpi = ExpertEpilogue::kSwiglu, class Value,
          class Sync>
__device__ __forceinline__ void m64_epilogue(const ForwardArgs& a, const TileInfo& tile, int mtile,
                                             int half, const float (&acc)[kNF * 4],
                                             unsigned char* smem, const float* tw_of,
                                             const int* pair_of, int tid, Value value, Sync sync) {
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int rows = tile.rows;
  constexpr int kXS = kWg3XS, kYS = kWg3YS;
  // f(col, r8, v): accumulator v of column col and row warp * 16 + g + r8 (r8 = 0 or 8), for
  // the columns of the tile's rows.
  auto each_acc = [&](auto f) {
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 8 >= rows) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) f(nf * 8 + 2 * t4 + (i & 1), (i >> 1) * 8, acc[nf * 4 + i]);
    }
  };
  if constexpr (kFc1) {
    // Scaled gate/up values to xs [col][kXS]: gate of h column j (0..31) at j, up at 32 + j
    // (warp w holds fragment 4*half + w: gate (w even) or up (w odd) of h columns
    // (w >> 1) * 16 + 0..15), then h in place of the gate values.
    float* xs = reinterpret_cast<float*>(smem);
    const int slot0 = (warp & 1) * kWg3HCols + (warp >> 1) * 16 + g;
    each_acc([&](int col, int r8, float v) { xs[col * kXS + slot0 + r8] = value(v, col); });
    sync();
    // Each thread reads the gate slot it overwrites, and nobody writes the up slots: no race.
    const int hcol0 = mtile * kFc1TileH + half * kWg3HCols;
    for (int it = tid; it < rows * kWg3HCols; it += 128) {
      const int col = it / kWg3HCols, j = it % kWg3HCols;
      float* x = xs + col * kXS;
      float hv = fc1_activation<kEpi>(a, tile.expert, hcol0 + j, x[j], x[kWg3HCols + j]);
      if (a.weight_in_fc1) hv = fmt::mul_rn(hv, tw_of[col]);
      x[j] = hv;
    }
    sync();
    store_h_rows<R, kWg3HCols, kXS>(a, xs, tile, hcol0, tid, 128);
  } else {
    // y tile [col][kYS] bf16, then 16-byte row stores to y_rows[t*K+k] (or y_dst).
    uint16_t* ys = reinterpret_cast<uint16_t*>(smem);
    const int row0 = mtile * kTileRows + half * kWg3Rows;
    each_acc([&](int col, int r8, float v) {
      const int row = warp * 16 + g + r8;
      float y = value(v, col);
      if constexpr (kEpi == ExpertEpilogue::kExtended)
        y = fc2_value<kEpi>(a, tile.expert, row0 + row, pair_of[col], y);
      ys[col * kYS + row] = fmt::float_to_bf16(y);
    });
    sync();
    for (int it = tid; it < rows * 8; it += 128) {
      const int col = it >> 3, p = it & 7;
      if (row0 + p * 8 >= a.H) continue;
      const int pair = pair_of[col];
      uint16_t* dst = a.y_dst != nullptr ? a.y_dst[pair] : a.y_rows + size_t(pair) * a.H;
      *reinterpret_cast<uint4*>(dst + row0 + p * 8) =
          *reinterpret_cast<const uint4*>(ys + col * kYS + p * 8);
    }
    if (a.y_dst_fence) __threadfence_system();
  }
}

// The m64 kernel's N classes: a tile runs the K loop of the narrowest that holds its rows. Steps
// of 8 except 80-112 (rows per expert on DSV3 are 32 +- 6 at 1024 tokens and 128 +- 11
// at 4096, and each column of padding costs wgmma time: 48 for 33-48 rows took 1024 tokens from
// 3386 to 3221 us).
using M64NClasses =
    std::integer_sequence<int, 32, 40, 48, 56, 64, 72, 80, 96, 112, 120, 128, 136, 144, 152, 160>;
// The narrow kernel's (kMaxN = kM64NarrowTileN).
using M64NarrowNClasses = std::integer_sequence<int, 32, 40, 48, 56, 64>;
template <int kMaxN>
using M64Classes = std::conditional_t<kMaxN == kM64TileN, M64NClasses, M64NarrowNClasses>;
template <class F, int N0, int... Ns>
__device__ __forceinline__ void with_n_class(int rows, F& f,
                                             std::integer_sequence<int, N0, Ns...>) {
  if constexpr (sizeof...(Ns) == 0) {
    f(std::integral_constant<int, N0>{});
  } else if (rows <= N0) {
    f(std::integral_constant<int, N0>{});
  } else {
    with_n_class(rows, f, std::integer_sequence<int, Ns...>{});
  }
}

// Grid: one CTA per (routing tile, group of kG consecutive half M-tiles), group fastest (the
// CTAs of one tile run together and share its activation rows in L2). Warpgroup wg of a CTA
// computes half M-tile group * kG + wg; a warpgroup past the matrix (kG not dividing the halves,
// or fc2's padding rows past H) loads its share of B and takes part in the barriers, but neither
// decodes nor multiplies.
template <Recipe R, bool kFc1, int kG, int kMinB, ExpertEpilogue kEpi = ExpertEpilogue::kSwiglu,
          int kMaxN = kM64TileN>
__global__ void __launch_bounds__(128 * kG, kMinB) sm90_moe_wgmma3_kernel(const ForwardArgs a) {
  static_assert(kMaxN == kM64TileN || kMaxN == kM64NarrowTileN, "an N class list per tile");
  using C = Wgmma3Config<R, kG, kMinB, kMaxN>;
  using RT = typename C::RT;
  constexpr int kNT = C::kNT;
  constexpr int kNF = kMaxN / 8;
  constexpr int kIF = C::kInFlight;
  extern __shared__ unsigned char smem_raw[];
  __shared__ const uint16_t* brow_ptr[kMaxN];  // first element of each B row (xq or h)
  __shared__ int pair_of[kMaxN];               // t*K+k of each column
  __shared__ float tw_of[kMaxN];

  // A split pair (ForwardArgs::tile_part, m64_split): the first launch, the wide tiles, lets
  // the second (the narrow tiles, on the narrow kernel) start at once; that one reads nothing
  // the first writes, and waits for it before every exit (pdl_late) so that the pair completes
  // after both.
  if (a.tile_part == 2) pdl_launch_dependents();
  auto finish = [&] {
    if (a.pdl_late) pdl_wait();
  };
  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int groups = (halves + kG - 1) / kG;
  const int group = int(blockIdx.x % unsigned(groups));
  unsigned tile_lo, part_tiles;
  tile_part_range(a, tile_lo, part_tiles);
  if (blockIdx.x / unsigned(groups) >= part_tiles) return finish();
  const int tile_idx = int(tile_lo + blockIdx.x / unsigned(groups));
  // fc2 rows are padded to a multiple of 128: halves made only of padding have nothing to store
  // (if the group's first is one, so are the others).
  auto half_live = [&](int m64) { return m64 < halves && (kFc1 || m64 * kWg3Rows < a.H); };
  if (!half_live(group * kG)) return finish();
  const TileInfo tile = a.tiles[tile_idx];
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
  const int warp = wtid >> 5, lane = tid & 31;  // warp within the warpgroup
  const int g = lane >> 2;
  const int m64 = group * kG + wg;
  const bool active = half_live(m64);  // warpgroup-uniform
  const int mtile = m64 >> 1, half = m64 & 1;
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);

  // This half's fragments 4*half .. 4*half+3 of each chunk (kTileFrags per chunk) are
  // contiguous. A warpgroup without rows points at the group's first half (it copies nothing).
  const int m64_src = active ? m64 : group * kG;
  const MTileStream ms = mtile_stream<R, kFc1>(a, tile.expert, m64_src >> 1);
  const int chunks = ms.chunks;
  const uint8_t* wsrc_t = ms.w + (m64_src & 1) * C::kWBytes + wtid * 16;
  [[maybe_unused]] const uint8_t* ssrc_t =
      RT::kFourBit ? ms.s + (m64_src & 1) * C::kSBytes + wtid * 16 : nullptr;

  tile_b_rows<kFc1>(a, tile, kMaxN, brow_ptr, pair_of, tid, kNT);
  __syncthreads();

  // This thread's B pieces: 16-byte column bc of rows br0 + kBStep i; the swizzle XORs the
  // column with the row's low 3 bits, which are br0's for every i (kBStep is a multiple of 8).
  constexpr int kBStep = kNT / 8;
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
    constexpr int kBCopies = (kNW + kBStep - 1) / kBStep;
    static_assert(kNW % 8 == 0 && kStages >= 3, "N class");
    // This thread's B sources, held in registers as 32-bit element offsets from bsrc (a
    // shared-memory table costs a load and three hazard slots per copy).
    const uint16_t* bsrc = kFc1 ? a.xq : a.h;
    uint32_t bptr[kBCopies];
#pragma unroll
    for (int i = 0; i < kBCopies; ++i)
      bptr[i] = br0 + kBStep * i < kNW
                    ? uint32_t(brow_ptr[br0 + kBStep * i] - bsrc) + uint32_t(bc * 8)
                    : 0u;
    // One stage: the kNW rows the wgmma reads (rows past the tile's zero-filled), each live
    // half's 4 weight fragments and their scales. Branch-free: a chunk past the end (`live`
    // false) or a warpgroup without rows copies nothing (src-size 0, its addresses clamped to
    // real ones), and the scale copy of threads past the scales is predicated off in the PTX.
    // Weight pieces land where they are in the resident layout (bf16: each lane's k16 steps in
    // the rotated order of bf16_resident_step, conflict-free reads below).
    const uint32_t wpiece = uint32_t(wtid * 16);
    const uint32_t wdst = uint32_t(kNW * 128 + wg * C::kWBytes) + wpiece;
    [[maybe_unused]] const uint32_t sdst =
        uint32_t(kNW * 128 + kG * C::kWBytes + wg * C::kSBytes + wtid * 16);
    [[maybe_unused]] const bool copies_scales = wtid < C::kSBytes / 16;  // 4-bit weights only
    auto load_stage = [&](uint32_t stage_off, int chunk, bool live) {
      const uint32_t st = smem_base + stage_off;
      const int cc = live ? chunk : 0;
      const uint16_t* bsrc_c = bsrc + size_t(cc) * kKChunk;
#pragma unroll
      for (int i = 0; i < kBCopies; ++i) {
        const uint32_t dst = st + uint32_t(bdst_off + i * (kBStep * 128));
        const uint16_t* src = bsrc_c + bptr[i];
        const uint32_t size = live && br0 + kBStep * i < live_rows ? 16u : 0u;
        // Only the last pass can hold rows past kNW (N not a multiple of kBStep): those threads
        // issue nothing (a PTX predicate, no branch around the copy).
        if (kNW % kBStep == 0 || i + 1 < kBCopies)
          cp_async16_sz(dst, src, size);
        else
          cp_async16_if(dst, src, size, br0 + kBStep * i < kNW);
      }
      const bool wl = live && active;
#pragma unroll
      for (int i = 0; i < C::kWCopies; ++i)
        cp_async16_sz(st + wdst + uint32_t(i * 16 * 128),
                      wsrc_t + size_t(cc) * (2 * C::kWBytes) + i * 16 * 128, wl ? 16u : 0u);
      if constexpr (RT::kFourBit)
        cp_async16_if(st + sdst, ssrc_t + size_t(cc) * (2 * C::kSBytes), wl ? 16u : 0u,
                      copies_scales);
    };
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      load_stage(uint32_t(s * kStageBytes), s, s < chunks);
      cp_async_commit();
    }
    // The epilogue's tables load while the first stages arrive (the barriers of the K loop
    // publish them).
    tile_epilogue_columns<kFc1>(a, tile, kMaxN, pair_of, tw_of, tid, kNT);
    uint32_t af[kIF][4];  // A fragments of the k16 steps in flight
#pragma unroll
    for (int s = 0; s < kIF; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) af[s][i] = 0;

    // The ring's stages as byte offsets. The chunk loop is unrolled over the ring (kStages
    // chunks per pass), so every stage's offset, its B descriptor and the stage loaded at each
    // chunk are constants: no per-chunk offset arithmetic. The warpgroup without rows keeps a
    // rolled loop, its offsets advanced by one stage per chunk and wrapped with a compare and
    // select.
    constexpr uint32_t kRingN = uint32_t(kStages * kStageBytes);
    auto advance = [](uint32_t off) {
      off += uint32_t(kStageBytes);
      return off == kRingN ? 0u : off;
    };
    // Start of a chunk: its data is visible to every warp after the barrier, and the stage
    // loaded then (`wr`, chunk - 2's) is free: every warp's waits in chunk - 1 retired all of
    // chunk - 2's steps.
    auto chunk_start = [&](int chunk, uint32_t wr) {
      cp_async_wait<kAhead - 1>();
      fence_proxy_async_smem();
      __syncthreads();
      const int next = chunk + kAhead;
      load_stage(wr, next, next < chunks);
      cp_async_commit();
    };
    if (!active) {  // warpgroup-uniform: copies and barriers only
      uint32_t wr = uint32_t(kAhead * kStageBytes);
      for (int chunk = 0; chunk < chunks; ++chunk) {
        chunk_start(chunk, wr);
        wr = advance(wr);
      }
      return;
    }
    const uint32_t desc0_lo = uint32_t(sw128_desc(smem_base));
    // One chunk in ring stage `stage` (byte offset), loading chunk + kAhead into stage `wr`.
    auto chunk_step = [&](int chunk, uint32_t stage, uint32_t wr) {
      chunk_start(chunk, wr);
      const unsigned char* ws = smem + stage + kNW * 128 + wg * C::kWBytes;

      // This warp's fragment: the 4-bit words and scale multipliers of the whole chunk, two
      // multipliers per register (sc_lo / sc_hi: rows g / g + 8): NVFP4's of k16 steps 2i and
      // 2i + 1 in register i, MXFP4's of its two blocks (steps 0-1, 2-3) in register 0.
      [[maybe_unused]] uint32_t words[4], sc_lo[2], sc_hi[2];
      if constexpr (RT::kFourBit) {
        const uint4 wq = *reinterpret_cast<const uint4*>(ws + warp * RT::kFragBytes + lane * 16);
        words[0] = wq.x;
        words[1] = wq.y;
        words[2] = wq.z;
        words[3] = wq.w;
      }
      [[maybe_unused]] const unsigned char* ss =
          smem + stage + kNW * 128 + kG * C::kWBytes + wg * C::kSBytes + warp * RT::kScaleBytes;
      if constexpr (!RT::kFourBit) {
      } else if constexpr (RT::kNvScale) {
        const uint32_t lo = *reinterpret_cast<const uint32_t*>(ss + g * 4);
        const uint32_t hi = *reinterpret_cast<const uint32_t*>(ss + (g + 8) * 4);
        sc_lo[0] = scale_multiplier_pair_of<R, 0>(lo);
        sc_lo[1] = scale_multiplier_pair_of<R, 2>(lo);
        sc_hi[0] = scale_multiplier_pair_of<R, 0>(hi);
        sc_hi[1] = scale_multiplier_pair_of<R, 2>(hi);
      } else {
        const uint32_t lo = *reinterpret_cast<const uint16_t*>(ss + g * 2);
        const uint32_t hi = *reinterpret_cast<const uint16_t*>(ss + (g + 8) * 2);
        sc_lo[0] = scale_multiplier_pair_of<R, 0>(lo);
        sc_hi[0] = scale_multiplier_pair_of<R, 0>(hi);
      }
      // Step s's multipliers: register and half.
      auto scaled = [&](uint32_t bits, const uint32_t(&sc)[2], int s) {
        const int reg = RT::kNvScale ? s >> 1 : 0, half = RT::kNvScale ? s & 1 : s >> 1;
        return half ? mul_bf16x2_by_half<1>(bits, sc[reg]) : mul_bf16x2_by_half<0>(bits, sc[reg]);
      };

      const uint64_t desc = sw128_desc_at(desc0_lo, stage);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // af[s % kIF] was last read by the wgmma kIF steps ago, retired by the wait below in
        // the step before (up to kIF - 1 steps stay in flight while the next ones decode; with
        // 2 in flight at three CTAs per SM 1-2 % slower at 1024-2048 tokens).
        uint32_t* f = af[s % kIF];
        if constexpr (RT::kFourBit) {
          uint32_t bits[4];
          decode_e2m1x8(words[s], bits);
          f[0] = scaled(bits[0], sc_lo, s);
          f[1] = scaled(bits[1], sc_hi, s);
          f[2] = scaled(bits[2], sc_lo, s);
          f[3] = scaled(bits[3], sc_hi, s);
        } else {  // the step's 16 bytes of this lane (bf16_resident_step: slot s ^ (l/2 % 4))
          const uint4 v = *reinterpret_cast<const uint4*>(ws + warp * RT::kFragBytes + lane * 64 +
                                                          (bf16_resident_step(lane, s) << 4));
          f[0] = v.x;
          f[1] = v.y;
          f[2] = v.z;
          f[3] = v.w;
        }
        wgmma_fence();
        wgmma_m64<kNW>(acc, af[s % kIF], desc + uint64_t(2 * s));  // +32 bytes per k16 step
        wgmma_commit();
        wgmma_wait<kIF - 1>();
        // The step that used af[(s + 1) % kIF] is retired now; keeping those registers alive
        // until here stops ptxas from reusing them for a decode while a wgmma may still read
        // them.
        keep_alive4(af[(s + 1) % kIF]);
      }
    };
    for (int c0 = 0; c0 < chunks; c0 += kStages) {
#pragma unroll
      for (int j = 0; j < kStages; ++j) {
        if (c0 + j >= chunks) break;  // CTA-uniform
        chunk_step(c0 + j, uint32_t(j * kStageBytes),
                   uint32_t((j + kAhead) % kStages * kStageBytes));
      }
    }
    // Retire every step inside this N's loop, so no wgmma is in flight where the paths of the
    // different N merge (ptxas may move accumulators there: C7515 serialization otherwise).
    wgmma_wait<0>();
  };
  with_n_class(tile.rows, k_loop, M64Classes<kMaxN>{});
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kNF * 4; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline; its smem becomes the epilogue tiles
  if (!active) return finish();

  // acc[nf*4 + i]: row warp*16 + g + (i>>1)*8 of the half's 64, column nf*8 + 2*t4 + (i&1).
  const float alpha = gemm_alpha<R, kFc1>(a, tile.expert);
  auto value = [alpha](float v, int) { return epilogue_value<R, kFc1>(v, alpha); };
  if constexpr (kG == 1) {
    m64_epilogue<R, kFc1, kNF, kEpi>(a, tile, mtile, half, acc, smem, tw_of, pair_of, wtid, value,
                                     [] { __syncthreads(); });
  } else {
    m64_epilogue<R, kFc1, kNF, kEpi>(a, tile, mtile, half, acc, smem + wg * C::kEpiBytes, tw_of,
                                     pair_of, wtid, value, [wg] { named_barrier(1 + wg, 128); });
  }
  finish();
}

}  // namespace moe_ep::kern
