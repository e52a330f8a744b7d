// The forward's small kernels (prepare = quantize + route, finalize) and the one-time weight
// preprocessing; launch_forward strings the stages together.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/moe/fp8_fragments.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/quant4_device.cuh"
#include "kernels/moe/sm90_moe_decode.cuh"
#include "kernels/moe/sm90_moe_device.cuh"
#include "kernels/moe/timeline.cuh"
#include "kernels/quantize/quantize_math.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
// The fp8 path's routing tile: up to kFp8N = 160 rows (one MMA width per tile from its
// rows, 8 to 160: sm90_moe_fp8.cuh). MOE_EP_FP8_TILE=128 caps it at 128 (a benchmark knob).
int fp8_tile_n() {
  static const int n = [] {
    const char* v = std::getenv("MOE_EP_FP8_TILE");
    return v && std::atoi(v) == 128 ? 128 : 160;
  }();
  return n;
}

namespace {

constexpr int kPrepThreads = 512;
// Ids per thread in flight in route's batched passes (launch_prepare).
constexpr int kRouteIds = 8;
constexpr int kMaxLocalExperts = 1024;  // cuda_backend_unsupported_reasons says so beyond it
static_assert(kMaxLocalExperts <= 2 * kPrepThreads, "route scans two experts per thread");

__device__ __forceinline__ int valid_tokens(const ForwardArgs& a) {
  if (!a.num_tokens) return a.tokens;
  const int n = *a.num_tokens;
  return n < 0 ? 0 : (n > a.tokens ? a.tokens : n);
}

__device__ void report_bad_id(DeviceError* err, int index, int value, int limit) {
  if (atomicCAS(&err->code, 0, 1) == 0) {
    err->index = index;
    err->value = value;
    err->limit = limit;
    __threadfence_system();
  }
}

// A routing tile is narrow (tile_split only) when it is an expert's last and holds at most
// tn / 2 of its c rows; those come first in the tile list.
__device__ __forceinline__ int narrow_tile(const ForwardArgs& a, int c, int tn) {
  const int r = c % tn;
  return a.tile_split && r != 0 && 2 * r <= tn ? 1 : 0;
}

// The local expert of a routed id, or -1 (an empty slot, a bad id, another rank's expert).
__device__ __forceinline__ int local_expert(const ForwardArgs& a, int id) {
  if (id < 0 || id >= a.num_experts) return -1;
  const int le = id - a.expert_base;
  return le >= 0 && le < a.local_experts ? le : -1;
}

// The routing tiles of local expert e with c pairs from pair offset off: a narrow last tile at
// narrow slot noff, the others from wide slot wide0 on (route_layout's order).
__device__ __forceinline__ void write_tiles(const ForwardArgs& a, int e, int c, int off, int tn,
                                            bool narrow, int noff, int wide0) {
  for (int j = 0; j * tn < c; ++j) {
    TileInfo ti;
    ti.expert = e;
    ti.start = off + j * tn;
    ti.rows = min(tn, c - j * tn);
    const bool last = (j + 1) * tn >= c;
    a.tiles[narrow && last ? noff : wide0 + j] = ti;
  }
}

// route() for at most 32 pairs, by warp 0 alone: one load per lane and warp collectives instead
// of the block's two passes and five barriers (at 1 token the route block is on the forward's
// critical path: prepare ends with it, and fc1 waits for prepare). The same counts, offsets and
// tile list as route(); the pairs of one expert in increasing order (any order gives the same
// results, see route()).
__device__ void route_warp(const ForwardArgs& a, int P) {
  const int lane = threadIdx.x & 31, tn = a.tile_n;
  const int id = lane < P ? a.ids[lane] : -1;
  if (id < -1 || id >= a.num_experts) report_bad_id(a.error, lane, id, a.num_experts);
  const int le = local_expert(a, id);
  const bool live = le >= 0;
  const unsigned group = __match_any_sync(0xffffffffu, live ? le : -1);  // lanes of one expert
  const int first = __ffs(group) - 1, c = __popc(group);
  const bool leader = live && first == lane;  // the expert's lowest lane speaks for it
  const int pairs = leader ? c : 0, tiles = leader ? (c + tn - 1) / tn : 0;
  const int narrow = leader ? narrow_tile(a, c, tn) : 0;
  // Pairs, tiles and narrow tiles of the experts below this lane's, over the leaders only (one
  // step per expert: 8 at 1 DSV3 token instead of 32).
  int off = 0, toff = 0, noff = 0;
  for (unsigned lm = __ballot_sync(0xffffffffu, leader); lm != 0u; lm &= lm - 1u) {
    const int j = __ffs(lm) - 1;  // the same for every lane
    const int lj = __shfl_sync(0xffffffffu, le, j), pj = __shfl_sync(0xffffffffu, pairs, j);
    const int tj = __shfl_sync(0xffffffffu, tiles, j), nj = __shfl_sync(0xffffffffu, narrow, j);
    if (lj < le) {
      off += pj;
      toff += tj;
      noff += nj;
    }
  }
  const int total_tiles = __reduce_add_sync(0xffffffffu, tiles);
  const int narrow_total = __reduce_add_sync(0xffffffffu, narrow);
  if (lane == 0) {
    a.num_tiles[0] = total_tiles;
    a.num_tiles[1] = narrow_total;
  }
  if (leader) write_tiles(a, le, c, off, tn, narrow, noff, narrow_total + toff - noff);
  const int base = __shfl_sync(0xffffffffu, off, first);
  if (live) a.sorted_pairs[base + __popc(group & ((1u << lane) - 1u))] = lane;
}

// Ids i0, i0 + kPrepThreads, ... (kBatch of them, -1 past P) of route's passes, all loaded before
// any is used, so a thread waits for one round trip per batch instead of one per id.
template <int kBatch>
__device__ __forceinline__ void load_ids(const ForwardArgs& a, int P, int i0, int (&ids)[kBatch]) {
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    const int i = i0 + j * kPrepThreads;
    ids[j] = i < P ? __ldg(a.ids + i) : -1;
  }
}

// f(i, ids[i]) for the P ids, thread tid of the block taking i = tid, tid + kPrepThreads, ...;
// each batch of kBatch ids is loaded before any is used, so a thread waits for one round trip
// per batch instead of one per id (at 4096 tokens x 8 slots, 64 ids per thread and pass).
template <int kBatch, class F>
__device__ __forceinline__ void for_each_id(const ForwardArgs& a, int P, int tid, F f) {
  for (int i0 = tid; i0 < P; i0 += kPrepThreads * kBatch) {
    int ids[kBatch];
    load_ids<kBatch>(a, P, i0, ids);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) f(i0 + j * kPrepThreads, ids[j]);
  }
}

