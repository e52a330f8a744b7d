// Expert-parallel transport kernels over LSA pointers of NCCL symmetric windows: dispatch (token
// rows to their owner ranks), the bounded wait, combine (result rows back to the source ranks)
// and a reference finalize. docs/protocol.md is the protocol; ep_device.cuh the primitives.
#include <algorithm>

#include "kernels/common/pdl.cuh"
#include "kernels/ep/ep_device.cuh"
#include "kernels/ep/ep_launch.h"
#include "moe_ep/formats.h"

namespace moe_ep {
namespace ep {
namespace {

constexpr int kMaxWarps = 32;
constexpr int kCountUnroll = 4;  // int4 words of ids in flight per thread in the count pass
constexpr int kPiece16 = 256;    // 16-byte words of one warp batch (32 lanes x 8): 4 KB

__device__ __forceinline__ int clamp_tokens(int bound, const int32_t* dev_count, int capacity) {
  int t = bound;
  if (dev_count != nullptr) t = min(t, max(0, *dev_count));
  return max(0, min(t, capacity));
}

// Owner rank of an expert id: a shift when E_local is a power of two (the usual case), else a
// division. Ids outside [0, W * E_local) belong to nobody.
struct OwnerOf {
  int num_local, shift, world;
  __device__ __forceinline__ explicit OwnerOf(int el, int w) : num_local(el), shift(0), world(w) {
    while ((1 << shift) < el) ++shift;
    if ((1 << shift) != el) shift = -1;
  }
  __device__ __forceinline__ uint64_t bit(int id) const {
    if (id < 0) return 0;
    const int o = shift >= 0 ? id >> shift : id / num_local;
    return o < world ? 1ull << o : 0;
  }
};

// Bit o set when one of the token's slots is an expert of rank o.
__device__ __forceinline__ uint64_t owner_mask(const int32_t* ids, int top_k, const OwnerOf& own,
                                               int t) {
  uint64_t m = 0;
  for (int k = 0; k < top_k; ++k) m |= own.bit(__ldg(ids + size_t(t) * top_k + k));
  return m;
}

// One warp copies `n16` 16-byte words; up to kUnroll loads per lane are in flight before their
// stores, so the remote (NVLink) stores leave in bursts.
template <int kUnroll = 8>
__device__ __forceinline__ void warp_copy16(int4* __restrict__ dst, const int4* __restrict__ src,
                                            int n16, int lane) {
  for (int c0 = 0; c0 < n16; c0 += 32 * kUnroll) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 + lane;
      if (c < n16) v[u] = __ldg(src + c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 + lane;
      if (c < n16) dst[c] = v[u];
    }
  }
}

// Adds, per owner rank, the tokens of [0, count_end) with a slot on it to s_base[] (shared).
// Ids rows of K in {4, 8, 16} (16-byte aligned) are read as int4 words, eight per thread in
// flight, and a token's K/4 words (adjacent lanes) are OR-ed with shuffles: one round of loads
// instead of one dependent load per token, so the last block starts copying early.
__device__ __forceinline__ void count_tokens_before(const int32_t* ids, int top_k,
                                                    const OwnerOf& own, int count_end,
                                                    int* s_base) {
  const int tid = threadIdx.x, lane = tid & 31, nthreads = blockDim.x, W = own.world;
  const int g = top_k / 4;  // int4 words per token
  const bool vec = (top_k & 3) == 0 && (g & (g - 1)) == 0 && g <= 4 &&
                   (reinterpret_cast<uintptr_t>(ids) & 15) == 0;
  if (vec) {
    const int4* w4 = reinterpret_cast<const int4*>(ids);
    const int words = count_end * g;
    for (int w0 = 0; w0 < words; w0 += nthreads * kCountUnroll) {
      int4 v[kCountUnroll];
#pragma unroll
      for (int u = 0; u < kCountUnroll; ++u) {
        const int w = w0 + u * nthreads + tid;
        v[u] = w < words ? __ldg(w4 + w) : make_int4(-1, -1, -1, -1);
      }
      uint64_t m[kCountUnroll];
#pragma unroll
      for (int u = 0; u < kCountUnroll; ++u) {
        m[u] = own.bit(v[u].x) | own.bit(v[u].y) | own.bit(v[u].z) | own.bit(v[u].w);
        // w0 and u * nthreads are multiples of 32, so a token's words sit in lanes
        // [lane - lane % g, + g): OR them into each of those lanes, count it in the first.
        for (int s = 1; s < g; s <<= 1) m[u] |= __shfl_xor_sync(~0u, m[u], s);
        if (lane % g != 0) m[u] = 0;
      }
      for (int o = 0; o < W; ++o) {
        int c = 0;
#pragma unroll
        for (int u = 0; u < kCountUnroll; ++u) c += int((m[u] >> o) & 1u);
        c = __reduce_add_sync(~0u, c);
        if (lane == 0 && c != 0) atomicAdd(&s_base[o], c);
      }
    }
    return;
  }
  for (int t0 = 0; t0 < count_end; t0 += nthreads) {
    const int t = t0 + tid;
    const uint64_t m = t < count_end ? owner_mask(ids, top_k, own, t) : 0;
    for (int o = 0; o < W; ++o) {
      const int c = __reduce_add_sync(~0u, int((m >> o) & 1u));
      if (lane == 0 && c != 0) atomicAdd(&s_base[o], c);
    }
  }
}

// cp.async: 16 bytes global -> shared without passing through registers (lands while the block
// does other work; cp_async_wait_all before reading).
__device__ __forceinline__ void cp_async16(int4* smem, const int4* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// dispatch. Block b handles tokens [b*chunk, (b+1)*chunk), one token per warp per tile of
// `nwarps` tokens. Rows at owner o: by default each tile takes as many rows as its tokens with a
// slot on o from a per-owner counter (one atomicAdd per owner and tile, EpState::rows), and a
// token's row is that base plus the earlier warps of the tile with a slot on o; the last block
// publishes the totals as recv_count and resets the counters. With ordered_rows the rows are the
// source's tokens in increasing order instead: the block first counts the tokens before its
// chunk (one round of vector loads; block 0 counts all and publishes recv_count). The first 4 KB
// of each warp's token row is prefetched into shared memory (cp.async) first, so it lands
// meanwhile; the row is read once and stored to every owner rank of the token (itself included).
__global__ void __launch_bounds__(1024) ep_dispatch_kernel(const EpDispatchParams p) {
  extern __shared__ int4 s_rows[];  // [nwarps][head16]: the head of each warp's current row
  __shared__ int s_base[kEpMaxRanks];
  __shared__ int s_total[kEpMaxRanks];  // solo: rows per owner so far (no global counter)
  __shared__ uint64_t s_mask[kMaxWarps];
  __shared__ int s_last;
  const EpTransport& tp = p.tp;
  const WorkspaceLayout& L = tp.layout;
  const int W = tp.world_size, K = L.top_k;
  const OwnerOf own(p.num_local_experts, W);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthreads = blockDim.x;
  const int nwarps = nthreads >> 5;
  const int meta16 = L.meta_row_bytes / 16;
  // Metadata row of token t (word 0 token, 1..K ids, K+1..2K weights, then zeros) in lanes <
  // meta16, and the owners of its slots in `part` (OR over the warp gives the token's mask).
  auto load_meta = [&](int t, bool valid, int4& meta_v, uint64_t& part) {
    meta_v = make_int4(0, 0, 0, 0);
    part = 0;
    if (valid && lane < meta16) {
      uint32_t v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int word = 4 * lane + q;
        uint32_t x = 0;
        if (word == 0) {
          x = uint32_t(t);
        } else if (word <= K) {
          const int id = __ldg(p.topk_ids + size_t(t) * K + (word - 1));
          part |= own.bit(id);
          x = uint32_t(id);
        } else if (word <= 2 * K) {
          x = __float_as_uint(__ldg(p.topk_weights + size_t(t) * K + (word - 1 - K)));
        }
        v[q] = x;
      }
      meta_v = make_int4(int(v[0]), int(v[1]), int(v[2]), int(v[3]));
    }
  };
  // early_inputs (the layer: its quantize kernel is a plain launch, so the caller's ids, weights
  // and count were complete before it, hence before this grid, started): the count and the first
  // tile's metadata are read before the wait for the quantize grid, overlapping its tail.
  int T = 0, chunk = 0, start = 0, end = 0;
  auto bounds = [&] {
    T = clamp_tokens(p.num_tokens, p.num_tokens_dev, L.capacity);
    chunk = (T + gridDim.x - 1) / gridDim.x;
    start = min(T, int(blockIdx.x) * chunk);
    end = min(T, start + chunk);
  };
  int4 meta_first = make_int4(0, 0, 0, 0);
  uint64_t part_first = 0;
  if (p.early_inputs) {
    bounds();
    load_meta(start + warp, start + warp < end, meta_first, part_first);
  }
  // The activation rows are the quantize kernel's output (launched with PDL:
  // kernels/common/pdl.cuh).
  pdl_wait();
  pdl_launch_dependents();
  // A rank with a sticky error stops moving data (its peers time out and report it, too).
  if (has_error(tp)) return;
  if (!p.early_inputs) bounds();
  const int n16 = L.act_row_bytes / 16, head16 = min(n16, kPiece16);
  int4* head = s_rows + size_t(warp) * head16;
  auto prefetch = [&](int tok) {
    const int4* src = reinterpret_cast<const int4*>(p.act + size_t(tok) * p.act_stride);
    for (int c = lane; c < head16; c += 32) cp_async16(head + c, src + c);
    cp_async_commit();
  };
  if (start + warp < end) prefetch(start + warp);

  // 1. ordered_rows: rows each owner already gets from tokens before this chunk (block 0: over
  //    all tokens, which are the counts it publishes).
  const bool ordered = p.ordered_rows;
  // One block: the rows of each owner come from a running total in shared memory instead of
  // the per-owner global counter (its atomics and the last block's exchange).
  const bool solo = one_block_path(p.solo, tp);
  for (int o = tid; o < W; o += nthreads) s_base[o] = 0, s_total[o] = 0;
  __syncthreads();
  if (ordered) {
    count_tokens_before(p.topk_ids, K, own, blockIdx.x == 0 ? T : start, s_base);
    __syncthreads();
    if (blockIdx.x == 0) {
      // recv_count[rank] at every owner (T = 0 included); the signal below orders it.
      for (int o = tid; o < W; o += nthreads) {
        *reinterpret_cast<int32_t*>(tp.peer_base[o] + L.recv_count(tp.rank)) = s_base[o];
        s_base[o] = 0;
      }
    }
    __syncthreads();
  }

  // 2. The chunk, one token per warp per tile.
  for (int tile = start; tile < end; tile += nwarps) {
    const int t = tile + warp;
    const bool valid = t < end;
    int4 meta_v;
    uint64_t part;
    if (p.early_inputs && tile == start) {
      meta_v = meta_first;
      part = part_first;
    } else {
      load_meta(t, valid, meta_v, part);
    }
    const uint64_t mask = uint64_t(__reduce_or_sync(~0u, uint32_t(part))) |
                          uint64_t(__reduce_or_sync(~0u, uint32_t(part >> 32))) << 32;
    if (lane == 0) s_mask[warp] = mask;
    __syncthreads();
    if (!ordered) {
      // The tile's rows at each owner: one atomic per owner (its latency overlaps the prefetch).
      for (int o = tid; o < W; o += nthreads) {
        int c = 0;
        for (int w = 0; w < nwarps; ++w) c += int((s_mask[w] >> o) & 1);
        if (solo) {
          s_base[o] = s_total[o];
          s_total[o] += c;
        } else {
          s_base[o] = c != 0 ? int(atomicAdd(&tp.state->rows[o], uint32_t(c))) : 0;
        }
      }
      __syncthreads();
    }
    cp_async_wait_all();
    __syncwarp();
    for (uint64_t m = mask; m != 0; m &= m - 1) {
      const int o = __ffsll(static_cast<long long>(m)) - 1;
      // Row: tokens of this chunk before ours (earlier warps of the tile) with a slot on o.
      const unsigned before = __ballot_sync(~0u, lane < warp && ((s_mask[lane] >> o) & 1));
      const int row = s_base[o] + __popc(before);
      uint8_t* dst_base = tp.peer_base[o];
      int4* dst = reinterpret_cast<int4*>(dst_base + L.recv_act(tp.rank, row));
      // From shared memory (short latency): four words per lane per round keep us in 64 registers.
      for (int c0 = 0; c0 < head16; c0 += 128) {
        int4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (c0 + u * 32 + lane < head16) v[u] = head[c0 + u * 32 + lane];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (c0 + u * 32 + lane < head16) dst[c0 + u * 32 + lane] = v[u];
      }
      if (lane < meta16)
        reinterpret_cast<int4*>(dst_base + L.recv_meta(tp.rank, row))[lane] = meta_v;
    }
    // Rows longer than 4 KB (mxfp8, bf16 rows): the rest, per owner (a second owner's read of
    // the same bytes hits L2).
    if (n16 > head16) {
      const int4* src = reinterpret_cast<const int4*>(p.act + size_t(t) * p.act_stride);
      for (uint64_t m = mask; m != 0; m &= m - 1) {
        const int o = __ffsll(static_cast<long long>(m)) - 1;
        const unsigned before = __ballot_sync(~0u, lane < warp && ((s_mask[lane] >> o) & 1));
        int4* dst = reinterpret_cast<int4*>(tp.peer_base[o] +
                                            L.recv_act(tp.rank, s_base[o] + __popc(before)));
        warp_copy16<4>(dst + head16, src + head16, n16 - head16, lane);  // 64 registers
      }
    }
    __syncthreads();  // every warp read s_mask / s_base of this tile
    if (ordered) {
      for (int o = tid; o < W; o += nthreads) {
        int c = 0;
        for (int w = 0; w < nwarps; ++w) c += int((s_mask[w] >> o) & 1);
        s_base[o] += c;
      }
    }
    if (t + nwarps < end) prefetch(t + nwarps);  // this warp is done with its head buffer
    __syncthreads();
  }

  // 3. The last block to finish publishes epoch 2n-1 to every owner (release after all rows),
  //    and with fused_wait waits for every source's epoch 2n-1 before the kernel ends.
  if (grid_arrive_last(&tp.state->dispatch_arrived, &s_last, solo)) {
    const uint64_t n = tp.state->call + 1;
    tp.state->call = n;
    if (!ordered) {
      // Every block's row atomics came before its arrival: the totals are final. recv_count[rank]
      // at every owner (T = 0 included; the signal below orders it), and 0 for the next call.
      for (int o = 0; o < W; ++o)
        *reinterpret_cast<int32_t*>(tp.peer_base[o] + L.recv_count(tp.rank)) =
            solo ? s_total[o] : int32_t(atomicExch(&tp.state->rows[o], 0u));
    }
    announce_call(tp);
    publish_signals(tp, ep_dispatch_signal(n));
  }
  if (p.fused_wait) {
    __syncthreads();
    if (s_last) {
      const uint64_t n = tp.state->call;
      wait_all_peers(tp, EpStage::kDispatch, n, ep_dispatch_signal(n));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// wait: one thread per peer spins (bounded) on this rank's slot for that peer.
__global__ void ep_wait_kernel(const EpWaitParams p) {
  const EpTransport& tp = p.tp;
  if (has_error(tp)) return;
  const uint64_t n = tp.state->call;
  const uint64_t target =
      p.stage == EpStage::kDispatch ? ep_dispatch_signal(n) : ep_combine_signal(n);
  wait_all_peers(tp, p.stage, n, target);
  // Each thread's acquire load orders the peer's rows before this kernel's end, hence before
  // every later kernel of the stream (which reads them).
}

// ---------------------------------------------------------------------------------------------
// abandon: this rank never launches the current call; tell every rank (itself included) with
// kEpAbandonBit | (last epoch it published) in its slot, so their waits fail at once.
__global__ void ep_abandon_kernel(const EpTransport tp) {
  const uint64_t last = ep_combine_signal(tp.state->call);
  for (int r = threadIdx.x; r < tp.world_size; r += blockDim.x)
    signal_release_sys(signal_slot(tp.peer_base[r], tp.layout, tp.rank), kEpAbandonBit | last);
}

// ---------------------------------------------------------------------------------------------
// combine: every (received row, local slot) result row goes to the source's combine area at
// token*K + slot. Many rows: one warp per received row (its slots in turn). Few rows (decode):
// one warp per (row, slot, 4 KB piece), so a handful of rows still spreads over many warps.
__global__ void __launch_bounds__(1024) ep_combine_kernel(const EpCombineParams p) {
  __shared__ int s_off[kEpMaxRanks + 1];
  __shared__ int s_last;
  const EpTransport& tp = p.tp;
  const WorkspaceLayout& L = tp.layout;
  pdl_wait();  // the result rows are the expert GEMM's output (launched with PDL)
  pdl_launch_dependents();
  if (has_error(tp)) return;
  const int W = tp.world_size, K = L.top_k, cap = L.capacity;
  const OwnerOf own(p.num_local_experts, W);
  const uint8_t* mine = tp.peer_base[tp.rank];
  // Fused combine: the rows were stored by fc2, a completed kernel earlier in this stream (kernel
  // completion makes its stores, peer stores included, visible system-wide); the arrival's
  // fence.sc.sys below then orders them before the signal, as for this kernel's own copies.
  if (!p.signal_only) {
    if (threadIdx.x == 0) {
      // recv_count was published before the dispatch signal this rank acquired (wait kernel).
      int acc = 0;
      for (int s = 0; s < W; ++s) {
        s_off[s] = acc;
        const int c = *reinterpret_cast<const int32_t*>(mine + L.recv_count(s));
        acc += max(0, min(c, cap));
      }
      s_off[W] = acc;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int gwarp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int nwarps = (gridDim.x * blockDim.x) >> 5;
    const int total = s_off[W];
    const int n16 = L.hidden * 2 / 16;
    const int pieces = (n16 + kPiece16 - 1) / kPiece16;
    const uint64_t mine_bit = 1ull << tp.rank;
    auto copy = [&](int s, int i, int tok, int k, int c0, int n) {
      const size_t dense = (size_t(s) * cap + i) * K + k;
      const size_t yrow = p.y_index != nullptr ? size_t(__ldg(p.y_index + dense)) : dense;
      warp_copy16(reinterpret_cast<int4*>(tp.peer_base[s] + L.combine_row(tok, k)) + c0,
                  reinterpret_cast<const int4*>(p.y + yrow * p.y_stride) + c0, n, lane);
    };
    if (int64_t(total) * 4 >= nwarps) {
      for (int j = gwarp; j < total; j += nwarps) {
        int s = 0;
        while (s_off[s + 1] <= j) ++s;
        const int i = j - s_off[s];
        RecvMetaRow meta{const_cast<uint8_t*>(mine) + L.recv_meta(s, i), K};
        const int tok = *meta.token();
        if (tok < 0 || tok >= cap) continue;
        for (int k = 0; k < K; ++k)
          if (own.bit(meta.ids()[k]) == mine_bit) copy(s, i, tok, k, 0, n16);
      }
    } else {
      const int64_t items = int64_t(total) * K * pieces;
      for (int64_t it = gwarp; it < items; it += nwarps) {
        const int j = int(it / (K * pieces)), rem = int(it % (K * pieces));
        const int k = rem / pieces, pc = rem % pieces;
        int s = 0;
        while (s_off[s + 1] <= j) ++s;
        const int i = j - s_off[s];
        RecvMetaRow meta{const_cast<uint8_t*>(mine) + L.recv_meta(s, i), K};
        const int tok = *meta.token();
        if (tok < 0 || tok >= cap || own.bit(meta.ids()[k]) != mine_bit) continue;
        copy(s, i, tok, k, pc * kPiece16, min(kPiece16, n16 - pc * kPiece16));
      }
    }
  }
  // The last block publishes epoch 2n to every source (release after all result rows), and
  // with fused_wait waits for every owner's epoch 2n.
  if (grid_arrive_last(&tp.state->combine_arrived, &s_last, one_block_path(p.solo, tp))) {
    publish_signals(tp, ep_combine_signal(tp.state->call));
  }
  if (p.fused_wait) {
    __syncthreads();
    if (s_last) {
      const uint64_t n = tp.state->call;
      wait_all_peers(tp, EpStage::kCombine, n, ep_combine_signal(n));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Reference finalize: one block per token, fp32 sum in slot order without FMA contraction.
__global__ void ep_finalize_reference_kernel(const EpFinalizeParams p) {
  const EpTransport& tp = p.tp;
  const WorkspaceLayout& L = tp.layout;
  const int K = L.top_k, H = L.hidden;
  const int T = clamp_tokens(p.num_tokens, p.num_tokens_dev, L.capacity);
  const uint8_t* mine = tp.peer_base[tp.rank];
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = 0.0f;
      if (t < T) {
        for (int k = 0; k < K; ++k) {
          if (p.topk_ids[size_t(t) * K + k] < 0) continue;
          const float c = p.topk_weights != nullptr ? p.topk_weights[size_t(t) * K + k] : 1.0f;
          const uint16_t y = reinterpret_cast<const uint16_t*>(mine + L.combine_row(t, k))[h];
          acc = fmt::add_rn(acc, fmt::mul_rn(c, fmt::bf16_to_float(y)));
        }
      }
      p.out[size_t(t) * H + h] = t < T ? fmt::float_to_bf16(acc) : uint16_t(0);
    }
  }
}

}  // namespace
}  // namespace ep

// Every SM: nothing overlaps the transfer kernels yet (measured on 2x H200: 132 blocks move
// DSV3 combine rows at 87% of the NVLink ceiling, 48 blocks at 79%). A backend that overlaps
// them with expert GEMMs passes fewer blocks.
int ep_default_blocks(int num_sms) { return std::max(1, num_sms); }

int ep_blocks_for(int num_sms, int64_t work_items, int items_per_block) {
  const int64_t b = (std::max<int64_t>(work_items, 1) + items_per_block - 1) / items_per_block;
  return int(std::min<int64_t>(std::max(1, num_sms), b));
}

namespace {

cudaError_t check_transport(const EpTransport& tp) {
  const WorkspaceLayout& L = tp.layout;
  if (tp.world_size < 1 || tp.world_size > kEpMaxRanks || tp.rank < 0 || tp.rank >= tp.world_size ||
      tp.state == nullptr || L.top_k > kEpMaxTopK || L.act_row_bytes % 16 != 0 ||
      L.hidden % 8 != 0 || L.capacity >= (1 << 23))
    return cudaErrorInvalidValue;
  for (int r = 0; r < tp.world_size; ++r)
    if (tp.peer_base[r] == nullptr) return cudaErrorInvalidValue;
  return cudaSuccess;
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 1;
  return n;
}

}  // namespace

cudaError_t launch_ep_dispatch(const EpDispatchParams& p, cudaStream_t stream) {
  if (cudaError_t e = check_transport(p.tp); e != cudaSuccess) return e;
  if (p.num_threads < 32 || p.num_threads > 1024 || p.num_threads % 32 != 0 ||
      p.act_stride % 16 != 0 || p.num_local_experts < 1 || p.num_tokens < 0)
    return cudaErrorInvalidValue;
  const int blocks = p.num_blocks > 0 ? p.num_blocks : ep_default_blocks(sm_count());
  // One row head (up to 4 KB) per warp.
  const size_t smem = size_t(p.num_threads / 32) *
                      std::min(p.tp.layout.act_row_bytes / 16, ep::kPiece16) * sizeof(int4);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(ep::ep_dispatch_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  return launch_pdl(ep::ep_dispatch_kernel, dim3(blocks), dim3(p.num_threads), smem, stream, p);
}

cudaError_t launch_ep_wait(const EpWaitParams& p, cudaStream_t stream) {
  if (cudaError_t e = check_transport(p.tp); e != cudaSuccess) return e;
  if (p.stage != EpStage::kDispatch && p.stage != EpStage::kCombine) return cudaErrorInvalidValue;
  const int threads = std::min(1024, (p.tp.world_size + 31) / 32 * 32);
  ep::ep_wait_kernel<<<1, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_ep_combine(const EpCombineParams& p, cudaStream_t stream) {
  if (cudaError_t e = check_transport(p.tp); e != cudaSuccess) return e;
  if (p.num_threads < 32 || p.num_threads > 1024 || p.num_threads % 32 != 0 ||
      p.num_local_experts < 1)
    return cudaErrorInvalidValue;
  if (!p.signal_only && (p.y == nullptr || p.y_stride < p.tp.layout.hidden || p.y_stride % 8 != 0))
    return cudaErrorInvalidValue;
  const int blocks = p.num_blocks > 0 ? p.num_blocks : ep_default_blocks(sm_count());
  return launch_pdl(ep::ep_combine_kernel, dim3(blocks), dim3(p.num_threads), 0, stream, p);
}

cudaError_t launch_ep_abandon(const EpTransport& tp, cudaStream_t stream) {
  if (cudaError_t e = check_transport(tp); e != cudaSuccess) return e;
  ep::ep_abandon_kernel<<<1, std::min(1024, (tp.world_size + 31) / 32 * 32), 0, stream>>>(tp);
  return cudaGetLastError();
}

cudaError_t launch_ep_finalize_reference(const EpFinalizeParams& p, cudaStream_t stream) {
  if (cudaError_t e = check_transport(p.tp); e != cudaSuccess) return e;
  if (p.num_tokens <= 0) return cudaSuccess;
  const int blocks = std::min(p.num_tokens, 4096);
  ep::ep_finalize_reference_kernel<<<blocks, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace moe_ep
