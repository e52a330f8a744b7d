// Test-only device helpers of the multi-GPU transport tests: the stand-in for expert compute
// (writes self-describing y rows for every received (source, row, local slot)) and the
// payload functions both sides regenerate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ep/ep_params.h"

namespace moe_ep::test {

MOE_EP_HD uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

// Byte j of the activation row of token t on source rank s.
MOE_EP_HD uint8_t act_byte(int src, int token, int j) {
  return uint8_t(mix32(uint32_t(src) * 0x9E3779B1u ^ mix32(uint32_t(token) * 7919u + j)) >> 11);
}

// Element h of y[t, slot] computed by `owner` for source `src`: a finite positive bf16
// (exponents 2^-7 .. 2^0) whose low 10 bits hash (owner, src, token, slot, h).
MOE_EP_HD uint16_t y_bits(int owner, int src, int token, int slot, int h) {
  const uint32_t m =
      mix32(mix32(uint32_t(owner) * 131u + uint32_t(src)) ^
            mix32(uint32_t(token) * 64u + uint32_t(slot)) ^ uint32_t(h) * 2654435761u);
  return uint16_t(0x3C00u | (m & 0x3FFu));
}

// For every received row of this rank and every slot whose expert is local, writes the y row
// y_bits(rank, src, token, slot, .) at row y_index[dense] (or dense when use_index is false;
// then y_index is also filled with the reversed permutation so combine can be tested with it).
// remote: the rows go straight into the source's combine area at token*K + slot instead (what
// the CUDA backend's fused fc2 does; combine then runs with signal_only).
cudaError_t launch_fake_experts(const EpTransport& tp, int num_local_experts, uint16_t* y,
                                int32_t* y_index, bool use_index, cudaStream_t stream,
                                bool remote = false);

}  // namespace moe_ep::test