// The layout of the routed pairs from the per-expert pair counts cnt[El] (shared): off[e] (shared)
// = the pairs of the experts below e, the tile list and its counts. A narrow tile (tile_split
// only) is an expert's last tile when it has at most tn / 2 rows; those come first in the list.
// Leaves cnt[e] = 0 (the placement cursor of route's second pass), behind a block barrier.
__device__ void route_layout(const ForwardArgs& a, int* cnt, int* off) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int El = a.local_experts, tn = a.tile_n;
  __shared__ int toff[kMaxLocalExperts];
  // Exclusive scans of the pair, tile and narrow-tile counts over El <= 2 * kPrepThreads
  // experts: two per thread, a warp scan, then the warp totals (a serial warp-0 loop over
  // 32-expert groups cost microseconds at 256 experts).
  __shared__ int warp_p[kPrepThreads / 32], warp_t[kPrepThreads / 32], warp_n[kPrepThreads / 32];
  __shared__ int noff[kMaxLocalExperts];
  __shared__ int narrow_total;
  const auto narrow_of = [&](int c) { return narrow_tile(a, c, tn); };
  {
    const int e0 = 2 * tid, e1 = e0 + 1;
    const int c0 = e0 < El ? cnt[e0] : 0, c1 = e1 < El ? cnt[e1] : 0;
    const int n0 = (c0 + tn - 1) / tn, n1 = (c1 + tn - 1) / tn;
    const int q0 = narrow_of(c0), q1 = narrow_of(c1);
    int ip = c0 + c1, it = n0 + n1, iq = q0 + q1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, ip, o), z = __shfl_up_sync(0xffffffffu, it, o);
      const int w = __shfl_up_sync(0xffffffffu, iq, o);
      if (lane >= o) {
        ip += y;
        it += z;
        iq += w;
      }
    }
    if (lane == 31) {
      warp_p[warp] = ip;
      warp_t[warp] = it;
      warp_n[warp] = iq;
    }
    __syncthreads();
    if (warp == 0) {
      constexpr int kW = kPrepThreads / 32;
      int wp = lane < kW ? warp_p[lane] : 0, wt = lane < kW ? warp_t[lane] : 0;
      int wn = lane < kW ? warp_n[lane] : 0;
#pragma unroll
      for (int o = 1; o < kW; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, wp, o), z = __shfl_up_sync(0xffffffffu, wt, o);
        const int w = __shfl_up_sync(0xffffffffu, wn, o);
        if (lane >= o) {
          wp += y;
          wt += z;
          wn += w;
        }
      }
      if (lane < kW) {
        warp_p[lane] = wp;  // inclusive
        warp_t[lane] = wt;
        warp_n[lane] = wn;
      }
      if (lane == kW - 1) {
        a.num_tiles[0] = wt;
        a.num_tiles[1] = wn;
        narrow_total = wn;
      }
    }
    __syncthreads();
    const int bp = (warp ? warp_p[warp - 1] : 0) + ip - c0 - c1;
    const int bt = (warp ? warp_t[warp - 1] : 0) + it - n0 - n1;
    const int bq = (warp ? warp_n[warp - 1] : 0) + iq - q0 - q1;
    if (e0 < El) {
      off[e0] = bp;
      toff[e0] = bt;
      noff[e0] = bq;
    }
    if (e1 < El) {
      off[e1] = bp + c0;
      toff[e1] = bt + n0;
      noff[e1] = bq + q0;
    }
  }
  __syncthreads();
  for (int e = tid; e < El; e += kPrepThreads) {
    const int c = cnt[e];
    // Wide tiles after every narrow one: the expert's place among the wide tiles is its tile
    // offset minus the narrow tiles before it. Without tile_split there are none (the old order).
    write_tiles(a, e, c, off[e], tn, narrow_of(c), noff[e], narrow_total + toff[e] - noff[e]);
    cnt[e] = 0;  // becomes the placement cursor
  }
  __syncthreads();
}

// Block 0: routing (counts, offsets, tiles, the expert-sorted pair list). Pairs of one expert
// take positions in arrival order (atomics); every output column of the GEMMs is computed the
// same way wherever it sits, so the result does not depend on that order.
template <int kRouteBatch>
__device__ void route(const ForwardArgs& a) {
  const int tid = threadIdx.x, warp = tid >> 5;
  const int P = valid_tokens(a) * a.K;
  if (P <= 32 && a.warp_route) {  // the same for the whole block
    if (warp == 0) route_warp(a, P);
    return;
  }
  __shared__ int cnt[kMaxLocalExperts], off[kMaxLocalExperts];
  const int El = a.local_experts;
  for (int e = tid; e < El; e += kPrepThreads) cnt[e] = 0;
  __syncthreads();
  for_each_id<kRouteBatch>(a, P, tid, [&](int i, int id) {
    if (id == -1) return;
    if (id < -1 || id >= a.num_experts) {
      report_bad_id(a.error, i, id, a.num_experts);
      return;
    }
    const int le = local_expert(a, id);
    if (le >= 0) atomicAdd(&cnt[le], 1);
  });
  __syncthreads();
  route_layout(a, cnt, off);
  for_each_id<kRouteBatch>(a, P, tid, [&](int i, int id) {
    const int le = local_expert(a, id);
    if (le >= 0) a.sorted_pairs[off[le] + atomicAdd(&cnt[le], 1)] = i;
  });
}

__device__ __forceinline__ bool live_id(int id, int E) { return id >= 0 && id < E; }

// Pairs per counting block of route_spread (one per thread). A token's blocks (1 + t, 0) count
// kSpreadPairs / K tokens each, so for K <= kSpreadPairs (launch_prepare) the grid's T + 1
// columns hold the nb counting blocks.
constexpr int kSpreadPairs = kPrepThreads;
// Fewer pairs than this on the device: one block routes (prepare_kernel).
constexpr int kSpreadMinPairs = 4 * kSpreadPairs;
__host__ __device__ inline int spread_blocks(int tokens, int K) {
  return (tokens * K + kSpreadPairs - 1) / kSpreadPairs;
}

