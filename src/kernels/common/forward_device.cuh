// Device helpers shared by the forward's small kernels (route/prepare, finalize, the EP stages).
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/forward_args.h"

namespace moe_ep::kern {

// The valid tokens of a forward: args.tokens, or the device-side count where one is given.
__device__ __forceinline__ int valid_tokens(const ForwardArgs& a) {
  if (!a.num_tokens) return a.tokens;
  const int n = *a.num_tokens;
  return n < 0 ? 0 : (n > a.tokens ? a.tokens : n);
}

__device__ __forceinline__ bool live_id(int id, int E) { return id >= 0 && id < E; }

}  // namespace moe_ep::kern
