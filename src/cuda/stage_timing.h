// Benchmark hook: while set, every CUDA-backend forward records 5 events (before prepare,
// after prepare, after fc1, after fc2, after finalize). Process-wide; not for graph capture.
#pragma once

#include <cuda_runtime.h>

namespace moe_ep::debug {

void set_stage_events(cudaEvent_t* events);  // null: off

}  // namespace moe_ep::debug