// Routing over nb blocks (from kPrepWideTokens tokens on, where route's one block set prepare's
// time: ~70 us at DSV3 4096 tokens). Block b counts pairs b * kSpreadPairs + tid into a.counts
// by global atomics, whose return value is the pair's place among its expert's pairs
// (a.pair_rank). The block that takes the last ticket (a.counts[El]) reads and zeroes the counts,
// lays out offsets and tiles (route_layout) and scatters every pair to off + rank, one pass
// without atomics. Pairs of one expert take places in arrival order, as in route().
__device__ void route_spread(const ForwardArgs& a, int b, int nb) {
  const int tid = threadIdx.x, El = a.local_experts;
  const int P = valid_tokens(a) * a.K;
  const int i = b * kSpreadPairs + tid;
  if (i < P) {
    const int id = __ldg(a.ids + i);
    if (id < -1 || id >= a.num_experts) report_bad_id(a.error, i, id, a.num_experts);
    const int le = local_expert(a, id);
    if (le >= 0) a.pair_rank[i] = atomicAdd(a.counts + le, 1);
  }
  __shared__ int last;
  __threadfence();  // this block's counts and ranks before its ticket
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.counts + El, 1) == nb - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every block's counts and ranks after the last ticket
  __shared__ int cnt[kMaxLocalExperts], off[kMaxLocalExperts];
  for (int e = tid; e < El; e += kPrepThreads) cnt[e] = atomicExch(a.counts + e, 0);
  if (tid == 0) a.counts[El] = 0;  // the next forward's tickets (stream-ordered after this one)
  __syncthreads();
  route_layout(a, cnt, off);
  for (int i0 = tid; i0 < P; i0 += kPrepThreads * kRouteIds) {
    int ids[kRouteIds], rank[kRouteIds];
    load_ids<kRouteIds>(a, P, i0, ids);
#pragma unroll
    for (int j = 0; j < kRouteIds; ++j) {
      const int k = i0 + j * kPrepThreads;
      rank[j] = k < P ? __ldcg(a.pair_rank + k) : 0;  // L2: written by other blocks
    }
#pragma unroll
    for (int j = 0; j < kRouteIds; ++j) {
      const int le = local_expert(a, ids[j]);
      if (le >= 0) a.sorted_pairs[off[le] + rank[j]] = i0 + j * kPrepThreads;
    }
  }
}

// Elements of a token row one quantizing block covers: kN per thread (4 or 8; a 16-wide NVFP4
// block = 16 / kN lanes, a 32-wide MX block = 32 / kN), so a decode token spreads over several
// SMs and each thread's chain is one block's worth of divisions, not 16 elements' (that chain
// dominated prepare at 1 token). From kPrepWideTokens tokens on 8 per thread (the block's scale
// and its reciprocal on half as many lanes: with route's batched ids, eager prepare at DSV3 4096
// tokens 89-91 -> 69-72 us, docs/gpu_kernels.md §6 "Session 15"); below it 4, as before (at 1
// token 8 per thread read 0.6-1.4 us slower for nvfp4 and level for mxfp4_mxfp8).
constexpr int kPrepWideTokens = 256;
int quant_per_thread(int tokens) {
  static const int forced = decode_env_int("MOE_EP_PREP_N", 4, 8);  // 4 or 8: A/B runs
  if (forced == 4 || forced == 8) return forced;
  return tokens >= kPrepWideTokens ? 8 : 4;
}
__host__ __device__ inline int quant_blocks_per_token(int H, int per_thread) {
  const int elems = per_thread * kPrepThreads;
  return (H + elems - 1) / elems;
}

