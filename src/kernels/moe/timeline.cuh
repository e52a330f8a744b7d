// The kernel timeline of a debug build (configure with -DMOE_EP_TIMELINE=ON): every kernel of
// the forward (one GPU, and the EP stages at W > 1) records, from %globaltimer, when its first
// CTA became resident and when its last CTA's thread 0 left, into a device buffer the benchmark
// reads (`MOE_EP_BENCH_TIMELINE=1 bench_layer ...`). It places the time of a CUDA-graph replay on
// the kernels where host events cannot (programmatic dependent launch overlaps them). Without the
// option (the default, and every shipped build) it compiles to nothing.
#pragma once

#include <cstdint>

namespace moe_ep::kern {

// A slot per stage: [first CTA resident, last CTA gone] in ns of %globaltimer. The EP stages
// (W > 1) too: the source quantize, the dispatch (its last block's wait for the peers included),
// the unpack and the combine (signal and wait); kTlEpDispatchSignal / kTlEpCombineSignal hold the
// moment the last block published its signal to the peers (start = end).
enum TimelineSlot : int {
  kTlPrepare,
  kTlFc1,
  kTlFc2,
  kTlFinalize,
  kTlEpSource,
  kTlEpDispatch,
  kTlEpDispatchSignal,
  kTlEpUnpack,
  kTlEpCombine,
  kTlEpCombineSignal,
  kTlSlots
};

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

// One moment (a signal's publication) into slot s, by the calling thread.
__device__ __forceinline__ void timeline_point(uint64_t* buf, int s) {
  if (buf == nullptr) return;
  const auto t = static_cast<unsigned long long>(timeline_now());
  atomicMin(reinterpret_cast<unsigned long long*>(buf) + 2 * s, t);
  atomicMax(reinterpret_cast<unsigned long long*>(buf) + 2 * s + 1, t);
}
#define MOE_EP_TIMELINE_POINT(args, s) ::moe_ep::kern::timeline_point((args).timeline, (s))

#else
#define MOE_EP_TIMELINE_SCOPE(args, s) static_cast<void>(0)
#define MOE_EP_TIMELINE_POINT(args, s) static_cast<void>(0)
#endif

}  // namespace moe_ep::kern
