// What the persistent warp-specialized kernels (the fp8 kernel, sm90_fp8.cuh; the bf16 m64
// kernel, sm90_m64_ws.cuh) share: the producer's bookkeeping of its ring's "empty" barriers across
// work items, and a thread index the compiler does not hoist.
#pragma once

#include <cstdint>

#include "kernels/common/sm90_ptx.cuh"

namespace moe_ep::kern {

// threadIdx.x read where it is used: the persistent loops' per-width values that follow from it
// (fc2's box counts per producer warp, ...) would otherwise be hoisted out of the item loop for
// every width at once and spill the producer's registers.
__device__ __forceinline__ int producer_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// The producer's barrier state across its items (at most 8 slots): slots filled and not yet
// waited empty (`pend`), and per slot the parity of the empty phase to wait for next (`epar`).
struct ProducerRing {
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

// The consumers' side of the same ring: per slot the parity of the "full" phase to wait for next
// (`fpar`, bit per slot) after an item that filled slots 0, 1, ... for `stages` stages in a ring
// of kSlots: the slots used an odd number of times flip.
template <int kSlots>
__device__ __forceinline__ uint32_t flip_used_slots(uint32_t fpar, int stages) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (s < stages && (stages - 1 - s) / kSlots % 2 == 0) fpar ^= 1u << s;
  return fpar;
}

}  // namespace moe_ep::kern