// Block (0, 0) routes (the other blocks of column 0 have nothing to do); block (t + 1, part)
// quantizes part `part` of token t's row, kN elements per thread. Writes xq (x as the GEMM sees
// it: q*s in bf16, exact, the same per-block arithmetic as fmt::quantize_block_*, whatever kN)
// and, for the unfinalized outputs, weights/indices and zero rows for empty slots.
// kRB = 0: the route spread over blocks (1, 0) .. (nb, 0) (route_spread), which then quantize as
// well (an EP owner's grid, xq_ready, has only those); block (0, *) has nothing to do.
template <Recipe R, int kN, int kRB = kRouteIds>
__global__ void __launch_bounds__(kPrepThreads) prepare_kernel(const ForwardArgs a) {
  static_assert(kN == 4 || kN == 8, "4 or 8 elements per thread");
  MOE_EP_TIMELINE_SCOPE(a, kTlPrepare);
  constexpr int kElems = kN * kPrepThreads;
  // An EP owner's prepare (route only) launches with PDL after the unpack kernel, whose ids it
  // reads; on one GPU it is the forward's first kernel, a plain launch (the wait is a no-op).
  pdl_wait();
  pdl_launch_dependents();  // fc1 may launch; it waits for this grid in pdl_wait
  if constexpr (kRB == 0) {
    // Few pairs on the device (a graph replayed with a small T, an EP owner receiving few rows):
    // block (0, 0) routes them alone, as below kPrepWideTokens.
    if (valid_tokens(a) * a.K < kSpreadMinPairs) {
      if (blockIdx.x == 0 && blockIdx.y == 0) route<1>(a);
    } else {
      const int nb = spread_blocks(a.tokens, a.K);
      if (blockIdx.y == 0 && blockIdx.x >= 1 && int(blockIdx.x) <= nb)
        route_spread(a, blockIdx.x - 1, nb);
    }
    if (blockIdx.x == 0 || a.xq_ready) return;
  } else if (blockIdx.x == 0) {
    if (blockIdx.y == 0) route<kRB>(a);
    return;
  }
  const int t = blockIdx.x - 1, part = blockIdx.y, tid = threadIdx.x;
  const int T = valid_tokens(a), K = a.K, H = a.H;
  const int c0 = part * kElems, c1 = min(H, c0 + kElems);
  if (a.weights_out) {
    for (int k = 0; k < K; ++k) {
      const int row = t * K + k;
      const bool live = t < T && live_id(a.ids[row], a.num_experts);
      if (tid == 0 && part == 0) {
        a.weights_out[row] = t < T ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
        a.indices_out[row] = live ? row : -1;
      }
      if (!live) {
        uint4* d = reinterpret_cast<uint4*>(a.y_rows + size_t(row) * H);
        for (int i = c0 / 8 + tid; i < c1 / 8; i += kPrepThreads) d[i] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  if (t >= T) return;
  const uint16_t* x = a.x + int64_t(t) * a.x_stride;
  uint16_t* xq = a.xq + size_t(t) * H;
  const int i0 = c0 + kN * tid;
  const bool on = i0 < c1;    // H is a multiple of the block (16 / 32): whole groups are on or off
  constexpr int kW = kN / 2;  // bf16 pairs
  uint32_t w[kW];
  if constexpr (kN == 8)
    load_x8(x, i0, on, x_rows16(a.x, a.x_stride), x_rows8(a.x, a.x_stride), w);
  else
    load_x4(x, i0, on, x_rows8(a.x, a.x_stride), w);
  uint32_t o[kW];
  if constexpr (kQuantizesActivations<R>) {
    float v[kN];
    bf16_words_to_f32(w, v);
    quantize_bf16_n<R, kN>(v, a.input_norm_const, o);
  } else {
#pragma unroll
    for (int j = 0; j < kW; ++j) o[j] = w[j];
  }
  if (!on) return;
  if constexpr (kN == 8)
    *reinterpret_cast<uint4*>(xq + i0) = make_uint4(o[0], o[1], o[2], o[3]);
  else
    *reinterpret_cast<uint2*>(xq + i0) = make_uint2(o[0], o[1]);
}

// out[t] = bf16(sum_k c * float(y[t,k])) in slot order, multiply and add rounded separately.
// The ids, weights and y rows of up to 8 slots are loaded before the ordered sum, so the loads
// overlap instead of forming a chain of K dependent round trips.
constexpr int kFinThreads = 128;
constexpr int kFinBatch = 8;
__global__ void __launch_bounds__(kFinThreads) finalize_kernel(const ForwardArgs a) {
  MOE_EP_TIMELINE_SCOPE(a, kTlFinalize);
  pdl_wait();  // y rows are fc2's output
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int c8 = (blockIdx.y * kFinThreads + threadIdx.x) * 8;
  if (c8 >= a.H) return;
  const int T = valid_tokens(a), K = a.K, H = a.H;
  uint4* dst = reinterpret_cast<uint4*>(a.out + size_t(t) * H + c8);
  if (t >= T) {
    *dst = make_uint4(0, 0, 0, 0);
    return;
  }
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kFinBatch) {
    bool live[kFinBatch];
    float c[kFinBatch];
    uint4 v[kFinBatch];
#pragma unroll
    for (int j = 0; j < kFinBatch; ++j) {
      const int row = t * K + k0 + j;
      live[j] = k0 + j < K && live_id(a.ids[row], a.num_experts);
      c[j] = live[j] ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
      v[j] = live[j] ? *reinterpret_cast<const uint4*>(a.y_rows + size_t(row) * H + c8)
                     : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kFinBatch; ++j) {
      if (!live[j]) continue;
      const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = fmt::add_rn(acc[2 * i], fmt::mul_rn(c[j], fmt::bf16_to_float(w[i] & 0xffff)));
        acc[2 * i + 1] =
            fmt::add_rn(acc[2 * i + 1], fmt::mul_rn(c[j], fmt::bf16_to_float(w[i] >> 16)));
      }
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = fmt::bf16x2(acc[2 * i], acc[2 * i + 1]);
  *dst = make_uint4(o[0], o[1], o[2], o[3]);
}

// EP unfinalized output: slot (t, k) of the source copies its combine row (live slot) or writes
// zeros, plus the weights / indices the single-GPU prepare writes.
__global__ void __launch_bounds__(kFinThreads)
    unfinalized_copy_kernel(const ForwardArgs a, uint16_t* rows) {
  MOE_EP_TIMELINE_SCOPE(a, kTlFinalize);
  pdl_wait();  // y rows: the combine's (EP) output
  pdl_launch_dependents();
  const int t = blockIdx.x, k = blockIdx.y, K = a.K, H = a.H;
  const int T = valid_tokens(a), row = t * K + k;
  const bool live = t < T && live_id(a.ids[row], a.num_experts);
  if (threadIdx.x == 0) {
    a.weights_out[row] = t < T ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
    a.indices_out[row] = live ? row : -1;
  }
  uint4* d = reinterpret_cast<uint4*>(rows + size_t(row) * H);
  const uint4* src = reinterpret_cast<const uint4*>(a.y_rows + size_t(row) * H);
  for (int i = threadIdx.x; i < H / 8; i += kFinThreads)
    d[i] = live ? src[i] : make_uint4(0, 0, 0, 0);
}

// ---------------------------------------------------------------------------------------------
// Weight preprocessing (moe_params.h describes the resident layout).

struct PrepShape {
  int E, M, K, I, mtiles, chunks;
  bool fc1;
  bool fp8 = false;  // the fp8 resident layout (fp8_resident_piece) for 4-bit weights
  __device__ int row_of(int mtile, int frag, int r) const {
    return fc1 ? (frag & 1) * I + mtile * kFc1TileH + (frag >> 1) * 16 + r
               : mtile * kTileRows + frag * 16 + r;
  }
};

// Rows of one M-tile as fp8_resident_piece asks for them.
struct PrepRows {
  const PrepShape* p;
  int mtile;
  __device__ int operator()(int frag, int r) const { return p->row_of(mtile, frag, r); }
};

// One thread per 16-byte piece of the resident weights.
__global__ void preprocess_weights_kernel(PrepShape p, bool four_bit, const uint8_t* raw,
                                          uint8_t* out, size_t pieces_per_expert) {
  const size_t total = pieces_per_expert * p.E;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / pieces_per_expert);
    const size_t rem = idx % pieces_per_expert;
    const int per_frag = four_bit ? 32 : 128;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int lane = four_bit ? within : within / 4;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int g = lane >> 2, t4 = lane & 3;
    uint32_t words[4];
    if (four_bit && p.fp8) {
      fp8_resident_piece(raw + size_t(e) * p.M * (p.K / 2), p.M, p.K, chunk, lane, frag,
                         PrepRows{&p, mtile}, words);
    } else if (four_bit) {
      for (int s = 0; s < 4; ++s) {
        uint32_t w = 0;
        for (int j = 0; j < 4; ++j) {
          const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
          const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
          uint32_t byte = 0;
          if (row < p.M) byte = raw[(size_t(e) * p.M + row) * (p.K / 2) + kc / 2];
          // Low element = low nibble (even k), high element = high nibble; bit layout of
          // decode_e2m1x8 (sm90_moe_device.cuh).
          for (int half = 0; half < 2; ++half) {
            const uint32_t code = half ? byte >> 4 : byte & 0xfu;
            for (int bit = 0; bit < 4; ++bit)
              w |= ((code >> bit) & 1u) << (e2m1_bit_pos(j, bit) + 16 * half);
          }
        }
        words[s] = w;
      }
    } else {
      const int s = within & 3;
      for (int j = 0; j < 4; ++j) {
        const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
        const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
        uint32_t v = 0;
        if (row < p.M)
          v = *reinterpret_cast<const uint32_t*>(raw + ((size_t(e) * p.M + row) * p.K + kc) * 2);
        words[j] = v;
      }
    }
    *reinterpret_cast<uint4*>(out + idx * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// One thread per resident scale byte. bad[0..3] = {flag, expert, row, byte}.
__global__ void preprocess_scales_kernel(PrepShape p, bool nv, const uint8_t* raw, uint8_t* out,
                                         size_t bytes_per_expert, int* bad) {
  const size_t total = bytes_per_expert * p.E;
  const int per_frag = nv ? 64 : 32, per_row = nv ? 4 : 2, block = nv ? 16 : 32;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / bytes_per_expert);
    const size_t rem = idx % bytes_per_expert;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int r = within / per_row, s = within % per_row;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int row = p.row_of(mtile, frag, r);
    uint8_t b = 0;
    if (row < p.M) {
      b = raw[(size_t(e) * p.M + row) * (p.K / block) + chunk * per_row + s];
      const bool is_bad = nv ? (b & 0x7f) == 0x7f : b > 191;
      if (is_bad && atomicCAS(&bad[0], 0, 1) == 0) {
        bad[1] = e;
        bad[2] = row;
        bad[3] = b;
      }
    }
    out[idx] = b;
  }
}

}  // namespace

namespace {
// Every prepare_kernel instance launch_prepare can pick: 4 or 8 elements per thread, each with
// the batched, the one-at-a-time and the spread route.
template <Recipe R>
cudaError_t prepare_attributes() {
  cudaFuncAttributes attr;
  cudaError_t err = cudaSuccess;
  for (const void* k : {reinterpret_cast<const void*>(prepare_kernel<R, 4, kRouteIds>),
                        reinterpret_cast<const void*>(prepare_kernel<R, 4, 1>),
                        reinterpret_cast<const void*>(prepare_kernel<R, 4, 0>),
                        reinterpret_cast<const void*>(prepare_kernel<R, 8, kRouteIds>),
                        reinterpret_cast<const void*>(prepare_kernel<R, 8, 1>),
                        reinterpret_cast<const void*>(prepare_kernel<R, 8, 0>)})
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, k);
  return err;
}
}  // namespace

