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

// After the slots, the buffer holds a per-CTA log of the fc1 and fc2 launches (each CTA's SM, its
// thread 0's start and end; CTAs of a linear block index past kTlCtaMax are not logged), which
// the benchmark zeroes before a replay (MOE_EP_BENCH_TIMELINE=3): where a grid's CTAs land. A
// GEMM of two launches (tile 16's row split) logs both into the same entries, the later over
// the earlier where their block indices meet.
constexpr int kTlCtaMax = 8192;
constexpr int kTlCtaWords = 3;  // SM id + 1 (0: not run), start, end
constexpr size_t kTlWords = 2 * kTlSlots + size_t(2) * kTlCtaMax * kTlCtaWords;
// The word offset of fc1's / fc2's log, or 0 for the other slots.
__host__ __device__ inline constexpr size_t timeline_cta_log(int slot) {
  return slot == kTlFc1   ? 2 * kTlSlots
         : slot == kTlFc2 ? 2 * kTlSlots + size_t(kTlCtaMax) * kTlCtaWords
                          : 0;
}

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
  uint64_t* cta;  // this CTA's entry in the per-CTA log (fc1, fc2), or null
  __device__ TimelineScope(uint64_t* buf, int s)
      : slot(buf != nullptr && threadIdx.x == 0 && threadIdx.y == 0
                 ? reinterpret_cast<unsigned long long*>(buf) + 2 * s
                 : nullptr),
        cta(nullptr) {
    if (!slot) return;
    const uint64_t now = timeline_now();
    atomicMin(slot, static_cast<unsigned long long>(now));
    const size_t log = timeline_cta_log(s);
    const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (log != 0 && b < unsigned(kTlCtaMax)) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      cta = buf + log + size_t(b) * kTlCtaWords;
      cta[0] = sm + 1;
      cta[1] = now;
    }
  }
  __device__ ~TimelineScope() {
    if (!slot) return;
    const uint64_t now = timeline_now();
    atomicMax(slot + 1, static_cast<unsigned long long>(now));
    if (cta) cta[2] = now;
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
