// Prepare, the forward's first kernel on one GPU: quantizes x into xq (x as the GEMMs see it)
// and routes the (token, slot) pairs into per-expert tiles; on an EP owner it only routes the
// received rows. The plan picks the route (one block, batched, or spread over blocks) and the
// quantizer's elements per thread.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/forward_device.cuh"
#include "kernels/common/launch.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/quant4_device.cuh"
#include "kernels/common/quantize_math.h"
#include "moe_ep/formats.h"
#include "moe_ep/plan.h"

namespace moe_ep::kern {
namespace {

// Ids per thread in flight in route's batched passes (launch_prepare).
constexpr int kRouteIds = 8;
constexpr int kMaxLocalExperts = 1024;  // cuda_backend_unsupported_reasons says so beyond it
static_assert(kMaxLocalExperts <= 2 * kPrepThreads, "route scans two experts per thread");

// The first bad id of a forward, for the next host call to report.
__device__ void report_bad_id(DeviceError* err, int index, int value, int limit) {
  if (atomicCAS(&err->code, 0, 1) == 0) {
    err->index = index;
    err->value = value;
    err->limit = limit;
    __threadfence_system();
  }
}

// A routing tile is narrow when it is an expert's last and holds at most tile_split_rows (0: no
// split) of its c rows; those come first in the tile list.
__device__ __forceinline__ int narrow_tile(const ForwardArgs& a, int c, int tn) {
  const int r = c % tn;
  return r != 0 && r <= a.tile_split_rows ? 1 : 0;
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
// = the pairs of the experts below e, the tile list and its counts. A narrow tile (tile_split_rows
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
    // offset minus the narrow tiles before it. Without a split there are none (the old order).
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
  if (P <= 32) {  // the same for the whole block
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

// Pairs per counting block of route_spread (one per thread). A token's blocks (1 + t, 0) count
// kSpreadPairs / K tokens each, so for K <= kSpreadPairs (launch_prepare) the grid's T + 1
// columns hold the nb counting blocks.
constexpr int kSpreadPairs = kPrepThreads;
// Fewer pairs than this on the device: one block routes (prepare_kernel).
constexpr int kSpreadMinPairs = 4 * kSpreadPairs;
__host__ __device__ inline int spread_blocks(int tokens, int K) {
  return (tokens * K + kSpreadPairs - 1) / kSpreadPairs;
}

// Routing over nb blocks (from kPrepWideTokens tokens on, where route's one block sets prepare's
// time: 82k cycles, ~50 us, for Qwen3's 32768 pairs at 4096 tokens, its 16 warps stalled on
// shared atomics and loads). Block b counts pairs b * kSpreadPairs + tid into a.counts by global
// atomics, whose return value is the pair's place among its expert's pairs (a.pair_rank). The
// block that takes the last ticket (a.counts[El]) reads the counts, lays out offsets and tiles
// (route_layout) and leaves each expert's pair offset in a.counts[e] for route_scatter_kernel,
// which places every pair at offset + rank over nb blocks and sets the counts back to zero.
// Pairs of one expert take places in arrival order, as in route().
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
  for (int e = tid; e < El; e += kPrepThreads) cnt[e] = __ldcg(a.counts + e);
  if (tid == 0) a.counts[El] = 0;  // route_scatter_kernel's tickets (the next kernel)
  __syncthreads();
  route_layout(a, cnt, off);
  for (int e = tid; e < El; e += kPrepThreads) a.counts[e] = off[e];
}

// The second half of the spread route, the kernel after prepare (programmatic dependent launch):
// pair i = blockIdx.x * kSpreadPairs + tid goes to sorted_pairs[offset of its expert + its
// rank], the offsets that route_spread left in a.counts. The block that takes the last ticket
// sets the counts and the ticket back to zero for the next forward. Nothing to do where prepare
// routed in one block (fewer than kSpreadMinPairs pairs on the device).
__global__ void __launch_bounds__(kPrepThreads) route_scatter_kernel(const ForwardArgs a) {
  pdl_wait();  // route_spread's offsets and ranks
  pdl_launch_dependents();
  const int P = valid_tokens(a) * a.K;
  if (P < kSpreadMinPairs) return;  // block (0, 0) of prepare routed alone
  const int tid = threadIdx.x, El = a.local_experts;
  const int i = blockIdx.x * kSpreadPairs + tid;
  if (i < P) {
    const int le = local_expert(a, __ldg(a.ids + i));
    if (le >= 0) a.sorted_pairs[__ldcg(a.counts + le) + __ldcg(a.pair_rank + i)] = i;
  }
  __shared__ int last;
  __threadfence();  // this block's reads of the offsets before its ticket
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.counts + El, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  for (int e = tid; e <= El; e += kPrepThreads) a.counts[e] = 0;
}

// Elements of a token row one quantizing block covers: kN per thread (the plan's
// quant_per_thread: 4, or 8 from kPrepWideTokens tokens on), so a decode token spreads over
// several SMs and each thread's chain is one block's worth of divisions, not 16 elements'.
__host__ __device__ inline int quant_blocks_per_token(int H, int per_thread) {
  const int elems = per_thread * kPrepThreads;
  return (H + elems - 1) / elems;
}

template <Recipe R, int kN>
__device__ __forceinline__ void prepare_token(const ForwardArgs& a, int t, int T, int K, int H,
                                              int c0, int c1, int tid);

// Block (0, 0) routes (the other blocks of column 0 have nothing to do); block (b + 1, part)
// quantizes part `part` of the rows of tokens b, b + gridDim.x - 1, ... (prepare_token), kN
// elements per thread. Writes xq (x as the GEMM sees it: q*s in bf16, exact, the same per-block
// arithmetic as fmt::quantize_block_*, whatever kN) and, for the unfinalized outputs,
// weights/indices and zero rows for empty slots.
// kRB = 0: the route spread over blocks (1, 0) .. (nb, 0) (route_spread), which then quantize as
// well (an EP owner's grid, xq_ready, has only those); block (0, *) has nothing to do.
template <Recipe R, int kN, int kRB = kRouteIds>
__global__ void __launch_bounds__(kPrepThreads) prepare_kernel(const ForwardArgs a) {
  static_assert(kN == 4 || kN == 8, "4 or 8 elements per thread");
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
    if (blockIdx.x == 0 || a.xq_ready || (a.xq_is_x && a.weights_out == nullptr)) return;
  } else if (blockIdx.x == 0) {
    if (blockIdx.y == 0) route<kRB>(a);
    return;
  }
  const int part = blockIdx.y, tid = threadIdx.x;
  const int T = valid_tokens(a), K = a.K, H = a.H;
  const int c0 = part * kElems, c1 = min(H, c0 + kElems);
  // Tokens blockIdx.x - 1, + (gridDim.x - 1), ... (block-uniform).
  for (int t = blockIdx.x - 1; t < a.tokens; t += gridDim.x - 1)
    prepare_token<R, kN>(a, t, T, K, H, c0, c1, tid);
}

// Block part [c0, c1) of token t's row: the unfinalized outputs' weights, indices and zero rows
// (t < a.tokens), and xq (t < T, unless fc1 reads x itself).
template <Recipe R, int kN>
__device__ __forceinline__ void prepare_token(const ForwardArgs& a, int t, int T, int K, int H,
                                              int c0, int c1, int tid) {
  if (a.weights_out) {
    for (int k = 0; k < K; ++k) {
      const int row = t * K + k;
      const bool live = t < T && live_id(a.ids[row], a.num_experts);
      if (tid == 0 && c0 == 0) {  // the row's first part
        a.weights_out[row] = t < T ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
        a.indices_out[row] = live ? row : -1;
      }
      if (!live) {
        uint4* d = reinterpret_cast<uint4*>(a.y_rows + size_t(row) * H);
        for (int i = c0 / 8 + tid; i < c1 / 8; i += kPrepThreads) d[i] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  if (t >= T || a.xq_is_x) return;  // xq_is_x: fc1 reads x's rows themselves
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

template <Recipe R>
cudaError_t launch_prepare_recipe(const ForwardArgs& a, const ForwardPlan& p, bool pdl,
                                  cudaStream_t s) {
  const int qn = p.quant_per_thread;
  // The routing column, then the plan's blocks per part of a row, each taking every
  // prepare_token_blocks-th token; an EP owner's rows are quantized already (xq_ready), and fc1
  // reads x itself where xq_is_x: without unfinalized outputs to write per token, the grid only
  // routes.
  const bool route_only = a.xq_ready || (a.xq_is_x && a.weights_out == nullptr);
  dim3 grid(route_only ? 1 : p.prepare_token_blocks + 1,
            route_only ? 1 : quant_blocks_per_token(a.H, qn));
  if (p.route == RouteKind::kSpread) {
    const int nb = spread_blocks(a.tokens, a.K);  // the route's blocks (1..nb, 0)
    grid.x = route_only ? nb + 1 : std::max<int>(grid.x, nb + 1);
    const auto k = qn == 8 ? prepare_kernel<R, 8, 0> : prepare_kernel<R, 4, 0>;
    return launch_kernel(pdl, k, grid, dim3(kPrepThreads), 0, s, a);
  }
  const bool batch = p.route == RouteKind::kBatched;
  const auto k = batch
                     ? (qn == 8 ? prepare_kernel<R, 8, kRouteIds> : prepare_kernel<R, 4, kRouteIds>)
                     : (qn == 8 ? prepare_kernel<R, 8, 1> : prepare_kernel<R, 4, 1>);
  return launch_kernel(pdl, k, grid, dim3(kPrepThreads), 0, s, a);
}

}  // namespace

// Every prepare_kernel instance a plan can pick: 4 or 8 elements per thread, each with the
// batched, the one-at-a-time and the spread route; and the spread route's scatter kernel.
cudaError_t set_prepare_attributes(Recipe recipe) {
  auto all = [](auto r) {
    constexpr Recipe R = decltype(r)::value;
    cudaFuncAttributes attr;
    cudaError_t err = cudaFuncGetAttributes(&attr, route_scatter_kernel);
    for (const void* k : {reinterpret_cast<const void*>(prepare_kernel<R, 4, kRouteIds>),
                          reinterpret_cast<const void*>(prepare_kernel<R, 4, 1>),
                          reinterpret_cast<const void*>(prepare_kernel<R, 4, 0>),
                          reinterpret_cast<const void*>(prepare_kernel<R, 8, kRouteIds>),
                          reinterpret_cast<const void*>(prepare_kernel<R, 8, 1>),
                          reinterpret_cast<const void*>(prepare_kernel<R, 8, 0>)})
      if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, k);
    return err;
  };
  switch (recipe) {
    case Recipe::kNvfp4:
      return all(std::integral_constant<Recipe, Recipe::kNvfp4>{});
    case Recipe::kMxfp4Mxfp8:
      return all(std::integral_constant<Recipe, Recipe::kMxfp4Mxfp8>{});
    case Recipe::kMxfp4Bf16:
      return all(std::integral_constant<Recipe, Recipe::kMxfp4Bf16>{});
    case Recipe::kBf16:
      return all(std::integral_constant<Recipe, Recipe::kBf16>{});
    case Recipe::kNvfp4Bf16:
      return all(std::integral_constant<Recipe, Recipe::kNvfp4Bf16>{});
  }
  return cudaErrorInvalidValue;
}

// The prepare kernel of the recipe (launch_prepare adds the spread route's scatter after it).
static cudaError_t launch_prepare_kind(const ForwardArgs& a, const ForwardPlan& p, bool pdl,
                                       cudaStream_t s) {
  switch (a.recipe) {
    case Recipe::kNvfp4:
      return launch_prepare_recipe<Recipe::kNvfp4>(a, p, pdl, s);
    case Recipe::kMxfp4Mxfp8:
      return launch_prepare_recipe<Recipe::kMxfp4Mxfp8>(a, p, pdl, s);
    case Recipe::kMxfp4Bf16:
      return launch_prepare_recipe<Recipe::kMxfp4Bf16>(a, p, pdl, s);
    case Recipe::kBf16:
      return launch_prepare_recipe<Recipe::kBf16>(a, p, pdl, s);
    case Recipe::kNvfp4Bf16:
      return launch_prepare_recipe<Recipe::kNvfp4Bf16>(a, p, pdl, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_prepare(const ForwardArgs& a, const ForwardPlan& p, bool pdl, cudaStream_t s) {
  if (p.route == RouteKind::kSpread) {
    const cudaError_t err = launch_prepare_kind(a, p, pdl, s);
    if (err != cudaSuccess) return err;
    return launch_pdl(route_scatter_kernel, dim3(spread_blocks(a.tokens, a.K)), dim3(kPrepThreads),
                      0, s, a);
  }
  return launch_prepare_kind(a, p, pdl, s);
}

}  // namespace moe_ep::kern