cudaError_t set_kernel_attributes(Recipe recipe) {
  // Querying attributes loads each module now, not lazily inside a graph capture.
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, finalize_kernel);
  if (err == cudaSuccess) {
    switch (recipe) {
      case Recipe::kNvfp4:
        err = prepare_attributes<Recipe::kNvfp4>();
        break;
      case Recipe::kMxfp4Mxfp8:
        err = prepare_attributes<Recipe::kMxfp4Mxfp8>();
        break;
      case Recipe::kMxfp4Bf16:
        err = prepare_attributes<Recipe::kMxfp4Bf16>();
        break;
      case Recipe::kBf16:
        err = prepare_attributes<Recipe::kBf16>();
        break;
    }
  }
  if (err != cudaSuccess) return err;
  switch (recipe) {
    case Recipe::kNvfp4:
      return set_gemm_attributes_nvfp4();
    case Recipe::kMxfp4Mxfp8:
      return set_gemm_attributes_mxfp4_mxfp8();
    case Recipe::kMxfp4Bf16:
      return set_gemm_attributes_mxfp4_bf16();
    case Recipe::kBf16:
      return set_gemm_attributes_bf16();
  }
  return cudaErrorInvalidValue;
}

// The tile of a forward: choose_tile_n's 8, 16, 32 or 160, except bf16 weights (no tile_n 8:
// 16 on sm90_moe_gemm_kernel; no 32 or 160: 128 on the v2 wgmma kernel). Benchmark knobs:
// MOE_EP_TILE_N=8|16|32|128|160 overrides the choice (8, 16 and 32: the decode kernel, or 16 on
// sm90_moe_gemm_kernel with MOE_EP_DECODE16=0; 128: the v2 wgmma kernel, 160: the m64 wgmma
// kernel); MOE_EP_WGMMA_V=2 turns 160 into 128 (moe_params.h).
namespace {
std::atomic<int> g_tile_override{0};
bool valid_tile_knob(int n) { return n == 8 || n == 16 || n == 32 || n == 128 || n == kM64TileN; }
}  // namespace

namespace {
std::atomic<int> g_fp8_widths_override{-1};
bool valid_fp8_widths(int w) {
  return w == kFp8WidthsPolicy || w == kFp8WidthsCoarse || w == kFp8WidthsFine;
}
}  // namespace

