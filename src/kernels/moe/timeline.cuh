// The kernel timeline of a debug build (configure with -DMOE_EP_TIMELINE=ON): every kernel of
// the single-GPU forward records, from %globaltimer, when its first CTA became resident and when
// its last CTA's thread 0 left, into a device buffer the benchmark reads
// (`MOE_EP_BENCH_TIMELINE=1 bench_layer ...`). It places the time of a CUDA-graph replay on the
// kernels where host events cannot (programmatic dependent launch overlaps them). Without the
// option (the default, and every shipped build) it compiles to nothing.
#pragma once

#include <cstdint>

namespace moe_ep::kern {

// A slot per stage: [first CTA resident, last CTA gone] in ns of %globaltimer.
enum TimelineSlot : int { kTlPrepare, kTlFc1, kTlFc2, kTlFinalize, kTlSlots };

#if defined(MOE_EP_TIMELINE) && MOE_EP_TIMELINE

__device__ __forceinline__ uint64_t timeline_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Lives for a kernel's body: thread 0 of each CTA records its start on construction and its end
// on destruction (every way out).
struct TimelineScope {
  unsigned long long* slot;
  __device__ TimelineScope(uint64_t* buf, int s)
      : slot(buf != nullptr && threadIdx.x == 0 && threadIdx.y == 0
                 ? reinterpret_cast<unsigned long long*>(buf) + 2 * s
                 : nullptr) {
    if (slot) atomicMin(slot, static_cast<unsigned long long>(timeline_now()));
  }
  __device__ ~TimelineScope() {
    if (slot) atomicMax(slot + 1, static_cast<unsigned long long>(timeline_now()));
  }
};
#define MOE_EP_TIMELINE_SCOPE(args, s) \
  const ::moe_ep::kern::TimelineScope moe_ep_timeline_scope_((args).timeline, (s))

#else
#define MOE_EP_TIMELINE_SCOPE(args, s) static_cast<void>(0)
#endif

}  // namespace moe_ep::kern
