// Device building blocks of the expert-parallel protocol: system-scope acquire/release on the
// signal slots of symmetric windows, the bounded wait that records a sticky error instead of
// trapping, and the "last block signals" grid arrival. A fused kernel of the CUDA backend may use
// these directly instead of the standalone kernels of ep_kernels.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ep/ep_params.h"

namespace moe_ep::ep {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Acquire: the data a peer wrote before its release store of this value is visible after it.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Release: everything this thread has observed or written (cumulatively, incl. what an earlier
// fence ordered) is visible to a peer that acquires this value. An atomic max, not a store: a
// slot never goes down, so an abandon marker (kEpAbandonBit) outlives a late epoch store.
__device__ __forceinline__ void signal_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The same reduction without ordering of its own: after fence_release_sys, the two form a
// release pattern (PTX memory model), so one fence serves every signal after it. Each
// red.release.sys compiles to its own MEMBAR.ALL.SYS (cuobjdump, sm_90a), and the last block of
// a dispatch issued 2W of them back to back.
__device__ __forceinline__ void signal_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void fence_release_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// A signal or announce word into a peer's memory: relaxed, after publish_signals' one fence.
__device__ __forceinline__ void signal_sys(const EpTransport& tp, uint64_t* p, uint64_t v) {
  (void)tp;
  signal_relaxed_sys(p, v);
}

__device__ __forceinline__ uint64_t* signal_slot(uint8_t* base, const WorkspaceLayout& l,
                                                 int peer) {
  return reinterpret_cast<uint64_t*>(base + l.signal(peer));
}

// The first wait to time out wins; later ones keep its record. The host-mapped fields are
// written before `flag`, separated by a system fence, so the host never sees a half record.
__device__ __forceinline__ void record_error(const EpTransport& tp, EpStage stage, int peer,
                                             uint64_t call, uint64_t expected, uint64_t observed,
                                             uint64_t waited_ns,
                                             EpErrorCause cause = EpErrorCause::kWait,
                                             int peer_workspace = -1) {
  if (atomicCAS(&tp.state->error, 0u, 1u) != 0u) return;
  volatile EpErrorRecord* r = tp.error;
  if (r == nullptr || r->flag != 0u) return;  // another state of this comm recorded first
  r->stage = int32_t(stage);
  r->peer = peer;
  r->rank = tp.rank;
  r->call = call;
  r->expected = expected;
  r->observed = observed;
  r->waited_ns = waited_ns;
  r->cause = uint32_t(cause);
  r->workspace = tp.workspace;
  r->peer_workspace = peer_workspace;
  // Orders the record fields above before the flag below, as seen by the host.
  __threadfence_system();
  r->flag = 1u;
}

__device__ __forceinline__ bool has_error(const EpTransport& tp) {
  return *reinterpret_cast<volatile const uint32_t*>(&tp.state->error) != 0u;
}

// Waits until this rank's slot for `peer` reaches `target` (acquire), at most tp.timeout_ns.
// Returns false after recording a sticky error (or when another wait already recorded one).
__device__ __forceinline__ bool wait_signal(const EpTransport& tp, EpStage stage, int peer,
                                            uint64_t call, uint64_t target) {
  const uint64_t* slot = signal_slot(tp.peer_base[tp.rank], tp.layout, peer);
  // Dispatch waits also watch the peer's announce (ep_params.h): a peer that runs this forward
  // call in another workspace never signals here. Read only on the slow path (every 64 spins).
  const uint64_t* announce =
      stage == EpStage::kDispatch && tp.calls != nullptr ? tp.announce[tp.rank] : nullptr;
  const uint64_t my_call = announce != nullptr ? *tp.calls : 0;
  const uint64_t start = globaltimer_ns();
  uint64_t v = ld_acquire_sys(slot);
  for (uint32_t spin = 0; v < target; ++spin) {
    const uint64_t waited = globaltimer_ns() - start;
    if (waited > tp.timeout_ns) {
      record_error(tp, stage, peer, call, target, v, waited);
      return false;
    }
    if ((spin & 63u) == 63u) {
      if (has_error(tp)) return false;  // another peer already failed this call
      if (announce != nullptr) {
        const uint64_t a = ld_acquire_sys(announce + peer);
        if (ep_announce_call(a) == my_call &&
            ep_announce_workspace(a) != ep_announce_workspace(ep_announce(0, tp.workspace))) {
          record_error(tp, stage, peer, my_call, target, a, waited,
                       EpErrorCause::kWorkspaceMismatch, ep_announce_workspace(a));
          return false;
        }
      }
      __nanosleep(64);
    }
    v = ld_acquire_sys(slot);
  }
  // An abandon marker carries the peer's last epoch: below the target, the peer gave up this
  // call (it will never arrive); at or above it, the peer did arrive before it gave up.
  if ((v & kEpAbandonBit) != 0 && (v & ~kEpAbandonBit) < target) {
    record_error(tp, stage, peer, call, target, v, globaltimer_ns() - start);
    return false;
  }
  return true;
}

// One thread of the dispatch's last block, before its signals: count this forward call on the
// communicator and announce (call, workspace) to every rank (ep_params.h), so a peer that waits
// in another workspace learns of the mismatch instead of timing out. Nothing is read under the
// announce, so it needs no release of its own: publish_signals' fence orders it with the rest.
__device__ __forceinline__ void announce_call(const EpTransport& tp) {
  if (tp.calls == nullptr) return;
  const uint64_t c = *tp.calls + 1;
  *tp.calls = c;
  for (int r = 0; r < tp.world_size; ++r)
    if (tp.announce[r] != nullptr)
      signal_sys(tp, tp.announce[r] + tp.rank, ep_announce(c, tp.workspace));
}

// The last block's signal `v` into this rank's slot at every rank: one system release fence
// (every store this thread made or synchronized with before it: its block's and, through
// grid_arrive_last, every other block's) and then a relaxed reduction per rank.
__device__ __forceinline__ void publish_signals(const EpTransport& tp, uint64_t v) {
  fence_release_sys();
  for (int r = 0; r < tp.world_size; ++r)
    signal_sys(tp, signal_slot(tp.peer_base[r], tp.layout, tp.rank), v);
}

// Every thread t < W of the calling block waits for peer t's signal `target` (fused waits).
__device__ __forceinline__ void wait_all_peers(const EpTransport& tp, EpStage stage, uint64_t call,
                                               uint64_t target) {
  for (int peer = threadIdx.x; peer < tp.world_size; peer += blockDim.x)
    wait_signal(tp, stage, peer, call, target);
}

// Grid arrival after a block's peer stores. Returns true in exactly one thread of the last block
// to arrive; that thread may then publish signals (its stores are ordered after every block's
// data stores). `counter` is reset by the last block, so the next launch starts at 0.
// `s_last` (shared) tells the whole block whether it is the last one (for fused waits).
// The one-block path of a dispatch or combine grid: the caller allows it (`allowed`, the params'
// `solo`) and the grid is one block. grid_arrive_last's `solo` and the dispatch's shared-memory
// row counts take it.
__device__ __forceinline__ bool one_block_path(bool allowed, const EpTransport& tp) {
  (void)tp;
  return allowed && gridDim.x * gridDim.y * gridDim.z == 1;
}

// `solo` (one_block_path): no other block to wait for, so no fence and no arrival; thread 0 is
// "last", and publish_signals' system release fence, cumulative over the block's stores through
// the barrier, orders them before the signals (docs/protocol.md §5: one system fence and no
// global atomic on the path of a decode-size call).
__device__ __forceinline__ bool grid_arrive_last(uint32_t* counter, int* s_last = nullptr,
                                                 bool solo = false) {
  __syncthreads();  // every thread of this block finished its stores (CTA-scope order)
  bool last = false;
  if (solo) {
    last = threadIdx.x == 0;
    if (last && s_last != nullptr) *s_last = 1;
    return last;
  }
  if (threadIdx.x == 0) {
    // Cumulative system fence: the block's peer stores (made visible to thread 0 by the barrier
    // above) are ordered before the arrival below, so before the last block's signal. A release
    // fence is all this needs (with the relaxed arrival it is a release pattern).
    fence_release_sys();
    const uint32_t prev = atomicAdd(counter, 1u);
    last = prev == gridDim.x - 1;
    if (last) {
      // Acquire side of the arrivals: every block's system fence + arrival synchronizes with
      // this fence (same GPU, so GPU scope is enough), which orders their stores before the
      // signals' release (publish_signals) cumulatively.
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      *counter = 0u;
    }
    if (s_last != nullptr) *s_last = last;
  }
  return last;
}

}  // namespace moe_ep::ep
