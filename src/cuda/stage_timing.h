// Benchmark hook: while set, every CUDA-backend forward records 5 events (before prepare,
// after prepare, after fc1, after fc2, after finalize). Process-wide; not for graph capture.
#pragma once

#include <cuda_runtime.h>

namespace moe_ep::debug {

void set_stage_events(cudaEvent_t* events);  // null: off

// The same for W > 1 forwards: 7 events (before quantize, after quantize, after dispatch + its
// wait, after unpack, after route + fc1 + fc2, after combine + its wait, after finalize).
constexpr int kEpStageEvents = 7;
void set_ep_stage_events(cudaEvent_t* events);  // null: off

}  // namespace moe_ep::debug