int fp8_widths() {
  static const int env = [] {
    const int m = env_mode("MOE_EP_FP8_FINE_N");
    return m < 0 ? kFp8WidthsPolicy : m == 1 ? kFp8WidthsFine : kFp8WidthsCoarse;
  }();
  const int o = g_fp8_widths_override.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

void set_fp8_widths_override(int widths) {
  g_fp8_widths_override.store(valid_fp8_widths(widths) ? widths : -1, std::memory_order_relaxed);
}

namespace {
std::atomic<int> g_fp8_grid_override{0};
}

int fp8_grid(int64_t items, int num_sms) {
  const int o = g_fp8_grid_override.load(std::memory_order_relaxed);
  return int(std::min<int64_t>(items, o > 0 ? o : std::max(1, num_sms)));
}

void set_fp8_grid_override(int ctas) {
  g_fp8_grid_override.store(std::max(0, ctas), std::memory_order_relaxed);
}

void set_tile_n_override(int tile_n) {
  g_tile_override.store(valid_tile_knob(tile_n) ? tile_n : 0, std::memory_order_relaxed);
}

int forward_tile_n(Recipe r, int chosen) {
  static const int forced = [] {
    const char* v = std::getenv("MOE_EP_TILE_N");
    const int n = v ? std::atoi(v) : 0;
    return valid_tile_knob(n) ? n : 0;
  }();
  const int o = g_tile_override.load(std::memory_order_relaxed);
  int n = o ? o : forced ? forced : chosen;
  if (n == 8 && r == Recipe::kBf16) n = 16;
  if (n == 32 && r == Recipe::kBf16) n = 128;  // where it had 160 before tile 32 existed
  if (n == kM64TileN && (r == Recipe::kBf16 || wgmma_version() == 2)) n = 128;
  return n;
}

namespace {
std::atomic<int> g_splitk_override[2] = {kSplitKFromEnv, kSplitKFromEnv};  // fc2, fc1
std::atomic<int> g_last_splits[2] = {1, 1};                                // fc2, fc1
std::atomic<int> g_cps_override{0};
std::atomic<int> g_last_cps{0};
// m64 shapes as ints: G * 16 + B; a pair as fc1 * 256 + fc2; 0 = none.
std::atomic<int> g_m64_override{0};
std::atomic<int> g_last_m64[2] = {0, 0};  // fc2, fc1
int m64_code(const std::array<int, 2>& shape) { return shape[0] * 16 + shape[1]; }
std::array<int, 2> m64_from_code(int v) { return {v / 16, v % 16}; }
}  // namespace

M64Shapes m64_shapes() {
  if (const int o = g_m64_override.load(std::memory_order_relaxed))
    return M64Shapes{{m64_from_code(o & 255), m64_from_code(o >> 8)}};
  static const M64Shapes env = parse_m64_shapes(std::getenv("MOE_EP_M64"));
  return env;
}
void set_m64_shapes_override(const char* knob) {
  int o = 0;
  if (knob != nullptr) {
    const M64Shapes v = parse_m64_shapes(knob);
    o = m64_code(v[1]) * 256 + m64_code(v[0]);
  }
  g_m64_override.store(o, std::memory_order_relaxed);
}
void note_m64_shape(bool fc1, std::array<int, 2> shape) {
  g_last_m64[fc1].store(m64_code(shape), std::memory_order_relaxed);
}
std::array<int, 2> last_m64_shape(bool fc1) {
  return m64_from_code(g_last_m64[fc1].load(std::memory_order_relaxed));
}

namespace {
std::atomic<int> g_wave_override{0};
}
void set_decode_wave_override(int ctas) {
  g_wave_override.store(ctas > 0 ? ctas : 0, std::memory_order_relaxed);
}
int decode_wave_override() { return g_wave_override.load(std::memory_order_relaxed); }

void set_decode_cps_override(int cps) {
  g_cps_override.store(cps == 1 || cps == 2 || cps == 4 ? cps : 0, std::memory_order_relaxed);
}
int decode_cps_override() { return g_cps_override.load(std::memory_order_relaxed); }
void note_decode_cps(int cps) { g_last_cps.store(cps, std::memory_order_relaxed); }
int last_decode_cps() { return g_last_cps.load(std::memory_order_relaxed); }

namespace {
std::atomic<int> g_fw_override{0};
std::atomic<int> g_last_fw[2] = {2, 2};
}  // namespace
void set_decode_fw_override(int fw) {
  g_fw_override.store(fw == 1 || fw == 2 ? fw : 0, std::memory_order_relaxed);
}
int decode_fw_mode() {
  if (const int o = g_fw_override.load(std::memory_order_relaxed)) return o;
  static const int env = decode_env_int("MOE_EP_DECODE_FW", 1, 2);
  return env;
}
void note_decode_fw(bool fc1, int fw) { g_last_fw[fc1].store(fw, std::memory_order_relaxed); }
int last_decode_fw(bool fc1) { return g_last_fw[fc1].load(std::memory_order_relaxed); }

namespace {
// An on/off policy a test can force: on (1), off (2), or 0 to clear; unforced, `env` decides (the
// caller's env_switch, read once per process).
class ForcedSwitch {
 public:
  void force(int mode) {
    mode_.store(mode == 1 || mode == 2 ? mode : 0, std::memory_order_relaxed);
  }
  bool on(bool env) const {
    const int m = mode_.load(std::memory_order_relaxed);
    return m ? m == 1 : env;
  }

 private:
  std::atomic<int> mode_{0};
};
ForcedSwitch g_evict, g_room;
std::atomic<bool> g_last_room{false};
}  // namespace
void set_weight_evict_override(int mode) { g_evict.force(mode); }
bool weight_evict_first() {
  static const bool env = env_switch("MOE_EP_WEIGHT_EVICT_FIRST", true);
  return g_evict.on(env);
}
void set_fc1_room_override(int mode) { g_room.force(mode); }
bool fc1_room_for_fc2() {
  static const bool env = env_switch("MOE_EP_FC1_ROOM", true);
  return g_room.on(env);
}
void note_fc1_room(bool taken) { g_last_room.store(taken, std::memory_order_relaxed); }
bool last_fc1_room() { return g_last_room.load(std::memory_order_relaxed); }

void note_decode_splits(bool fc1, int splits) {
  g_last_splits[fc1].store(splits, std::memory_order_relaxed);
}
int last_decode_splits(bool fc1) { return g_last_splits[fc1].load(std::memory_order_relaxed); }

int decode_splitk_mode(bool fc1) {
  const int o = g_splitk_override[fc1].load(std::memory_order_relaxed);
  if (o != kSplitKFromEnv) return o;
  static const std::array<int, 2> env = [] {
    const char* v = std::getenv("MOE_EP_DECODE_SPLITK");
    if (v != nullptr && std::strcmp(v, "auto") == 0)
      return std::array<int, 2>{kSplitKAuto, kSplitKAuto};
    return knob_fc1_fc2(v, 1, 8, kSplitKDefault);
  }();
  return env[fc1];
}

void set_decode_splitk_override(int fc1_mode, int fc2_mode) {
  auto valid = [](int m) { return m >= kSplitKFromEnv && m <= 8 ? m : kSplitKFromEnv; };
  g_splitk_override[1].store(valid(fc1_mode), std::memory_order_relaxed);
  g_splitk_override[0].store(valid(fc2_mode), std::memory_order_relaxed);
}

// x (after prepare) or h (after fc1) folded (fp8_row_reference, fp8_fold): one block of 128
// threads per row of `cols` bf16 values (a multiple of 8), 16-byte loads, the row's amax, then
// 8 e4m3 bytes per 16 loaded (the conversion instruction, as fmt::float_to_e4m3: qmath).
__global__ void __launch_bounds__(128)
    fp8_fold_rows_kernel(const uint16_t* src, int cols, uint8_t* dst, uint8_t* ref) {
  const size_t row = blockIdx.x;
  const uint4* s = reinterpret_cast<const uint4*>(src + row * cols);
  const int nv = cols / 8;
  auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
  auto hi = [](uint32_t w) { return __uint_as_float(w & 0xffff0000u); };
  float amax = 0.0f;
  for (int i = threadIdx.x; i < nv; i += 128) {
    const uint4 v = s[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fmaxf(fabsf(lo(w[j])), fabsf(hi(w[j]))));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float red[4];
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  const uint8_t r = fp8_row_reference(amax);
  if (threadIdx.x == 0) ref[row] = r;
  const float inv = fmt::exp2i(127 - int(r));
  uint2* d = reinterpret_cast<uint2*>(dst + row * cols);
  for (int i = threadIdx.x; i < nv; i += 128) {
    const uint4 v = s[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      p[j] = kernels::qmath::e4m3_pair(fmt::mul_rn(lo(w[j]), inv), fmt::mul_rn(hi(w[j]), inv));
    d[i] = make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
  }
}

cudaError_t launch_fp8_fold(const uint16_t* src, int rows, int cols, uint8_t* dst, uint8_t* ref,
                            cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  fp8_fold_rows_kernel<<<rows, 128, 0, s>>>(src, cols, dst, ref);
  return cudaGetLastError();
}

namespace {
std::atomic<int> g_split16_override{-2};  // -2: none (the knob)
}
void set_decode16_split_override(int mode) {
  g_split16_override.store(mode < 0 ? -2 : mode != 0, std::memory_order_relaxed);
}
int decode16_split_mode() {
  static const int env = env_mode("MOE_EP_DECODE16_SPLIT");
  const int o = g_split16_override.load(std::memory_order_relaxed);
  return o == -2 ? env : o;
}
// Measured on the H200x2 (docs/gpu_kernels.md §6 "Session 13"): at a mean of 8 rows per expert
// 3-11 % faster (E = 128 x 128 tokens, DSV3 256 tokens, EP = 2 at 128 tokens per rank), at 16
// rows 3 % slower (DSV3 512 tokens): there most experts have a tile of 16 and a remainder, which
// then run in different launches and each read the expert's weights from memory. At 12 rows no
// gain (DSV3 384 tokens), hence the bound of 10.
bool decode16_split_for(int64_t pairs, int local_experts) {
  const int mode = decode16_split_mode();
  if (mode >= 0) return mode == 1;
  return local_experts > 0 && double(pairs) <= kSplit16MaxMeanRows * local_experts;
}

bool fc2_early_start() {
  static const bool on = env_switch("MOE_EP_FC2_EARLY", true);
  return on;
}

namespace {
// prepare_kernel with qn elements per thread, its route loading the ids kRouteIds at a time
// (batch) or one at a time. Batches from kPrepWideTokens tokens (rows, for an EP owner) on:
// at DSV3 4096 tokens they take route from ~90 to ~70 us (eager prepare 89-91 -> 69-72 with 8
// elements per thread), while at 1 token they cost 1.5-2 us in the graph replay (75.3-75.8 ->
// 77.1-77.4 us; docs/gpu_kernels.md §6 "Session 15"). MOE_EP_ROUTE_BATCH=0 / 1 forces either.
// Or the route spread over blocks (route_spread), where set_route_spread_override /
// MOE_EP_ROUTE_SPREAD say so or by default on an EP owner (moe_params.h).
std::atomic<int> g_spread_override{-1};

template <Recipe R>
cudaError_t launch_prepare(bool pdl, int qn, dim3 grid, cudaStream_t s, const ForwardArgs& a) {
  static const int forced = env_mode("MOE_EP_ROUTE_BATCH");
  static const int forced_spread = env_mode("MOE_EP_ROUTE_SPREAD");
  const bool wide = a.tokens >= kPrepWideTokens;
  // An EP owner's tokens are W * capacity rows; it expects owner_pairs of them (its sources' T).
  // At DSV3 4096 tokens per rank the spread took the EP = 2 forward 6160 / 6178 -> 6101 / 6132
  // us; on one GPU eager prepare stayed at 80-95 us with or without it (the quantizer's time;
  // docs/gpu_kernels.md §9 "Session 16").
  const int o = g_spread_override.load(std::memory_order_relaxed);
  const int mode = o >= 0 ? o : forced_spread;
  const bool spread = mode >= 0 ? mode == 1 : a.xq_ready && a.owner_pairs / a.K >= kPrepWideTokens;
  if (spread && a.K <= kSpreadPairs) {
    if (a.xq_ready) grid = dim3(spread_blocks(a.tokens, a.K) + 1, 1);
    const auto k = qn == 8 ? prepare_kernel<R, 8, 0> : prepare_kernel<R, 4, 0>;
    return launch_kernel(pdl, k, grid, dim3(kPrepThreads), 0, s, a);
  }
  const bool batch = forced >= 0 ? forced == 1 : wide;
  const auto k = batch
                     ? (qn == 8 ? prepare_kernel<R, 8, kRouteIds> : prepare_kernel<R, 4, kRouteIds>)
                     : (qn == 8 ? prepare_kernel<R, 8, 1> : prepare_kernel<R, 4, 1>);
  return launch_kernel(pdl, k, grid, dim3(kPrepThreads), 0, s, a);
}
}  // namespace

void set_route_spread_override(int mode) {
  g_spread_override.store(mode == 0 || mode == 1 ? mode : -1, std::memory_order_relaxed);
}

cudaError_t encode_fp8_h_tensor_map(void* dst, const uint8_t* h8, size_t rows, int I) {
  // The driver's encoder through the runtime (no link against libcuda).
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (rows == 0 || I % 128 != 0 || (reinterpret_cast<uintptr_t>(h8) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(dst) & 63) != 0)
    return cudaErrorInvalidValue;
  alignas(64) CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(I), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(I)};
  const cuuint32_t box[2] = {128, 8};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(h8), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  return cudaMemcpy(dst, &map, sizeof(map), cudaMemcpyHostToDevice);
}

namespace {
std::atomic<uint64_t*> g_timeline{nullptr};
}
void set_timeline_buffer(uint64_t* buf) { g_timeline.store(buf, std::memory_order_relaxed); }
uint64_t* timeline_buffer() { return g_timeline.load(std::memory_order_relaxed); }

cudaError_t launch_forward(const ForwardArgs& args, cudaStream_t s, cudaEvent_t* ev) {
  if (args.tokens == 0) return cudaSuccess;
  ForwardArgs a = args;
  attach_timeline(a);
  a.tile_n = a.fp8 ? fp8_tile_n() : forward_tile_n(a.recipe, a.tile_n);
  a.fp8_widths = fp8_widths();
  a.fc2_early = fc2_early_start();
  a.weight_evict_first = weight_evict_first();
  note_fc1_room(false);
  static const bool warp_route = env_switch("MOE_EP_WARP_ROUTE", true);
  a.warp_route = warp_route;
  // Route orders the tiles for the split, and the decode GEMMs run it (launch_decode).
  // The expected pairs: T * K on one GPU; an EP owner's grid counts W * capacity rows, its
  // expected pairs are owner_pairs.
  a.tile_split =
      a.tile_n == 16 && a.recipe != Recipe::kBf16 && !a.fp8 &&
      decode16_split_for(a.owner_pairs ? int64_t(a.owner_pairs) : int64_t(a.tokens) * a.K,
                         a.local_experts);
  if (ev) cudaEventRecord(ev[0], s);
  const int qn = quant_per_thread(a.tokens);
  const dim3 pgrid(a.xq_ready ? 1 : a.tokens + 1, a.xq_ready ? 1 : quant_blocks_per_token(a.H, qn));
  // One GPU: the forward's first kernel, a plain launch. EP owner (xq_ready): after the unpack.
  const bool pdl = a.xq_ready && transport_pdl();
  cudaError_t err = cudaErrorInvalidValue;
  switch (a.recipe) {
    case Recipe::kNvfp4:
      err = launch_prepare<Recipe::kNvfp4>(pdl, qn, pgrid, s, a);
      break;
    case Recipe::kMxfp4Mxfp8:
      err = launch_prepare<Recipe::kMxfp4Mxfp8>(pdl, qn, pgrid, s, a);
      break;
    case Recipe::kMxfp4Bf16:
      err = launch_prepare<Recipe::kMxfp4Bf16>(pdl, qn, pgrid, s, a);
      break;
    case Recipe::kBf16:
      err = launch_prepare<Recipe::kBf16>(pdl, qn, pgrid, s, a);
      break;
  }
  if (err != cudaSuccess) return err;
  if (a.fp8) {  // x folded to e4m3 rows for the fp8 GEMM (docs/gpu_kernels.md §8)
    if ((err = launch_fp8_fold(a.xq, a.tokens, a.H, a.xq8, a.xref, s)) != cudaSuccess) return err;
  }
  if (ev) cudaEventRecord(ev[1], s);
  switch (a.recipe) {
    case Recipe::kNvfp4:
      err = launch_gemms_nvfp4(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kMxfp4Mxfp8:
      err = launch_gemms_mxfp4_mxfp8(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kMxfp4Bf16:
      err = launch_gemms_mxfp4_bf16(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kBf16:
      err = launch_gemms_bf16(a, s, ev ? ev + 2 : nullptr);
      break;
  }
  if (err != cudaSuccess) return err;
  if (ev) cudaEventRecord(ev[3], s);
  if (a.out) {
    // Programmatic dependent launch: finalize's CTAs are resident when fc2 ends.
    err = launch_pdl(finalize_kernel, dim3(a.tokens, (a.H / 8 + kFinThreads - 1) / kFinThreads),
                     dim3(kFinThreads), 0, s, a);
  }
  if (ev) cudaEventRecord(ev[4], s);
  return err;
}

cudaError_t launch_finalize(const ForwardArgs& args, uint16_t* unfinalized_rows, cudaStream_t s) {
  if (args.tokens == 0) return cudaSuccess;
  ForwardArgs a = args;
  attach_timeline(a);
  // After the EP combine (its wait orders the peers' rows): PDL, as the other EP kernels.
  const bool pdl = transport_pdl();
  if (a.out) {
    const dim3 fgrid(a.tokens, (a.H / 8 + kFinThreads - 1) / kFinThreads);
    return launch_kernel(pdl, finalize_kernel, fgrid, dim3(kFinThreads), 0, s, a);
  }
  return launch_kernel(pdl, unfinalized_copy_kernel, dim3(a.tokens, a.K), dim3(kFinThreads), 0, s,
                       a, unfinalized_rows);
}

cudaError_t preprocess_weights(Recipe recipe, bool fc1, int E, int H, int I, const uint8_t* raw,
                               const uint8_t* raw_scale, uint8_t* out, uint8_t* out_scale,
                               cudaStream_t stream, std::string* why, bool fp8_layout) {
  const ResidentShape rs = resident_shape(recipe, H, I);
  PrepShape p;
  p.fp8 = fp8_layout;  // the kernel applies it to 4-bit weights only
  p.E = E;
  p.fc1 = fc1;
  p.I = I;
  p.M = fc1 ? 2 * I : H;
  p.K = fc1 ? H : I;
  p.mtiles = fc1 ? rs.fc1_mtiles : rs.fc2_mtiles;
  p.chunks = fc1 ? rs.fc1_chunks : rs.fc2_chunks;
  const bool four_bit = recipe != Recipe::kBf16;
  const size_t wbytes = fc1 ? rs.fc1_bytes : rs.fc2_bytes;
  const size_t sbytes = fc1 ? rs.fc1_scale_bytes : rs.fc2_scale_bytes;
  why->clear();
  if (E == 0) return cudaSuccess;
  const int threads = 256, blocks = 132 * 16;
  preprocess_weights_kernel<<<blocks, threads, 0, stream>>>(p, four_bit, raw, out, wbytes / 16);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !four_bit)
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream);
  int* bad = nullptr;
  if ((err = cudaMalloc(&bad, 4 * sizeof(int))) != cudaSuccess) return err;
  cudaMemsetAsync(bad, 0, 4 * sizeof(int), stream);
  preprocess_scales_kernel<<<blocks, threads, 0, stream>>>(p, recipe == Recipe::kNvfp4, raw_scale,
                                                           out_scale, sbytes, bad);
  int host_bad[4] = {0, 0, 0, 0};
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(host_bad, bad, sizeof host_bad, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaFree(bad);
  if (err == cudaSuccess && host_bad[0]) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", host_bad[3]);
    *why = std::string(fc1 ? "w13_scale" : "w2_scale") + " byte " + hex + " at local expert " +
           std::to_string(host_bad[1]) + ", row " + std::to_string(host_bad[2]) +
           (recipe == Recipe::kNvfp4
                ? " is an E4M3 NaN"
                : " is a UE8M0 NaN or a scale above 2^64 (bytes > 191 are not supported)");
  }
  return err;
}

}  // namespace moe_ep::kern
