// Launchers of the expert-parallel transport kernels. Each enqueues on `stream`, never syncs the
// host, uses only fixed-size buffers, and can be captured in a CUDA graph. Errors of the launch
// itself come back as cudaError_t; a peer that never arrives is reported through the sticky
// EpErrorRecord (EpComm::check()).
//
// One forward on every rank, in stream order (all ranks, also with T = 0):
//   launch_ep_dispatch -> launch_ep_wait(kDispatch) -> expert compute (reads recv_* of the local
//   window, writes y) -> launch_ep_combine -> launch_ep_wait(kCombine) -> finalize (reads the
//   local combine area). With fused_wait set, dispatch / combine do their wait themselves.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ep/ep_params.h"

namespace moe_ep {

cudaError_t launch_ep_dispatch(const EpDispatchParams& p, cudaStream_t stream);
cudaError_t launch_ep_wait(const EpWaitParams& p, cudaStream_t stream);
cudaError_t launch_ep_combine(const EpCombineParams& p, cudaStream_t stream);
cudaError_t launch_ep_finalize_reference(const EpFinalizeParams& p, cudaStream_t stream);
// This rank rejected the call it was about to make on this workspace: every rank's waits for it
// fail at once with a sticky error naming it (docs/protocol.md §6). Enqueue it after this rank's
// earlier calls (their stream), so the marker carries the last epoch it really published.
cudaError_t launch_ep_abandon(const EpTransport& tp, cudaStream_t stream);

// Default grid of dispatch / combine (num_blocks = 0): every SM, since nothing overlaps them yet.
int ep_default_blocks(int num_sms);
// A grid for `work_items` at `items_per_block` each, between 1 and num_sms blocks (small calls
// launch few blocks: each block pays the arrival fence and atomic).
int ep_blocks_for(int num_sms, int64_t work_items, int items_per_block);

}  // namespace moe_ep
