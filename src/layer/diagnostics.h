// The one internal header that the project's own programs (the moe-ep command, bench_layer, the
// multi-GPU tests) use beyond the public API of include/moe_ep: the hand-over of an NCCL unique
// id between forked ranks, and the byte counts a benchmark record reports. Nothing here is on a
// forward's path. (The launch plan and per-stage events are public: MegaLayer::plan,
// last_plan, set_stage_events.)
#pragma once

#include "common/unique_id.h"
#include "moe_ep/config.h"

namespace moe_ep {

// Bytes one token row costs a dispatch per owner rank it goes to at W > 1: its activation row in
// the recipe's format (data, then scales) and its metadata row (token index, K ids, K weights).
int dispatch_row_bytes(const LayerConfig& config);

}  // namespace moe_ep
